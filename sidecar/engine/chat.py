"""ChatEngine: chat:send / chat:abort / chat:regenerate / chat:editResend.

Owns the one-generation-job-per-session rule (seed 000 sections 1 and 9): a new send,
regenerate or edit on a session cancels the running job and waits for it to end before it
stores anything; the stored user message exists before generation starts; the request
answers at once with the ids it created while the job streams in the engine's task group.

Branch rules: regenerate adds a sibling assistant reply under the same user message;
editResend adds a sibling user message under the same parent and a reply under it. Old
branches are never rewritten; the active branch moves to the new one.

A job is one ReplyLifecycle (lifecycle/: the row, events, persistence, ending, counters
and ``chat:session:updated``) run with the driver of the session's mode: the step loop
(generation.py) for ``direct``, the agent turn (acp_turn.py) for ``acp``, the forwarded
turn (sidecar/sync/forward.py, attached as ``server``) for ``server``, whose sends are
checked by it before anything is stored (a server conversation is linear: no regenerate
or edit), and a remote agent's turn (sidecar/channels/remote.py, attached as ``remote``)
for ``remote``, checked the same way. After a successful first exchange the session is titled by a side call
(settings ``generateTitles``, titles.py), which sends ``chat:session:updated`` again with
the title (a server session's title comes from its conversation's topic instead); the
start-up pass (``start_background``) asks for the titles that were due when the previous
process stopped, and resumes paused replies whose calls were all decided then. The other
side calls of a completed reply (suggestions, the automatic session summary) are
``side.after_reply``'s (sidecar/engine/side.py), and every new turn, abort or delete on a
session cancels its pending suggestions first (``side.cancel``).

Per-turn overrides (``chat:send``/``chat:regenerate`` options: provider, model, temperature,
reasoning, tools on/off) travel in the Turn and the ReplyJob; a paused reply keeps its
reasoning override in its tool run, so its resumption uses it too.

Stopping is bounded: a job that does not end within STOP_TIMEOUT_S (plus an ACP agent's
cancel timeout) makes the request that needed it fail with BUSY (nothing is written), so a
session never runs two jobs.
Deleting a session: the delete hook (``stop_session``) stops its job and marks the session
as being deleted until the delete is over; sends, regenerates, edits and resumes on it are
refused meanwhile (NOT_FOUND). Deleting messages (``chat:messages:delete``): the same hook
with ``below`` stops only the job and the paused replies whose message is at or below
``below`` (read under the session's lock after the session is marked, so no new turn can
land in that subtree), and marks the session as pruning until the delete is over: sends,
regenerates and edits are refused with BUSY meanwhile. A resume needs no such refusal: a
reply it reopens is outside the subtree (the hook closed those first) and so are its
ancestors. Per-session locks exist only while in use.

Paused replies (tool calls waiting for approval, see tool_loop.py): a paused reply holds
no job slot. ``resume`` (called by the ApprovalService when the last pending call of a
reply is decided) hands the decision to the reply's running step when that step will
still read it (its automatic tools are running), else waits for the paused row and starts
a job that continues it: pausing and resuming are one decision, so no reply is left
paused with nothing pending. A new send, regenerate or edit on the
session, ``chat:abort``, and deleting the session end every paused reply of the session
as ``aborted``: its pending calls become ``cancelled`` (audited, actor system) and get a
"not run" error result, so the stored history stays valid for the next request.
``send_if_idle`` (a scheduled task's send) never ends a reply: on a session with a reply
running or paused it stores nothing and answers None.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import anyio
import anyio.abc

from protocol.errors import ErrorCode
from protocol.chat import (
    AbortParams,
    EditResendParams,
    MessageIdResult,
    RegenerateParams,
    SendParams,
    SendResult,
)
from protocol.common import SuccessResult
from protocol.settings import ChatSettings
from protocol.types import MessageV2, SessionV2
from sidecar.engine.approvals import ApprovalService
from sidecar.engine.generation import GenerationHandler, ReplyProviders, ToolAssembler
from sidecar.engine.lifecycle import (
    COMPLETED,
    PAUSED,
    Pricing,
    ReplyDriver,
    ReplyJob,
    ReplyLifecycle,
    ReplyServices,
)
from sidecar.engine.titles import TitleGenerator
from sidecar.engine.usage import SideUsage
from sidecar.engine.turns import Turn, TurnWriter
from sidecar.errors import NotFound, SidecarError
from sidecar.pipeline.builder import Prepared, RequestBuilder
from sidecar.locks import KeyedLocks
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.store.store import Store
from sidecar.store.tools import ToolRun
from sidecar.notify import Notifier
from protocol.notifications import SESSION_UPDATED

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0
"""Longer than a reply's whole ending may take (the lifecycle's timeouts, in
lifecycle/runner.py), so a stop that arrives while a reply ends waits for it."""


class _RunningJob:
    __slots__ = ("job", "scope", "done")

    def __init__(self, job: ReplyJob) -> None:
        self.job = job
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()


class ChatProviders(ReplyProviders, Pricing, Protocol):
    """The engine's ProviderService as the chat engine uses it."""


