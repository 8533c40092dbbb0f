"""RemoteAgentHandler: the replies of ``mode: "remote"`` sessions (a channel's remote-agent route).

A remote turn is one more ReplyLifecycle driver (sidecar/engine/lifecycle/ owns the row,
seq, events, persistence and the ending); ChatEngine runs it for the replies of remote
sessions, which only the channels' router makes (routes.py). A turn (05-CHANNELS §4.1):

1. the session's channel and its route (a channel that no longer routes to a remote agent
   fails the turn), the token (sealed, ChannelRepo.secret), the user message's text (local
   files cannot be sent: a notice says so);
2. the session map: ``user_id`` names the local session (``im-`` and a digest: the V1
   runner keeps one conversation per user and project, and one local session is one remote
   conversation, whoever spoke in the chat), ``project_id`` the channel, ``session_id`` the
   remote session the previous turn answered (kept in channel_remote_sessions);
3. ``POST {serviceUrl}{chatEndpoint}`` (never retried), then the progress stream, followed
   across drops and silences (sidecar/sync/chatstream.py Follower: re-attached, replays
   skipped, given up after MAX_REATTACH attempts without a new event) and mapped into the
   reply as the Qiming computer API's frames are (sidecar/sync/events.py ComputerEvents:
   text and thinking chunks, tool calls, plan, the end). A permission request cannot be
   answered from a channel: it is shown as a notice;
4. a stream lost for good (the service went away mid-turn) fails the reply with the text it
   had (``error``); the service's own error frame fails it with its description.

Stop (``chat:abort``, a newer send, shutdown): ``POST {cancelEndpoint}``, then the rest of
the turn is drained for at most STOP_GRACE_S (at shutdown its share of the deadline),
shielded and bounded; the reply ends ``aborted`` with its content.

Must stay true: a turn is started on the service at most once; every wait is bounded; the
token is never logged or shown.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from contextlib import aclosing

import anyio
import httpx2

from protocol.channels import ChannelConfig, RemoteAgentRoute
from protocol.errors import ErrorCode
from protocol.settings import ChatSettings
from protocol.types import FilePart, ImagePart, SessionV2, TextPart
from sidecar.channels.remote_client import ChatBody, RemoteAgentClient
from sidecar.channels.routes import REMOTE_TOKEN
from sidecar.engine.acp_turn import cancel_grace
from sidecar.engine.lifecycle import Ending, Failed, ReplyDriver, ReplyFeed, ReplyJob
from sidecar.errors import EngineError, SidecarError
from sidecar.store import AsyncStore, Store
from sidecar.supervision import SHUTDOWN_CLOCK
from sidecar.sync.chatstream import Follower, stop_and_drain
from sidecar.sync.errors import ChatFailed, QimingError
from sidecar.sync.events import ComputerEvents, PermissionAsk, frame_ends, frame_key
from sidecar.sync.wire import SessionFrame

__all__ = ["RemoteAgentHandler", "STOP_GRACE_S", "v1_ids"]

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
STOP_CALL_S = 5.0
READ_MARGIN_S = 5.0
_V1_ID = re.compile(r"[^A-Za-z0-9_-]")


def v1_ids(session: SessionV2) -> tuple[str, str]:
    """(user_id, project_id) of a local session: ids the V1 runner accepts
    (``[A-Za-z0-9_-]{1,64}``)."""
    user = "im-" + hashlib.sha256(session.id.encode()).hexdigest()[:32]
    project = _V1_ID.sub("_", session.channel_id or "channel")[:64] or "channel"
    return user, project


class RemoteAgentHandler:
    def __init__(self, store: AsyncStore, config_of: Callable[[str], ChannelConfig | None]) -> None:
        self.store = store
        self.config_of = config_of
        self.http = httpx2.AsyncClient(follow_redirects=False, trust_env=False)

    async def aclose(self) -> None:
        await self.http.aclose()

    def driver(self, job: ReplyJob, settings: ChatSettings) -> ReplyDriver:
        return _RemoteTurn(self, job)

    def check(self, s: Store, session: SessionV2, *, branching: bool) -> None:
        if branching:
            raise SidecarError(
                "a remote agent's conversation is linear: chat:regenerate and chat:editResend are not"
                " available (send a new message instead)",
                code=ErrorCode.NOT_IMPLEMENTED,
            )

    def route_of(self, session: SessionV2) -> RemoteAgentRoute:
        config = self.config_of(session.channel_id or "")
        if config is None or not isinstance(config.route, RemoteAgentRoute):
            raise EngineError("this session's channel no longer routes to a remote agent")
        return config.route


class _RemoteTurn(ReplyDriver):
    doing = "forwarding the turn to the remote agent"

    def __init__(self, handler: RemoteAgentHandler, job: ReplyJob) -> None:
        self._handler = handler
        self.job = job

    async def drive(self, reply: ReplyFeed) -> Ending:
        handler, job = self._handler, self.job
        session = job.session
        store = handler.store
        try:
            route = handler.route_of(session)
            channel_id = session.channel_id or ""
            token = await store.run(lambda s: s.channels.secret(channel_id, REMOTE_TOKEN))
            user = await store.run(lambda s: s.messages.get(job.parent_id))
            previous = await store.run(lambda s: s.channels.remote_session(session.id))
        except SidecarError as exc:
            return Failed(exc, close_open=False)
        text = user.text_content or "".join(p.text for p in user.parts or [] if isinstance(p, TextPart))
        if any(isinstance(p, (ImagePart, FilePart)) for p in user.parts or []):
            await reply.notice("the remote agent gets the message's text only (attachments are not sent)",
                               "remote_content_not_sent")
        user_id, project_id = v1_ids(session)
        client = RemoteAgentClient(handler.http, route, token)
        body = ChatBody(
            user_id=user_id, project_id=project_id, prompt=text, message=text, request_id=job.message_id,
            session_id=previous[0] if previous else None,
        )
        try:
            remote_id = await client.chat(body)
        except SidecarError as exc:
            return Failed(exc, close_open=False)
        await store.run(lambda s: s.channels.set_remote_session(session.id, remote_id, user_id, project_id))
        job.stop_grace = STOP_GRACE_S + STOP_CALL_S + 1
        read_s = route.idle_timeout_ms / 1000 + READ_MARGIN_S
        follower: Follower[SessionFrame] = Follower(
            open_first=lambda: client.progress(remote_id, read_timeout_s=read_s),
            open_again=lambda: client.progress(remote_id, read_timeout_s=read_s),
            key=frame_key, ends=frame_ends, idle_s=route.idle_timeout_ms / 1000,
            what=f"remote agent session {remote_id}", first_starts=False,
        )
        asked: list[PermissionAsk] = []
        mapper = ComputerEvents(reply, asked.append)
        try:
            return await self._follow(follower, mapper, reply, asked)
        except anyio.get_cancelled_exc_class():
            grace = cancel_grace(STOP_GRACE_S)
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_CLOCK.bound(grace + STOP_CALL_S + 1)):
                await self._stop(client, follower, mapper, user_id, project_id, remote_id, grace)
            raise

    async def _follow(
        self, follower: Follower[SessionFrame], mapper: ComputerEvents, reply: ReplyFeed, asked: list[PermissionAsk]
    ) -> Ending:
        try:
            async with aclosing(follower.events()) as frames:
                async for frame in frames:
                    ending = await mapper.apply(frame)
                    while asked:
                        ask = asked.pop(0)
                        await reply.notice(
                            f"the remote agent asked for permission ({ask.title}); a channel cannot answer it",
                            "remote_permission_unanswered",
                        )
                    if ending is not None:
                        return ending
        except QimingError as exc:
            return Failed(exc, close_open=True)
        return Failed(ChatFailed("the remote agent's stream ended without the end of the turn"), close_open=True)

    async def _stop(
        self, client: RemoteAgentClient, follower: Follower[SessionFrame], mapper: ComputerEvents,
        user_id: str, project_id: str, remote_id: str, grace: float,
    ) -> None:
        """Cancel the turn on the service, then keep mapping what it still sends, at most ``grace``."""
        ended = await stop_and_drain(
            lambda: client.cancel(user_id=user_id, project_id=project_id, session_id=remote_id), follower, mapper,
            stop_call_s=SHUTDOWN_CLOCK.bound(STOP_CALL_S), grace_s=grace,
            what=f"the remote turn of {self.job.message_id}",
        )
        if not ended:
            self.job.abort_reason = (self.job.abort_reason or "aborted") + (
                f" (the remote agent did not end the turn within {grace:g} s; it was ended without it)"
            )
