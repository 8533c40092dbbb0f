"""Endpoint: what each V1 route does, over Projects, the TurnRunner and the ProgressHub.

The HTTP layer (sidecar.compat.http) reads and checks transport matters (auth, body,
routing) and calls one method here per route; each returns the response body's ``data``
or raises V1Error. Rules that are V1's (README "V1 /computer/chat" has the full list):
- chat: prepare the project (sidecar.compat.projects), start the turn, answer at once
  with the session id; the reply streams on the progress route;
- progress: a session this endpoint does not know gets the idle ``end_turn`` (electron)
  or 404 (rcoder); a client gets the buffered early frames first; with nothing
  buffered and no turn running it gets one ``end_turn``
  ("Agent 当前无在执行任务") and the stream closes, except that in the electron flavor a
  session that ran a V1 turn since the start (and was not stopped) keeps the client
  waiting for its next turn, as V1 Electron did while its engine lived;
- cancel: aborts the running reply (``chat:abort``), idempotent, clears the buffer;
- stop: cancels, ends the session's streams and stops its agent engine (when no other V1
  turn uses it); the conversation stays and the next prompt starts the engine again;
- status: Busy while a V1 turn of the project runs (paused for an approval included).

The agent engines started for V1 requests are bounded: at most MAX_ENGINES run at once;
starting one more stops the least recently used idle one.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Protocol

import msgspec

from protocol.compat import CompatFlavor
from sidecar.compat import validate
from sidecar.compat.frames import Frame, FrameBuilder, Frames
from sidecar.compat.progress import ProgressHub, SseClient
from sidecar.compat.projects import Projects, Target, iso
from sidecar.compat.turns import Turn, TurnRunner
from sidecar.compat.wire import (
    INTERNAL,
    SESSION_NOT_FOUND,
    CancelResponse,
    ChatResponse,
    ComputerChatRequest,
    ProjectRequest,
    StatusResponse,
    StopResponse,
    V1Error,
    invalid,
    text_id,
)
from sidecar.errors import InvalidParams, SidecarError
from sidecar.locks import KeyedLocks

log = logging.getLogger(__name__)

MAX_ENGINES = 16
STOP_WAIT_S = 20.0


class Engines(Protocol):
    def live(self, provider_id: str) -> Any: ...

    async def stop(self, provider_id: str) -> None: ...


class Attach(msgspec.Struct, kw_only=True):
    """What a new progress stream gets: its client (None: only ``frames``, then close)."""

    client: SseClient | None
    frames: list[Frame]


class Endpoint:
    def __init__(
        self,
        *,
        flavor: CompatFlavor,
        cancel_as_error: bool,
        projects: Projects,
        runner: TurnRunner,
        hub: ProgressHub,
        engines: Engines | None,
    ) -> None:
        self.flavor = flavor
        self._cancel_as_error = cancel_as_error
        self.projects = projects
        self.runner = runner
        self.hub = hub
        self._engines = engines
        self._live: set[str] = set()
        """Sessions that ran a V1 turn since the start and were not stopped (electron: a
        progress stream opened between turns waits for the next one)."""
        self._engine_used: dict[str, float] = {}
        self._locks = KeyedLocks()
        """One chat at a time per project (two first prompts must not make two sessions)."""

    def _frames(self, session_id: str) -> Frames:
        return self.hub.ensure(
            session_id, lambda: Frames(self.flavor, session_id, cancel_as_error=self._cancel_as_error)
        )

    # -- routes ---------------------------------------------------------------------

    async def chat(self, req: ComputerChatRequest) -> ChatResponse:
        user_id = validate.identifier(text_id(req.user_id), "user_id", required=True)
        assert user_id is not None
        project_id = validate.identifier(text_id(req.project_id), "project_id") or uuid.uuid4().hex
        async with self._locks.hold(f"{user_id}/{project_id}"):
            return await self._chat(req, user_id, project_id)

    async def _chat(self, req: ComputerChatRequest, user_id: str, project_id: str) -> ChatResponse:
        prepared = await self.projects.prepare(req, user_id, project_id)
        session_id = prepared.session.id
        request_id = prepared.request_id
        if request_id is None and self.flavor == "rcoder":
            request_id = str(uuid.uuid4())  # rcoder answers with one it made
        await self._make_room(prepared.target)
        turn = Turn(
            session_id,
            FrameBuilder(self._frames(session_id), request_id),
            rules=prepared.rules,
            yolo=prepared.yolo,
            provider_id=prepared.target.provider_id if prepared.target.mode == "acp" else None,
        )
        try:
            await self.runner.start(turn, prepared.input)
        except InvalidParams as exc:  # the input itself (an attachment that is not base64, too large)
            raise invalid(exc.message) from exc
        except SidecarError as exc:
            raise V1Error(200, INTERNAL, exc.message) from exc
        self._live.add(session_id)
        return ChatResponse(
            project_id=project_id,
            session_id=session_id,
            error=None,
            request_id=request_id,
            is_new_session=prepared.is_new if self.flavor == "electron" else msgspec.UNSET,
        )

    async def known(self, session_id: str) -> bool:
        return await self.projects.session(session_id) is not None

    async def progress(self, session_id: str) -> Attach:
        """A progress stream of ``session_id``. A session this endpoint does not know (the
        renderer's own ones included): the electron flavor gets the idle ``end_turn`` and
        the stream closes, as V1 Electron answered any id while no turn ran, and as the
        server's SandboxAgentClient expects; rcoder answers 404 ``SESSION_NOT_FOUND``.
        Nothing is kept for such an id."""
        if await self.known(session_id):
            return self.attach(session_id)
        if self.flavor == "electron":
            frames = Frames(self.flavor, session_id, cancel_as_error=self._cancel_as_error)
            return Attach(client=None, frames=[frames.idle_end()])
        raise V1Error(404, SESSION_NOT_FOUND, f"Session not found: {session_id}")

    def attach(self, session_id: str) -> Attach:
        """A progress stream of a known session; TooManyClients past the bound."""
        frames = self._frames(session_id)
        waits = (
            self.hub.buffered(session_id)
            or self.runner.running(session_id) is not None
            or (self.flavor == "electron" and session_id in self._live)
        )
        if not waits:
            return Attach(client=None, frames=[frames.idle_end()])
        client, replay = self.hub.connect(session_id)
        return Attach(client=client, frames=replay)

    async def cancel(self, req: ProjectRequest) -> CancelResponse:
        user_id, project_id, session_id = self._ids(req)
        session = await self._session_of(user_id, project_id, session_id)
        if session is not None:
            if self.runner.running(session) is not None:
                try:
                    await self.runner.cancel(session)
                except SidecarError as exc:
                    raise V1Error(200, INTERNAL, exc.message) from exc
            self.hub.clear_buffer(session)
        return CancelResponse(success=True, session_id=session_id or "")

    async def stop(self, req: ProjectRequest) -> StopResponse:
        user_id, project_id, session_id = self._ids(req)
        session_key = await self._session_of(user_id, project_id, session_id)
        if session_key is not None:
            turn = self.runner.running(session_key)
            if turn is not None:
                try:
                    await self.runner.cancel(session_key)
                except SidecarError as exc:
                    raise V1Error(200, INTERNAL, exc.message) from exc
                await self.runner.wait_done(turn, STOP_WAIT_S)
            self.hub.close_session(session_key)
            self._live.discard(session_key)
            found = await self.projects.session(session_key)
            if found is not None and found[0].mode == "acp":
                await self._stop_engine(found[0].provider_id)
        return StopResponse(success=True, message="Agent stopped successfully", user_id=user_id, project_id=project_id)

    async def status(self, req: ProjectRequest) -> StatusResponse:
        user_id, project_id, _ = self._ids(req)
        session = await self.projects.find(user_id, project_id)
        if session is None:
            return StatusResponse(
                user_id=user_id, project_id=project_id, is_alive=False, session_id=None, status=None,
                last_activity=None, created_at=None,
            )
        alive = True
        if session.mode == "acp" and self._engines is not None:
            # an agent that is not running has lost the conversation's context
            alive = self._engines.live(session.provider_id) is not None
        return StatusResponse(
            user_id=user_id,
            project_id=project_id,
            is_alive=alive,
            session_id=session.id,
            status="Busy" if self.runner.running(session.id) is not None else "Idle",
            last_activity=iso(session.updated_at),
            created_at=iso(session.created_at),
        )

    # -- helpers --------------------------------------------------------------------

    def _ids(self, req: ProjectRequest) -> tuple[str, str, str | None]:
        user_id = validate.identifier(text_id(req.user_id), "user_id", required=True)
        project_id = validate.identifier(text_id(req.project_id), "project_id", required=True)
        session_id = validate.identifier(text_id(req.session_id), "session_id")
        assert user_id is not None and project_id is not None
        return user_id, project_id, session_id

    async def _session_of(self, user_id: str, project_id: str, session_id: str | None) -> str | None:
        """The project's session: ``session_id`` when it is one of the project's, else the project's own."""
        if session_id is not None:
            found = await self.projects.session(session_id)
            if found is not None and (found[1].user_id, found[1].project_id) == (user_id, project_id):
                return session_id
        session = await self.projects.find(user_id, project_id)
        return session.id if session is not None else None

    async def _make_room(self, target: Target) -> None:
        if target.mode != "acp" or target.provider_id is None or self._engines is None:
            return
        wanted = target.provider_id
        self._engine_used[wanted] = time.monotonic()
        if self._engines.live(wanted) is not None:
            return
        busy = {t.provider_id for t in self.runner.running_turns()}
        live = sorted(
            (used, pid) for pid, used in self._engine_used.items()
            if pid != wanted and self._engines.live(pid) is not None
        )
        excess = len(live) - (MAX_ENGINES - 1)
        for _, pid in live:
            if excess <= 0:
                break
            if pid in busy:
                continue
            log.info("stopping the least recently used V1 agent engine %s (at most %d run)", pid, MAX_ENGINES)
            await self._engines.stop(pid)
            excess -= 1

    async def _stop_engine(self, provider_id: str) -> None:
        if self._engines is None:
            return
        if any(t.provider_id == provider_id for t in self.runner.running_turns()):
            return  # another V1 project runs on the same engine
        await self._engines.stop(provider_id)
