"""ReplyLifecycle: everything an assistant reply has, whatever produces its content.

A reply is one assistant message, stored ``pending`` by the turn that asked for it
(sidecar/engine/turns.py), and the ``chat:stream`` events that build it. Whatever produces
the content (the direct-mode model/tool step loop, an ACP agent, a remote server, the V1
shim), the life of the reply is the same, and it is owned here, once:

- the row: ``pending`` -> ``streaming`` (written at the first persistence tick, so it never
  delays the first delta) -> exactly one final status (``completed`` | ``error`` |
  ``aborted``), or ``paused`` while it waits for the user (a later job resumes it);
- ``seq`` and the StreamRelay: ``stream_start`` is event 1 (a resumed reply continues its
  seq and sends none); the first delta goes out at once, later ones are merged for
  ``deltaCoalesceMs``; every other event flushes the pending deltas first;
- persistence: the partial content every ``persistIntervalMs`` while it changed (a failed
  write is logged and retried at the next tick: the content stays in memory) and at every
  state change (pause, ending);
- the overlay ``chat:messages:get`` shows while the message streams (``overlay``): exactly
  the content of events 1..seq;
- usage (the driver reports running totals) and cost (``Pricing``), added to the session's
  counters (``usageByKind.reply``) at every ending that used tokens, completed, error or
  aborted (a paused reply adds its usage when it ends), and ``chat:session:updated`` with
  the session as stored after the ending;
- the ending: shielded (a stop that arrives meanwhile waits for it) and bounded
  (FINALIZE_TIMEOUT_S); the last throttled state is flushed, then one final row and exactly
  one final event (``stream_end`` | ``error`` | ``aborted``); when the driver's ``finalize``
  stored other text than was streamed, ``content_replaced`` with the stored text comes right
  before ``stream_end`` (the renderer never keeps text that is not stored); an ending that fails or runs
  out of time falls back to ``error`` with the content so far (FALLBACK_TIMEOUT_S); if that
  cannot store its row in time either, the ``error`` event is still sent (the row is left
  to restart recovery).

The driver interface
--------------------
A driver produces content and nothing else. It subclasses ReplyDriver::

    class EchoDriver(ReplyDriver):
        doing = "echoing"              # a bug escaping drive(): "internal error while echoing"

        async def drive(self, reply: ReplyFeed) -> Ending:
            await reply.text("hello")
            await reply.report_usage(Usage(input_tokens=3, output_tokens=1))
            return Completed("stop")

    await ReplyLifecycle(job, services, settings).run(EchoDriver())

``drive`` feeds the reply through ReplyFeed and returns how the content ended:

    Completed(finish_reason)        complete: ``stream_end`` with the finish reason
    Failed(error, close_open=True)  failed: ``error`` (a SidecarError) is stored and sent;
                                    ``close_open=False`` says nothing of the driver is left
                                    open (its ``close`` hook is skipped)
    Aborted(reason)                 the producer stopped by itself (an agent cancelled its turn)
    Paused()                        waits for the user (tool calls pending approval): the row
                                    becomes ``paused`` with content, usage and seq and no final
                                    event is sent; a new job with ``ReplyJob.resume`` (the
                                    stored message) continues it, content, usage and seq included

Cancellation (chat:abort, a newer send, shutdown) propagates out of ``drive`` (a driver may
clean up first, shielded and bounded, as ACP's ``session/cancel``) and ends the reply
``aborted`` with ``job.abort_reason``; any other exception ends it ``error`` (a
SidecarError as it is, anything else as an internal error naming only its type). A driver
never has to catch anything to end its reply properly.

ReplyFeed, what a driver calls (content and its event move together)::

    await reply.text(delta)                               text_delta (coalesced)
    await reply.thinking(delta, signature=None)           thinking_delta; a signature seals
                                                          the block just streamed
    await reply.tool_call_started(id, name, arguments="") tool_call_start (a call being made)
    await reply.tool_call_arguments(id, name, fragment)   tool_call_delta
    await reply.tool_use(id, name, arguments) -> index    a complete call the reply owes a
                                                          result (ToolUsePart + ToolCall, no event)
    await reply.tool_result(id, output, is_error, replace=None, announce=True) -> index
                                                          ToolResultPart (+ tool_result); replace:
                                                          the index of the result it updates
    await reply.part(part) -> index                       any other part: DiffPart, StepStartPart,
                                                          StepFinishPart, ImagePart, FilePart...
    reply.replace_part(index, part)                       a part changed in place (no event)
    await reply.report_usage(total, announce=False)       the usage so far (announce: usage event)
    await reply.notice(text, code)                        notice
    await reply.plan(entries)                             plan (an agent's whole plan)
    await reply.citations(records)                        citations: every source the reply
                                                          may cite so far (the full list)
    await reply.approval_required(call, decisions=None, options=None, source="tool")
                                                          tool_approval_required
    reply.content                                         the ReplyBuilder, to read (parts so
                                                          far, calls without a result, usage)

Hooks a driver may override (ReplyDriver's defaults add nothing)::

    def persisted(self) -> StoreWrite | None
        Driver state stored with the row, in its transaction, at each persistence tick and
        at the ending: a write of what changed since the last call, or None (ACP: the raw
        session/update log, appended). A failed write is retried, together with the next
        one (a write must be idempotent: it may run twice).
    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None
        Before the row of an error or aborted ending: close what the driver left open (the
        tool loop: pending approvals cancelled, unanswered calls given a "cancelled" result
        with announce=False). A failure is logged; the row and the final event still follow.
    async def finalize(self, snapshot: ReplySnapshot) -> ReplySnapshot
        Before the row of a completed ending: the content as it is stored (direct mode: think
        tags, images to files, output regex rules, citation markers normalized and checked).
        A failure ends the reply as ``error``. When it changes the content, ``stream_end``
        carries the stored content (``contentReplaced``), so a renderer never keeps showing
        text that was not stored; when it changes the citations, a ``citations`` event with
        the final list comes first.
    def final_write(self, outcome: str) -> StoreWrite | None
        Stored in the transaction of the final or paused row: the driver's own record of how
        the reply ended (the tool loop's run state).

A reply that pauses for approvals fits as it is: the driver records the pending calls, sends
``approval_required`` and returns Paused(); the approval starts a new job with ``resume``
set, whose driver continues from ``reply.content`` (the restored message). A driver whose
approvals are answered while it waits (ACP's permission requests) simply awaits them
inside ``drive``.

Where the events go is ``ReplyServices.notify`` (``chat:stream`` notifications through the
server's writer, for ChatEngine's jobs); whoever runs a lifecycle may give it its own, e.g. a
shim that also streams the events to an HTTP client. Whoever runs it also keeps the one
job per message rule (ChatEngine does for its jobs).

Must stay true: the lifecycle is the only writer of the reply's row and the only sender of
its events while it runs; ``job.outcome`` is set right before the final event, once the
final row was attempted (or when the paused row is stored); the timeouts of an ending add
up to less than ChatEngine's STOP_TIMEOUT_S.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.events import (
    AbortedEvent,
    CitationsEvent,
    ContentReplacedEvent,
    ErrorEvent,
    FinishReason,
    NoticeCode,
    NoticeEvent,
    PlanEntry,
    PlanEvent,
    StreamEndEvent,
    StreamStartEvent,
    StreamToolCall,
    StreamToolResult,
    ToolApprovalOption,
    ToolApprovalRequiredEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEvent,
    UsageEvent,
)
from protocol.providers import ReasoningLevel
from protocol.settings import ChatSettings
from protocol.types import Citation, ContentPart, MessageV2, SessionV2, ToolResultPart, Usage
from sidecar.engine.relay import StreamRelay
from sidecar.engine.reply import ReplyBuilder, ReplySnapshot
from sidecar.errors import SidecarError
from sidecar.notify import Notifier
from protocol.notifications import SESSION_UPDATED

if TYPE_CHECKING:
    from sidecar.store.async_store import AsyncStore
    from sidecar.store.store import Store

__all__ = [
    "ABORTED",
    "COMPLETED",
    "ERROR",
    "PAUSED",
    "Aborted",
    "Completed",
    "Ending",
    "Failed",
    "Paused",
    "Pricing",
    "ReplyDriver",
    "ReplyFeed",
    "ReplyJob",
    "ReplyLifecycle",
    "ReplyServices",
    "StoreWrite",
    "internal_failure",
]

log = logging.getLogger(__name__)

FINALIZE_TIMEOUT_S = 10.0
FALLBACK_TIMEOUT_S = 2.0
"""For the fallback ending when the first one failed."""
LAST_EVENT_TIMEOUT_S = 1.0
"""For the final event alone when the fallback could not send it either."""
COST_TIMEOUT_S = 0.5
"""For the cost of an error or aborted ending (a price lookup; 0 when it takes longer)."""
PUBLISH_TIMEOUT_S = 1.0
"""For ``chat:session:updated`` after the final event. A stop waits for all of these: their
sum stays under ChatEngine's STOP_TIMEOUT_S, so it waits for the ending instead of giving up."""

