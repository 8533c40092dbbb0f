"""ReplyLifecycle: the one implementation of the reply lifecycle (the contract is the
package docstring, sidecar/engine/lifecycle/__init__.py): the row, seq and the relay,
persistence, the overlay, usage and cost, and the bounded, shielded ending.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.events import (
    AbortedEvent,
    CitationsEvent,
    ContentReplacedEvent,
    ErrorEvent,
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
from protocol.settings import ChatSettings
from protocol.types import Citation, ContentPart, MessageV2, SessionV2, ToolResultPart, Usage
from sidecar.engine.lifecycle.driver import (
    ABORTED,
    COMPLETED,
    ERROR,
    PAUSED,
    Aborted,
    Completed,
    Ending,
    Failed,
    Paused,
    ReplyDriver,
    ReplyJob,
    ReplyServices,
    StoreWrite,
    internal_failure,
)
from protocol.notifications import SESSION_UPDATED
from sidecar.engine.relay import StreamRelay
from sidecar.engine.reply import ReplyBuilder, ReplySnapshot
from sidecar.errors import SidecarError
from sidecar.usage_counts import reported

if TYPE_CHECKING:
    from sidecar.store.store import Store

__all__ = [
    "ReplyLifecycle",
    "FINALIZE_TIMEOUT_S",
    "FALLBACK_TIMEOUT_S",
    "LAST_EVENT_TIMEOUT_S",
    "COST_TIMEOUT_S",
    "PUBLISH_TIMEOUT_S",
]

log = logging.getLogger("sidecar.engine.lifecycle")

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


def _both(first: StoreWrite | None, second: StoreWrite | None) -> StoreWrite | None:
    if first is None or second is None:
        return first or second

    def write(s: Store) -> None:
        first(s)
        second(s)

    return write



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
        total = reported(total)  # a peer's counts: what is not a count is not reported
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
