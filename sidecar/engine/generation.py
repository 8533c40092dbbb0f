"""GenerationHandler: direct-mode replies, through the model/tool step loop (seed 000 section 8).

The step loop is a ReplyLifecycle driver (sidecar/engine/lifecycle/: the row, seq,
events, persistence and the ending are the lifecycle's). ``driver(job, settings)`` gives the
driver of one reply, which resolves the model, assembles the request's tools (ToolService)
and loops: build the request from the stored branch plus this reply's content so far,
stream the provider's parts into the reply; when the step left tool calls without results,
the tool loop (tool_loop.py) decides and runs them, or the reply pauses until the user
decides. At most MAX_STEPS model steps per reply; a reply that wants more ends with an
``error`` naming the limit (its last calls get "not run" results).

Streaming or not (seed 000 section 6): a model whose ``stream`` is false (its ModelConfig, or
its provider's) is asked with ``generate``; the whole answer then goes through exactly the
same parts, so the reply has the same events (its text as one delta). When a streaming
request is refused with a 400 that says the endpoint cannot stream, the step is asked again
whole, once, the reply gets a ``stream_unsupported`` notice, and the model's ``stream`` is
stored false (ProviderService.disable_streaming), so later replies ask whole at once.

The context budget (pipeline/budget.py) may leave older history out of a step's request;
the reply then gets a ``context_trimmed`` notice saying how many messages (again only when
the number changes in a later step).

Must stay true (seed 000 section 9 and its invariants, DESIGN.md section 4):
- a provider failure, a failure to build the request, a store failure or a bug ends the
  reply with ``error`` (the lifecycle's ending) and never escapes the job;
- nothing already received from the provider is lost: partial text stays in the message;
- call ids are unique within a reply, across steps and within a step (CallIds: a repeated
  id gets a fresh one before any event names it);
- a resumed reply first answers the calls left from before its pause, then continues;
- citations (seed 000 sections 5 and 8): each job numbers its sources in a ledger of its
  own (a regenerate gets its own; a resumed reply continues its stored ones). The reply may
  cite exactly what it was shown: the chunks each request sent (BuildInfo.citations) and
  what executed knowledge tools returned (ToolOutput.citations); that set is announced
  (``citations`` event) before the text of the step that may use it and after tool results
  that added to it, stored at every persistence tick and in the transaction of the final
  row (``persisted``/``final_write``). ``finalize`` normalizes the markers the model wrote
  (``[3, 5]`` -> ``[3][5]``, sidecar/retrieval/markers.py) and adds a ``dangling`` citation
  for every marker that points at no sent chunk.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import AsyncGenerator, Callable, Collection, Iterable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Protocol

import anyio
import msgspec

from protocol.context import AssistantProfile
from protocol.errors import ErrorCode
from protocol.events import FinishReason
from protocol.settings import ChatSettings
from protocol.types import Citation, SessionV2, TextPart, Usage
from sidecar.engine.approvals import ApprovalService
from sidecar.engine.lifecycle import (
    COMPLETED,
    Aborted,
    Completed,
    Ending,
    Failed,
    Paused,
    ReplyDriver,
    ReplyFeed,
    ReplyJob,
    ReplyServices,
    StoreWrite,
)
from sidecar.engine.reply import ReplySnapshot
from sidecar.engine.tool_loop import ToolLoop
from sidecar.errors import SidecarError
from sidecar.pipeline.builder import Prepared, RequestBuilder
from sidecar.providers.calls import ModelResolver, ResolvedModel
from sidecar.providers.errors import ProviderCallError
from sidecar.providers.types import (
    Finish,
    GenerationParams,
    ModelInfo,
    StreamPart,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)
from sidecar.retrieval import markers
from sidecar.retrieval.citations import CitationLedger
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store
from sidecar.tools.registry import ToolRegistry
from sidecar.usage_counts import added

__all__ = ["GenerationHandler", "MAX_STEPS"]

log = logging.getLogger(__name__)

MAX_STEPS = 256
LIMIT_NOTE = f"not run: the generation reached its limit of {MAX_STEPS} model/tool steps"


class ToolAssembler(Protocol):
    """The tools of one request (sidecar.tools.service.ToolService)."""

    async def assemble(
        self, session: SessionV2, model: ModelInfo, *, assistant: AssistantProfile | None = None, enabled: bool = True
    ) -> ToolRegistry: ...


class ReplyProviders(ModelResolver, Protocol):
    """The engine's ProviderService as the step loop uses it."""

    async def disable_streaming(self, provider_id: str, model_id: str) -> None:
        """Remember that this model's endpoint cannot stream it."""