COMPLETED = "completed"
ERROR = "error"
ABORTED = "aborted"
PAUSED = "paused"

StoreWrite = Callable[["Store"], None]
"""A write of a driver's own state, run in the store's worker thread inside the transaction
of the reply's row."""


# ---- endings ----------------------------------------------------------------------------


class Completed(msgspec.Struct, frozen=True):
    finish_reason: FinishReason = "stop"


class Failed(msgspec.Struct, frozen=True):
    error: SidecarError
    close_open: bool = True
    """False: the driver left nothing open (its ``close`` hook is skipped)."""


class Aborted(msgspec.Struct, frozen=True):
    reason: str | None = None


class Paused(msgspec.Struct, frozen=True):
    pass


Ending = Completed | Failed | Aborted | Paused


def _both(first: StoreWrite | None, second: StoreWrite | None) -> StoreWrite | None:
    if first is None or second is None:
        return first or second

    def write(s: Store) -> None:
        first(s)
        second(s)

    return write


def internal_failure(exc: BaseException, doing: str) -> SidecarError:
    """The failure a reply ends with when ``exc`` escaped its driver: a SidecarError (a store
    failure) as it is, anything else as an internal error naming only its type."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, SidecarError):
        return exc
    return SidecarError(f"internal error while {doing}: {type(exc).__name__}")


# ---- what a job is ------------------------------------------------------------------------


class ReplyJob(msgspec.Struct, kw_only=True):
    """One run of a reply: the assistant message ``message_id``, a child of ``parent_id``."""

    session: SessionV2
    message_id: str
    parent_id: str
    provider_id: str
    model_id: str
    temperature: float | None = None
    reasoning: ReasoningLevel | None = None
    """A reasoning level for this reply only (a per-send option); None: the settings'."""
    tools: bool = True
    """False: no tools are offered for this reply (a per-send option)."""
    resume: MessageV2 | None = None
    """A paused reply to continue (its stored content, usage and seq), instead of a new one."""
    steps: int = 0
    """Model steps taken so far (direct mode; a resumed reply keeps counting)."""
    prepared: object | None = None
    """Reads the turn made ahead for its driver (direct mode: the first request's
    RequestBuilder.Prepared), or None; a driver checks the type it expects."""
    abort_reason: str | None = None
    """Set by whoever cancels the job (abort, a newer send, shutdown)."""
    stop_grace: float = 0.0
    """How much longer than ChatEngine's STOP_TIMEOUT_S a stop may take (set by a driver
    whose cleanup is slower, e.g. an ACP agent's cancel timeout)."""
    publish: bool = True
    """Send ``chat:session:updated`` after the ending (off at shutdown)."""
    outcome: str | None = None
    """completed | error | aborted | paused, once the job has ended."""
    ended_session: SessionV2 | None = None
    """The session as stored after the ending (what ``chat:session:updated`` carried)."""
    live: ReplyLifecycle | None = None
    """The lifecycle while it runs: the in-flight content for ``chat:messages:get``."""
    pausing: bool = False
    """Set by a driver that has decided to pause (before its ``tool_approval_required``
    events): the in-flight content is shown ``paused`` until the paused row is stored."""