class SideTasks(Protocol):
    """The side calls around replies (sidecar/engine/side.py SideCalls)."""

    def cancel(self, session_id: str) -> None:
        """A new turn on the session began: its pending suggestions are not wanted."""

    async def after_reply(self, session: SessionV2, job: ReplyJob) -> None:
        """A reply completed: start its side calls (suggestions, the automatic summary)."""


class SettingsSource(Protocol):
    def current(self) -> ChatSettings: ...


class AgentTurns(Protocol):
    """The drivers of mode 'acp' replies (sidecar/engine/acp_turn.py AcpTurnHandler)."""

    def driver(self, job: ReplyJob, settings: ChatSettings) -> ReplyDriver: ...

    async def require_fork(self, session: SessionV2) -> None:
        """EngineError-like SidecarError when the session's engine cannot branch."""


class ServerTurns(Protocol):
    """The drivers of mode 'server' replies (sidecar/sync/forward.py ServerTurnHandler)."""

    def driver(self, job: ReplyJob, settings: ChatSettings) -> ReplyDriver: ...

    def check(self, s: Store, session: SessionV2, *, branching: bool) -> None:
        """In the store's worker thread, before a turn is stored: a SidecarError when the
        session's turns cannot be forwarded now."""


class ChatEngine:
    def __init__(
        self,
        *,
        store: AsyncStore,
        notify: Notifier,
        providers: ChatProviders,
        attachments: AttachmentStore,
        requests: RequestBuilder,
        settings: SettingsSource,
        task_group: anyio.abc.TaskGroup,
        tools: ToolAssembler | None = None,
        approvals: ApprovalService | None = None,
        data_dir: Path | None = None,
        acp: AgentTurns | None = None,
        side_usage: SideUsage | None = None,
        side: SideTasks | None = None,
    ) -> None:
        self._store = store
        self._side = side
        """Suggestions and the automatic summary after a reply (None: none)."""
        self._notify = notify
        self._settings = settings
        self._tg = task_group
        self._services = ReplyServices(store=store, notify=notify, pricing=providers)
        self._handler = GenerationHandler(
            store=store,
            providers=providers,
            requests=requests,
            services=self._services,
            settings=settings.current,
            tools=tools,
            approvals=approvals,
            data_dir=data_dir,
        )
        if approvals is not None:
            approvals.on_settled["tool"] = self.resume
        self._acp = acp
        """AcpTurnHandler (sidecar/engine/acp_turn.py): the drivers of mode 'acp' replies."""
        self.server: ServerTurns | None = None
        """ServerTurnHandler (sidecar/sync/forward.py), attached once the sync service is
        open: the drivers of mode 'server' replies."""
        self.remote: ServerTurns | None = None
        """RemoteAgentHandler (sidecar/channels/remote.py): the drivers of mode 'remote'
        replies (a channel's remote-agent route)."""
        self._turns = TurnWriter(attachments)
        self._titles = TitleGenerator(store=store, providers=providers, settings=settings.current, usage=side_usage)
        self._jobs: dict[str, _RunningJob] = {}
        self._locks = KeyedLocks()
        self._deleting: dict[str, int] = {}
        """Sessions whose delete is in progress (a count: two deletes may overlap)."""
        self._pruning: dict[str, int] = {}
        """Sessions whose messages are being deleted (a count, as ``_deleting``)."""
        self._closing = False
        self._titling: set[str] = set()
        """Sessions whose title is being asked for."""
        self.on_completed: list[Callable[[str, ReplyJob], None]] = []
        """Called (session id, job) after a reply completed; must not wait (the memory
        encoder schedules its work in its own task group)."""

    # -- methods ---------------------------------------------------------------------

    async def send(self, params: SendParams) -> SendResult:
        self._check_open()
        fast = await self._send_idle(params)
        if fast is not None:
            return fast
        turn = await self._store.run(lambda s: self._turns.check_send(s, params))
        await self._check_acp(turn, branching=False)
        user, reply = await self._begin(turn, "superseded by a new message", after_active_leaf=True)
        assert user is not None
        return SendResult(message_id=reply.id, user_message_id=user.id)

    async def send_if_idle(self, params: SendParams) -> SendResult | None:
        """``send`` for a sender that must never supersede a reply (a scheduled task): the
        turn is stored and started only when the session has no reply running or paused,
        else None and nothing is stopped or stored. The rule is ``_send_idle``'s, decided
        under the session's lock (a paused reply not known to the cache is read from the
        store), so no send, regenerate or resume of the session lands between the check
        and the write."""
        self._check_open()
        return await self._send_idle(params, wait=True)

    async def _send_idle(self, params: SendParams, *, wait: bool = False) -> SendResult | None:
        """A send on a session with nothing running or paused: check and store in one
        worker-thread hop (the common case, on the way to the first delta). None when the
        session is busy: then the two-hop path checks before it stops anything. With
        ``wait`` the session's lock is waited for and its paused replies are read from the
        store when the cache does not know them, so None means busy."""
        session_id = params.session_id
        if not wait and (
            session_id in self._jobs or self._locks.locked(session_id) or not self._handler.is_idle(session_id)
        ):
            return None
        async with self._locks.hold(session_id):
            self._check_not_deleting(session_id)
            if session_id in self._jobs or not await self._no_paused(session_id, read=wait):
                return None
            if self._side is not None:
                self._side.cancel(session_id)
            acp_ok = self._acp is not None

            def check_and_write(s: Store) -> tuple[Turn, MessageV2 | None, MessageV2, Prepared | None]:
                turn = self._turns.check_send(s, params)
                if turn.session.mode == "acp" and not acp_ok:
                    raise SidecarError("ACP mode is not available in this process", code=ErrorCode.NOT_IMPLEMENTED)
                if turn.session.mode in ("server", "remote"):
                    self._check_server(s, turn.session, branching=False)
                user, reply = self._turns.write(s, turn, after_active_leaf=True)
                # the first request's reads in the same hop (the job reads again if they fail
                # or do not fit the model it resolves)
                prepared = self._handler.prepare_first(turn.session, reply.parent_id, turn.model_id)
                return turn, user, reply, prepared

            turn, user, reply, prepared = await self._store.run(check_and_write)
            self._start_turn(turn, reply, prepared)
        assert user is not None
        return SendResult(message_id=reply.id, user_message_id=user.id)

    async def _no_paused(self, session_id: str, *, read: bool) -> bool:
        """The session has no paused reply: known from the cache, or with ``read`` from the store."""
        if self._handler.is_idle(session_id):
            return True
        return read and not await self._store.run(lambda s: s.tools.runs(session_id=session_id, state="paused"))

    async def abort(self, params: AbortParams) -> SuccessResult:
        await self._store.run(lambda s: s.sessions.get(params.session_id))  # NotFound for unknown ids
        async with self._locks.hold(params.session_id):
            stopped = await self._stop(params.session_id, "aborted by the user")
        return SuccessResult(success=stopped)

    async def regenerate(self, params: RegenerateParams) -> MessageIdResult:
        self._check_open()
        turn = await self._store.run(lambda s: self._turns.check_regenerate(s, params))
        await self._check_acp(turn, branching=True)
        _, reply = await self._begin(turn, "superseded by regenerate", after_active_leaf=False)
        return MessageIdResult(message_id=reply.id)

    async def edit_resend(self, params: EditResendParams) -> SendResult:
        self._check_open()
        turn = await self._store.run(lambda s: self._turns.check_edit(s, params))
        await self._check_acp(turn, branching=True)
        user, reply = await self._begin(turn, "superseded by edit and resend", after_active_leaf=False)
        assert user is not None
        return SendResult(message_id=reply.id, user_message_id=user.id)

    # -- lifecycle -------------------------------------------------------------------

    async def resume(self, session_id: str, message_id: str) -> bool:
        """Continue a paused reply whose calls are all decided; False if there is none.

        Called by the ApprovalService when the last pending call of a reply was decided.
        While the reply's job still runs its tool step the decision is the step's own (it
        reads the decisions before it pauses: True at once); once the step has sealed its
        decision, this waits for the paused row and resumes from it."""
        if self._closing:
            return False
        async with self._locks.hold(session_id):
            if session_id in self._deleting:
                return False
            running = self._jobs.get(session_id)
            if running is not None:
                if running.job.message_id != message_id:
                    return False
                if await self._handed_to_step(running, message_id):
                    return True
                if self._jobs.get(session_id) is not None:
                    return False

            def reopen(s: Store) -> tuple[SessionV2, MessageV2, ToolRun] | None:
                run = s.tools.get_run(message_id)
                if run is None or run.state != "paused" or run.session_id != session_id:
                    return None
                if any(c.state == "pending" for c in s.tools.calls(message_id)):
                    return None
                session = s.sessions.get(session_id)
                message = s.tools.reopen_message(message_id)
                return None if message is None else (session, message, run)

            reopened = await self._store.run(reopen)
            if reopened is None:
                return False
            session, message, run = reopened
            self._start(
                ReplyJob(
                    session=session,
                    message_id=message_id,
                    parent_id=message.parent_id or "",
                    provider_id=run.provider_id,
                    model_id=run.model_id,
                    temperature=run.temperature,
                    reasoning=run.reasoning,
                    resume=message,
                    steps=run.steps,
                )
            )
        return True

    async def _handed_to_step(self, running: _RunningJob, message_id: str) -> bool:
        """True when the running job's tool step will read the decision just made; False
        once the job has ended (it paused: the caller resumes it from the stored row)."""
        with anyio.move_on_after(STOP_TIMEOUT_S):
            while not running.done.is_set():
                gate = self._handler.tool_loop.running_gate(message_id)
                if gate is not None and not gate.sealed:
                    return True
                async with anyio.create_task_group() as tg:

                    async def wake_on(event: Callable[[], Awaitable[object]]) -> None:
                        await event()
                        tg.cancel_scope.cancel()

                    tg.start_soon(wake_on, running.done.wait)
                    if gate is not None:
                        tg.start_soon(wake_on, gate.changed)
        return False

    def is_generating(self, session_id: str) -> bool:
        return session_id in self._jobs

    def overlay_live(self, message: MessageV2) -> MessageV2:
        """``message`` with the in-flight content and seq if it is being generated now.

        The database holds a partial reply at most one persistence interval old; a renderer
        that resyncs needs the content that matches the last event it can have seen.
        """
        if message.status not in ("pending", "streaming"):
            return message
        running = self._jobs.get(message.session_id)
        if running is None or running.job.message_id != message.id or running.job.live is None:
            return message
        return running.job.live.overlay(message)

    async def stop_session(self, session_id: str, reason: str, below: str | None = None) -> Callable[[], None]:
        """The delete hook: stop the session's job and refuse new ones until the returned
        callable is called (SessionService calls it once the delete is over, done or not).
        With ``below`` (messages at and below it are being deleted): only a job or paused
        reply in that subtree is stopped, and new turns are refused with BUSY meanwhile.
        BUSY (and no mark left) when the job does not stop in time."""
        marks = self._deleting if below is None else self._pruning
        async with self._locks.hold(session_id):
            marks[session_id] = marks.get(session_id, 0) + 1
            try:
                if below is None:
                    await self._stop(session_id, reason)
                else:
                    await self._stop_below(session_id, below, reason)
            except BaseException:
                self._unmark(marks, session_id)
                raise
        return lambda: self._unmark(marks, session_id)

    def _unmark(self, marks: dict[str, int], session_id: str) -> None:
        count = marks.get(session_id, 0) - 1
        if count > 0:
            marks[session_id] = count
            return
        marks.pop(session_id, None)
        if marks is self._deleting:
            self._handler.forget_session(session_id)
        else:  # a summary verified before is checked again
            self._handler.forget_branch(session_id)

    async def _stop_below(self, session_id: str, below: str, reason: str) -> None:
        """Stop the job and close the paused replies whose message is ``below`` or under it."""
        def read(s: Store) -> tuple[set[str], str | None]:
            return set(s.messages.subtree_ids(session_id, below)), s.sessions.get(session_id).active_leaf_id

        doomed, active = await self._store.run(read)
        if self._side is not None and active in doomed:
            self._side.cancel(session_id)  # suggestions are only stored for the active leaf
        running = self._jobs.get(session_id)
        if running is not None and running.job.message_id in doomed:
            await self._stop_job(running, reason)
        if self._closing or self._handler.is_idle(session_id):
            return
        await self._handler.close_paused(session_id, reason, only=doomed)

        def left(s: Store) -> bool:
            return any(r.message_id in doomed for r in s.tools.runs(session_id=session_id, state="paused"))

        if await self._store.run(left):  # closing is bounded: one that did not end keeps its rows
            raise SidecarError("a paused reply of this session could not be ended in time", code=ErrorCode.BUSY)

    async def aclose(self) -> None:
        """Abort every running job (their partial replies are stored as aborted): all are
        cancelled first, then awaited together, bounded."""
        self._closing = True
        running = list(self._jobs.values())
        for job in running:
            job.job.abort_reason = "the sidecar is shutting down"
            job.job.publish = False
            job.scope.cancel()
        with anyio.move_on_after(STOP_TIMEOUT_S + max((job.job.stop_grace for job in running), default=0.0)):
            for job in running:
                await job.done.wait()
        stuck = sum(not job.done.is_set() for job in running)
        if stuck:
            log.warning("%d replies did not stop within %.0f s at shutdown", stuck, STOP_TIMEOUT_S)
        self._tg.cancel_scope.cancel()  # side tasks (titles) are not worth waiting for

    # -- internals -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing:
            raise SidecarError("the sidecar is shutting down", code=ErrorCode.BUSY)

    def _check_not_deleting(self, session_id: str) -> None:
        if session_id in self._deleting:
            raise NotFound(f"session {session_id!r} is being deleted")
        if session_id in self._pruning:
            raise SidecarError("messages of this session are being deleted: try again", code=ErrorCode.BUSY)

    async def _begin(
        self, turn: Turn, reason: str, *, after_active_leaf: bool
    ) -> tuple[MessageV2 | None, MessageV2]:
        """Stop the session's job, store the turn, start generating its reply."""
        session_id = turn.session.id
        async with self._locks.hold(session_id):
            self._check_not_deleting(session_id)
            await self._stop(session_id, reason)
            user, reply = await self._store.run(lambda s: self._turns.write(s, turn, after_active_leaf=after_active_leaf))
            self._start_turn(turn, reply)
        return user, reply

    def _start_turn(self, turn: Turn, reply: MessageV2, prepared: Prepared | None = None) -> None:
        self._start(
            ReplyJob(
                session=turn.session,
                message_id=reply.id,
                parent_id=reply.parent_id or "",
                provider_id=turn.provider_id,
                model_id=turn.model_id,
                temperature=turn.temperature,
                reasoning=turn.reasoning,
                tools=turn.tools,
                prepared=prepared,
            )
        )

    def _start(self, job: ReplyJob) -> None:
        running = _RunningJob(job)
        self._jobs[job.session.id] = running
        self._tg.start_soon(self._run, running)

    def _check_server(self, s: Store, session: SessionV2, *, branching: bool) -> None:
        handler = self.remote if session.mode == "remote" else self.server
        if handler is None:
            raise SidecarError(f"{session.mode} mode is not available in this process", code=ErrorCode.NOT_IMPLEMENTED)
        handler.check(s, session, branching=branching)

    async def _check_acp(self, turn: Turn, *, branching: bool) -> None:
        if turn.session.mode in ("server", "remote"):
            session = turn.session
            await self._store.run(lambda s: self._check_server(s, session, branching=branching))
            return
        if turn.session.mode != "acp":
            return
        if self._acp is None:
            raise SidecarError("ACP mode is not available in this process", code=ErrorCode.NOT_IMPLEMENTED)
        if branching:  # ACP cannot rewind an agent session: a new branch needs session/fork
            await self._acp.require_fork(turn.session)

    async def _run(self, running: _RunningJob) -> None:
        job = running.job
        try:
            with running.scope:
                settings = self._settings.current()
                if job.session.mode == "acp" and self._acp is not None:
                    driver = self._acp.driver(job, settings)
                elif job.session.mode == "server" and self.server is not None:
                    driver = self.server.driver(job, settings)
                elif job.session.mode == "remote" and self.remote is not None:
                    driver = self.remote.driver(job, settings)
                else:
                    driver = self._handler.driver(job, settings)
                await ReplyLifecycle(job, self._services, settings).run(driver)
                if job.outcome == PAUSED:  # before the slot is free: a send must see it
                    self._handler.note_paused(job.session.id)
        except Exception:  # never let one reply take the engine down
            log.exception("generation %s failed unexpectedly", job.message_id)
        finally:
            if self._jobs.get(job.session.id) is running:
                del self._jobs[job.session.id]
            self._handler.tool_loop.job_ended(job.message_id)
            running.done.set()
        await self._after(job)

    async def _after(self, job: ReplyJob) -> None:
        """Side tasks of a finished reply (its lifecycle sent chat:session:updated)."""
        session = job.ended_session
        if job.outcome != COMPLETED or session is None or self._closing or session.mode == "remote":
            return  # a remote agent keeps its own memory, titles and suggestions
            return
        for hook in self.on_completed:  # server-mode replies too: the memory encoder reads them
            try:
                hook(session.id, job)
            except Exception:
                log.exception("a completed-reply hook failed for %s", job.message_id)
        if session.mode == "server":  # its title and suggestions come from the server
            return
        try:
            if await self._titles.wants_title(session, job.message_id):
                self._tg.start_soon(self._title, session, job.message_id, job.provider_id, job.model_id)
            if self._side is not None:
                await self._side.after_reply(session, job)
        except SidecarError:
            log.debug("session %s vanished after its generation", job.session.id)

    async def _title(self, session: SessionV2, reply_id: str, provider_id: str, model_id: str) -> None:
        if session.id in self._titling:  # the start-up pass and a finished reply at once
            return
        self._titling.add(session.id)
        try:
            updated = await self._titles.generate(session, reply_id, provider_id, model_id)
        finally:
            self._titling.discard(session.id)
        if updated is not None and not self._closing:
            await self._notify(SESSION_UPDATED, updated)

    # -- the start-up pass -----------------------------------------------------------

    def start_background(self, task_group: anyio.abc.TaskGroup) -> None:
        """What a previous run left undone, in the background (never before the first
        answers): paused replies whose calls were all decided (the process stopped between
        the last decision and the resume), then the titles that were due and never written."""
        task_group.start_soon(self.catch_up)

    async def catch_up(self) -> None:
        """The start-up pass itself (see ``start_background``)."""
        try:
            runs = await self._store.run(lambda s: [
                r for r in s.tools.runs(state="paused")
                if not any(c.state == "pending" for c in s.tools.calls(r.message_id))
            ])
            for run in runs:
                if await self.resume(run.session_id, run.message_id):
                    log.info("resumed the reply %s: its tool calls were decided before the restart", run.message_id)
            for session, reply_id in await self._titles.due():
                if self._closing:
                    return
                await self._title(session, reply_id, session.provider_id, session.model_id)
        except SidecarError as exc:
            log.warning("the start-up pass of the chat engine stopped: %s", exc.message)

    async def _stop(self, session_id: str, reason: str) -> bool:
        """Stop the session's job and close its paused replies; True if there was any.
        BUSY when the job does not end within STOP_TIMEOUT_S (the caller writes nothing)."""
        running = self._jobs.get(session_id)
        stopped = False
        if self._side is not None:
            self._side.cancel(session_id)
        if running is not None:
            await self._stop_job(running, reason)
            stopped = True
        if not self._closing:  # at shutdown a paused reply stays paused (it survives restarts)
            try:
                stopped = await self._handler.close_paused(session_id, reason) or stopped
            except SidecarError:
                log.exception("could not end the paused replies of %s", session_id)
        return stopped

    async def _stop_job(self, running: _RunningJob, reason: str) -> None:
        """Cancel a running job and wait for its end; BUSY when it does not end within
        STOP_TIMEOUT_S (the caller writes nothing)."""
        running.job.abort_reason = reason
        running.scope.cancel()
        with anyio.move_on_after(STOP_TIMEOUT_S + running.job.stop_grace):
            await running.done.wait()
        if not running.done.is_set():
            raise SidecarError("the previous reply of this session did not stop in time", code=ErrorCode.BUSY)