_STREAM = re.compile(r"\bstream(ing|ed|s)?\b", re.IGNORECASE)
_UNSUPPORTED = re.compile(
    r"not\s+supported|unsupported|does\s*n[o']t\s+support|do\s+not\s+support|not\s+allowed|"
    r"not\s+available|disabled|only\s+the\s+default|must\s+be\s+false|is\s+not\s+enabled",
    re.IGNORECASE,
)


def says_streaming_unsupported(exc: ProviderCallError) -> bool:
    """A 400 whose message says the endpoint cannot stream (OpenAI's o1 ``'stream' does not
    support true with this model``, "Streaming is not supported", "stream mode is disabled")."""
    return exc.kind == "http" and exc.status == 400 and bool(_STREAM.search(exc.message)) and bool(
        _UNSUPPORTED.search(exc.message)
    )


async def _replay(parts: Sequence[StreamPart]) -> AsyncGenerator[StreamPart, None]:
    """A whole answer (``generate``) as the stream it stands for."""
    for part in parts:
        yield part


class GenerationHandler:
    """The drivers of direct-mode replies, and what they share across replies."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        providers: ReplyProviders,
        requests: RequestBuilder,
        services: ReplyServices,
        settings: Callable[[], ChatSettings],
        tools: ToolAssembler | None = None,
        approvals: ApprovalService | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self._providers = providers
        self._requests = requests
        self._tools = tools
        self.tool_loop = ToolLoop(
            store=store, approvals=approvals, data_dir=data_dir or Path("."), services=services, settings=settings
        )

    def driver(self, job: ReplyJob, settings: ChatSettings) -> ReplyDriver:
        return _StepLoop(self, job, settings)

    def prepare_first(self, session: SessionV2, leaf_id: str | None, model_id: str) -> Prepared | None:
        """The first request's reads for a direct-mode reply under ``leaf_id`` (blocking: for a
        worker thread that is already storing the turn); None when it cannot be made here."""
        if session.mode != "direct" or not leaf_id or not model_id:
            return None
        try:
            return self._requests.prepare_blocking(session, leaf_id, model_id)
        except Exception:  # the job makes the same reads again and reports what fails
            log.debug("reading ahead for %s failed", session.id, exc_info=True)
            return None

    # -- paused replies (the tool loop's) ------------------------------------------------

    def is_idle(self, session_id: str) -> bool:
        """True when the session is known to have no paused reply (no database read)."""
        return self.tool_loop.is_idle(session_id)

    def note_paused(self, session_id: str) -> None:
        self.tool_loop.note_paused(session_id)

    def forget_session(self, session_id: str) -> None:
        """Drop what is kept per session once the session is deleted."""
        self.tool_loop.forget(session_id)
        self._requests.forget(session_id)

    def forget_branch(self, session_id: str) -> None:
        """Some of the session's messages were deleted: its summary is verified again (one
        id comparison; a summary that covered a deleted message was dropped with it)."""
        self._requests.context.forget(session_id)

    async def close_paused(self, session_id: str, reason: str, only: Collection[str] | None = None) -> bool:
        """End the session's paused replies (``only``: those whose message is in it) as
        ``aborted`` (see ToolLoop.close_paused)."""
        return await self.tool_loop.close_paused(session_id, reason, only)

    async def _assemble(
        self, session: SessionV2, model: ModelInfo, assistant: AssistantProfile, enabled: bool
    ) -> ToolRegistry:
        if self._tools is None:
            return ToolRegistry()
        try:
            return await self._tools.assemble(session, model, assistant=assistant, enabled=enabled)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:  # tools are an addition: a broken tool source must not stop the reply
            log.exception("assembling the tools of %s failed; generating without tools", session.id)
            return ToolRegistry()


class _StepLoop(ReplyDriver):
    """The driver of one direct-mode reply."""

    doing = "generating"

    def __init__(self, handler: GenerationHandler, job: ReplyJob, settings: ChatSettings) -> None:
        self._handler = handler
        self._job = job
        self._settings = settings
        self._ledger = CitationLedger()  # a resumed reply restores its own in drive()
        self._tools = handler.tool_loop.for_reply(job, self._ledger)
        self._finish_reason: FinishReason | None = None
        self._citable: dict[int, Citation] = {}
        """What the reply was shown and may cite, by marker."""
        self._announced = 0
        self._stored: list[Citation] | None = None
        """The citations last handed to a store write."""
        self._final: list[Citation] | None = None
        """The checked citations of a completed reply (finalize)."""
        self._trimmed = 0
        """Messages the last notice said were left out of the request."""
        self._whole = False
        """The endpoint refused to stream during this reply: the later steps ask whole too."""

    async def drive(self, reply: ReplyFeed) -> Ending:
        """Model steps and tool calls until the reply is complete, paused or failed."""
        job = self._job
        handler = self._handler
        requests = handler._requests
        try:
            resolved = await handler._providers.resolve(job.provider_id, job.model_id)
            prepared = job.prepared if isinstance(job.prepared, Prepared) else None
            if prepared is not None and (prepared.leaf_id, prepared.model_id) != (job.parent_id, resolved.model.id):
                prepared = None  # made for another leaf or model: read again
            job.prepared = None
            if prepared is None:
                prepared = await requests.prepare(session=job.session, leaf_id=job.parent_id, model=resolved.model)
            # the assistant's enabled tools decide what is offered (its profile was just read)
            registry = await handler._assemble(job.session, resolved.model, prepared.profile.assistant, job.tools)
        except SidecarError as exc:
            return Failed(exc, close_open=False)
        except Exception as exc:  # a bug: keep serving, report it as internal
            log.exception("preparing generation of %s failed", job.message_id)
            return Failed(_internal("preparing the request", exc), close_open=False)
        if job.resume is not None:
            stored = [c for c in reply.content.citations if not c.dangling]
            self._ledger = CitationLedger(stored)
            self._tools = self._handler.tool_loop.for_reply(job, self._ledger)
            self._citable = {c.marker: c for c in stored}
            self._announced = len(self._citable)
            self._stored = self._records()
        if job.resume is not None and reply.content.unanswered_calls():
            paused = await self._tools.run(reply, registry)
            await self._cite(reply, self._tools.take_cited())
            if paused:
                return Paused()
        while True:
            if job.steps >= MAX_STEPS:
                return Failed(
                    SidecarError(
                        f"stopped: the generation reached its limit of {MAX_STEPS} model/tool steps",
                        code=ErrorCode.BAD_STATE,
                    ),
                    close_open=False,
                )
            job.steps += 1
            failure = await self._model_step(reply, resolved, registry, prepared)
            prepared = None  # later steps read the branch again
            if failure is not None:
                return Failed(failure, close_open=False)
            if not reply.content.unanswered_calls():
                return Completed(self._finish_reason or "stop")
            if job.steps >= MAX_STEPS:
                await self._tools.close(reply, LIMIT_NOTE, announce=True)
                return Failed(
                    SidecarError(
                        f"stopped: the generation reached its limit of {MAX_STEPS} model/tool steps "
                        "and its last tool calls were not run",
                        code=ErrorCode.BAD_STATE,
                    ),
                    close_open=False,
                )
            paused = await self._tools.run(reply, registry)
            await self._cite(reply, self._tools.take_cited())
            if paused:
                return Paused()

    async def _model_step(
        self, reply: ReplyFeed, resolved: ResolvedModel, registry: ToolRegistry, prepared: Prepared | None
    ) -> SidecarError | None:
        """One provider step; returns the failure that ended it, if any."""
        job = self._job
        settings = self._settings
        requests = self._handler._requests
        reasoning = job.reasoning if job.reasoning is not None else settings.reasoning
        try:
            request, info = await requests.build_detailed(
                session=job.session,
                leaf_id=job.parent_id,
                model=resolved.model,
                params=GenerationParams(
                    temperature=job.temperature if job.temperature is not None else settings.temperature,
                    top_p=settings.top_p,
                    max_tokens=settings.max_tokens,
                    reasoning=reasoning,
                ),
                tools=registry.specs(),
                tool_prompts=registry.prompts(),
                capability_note=registry.capability_note,
                prepared=prepared,
                citations=self._ledger,
                # the steps so far (text, tool calls and their results) continue the reply
                continuation=reply.content.parts,
            )
        except SidecarError as exc:
            return exc
        except Exception as exc:
            log.exception("building the request of %s failed", job.message_id)
            return _internal("preparing the request", exc)
        await self._cite(reply, info.citations)  # before the text that may use them
        dropped = info.budget.dropped
        if dropped and dropped != self._trimmed:
            self._trimmed = dropped
            window = resolved.model.context_window or 0
            await reply.notice(
                f"{dropped} older message{'s were' if dropped != 1 else ' was'} left out of this request so it "
                f"fits the context window of {resolved.model.id} ({window:,} tokens)",
                "context_trimmed",
            )
        output = requests.output
        try:
            # think tags in text become reasoning while streaming (pipeline/output.py)
            if not resolved.model.stream or self._whole:
                await self._consume(output.stream(_replay(await resolved.provider.generate(request))), reply)
                return None
            refused = await self._consume(output.stream(resolved.provider.stream(request)), reply)
            if refused is not None:
                if not says_streaming_unsupported(refused):
                    return refused
                await self._stream_refused(reply, resolved)
                self._whole = True
                await self._consume(output.stream(_replay(await resolved.provider.generate(request))), reply)
        except SidecarError as exc:
            return exc
        except Exception as exc:
            log.exception("stream of %s failed", job.message_id)
            return _internal("streaming", exc)
        return None

    async def _stream_refused(self, reply: ReplyFeed, resolved: ResolvedModel) -> None:
        """The endpoint refused to stream this model: say so, and remember it."""
        model = resolved.model
        provider_id = self._job.provider_id
        log.warning("provider %s cannot stream %s: asking for whole replies from now on", provider_id, model.id)
        await reply.notice(
            f"The endpoint does not stream {model.id}: its replies are asked for whole from now on "
            "(the model's stream setting is now off)",
            "stream_unsupported",
        )
        try:
            await self._handler._providers.disable_streaming(provider_id, model.id)
        except SidecarError as failure:  # the reply goes on; the next one finds out again
            log.warning("could not store that %s cannot stream: %s", model.id, failure.message)

    async def _consume(self, parts: AsyncGenerator[StreamPart, None], reply: ReplyFeed) -> ProviderCallError | None:
        """Feed the step's parts to the reply. A ProviderCallError raised before the first
        part (nothing of the step was received) is returned instead of raised: the caller may
        ask again another way."""
        tool_names: dict[str, str] = {}
        base = reply.content.usage  # usage of earlier steps: a step's updates are cumulative within it
        ids = CallIds(c.id for c in reply.content.tool_calls)
        text = reply.text
        received = False
        async with aclosing(parts):
            try:
                async for part in parts:
                    received = True
                    if isinstance(part, TextDelta):
                        await text(part.text)
                    elif isinstance(part, ThinkingDelta):
                        await reply.thinking(part.text, part.signature)
                    elif isinstance(part, ToolCallStart):
                        call_id = ids.start(part.id)
                        tool_names[call_id] = part.name
                        await reply.tool_call_started(call_id, part.name)
                    elif isinstance(part, ToolCallDelta):
                        call_id = ids.delta(part.id)
                        await reply.tool_call_arguments(call_id, tool_names.get(call_id, ""), part.arguments)
                    elif isinstance(part, ToolCallEnd):
                        await reply.tool_use(ids.end(part.id), part.name, part.arguments)
                    elif isinstance(part, UsageUpdate):
                        await reply.report_usage(added(base, part.usage))
                    elif isinstance(part, Finish):
                        self._finish_reason = part.reason
            except ProviderCallError as exc:
                if received:
                    raise
                return exc
        return None

    # -- the lifecycle's hooks -------------------------------------------------------------

    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None:
        await self._tools.cancel_open(reply)

    async def finalize(self, snapshot: ReplySnapshot) -> ReplySnapshot:
        # finish processing (think tags closed, base64 images to files, output regex rules)
        snapshot = await self._handler._requests.output.finish(self._job.session, snapshot)
        return self._check_markers(snapshot)

    def persisted(self) -> StoreWrite | None:
        return self._save(self._records())

    def final_write(self, outcome: str) -> StoreWrite | None:
        records = self._final if outcome == COMPLETED and self._final is not None else self._records()
        writes = [w for w in (self._save(records), self._tools.final_write(outcome)) if w is not None]
        if not writes:
            return None

        def write(s: Store) -> None:
            for w in writes:
                w(s)

        return write

    # -- citations ------------------------------------------------------------------------

    def _records(self) -> list[Citation]:
        message_id = self._job.message_id
        return [
            c if c.message_id == message_id else msgspec.structs.replace(c, message_id=message_id)
            for _, c in sorted(self._citable.items())
        ]

    async def _cite(self, reply: ReplyFeed, shown: list[Citation]) -> None:
        """``shown`` (sent in a request or returned by an executed knowledge tool) may be
        cited: announce the reply's citations when they grew."""
        for c in shown:
            self._citable.setdefault(c.marker, c)
        if len(self._citable) != self._announced:
            self._announced = len(self._citable)
            await reply.citations(self._records())

    def _save(self, records: list[Citation]) -> StoreWrite | None:
        """The write of ``records`` as the reply's citations, None when they are stored."""
        if records == (self._stored if self._stored is not None else []):
            return None
        self._stored = records
        message_id, session_id = self._job.message_id, self._job.session.id
        return lambda s: s.citations.save(message_id, session_id, records)

    def _check_markers(self, snapshot: ReplySnapshot) -> ReplySnapshot:
        """Markers normalized in the stored text; markers of no sent chunk flagged."""
        records = self._records()
        if not records:
            return snapshot  # no source was shown: brackets in the text are not markers
        known = {c.marker for c in records}
        seen: dict[int, None] = {}
        parts = snapshot.parts
        if parts is None:
            scan = markers.normalize(snapshot.text_content)
            text = scan.text
            seen.update(dict.fromkeys(scan.numbers))
        else:
            parts = list(parts)
            for i, part in enumerate(parts):
                if isinstance(part, TextPart):
                    scan = markers.normalize(part.text)
                    seen.update(dict.fromkeys(scan.numbers))
                    if scan.text != part.text:
                        parts[i] = TextPart(text=scan.text)
            text = "".join(p.text for p in parts if isinstance(p, TextPart))
        message_id = self._job.message_id
        dangling = [
            Citation(message_id=message_id, marker=n, dangling=True) for n in seen if n not in known
        ]
        self._final = sorted(records + dangling, key=lambda c: c.marker)
        return msgspec.structs.replace(snapshot, text_content=text, parts=parts, citations=self._final)


