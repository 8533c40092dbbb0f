"""GenerationHandler: one assistant reply, from provider stream to stored message and events.

A job is ``run(job)``: resolve the model, build the request from the stored branch, stream
the provider's parts into a ReplyBuilder (content) and a StreamRelay (events), persist the
partial reply at a bounded interval, then finish the message as ``completed``, ``error``
or ``aborted`` and send the matching final event.

Must stay true (seed 000 section 9, DESIGN.md section 4):
- ``stream_start`` is the first event of every job (seq 1), even when the job fails at once;
- the last throttled state is flushed (events and database) before the finish event;
- cancellation is re-raised; the aborted state is written in a shielded, bounded scope;
- a provider/store failure ends this reply with ``error`` and never escapes the job;
- nothing already received from the provider is lost: partial text stays in the message.
"""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.events import (
    AbortedEvent,
    ErrorEvent,
    StreamEndEvent,
    StreamStartEvent,
    StreamToolCall,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    UsageEvent,
)
from protocol.params import ChatSettings
from protocol.types import SessionV2, Usage
from sidecar.engine.relay import StreamRelay
from sidecar.engine.reply import ReplyBuilder
from sidecar.errors import SidecarError
from sidecar.pipeline.builder import RequestBuilder
from sidecar.providers.types import (
    Finish,
    GenerationParams,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)

log = logging.getLogger(__name__)

FINALIZE_TIMEOUT_S = 10.0


class GenerationJob(msgspec.Struct, kw_only=True):
    """What to generate: the assistant message ``message_id`` as a child of ``parent_id``."""

    session: SessionV2
    message_id: str
    parent_id: str
    provider_id: str
    model_id: str
    temperature: float | None = None
    abort_reason: str | None = None
    """Set by whoever cancels the job (abort, a newer send, shutdown)."""
    outcome: str | None = None
    """completed | error | aborted, once the job has ended."""
    live: Any = None
    """(ReplyBuilder, StreamRelay) while streaming: the in-flight content for resync."""