# ---- collaborators ------------------------------------------------------------------------


class Pricing(Protocol):
    async def cost(self, provider_id: str, model_id: str, usage: Usage) -> float:
        """USD cost of ``usage`` (0 when unknown); SidecarError when it cannot be known."""
        ...


class ReplyServices:
    """What every lifecycle of a process shares (built once by ChatEngine)."""

    __slots__ = ("store", "notify", "pricing")

    def __init__(self, *, store: AsyncStore, notify: Notifier, pricing: Pricing) -> None:
        self.store = store
        self.notify = notify
        self.pricing = pricing


class ReplyFeed(Protocol):
    """What a driver feeds a reply with (see the module docstring)."""

    @property
    def content(self) -> ReplyBuilder: ...

    async def text(self, delta: str) -> None: ...

    async def thinking(self, delta: str, signature: str | None = None) -> None: ...

    async def tool_call_started(self, call_id: str, name: str, arguments: str = "") -> None: ...

    async def tool_call_arguments(self, call_id: str, name: str, fragment: str) -> None: ...

    async def tool_use(self, call_id: str, name: str, arguments: str) -> int: ...

    async def tool_result(
        self, call_id: str, output: str, is_error: bool, *, replace: int | None = None, announce: bool = True
    ) -> int: ...

    async def part(self, part: ContentPart) -> int: ...

    def replace_part(self, index: int, part: ContentPart) -> None: ...

    async def report_usage(self, total: Usage, *, announce: bool = False) -> None: ...

    async def notice(self, text: str, code: NoticeCode | None = None) -> None: ...

    async def plan(self, entries: list[PlanEntry]) -> None: ...

    async def citations(self, records: list[Citation]) -> None: ...

    async def approval_required(
        self,
        call: StreamToolCall,
        *,
        decisions: list[str] | None = None,
        options: list[ToolApprovalOption] | None = None,
        source: str = "tool",
        preview: str | None = None,
    ) -> None: ...