class CallIds:
    """Tool-call ids unique within a reply, across its steps and within one step.

    A provider's id is kept when it is new to the reply; a repeated one (an adapter that
    numbers id-less calls per request, a model that sends one id twice in a step) becomes
    ``<id>_2``, ``<id>_3``... deterministically, before any event names it. Within a step
    the provider's id maps to its calls in order: a start opens a call, fragments go to the
    latest call opened with that id, an end closes the oldest one still open. The renamed
    id is what the reply stores and what the next request sends back on both sides (the
    call and its result), so no provider needs the original: OpenAI-compatible, Anthropic
    and Ollama only need the two to match (and Anthropic needs them unique)."""

    def __init__(self, used: Iterable[str]) -> None:
        self._used = set(used)
        self._open: dict[str, deque[str]] = {}
        self._latest: dict[str, str] = {}

    def _fresh(self, provider_id: str) -> str:
        call_id, n = provider_id or "call", 1
        while call_id in self._used:
            n += 1
            call_id = f"{provider_id or 'call'}_{n}"
        self._used.add(call_id)
        return call_id

    def start(self, provider_id: str) -> str:
        call_id = self._fresh(provider_id)
        self._open.setdefault(provider_id, deque()).append(call_id)
        self._latest[provider_id] = call_id
        return call_id

    def delta(self, provider_id: str) -> str:
        latest = self._latest.get(provider_id)
        return latest if latest is not None else self.start(provider_id)

    def end(self, provider_id: str) -> str:
        waiting = self._open.get(provider_id)
        if waiting:
            return waiting.popleft()
        return self._fresh(provider_id)  # an end without a start (a whole call at once)


def _internal(doing: str, exc: BaseException) -> SidecarError:
    return SidecarError(f"internal error while {doing}: {type(exc).__name__}")