class GenerationHandler:
    def __init__(
        self,
        *,
        store: Any,
        notify: Callable[[str, Any], Awaitable[None]],
        providers: Any,
        attachments: Any,
        settings: Callable[[], ChatSettings],
    ) -> None:
        self._store = store
        self._notify = notify
        self._providers = providers
        self._requests = RequestBuilder.shared(store.sync, attachments, providers=providers)
        self._settings = settings

    async def run(self, job: GenerationJob) -> None:
        settings = self._settings()
        reply = ReplyBuilder()
        relay = StreamRelay(
            self._notify,
            job.session.id,
            job.message_id,
            coalesce_s=max(0, settings.delta_coalesce_ms) / 1000,
            on_delta=reply.add_delta,
        )
        job.live = (reply, relay)
        started = time.monotonic()
        model_id = job.model_id
        try:
            await relay.emit(
                StreamStartEvent,
                parent_id=job.parent_id,
                model_id=job.model_id,
                provider_id=job.provider_id,
            )
            failure = await self._stream(job, settings, relay, reply)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(FINALIZE_TIMEOUT_S):
                await self._finish_aborted(job, relay, reply, started, model_id)
            raise
        if failure is None:
            await self._finish_completed(job, relay, reply, started, model_id)
        else:
            await self._finish_error(job, relay, reply, started, model_id, failure)

    # -- streaming -------------------------------------------------------------------

    async def _stream(
        self, job: GenerationJob, settings: ChatSettings, relay: StreamRelay, reply: ReplyBuilder
    ) -> SidecarError | None:
        """Stream one provider step; returns the failure that ended it, if any."""
        try:
            resolved = await self._providers.resolve(job.provider_id, job.model_id)
            request = await self._requests.build(
                session=job.session,
                leaf_id=job.parent_id,
                model=resolved.model,
                params=GenerationParams(
                    temperature=job.temperature if job.temperature is not None else settings.temperature,
                    top_p=settings.top_p,
                    max_tokens=settings.max_tokens,
                    reasoning=settings.reasoning,
                ),
            )
        except SidecarError as exc:
            return exc
        except Exception as exc:  # a bug: keep serving, report it as internal
            log.exception("preparing generation of %s failed", job.message_id)
            return SidecarError(f"internal error while preparing the request: {type(exc).__name__}")

        failure: SidecarError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run_flusher)
            tg.start_soon(self._persist_loop, job, relay, reply, settings)
            try:
                # think tags in text become reasoning while streaming (pipeline/output.py)
            await self._consume(self._requests.output.stream(resolved.provider.stream(request)), relay, reply)
            except SidecarError as exc:
                failure = exc
            except Exception as exc:
                log.exception("stream of %s failed", job.message_id)
                failure = SidecarError(f"internal error while streaming: {type(exc).__name__}")
            finally:
                relay.close()
                tg.cancel_scope.cancel()
        return failure

    async def _consume(self, parts: Any, relay: StreamRelay, reply: ReplyBuilder) -> None:
        tool_names: dict[str, str] = {}
        async with aclosing(parts):
            async for part in parts:
                # text and thinking reach the ReplyBuilder through the relay, when their
                # event is sent (see StreamRelay.on_delta)
                if isinstance(part, TextDelta):
                    await relay.delta("text", part.text)
                elif isinstance(part, ThinkingDelta):
                    await relay.delta("thinking", part.text)
                elif isinstance(part, ToolCallStart):
                    tool_names[part.id] = part.name
                    await relay.emit(
                        ToolCallStartEvent, tool_call=StreamToolCall(id=part.id, name=part.name)
                    )
                elif isinstance(part, ToolCallDelta):
                    await relay.emit(
                        ToolCallDeltaEvent,
                        tool_call=StreamToolCall(
                            id=part.id, name=tool_names.get(part.id, ""), arguments=part.arguments
                        ),
                    )
                elif isinstance(part, ToolCallEnd):
                    reply.add_tool_call(part.id, part.name, part.arguments)
                elif isinstance(part, UsageUpdate):
                    reply.usage = part.usage
                elif isinstance(part, Finish):
                    reply.finish_reason = part.reason

    async def _persist_loop(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, settings: ChatSettings
    ) -> None:
        # pending -> streaming is a state change: written at once, but beside the provider
        # request rather than before it (it must not delay the first delta)
        await self._store.update_partial(
            job.message_id, text_content="", parts=None, status="streaming", seq=relay.seq
        )
        interval = max(20, settings.persist_interval_ms) / 1000
        while True:
            await anyio.sleep(interval)
            if reply.dirty:
                snap = reply.snapshot()
                await self._store.update_partial(
                    job.message_id,
                    text_content=snap.text_content,
                    parts=snap.parts,
                    status="streaming",
                    seq=relay.seq,
                )

    # -- endings ---------------------------------------------------------------------

    async def _finish_completed(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, started: float, model_id: str
    ) -> None:
        await relay.flush()
        usage = reply.usage or Usage()
        if reply.usage is not None:
            await relay.emit(UsageEvent, usage=usage)
        # finish processing (think tags closed, base64 images to files, output regex rules)
        snap = await self._requests.output.finish(job.session, reply.snapshot())
        await self._store.finish_message(
            job.message_id,
            status="completed",
            text_content=snap.text_content,
            parts=snap.parts,
            tool_calls=snap.tool_calls,
            usage=reply.usage,
            latency_ms=_elapsed_ms(started),
            model_id=model_id,
            seq=relay.seq + 1,
        )
        cost = await self._providers.cost(job.provider_id, model_id, usage)
        await self._store.add_session_usage(
            job.session.id, usage.input_tokens + usage.output_tokens, cost
        )
        job.outcome = "completed"
        await relay.emit(StreamEndEvent, finish_reason=_finish_reason(reply), usage=reply.usage)

    async def _finish_error(
        self,
        job: GenerationJob,
        relay: StreamRelay,
        reply: ReplyBuilder,
        started: float,
        model_id: str,
        failure: SidecarError,
    ) -> None:
        await relay.flush()
        snap = reply.snapshot()
        try:
            await self._store.finish_message(
                job.message_id,
                status="error",
                text_content=snap.text_content,
                parts=snap.parts,
                tool_calls=snap.tool_calls,
                usage=reply.usage,
                latency_ms=_elapsed_ms(started),
                model_id=model_id,
                error=failure.message,
                seq=relay.seq + 1,
            )
        except SidecarError:
            log.exception("could not store the error state of %s", job.message_id)
        job.outcome = "error"
        code = int(failure.code) if failure.code != ErrorCode.INTERNAL_ERROR else None
        await relay.emit(ErrorEvent, error=failure.message, code=code)

    async def _finish_aborted(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, started: float, model_id: str
    ) -> None:
        relay.close()
        await relay.flush()
        snap = reply.snapshot()
        try:
            await self._store.finish_message(
                job.message_id,
                status="aborted",
                text_content=snap.text_content,
                parts=snap.parts,
                tool_calls=snap.tool_calls,
                usage=reply.usage,
                latency_ms=_elapsed_ms(started),
                model_id=model_id,
                seq=relay.seq + 1,
            )
        except SidecarError:
            log.exception("could not store the aborted state of %s", job.message_id)
        job.outcome = "aborted"
        await relay.emit(AbortedEvent, reason=job.abort_reason)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _finish_reason(reply: ReplyBuilder) -> Any:
    return reply.finish_reason or "stop"