class ReplyDriver:
    """Produces a reply's content; see the module docstring for the contract."""

    doing = "generating the reply"
    """Completes "internal error while ..." when a bug escapes ``drive``."""

    async def drive(self, reply: ReplyFeed) -> Ending:
        raise NotImplementedError

    def persisted(self) -> StoreWrite | None:
        return None

    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None:
        return None

    async def finalize(self, snapshot: ReplySnapshot) -> ReplySnapshot:
        return snapshot

    def final_write(self, outcome: str) -> StoreWrite | None:
        return None


# ---- the lifecycle --------------------------------------------------------------------------


class ReplyLifecycle:
    text: Callable[[str], Coroutine[Any, Any, None]]
    """ReplyFeed.text: the relay's own delta (no frame of ours per chunk: the hot path); the
    content follows through the relay's on_delta, when the delta's event takes its seq."""

    def __init__(self, job: ReplyJob, services: ReplyServices, settings: ChatSettings) -> None:
        self.job = job
        self._store = services.store
        self._notify = services.notify
        self._pricing = services.pricing
        self._persist_s = max(20, settings.persist_interval_ms) / 1000
        self._content = ReplyBuilder()
        self._relay = StreamRelay(
            services.notify,
            job.session.id,
            job.message_id,
            coalesce_s=max(0, settings.delta_coalesce_ms) / 1000,
            on_delta=self._content.add_delta,
        )
        self.text = functools.partial(self._relay.delta, "text")
        if job.resume is not None:
            self._content.restore(job.resume)  # its usage too: stored when the reply paused
            self._relay.seq = job.resume.seq or 0
        self._started = time.monotonic()
        self._unsaved: StoreWrite | None = None
        """A driver write whose transaction failed: written with the next one."""

    @property
    def content(self) -> ReplyBuilder:
        return self._content

    @property
    def seq(self) -> int:
        return self._relay.seq

    # -- running -----------------------------------------------------------------------

    async def run(self, driver: ReplyDriver) -> None:
        """The reply from its current state to its ending; cancellation is re-raised after
        the aborted state is stored and sent."""
        job = self.job
        job.live = self
        ending: Ending
        try:
            if job.resume is None:
                await self._relay.emit(
                    StreamStartEvent, parent_id=job.parent_id, model_id=job.model_id, provider_id=job.provider_id
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._relay.run_flusher)
                tg.start_soon(self._persist_loop, driver)
                try:
                    ending = await driver.drive(self)
                finally:
                    self._relay.close()
                    tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            await self._end(driver, Aborted(job.abort_reason))
            raise
        except Exception as exc:  # a store failure or a bug (the task group wraps it)
            log.exception("reply %s failed", job.message_id)
            ending = Failed(internal_failure(exc, driver.doing))
        await self._end(driver, ending)

    def overlay(self, message: MessageV2) -> MessageV2:
        """``message`` (its stored row) with the in-flight content and seq: the database
        holds a partial reply at most one persistence interval old, a renderer that resyncs
        needs the content that matches the last event it can have seen."""
        snap = self._content.snapshot(mark_clean=False)
        seq = self._relay.seq
        status = "paused" if self.job.pausing else "streaming" if seq else message.status
        return msgspec.structs.replace(
            message,
            status=status,
            content_type=snap.content_type,
            text_content=snap.text_content,
            parts=snap.parts,
            tool_calls=snap.tool_calls,
            seq=seq,
            citations=snap.citations,
        )

    # -- ReplyFeed -----------------------------------------------------------------------

    async def thinking(self, delta: str, signature: str | None = None) -> None:
        await self._relay.delta("thinking", delta)
        if signature:
            # a signature belongs to the block just streamed (Anthropic wants a signed
            # thinking block back unchanged when a tool turn continues)
            await self._relay.flush()
            self._content.sign_thinking(signature)

    async def tool_call_started(self, call_id: str, name: str, arguments: str = "") -> None:
        await self._relay.emit(ToolCallStartEvent, tool_call=StreamToolCall(id=call_id, name=name, arguments=arguments))

    async def tool_call_arguments(self, call_id: str, name: str, fragment: str) -> None:
        await self._relay.emit(ToolCallDeltaEvent, tool_call=StreamToolCall(id=call_id, name=name, arguments=fragment))

    async def tool_use(self, call_id: str, name: str, arguments: str) -> int:
        await self._relay.flush()  # the call's place in the parts follows the text before it
        self._content.add_tool_call(call_id, name, arguments)
        return len(self._content.parts) - 1

    async def tool_result(
        self, call_id: str, output: str, is_error: bool, *, replace: int | None = None, announce: bool = True
    ) -> int:
        await self._relay.flush()
        if replace is None:
            self._content.add_tool_result(call_id, output, is_error)
            index = len(self._content.parts) - 1
        else:
            self._content.replace_part(replace, ToolResultPart(tool_use_id=call_id, content=output, is_error=is_error))
            index = replace
        if announce:
            await self._relay.emit(
                ToolResultEvent, tool_result=StreamToolResult(tool_call_id=call_id, output=output, is_error=is_error)
            )
        return index

    async def part(self, part: ContentPart) -> int:
        await self._relay.flush()  # deltas that came first stay first in the parts
        return self._content.add_part(part)

    def replace_part(self, index: int, part: ContentPart) -> None:
        self._content.replace_part(index, part)

    async def report_usage(self, total: Usage, *, announce: bool = False) -> None:
        self._content.usage = total
        self._content.dirty = True
        if announce:
            await self._relay.emit(UsageEvent, usage=total)

    async def notice(self, text: str, code: NoticeCode | None = None) -> None:
        await self._relay.emit(NoticeEvent, notice=text, code=code)

    async def plan(self, entries: list[PlanEntry]) -> None:
        await self._relay.emit(PlanEvent, entries=entries)

    async def citations(self, records: list[Citation]) -> None:
        await self._relay.flush()  # text streamed before them stays before them
        self._content.citations = list(records)
        await self._relay.emit(CitationsEvent, citations=list(records))

    async def approval_required(
        self,
        call: StreamToolCall,
        *,
        decisions: list[str] | None = None,
        options: list[ToolApprovalOption] | None = None,
        source: str = "tool",
        preview: str | None = None,
    ) -> None:
        fields: dict[str, Any] = {"tool_call": call, "options": options, "source": source, "preview": preview}
        if decisions is not None:
            fields["decisions"] = decisions
        await self._relay.emit(ToolApprovalRequiredEvent, **fields)

    # -- persistence -----------------------------------------------------------------------

    async def _persist_loop(self, driver: ReplyDriver) -> None:
        # pending -> streaming is written on the first tick, not before the producer is asked
        # (it must not delay the first delta); a crash before it ends the same way, as an
        # aborted reply, and a live reply's status is overlaid (``overlay``)
        unwritten = self.job.resume is None
        failures = 0
        while True:
            await anyio.sleep(self._persist_s)
            extra = _both(self._unsaved, driver.persisted())
            if not (self._content.dirty or unwritten or extra is not None):
                continue
            try:
                await self._write_partial(extra)
            except SidecarError as exc:
                # a busy or failing database must not end the reply: the content stays in
                # memory, the next tick tries again and the final row is written anyway
                failures += 1
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "could not store the partial reply %s (%d times): %s", self.job.message_id, failures, exc.message,
                )
                self._content.dirty = True
                self._unsaved = extra
                continue
            self._unsaved = None
            unwritten = False

    async def _write_partial(self, extra: StoreWrite | None) -> None:
        snap = self._content.snapshot()
        seq = self._relay.seq
        message_id = self.job.message_id

        def write(s: Store) -> None:
            with s.transaction():
                s.messages.update_partial(
                    message_id, text_content=snap.text_content, parts=snap.parts, status="streaming", seq=seq
                )
                if extra is not None:
                    extra(s)

        # batched with the other replies' partial writes; committed when it returns, even
        # when the loop is being stopped, so the ending's final row is written after it
        await self._store.persist(write)

    # -- the ending ------------------------------------------------------------------------

    async def _end(self, driver: ReplyDriver, ending: Ending) -> None:
        """The reply's one ending. Shielded: a stop that arrives meanwhile (an abort, a newer
        send) waits for it, so the row is never left ``streaming`` without a final event.
        Bounded: when the ending fails or runs out of time before its final event, the reply
        ends as ``error`` with the content it has (the driver's open work closed)."""
        job = self.job
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(FINALIZE_TIMEOUT_S):
                try:
                    await self._finish(driver, ending)
                except Exception:
                    log.exception("ending the reply %s failed", job.message_id)
            failure = SidecarError("internal error while ending the reply")
            if job.outcome is None:
                with anyio.move_on_after(FALLBACK_TIMEOUT_S):
                    try:
                        await self._finish(driver, Failed(failure))
                    except Exception:
                        log.exception("the fallback ending of %s failed too", job.message_id)
            if job.outcome is None:
                # neither ending got as far as its final event: the renderer still gets one
                # (the row is left to restart recovery, which ends it aborted)
                log.error("the reply %s ended without storing its final state", job.message_id)
                with anyio.move_on_after(LAST_EVENT_TIMEOUT_S):
                    job.outcome = ERROR
                    try:
                        await self._relay.emit(ErrorEvent, error=failure.message)
                    except Exception:
                        log.exception("the final event of %s could not be sent", job.message_id)
            if job.outcome not in (None, PAUSED) and job.publish:
                with anyio.move_on_after(PUBLISH_TIMEOUT_S):
                    await self._publish()

    async def _finish(self, driver: ReplyDriver, ending: Ending) -> None:
        relay = self._relay
        relay.close()
        self.job.pausing = isinstance(ending, Paused) and self.job.pausing
        await relay.flush()  # the last throttled deltas, before the row and the final event
        job = self.job
        if isinstance(ending, Completed):
            usage = self._content.usage
            if usage is not None:
                await relay.emit(UsageEvent, usage=usage)
            streamed = self._content.snapshot()
            snap = await driver.finalize(streamed)
            if (snap.citations or None) != (streamed.citations or None):
                self._content.citations = list(snap.citations or [])
                await relay.emit(CitationsEvent, citations=list(snap.citations or []))
            if (snap.text_content, snap.parts) != (streamed.text_content, streamed.parts):
                # a rewrite after streaming (output regex rules, think tags, images to files,
                # citation markers normalized): the renderer must show what is stored
                await relay.emit(
                    ContentReplacedEvent, text=snap.text_content,
                    parts=snap.parts if snap.content_type == "multipart" else None,
                )
            # the cost first: the final row and the session's counters are then written in
            # one worker-thread hop, back to back
            cost = await self._cost(usage)
            job.ended_session = await self._write_final(driver, COMPLETED, snap, cost=cost, best_effort=False)
            job.outcome = COMPLETED
            await relay.emit(
                StreamEndEvent, finish_reason=ending.finish_reason, usage=usage
            )
            return
        if isinstance(ending, Paused):
            # a failure raises: the ending falls back to error instead of leaving the row
            # streaming while the driver counts the reply as paused
            await self._write_paused(driver)
            job.outcome = PAUSED
            return
        status = ERROR if isinstance(ending, Failed) else ABORTED
        try:
            if not (isinstance(ending, Failed) and not ending.close_open):
                await driver.close(self, ending)
            error = ending.error.message if isinstance(ending, Failed) else None
            # what the provider billed before the reply failed or was stopped counts too
            cost = 0.0
            with anyio.move_on_after(COST_TIMEOUT_S):
                cost = await self._cost(self._content.usage)
            job.ended_session = await self._write_final(
                driver, status, self._content.snapshot(), cost=cost, error=error, best_effort=True
            )
        except Exception:  # the final event still goes out (restart recovery ends the row)
            log.exception("could not store the %s state of %s", status, job.message_id)
        job.outcome = status
        if isinstance(ending, Failed):
            failure = ending.error
            code = int(failure.code) if failure.code != ErrorCode.INTERNAL_ERROR else None
            await relay.emit(ErrorEvent, error=failure.message, code=code)
        else:
            await relay.emit(AbortedEvent, reason=ending.reason)

    async def _cost(self, usage: Usage | None) -> float:
        if usage is None:
            return 0.0
        job = self.job
        try:
            return await self._pricing.cost(job.provider_id, job.model_id, usage)
        except SidecarError as exc:
            log.warning("no cost for the reply %s: %s", job.message_id, exc.message)
            return 0.0

    async def _write_final(
        self,
        driver: ReplyDriver,
        status: str,
        snap: ReplySnapshot,
        *,
        cost: float = 0.0,
        error: str | None = None,
        best_effort: bool,
    ) -> SessionV2 | None:
        """The final row (its event, the final one, is ``seq + 1``), the driver's writes in
        the same transaction, then the session's counters; returns the session as stored.
        ``best_effort``: when the driver's writes make the transaction fail, the row is
        written without them (an ending that is already an error or aborted)."""
        job = self.job
        usage = self._content.usage
        latency_ms = int((time.monotonic() - self._started) * 1000)
        seq = self._relay.seq + 1
        writes = [w for w in (self._unsaved, driver.persisted(), driver.final_write(status)) if w is not None]
        counted = usage is not None or cost > 0
        session_id = job.session.id

        def row(s: Store) -> None:
            s.messages.finish(
                job.message_id, status=status, text_content=snap.text_content, parts=snap.parts,
                tool_calls=snap.tool_calls, usage=usage, latency_ms=latency_ms, model_id=job.model_id or None,
                error=error, seq=seq,
            )

        def write(s: Store, with_driver: bool) -> SessionV2 | None:
            with s.transaction():
                row(s)
                if with_driver:
                    for extra in writes:
                        extra(s)
            if counted:  # every ending: an aborted or failed reply was billed too
                try:
                    return s.sessions.add_usage(session_id, usage, cost, kind="reply")
                except SidecarError:  # the reply is stored: only the session's counters miss it
                    log.exception("could not add the usage of %s to its session", job.message_id)
            try:
                return s.sessions.get(session_id)
            except SidecarError:
                return None  # deleted meanwhile

        try:
            return await self._store.run(lambda s: write(s, True))
        except Exception:
            if not best_effort or not writes:
                raise
            log.exception("storing the %s state of %s with its driver's state failed", status, job.message_id)
        return await self._store.run(lambda s: write(s, False))

    async def _write_paused(self, driver: ReplyDriver) -> None:
        snap = self._content.snapshot()
        seq = self._relay.seq
        usage = self._content.usage
        message_id = self.job.message_id
        writes = [w for w in (self._unsaved, driver.persisted(), driver.final_write(PAUSED)) if w is not None]

        def write(s: Store) -> None:
            with s.transaction():
                s.messages.pause(
                    message_id, text_content=snap.text_content, parts=snap.parts, tool_calls=snap.tool_calls,
                    seq=seq, usage=usage,
                )
                for extra in writes:
                    extra(s)

        await self._store.run(write)

    async def _publish(self) -> None:
        job = self.job
        try:
            session = job.ended_session
            if session is None:
                session = job.ended_session = await self._store.run(lambda s: s.sessions.get(job.session.id))
            await self._notify(SESSION_UPDATED, session)
        except SidecarError:
            log.debug("session %s vanished after its reply", job.session.id)
