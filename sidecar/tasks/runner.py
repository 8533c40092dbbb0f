"""TaskRunner: one run of a task, from its queued row to its final status.

A ``prompt`` run finds its session (the one the task continues, or a new one with the
task's options and assistant), sends the prompt as ``chat:send`` does (ChatEngine.send
through the channels' ReplyWatcher: subscribed to the session before the send, so no event
of the reply is missed) and follows the reply to its end; while a tool call of it waits for
approval the run is ``paused``. The run's status is the reply's (completed, error,
aborted). A run never supersedes a reply: the prompt goes through ChatEngine.send_if_idle,
so on a session that has a reply running or paused (the user's own, one waiting for a
tool approval included) nothing is sent and the run ends ``skipped`` (BUSY_SESSION_ERROR);
the next time of the task tries again. A reply that completed or failed is then handed to
the task's channel chat, if it has one; a delivery that cannot be made is the run's
``delivery_error``. A
``memory-consolidate`` run calls the memory upkeep instead.

``task_fired`` goes out once the run has started (for a prompt: once the reply exists, with
its ids), ``task_finished`` once its final status is stored. After a restart ``resume``
follows a run whose reply was sent (paused or not) to its end the same way.

Must stay true: every run that starts ends with a final status (a failure is ``error``
with its message, never an open row left behind while the process lives); nothing here
waits without a bound except on the reply itself, which ends or is aborted by the engine;
a run never stops or ends a reply of its session (the user's turn survives it).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import anyio
import msgspec

from protocol.chat import SendParams, SendResult, UserInput
from protocol.events import ToolApprovalRequiredEvent
from protocol.sessions import CreateSessionOptions
from protocol.tasks import TaskDelivery, TaskRun
from protocol.types import MessageV2, SessionV2
from sidecar.channels.watch import ChatTurns, ReplyWatcher
from sidecar.engine.events import EventHub
from sidecar.errors import NotFound, SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store
from sidecar.store.tasks import TaskRecord
from sidecar.notify import Notifier
from protocol.notifications import SESSION_UPDATED, TASK_FINISHED, TASK_FIRED

__all__ = ["TaskRunner", "TaskChat", "Deliver", "Consolidate", "BUSY_SESSION_ERROR"]

log = logging.getLogger(__name__)

_STATUS_OF_REPLY = {"completed": "completed", "error": "error", "aborted": "aborted"}
MAX_ERROR_CHARS = 2000
BUSY_SESSION_ERROR = "the session was busy (a reply was running or waiting for a tool approval)"


class TaskChat(ChatTurns, Protocol):
    """What a run needs of ChatEngine: the watcher's methods and the send that never
    supersedes a reply (None: the session is busy, nothing was stored)."""

    async def send_if_idle(self, params: SendParams) -> SendResult | None: ...


class _SessionBusy(SidecarError):
    """The session had a reply running or paused: the prompt was not sent."""


class _Unattended:
    """ChatEngine as the watcher sees it for a run: ``send`` never supersedes a reply."""

    def __init__(self, chat: TaskChat) -> None:
        self._chat = chat

    async def send(self, params: SendParams) -> SendResult:
        sent = await self._chat.send_if_idle(params)
        if sent is None:
            raise _SessionBusy(BUSY_SESSION_ERROR)
        return sent

    def is_generating(self, session_id: str) -> bool:
        return self._chat.is_generating(session_id)

    def overlay_live(self, message: MessageV2) -> MessageV2:
        return self._chat.overlay_live(message)


class Deliver(Protocol):
    async def __call__(self, to: TaskDelivery, message: MessageV2) -> None: ...


class Consolidate(Protocol):
    async def __call__(self, scope: str | None) -> str:
        """Run the memory upkeep of ``scope`` (None: every scope); a one-line summary."""
        ...


class TaskRunner:
    def __init__(
        self,
        *,
        store: AsyncStore,
        chat: TaskChat,
        events: EventHub,
        notify: Notifier,
        deliver: Deliver | None = None,
        consolidate: Consolidate | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self._notify = notify
        self._watcher = ReplyWatcher(events, store, _Unattended(chat))
        self.deliver = deliver
        self.consolidate = consolidate

    async def execute(self, run: TaskRun, task: TaskRecord) -> None:
        """Start a queued run and follow it to its end (the caller holds its slot)."""
        started = await self._store.run(lambda s: s.tasks.start_run(run.id))
        if started is None:  # deleted meanwhile
            return
        try:
            if task.spec.kind == "memory-consolidate":
                await self._consolidate(started, task)
            else:
                await self._prompt(started, task)
        except anyio.get_cancelled_exc_class():
            raise
        except _SessionBusy as exc:
            log.info("task %s run %s skipped: %s", task.id, run.id, exc.message)
            await self.finish(run.id, "skipped", error=exc.message)
        except SidecarError as exc:
            log.warning("task %s run %s failed: %s", task.id, run.id, exc.message)
            await self.finish(run.id, "error", error=exc.message)
        except Exception as exc:
            log.exception("task %s run %s failed", task.id, run.id)
            await self.finish(run.id, "error", error=f"internal error ({type(exc).__name__})")

    async def resume(self, run: TaskRun, task: TaskRecord) -> None:
        """Follow a run whose reply was sent before the restart to its end."""
        assert run.session_id is not None and run.message_id is not None
        session_id, message_id = run.session_id, run.message_id
        try:
            message = await self._store.run(lambda s: s.messages.get(message_id))
            if message.status == "paused":
                await self._store.run(lambda s: s.tasks.set_status(run.id, "paused"))
            with self._events.subscribe(session_id) as sub:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._track_pauses, sub, run.id, message_id)
                    final = await self._watcher.wait(session_id, message_id)
                    tg.cancel_scope.cancel()
            await self._ended(run.id, task, final)
        except anyio.get_cancelled_exc_class():
            raise
        except NotFound:
            await self.finish(run.id, "interrupted", error="its reply no longer exists")
        except SidecarError as exc:
            await self.finish(run.id, "error", error=exc.message)

    # ---- kinds --------------------------------------------------------------------------

    async def _prompt(self, run: TaskRun, task: TaskRecord) -> None:
        spec = task.spec
        assert spec.prompt is not None  # checked when the task was written
        session = await self._session(task)
        params = SendParams(session_id=session.id, input=UserInput(content=spec.prompt))
        refused: SidecarError | None = None
        with self._events.subscribe(session.id) as sub:
            async with anyio.create_task_group() as tg:

                async def sent(result: SendResult) -> None:
                    fired = await self._store.run(lambda s: s.tasks.set_reply(run.id, session.id, result.message_id))
                    if fired is not None:
                        await self._notify(TASK_FIRED, fired)
                    tg.start_soon(self._track_pauses, sub, run.id, result.message_id)

                try:
                    final = await self._watcher.send_and_wait(params, sent)
                except SidecarError as exc:  # raised past the group, not wrapped in an ExceptionGroup
                    refused = exc
                tg.cancel_scope.cancel()
        if refused is not None:
            raise refused
        await self._ended(run.id, task, final)

    async def _consolidate(self, run: TaskRun, task: TaskRecord) -> None:
        if self.consolidate is None:
            raise SidecarError("memory upkeep is not available in this process")
        await self._notify(TASK_FIRED, run)
        summary = await self.consolidate(task.spec.scope)
        log.info("task %s run %s: %s", task.id, run.id, summary)
        await self.finish(run.id, "completed")

    async def _session(self, task: TaskRecord) -> SessionV2:
        spec = task.spec
        if spec.session_id is not None:
            session_id = spec.session_id
            try:
                return await self._store.run(lambda s: s.sessions.get(session_id))
            except NotFound:
                raise SidecarError(f"the task's session {session_id!r} no longer exists") from None
        options = spec.new_session or CreateSessionOptions()
        if options.title is None:
            options = msgspec.structs.replace(options, title=spec.name)
        assistant_id = spec.assistant_id

        def create(s: Store) -> SessionV2:
            with s.transaction():
                if assistant_id is not None and not s.assistants.exists(assistant_id):
                    raise SidecarError(f"the task's assistant {assistant_id!r} no longer exists")
                session = s.sessions.create(options)
                if assistant_id is not None:
                    s.context.set_session_settings(session.id, assistant_id=assistant_id, truncation_strategy=None)
                return session

        session = await self._store.run(create)
        await self._notify(SESSION_UPDATED, session)
        return session

    # ---- following and ending -------------------------------------------------------------

    async def _track_pauses(self, sub: Any, run_id: str, message_id: str) -> None:
        """``paused`` while a tool call of the reply waits for approval, ``running`` again
        at its next event (the final status is written by the run itself)."""
        paused = False
        async for event in sub:
            if event.message_id != message_id:
                continue
            if isinstance(event, ToolApprovalRequiredEvent):
                if not paused:
                    paused = True
                    await self._store.run(lambda s: s.tasks.set_status(run_id, "paused"))
            elif paused:
                paused = False
                await self._store.run(lambda s: s.tasks.set_status(run_id, "running"))

    async def _ended(self, run_id: str, task: TaskRecord, final: MessageV2) -> None:
        status = _STATUS_OF_REPLY.get(final.status, "error")
        error = (final.error or None) if status != "completed" else None
        delivery_error = None
        to = task.spec.deliver
        if to is not None and final.status in ("completed", "error"):
            if self.deliver is None:
                delivery_error = "channels are not available in this process"
            else:
                try:
                    await self.deliver(to, final)
                except SidecarError as exc:
                    delivery_error = exc.message
                    log.warning("task %s: its reply could not be handed to channel %s: %s", task.id, to.channel,
                                exc.message)
        await self.finish(run_id, status, error=error, delivery_error=delivery_error)

    async def finish(self, run_id: str, status: str, *, error: str | None = None,
                      delivery_error: str | None = None) -> None:
        err = error[:MAX_ERROR_CHARS] if error else None
        derr = delivery_error[:MAX_ERROR_CHARS] if delivery_error else None
        # shielded: a run that ended must not stay open because shutdown cancelled its write
        with anyio.CancelScope(shield=True):
            finished = await self._store.run(lambda s: s.tasks.finish(run_id, status, error=err, delivery_error=derr))
        if finished is not None:
            await self._notify(TASK_FINISHED, finished)
