"""RequestBuilder: one provider request from a session's stored branch (DESIGN.md section 4).

The single entry point the generation loop calls before each model step:
1. the session's assistant profile and truncation strategy (profiles.py), Soul.md and the
   basic memory text (sidecar/memory), whose tokens are taken off the history's share;
2. the context window (context.py, RollingContext): which messages of the branch root ->
   ``leaf_id`` are carried, with a validated (possibly refreshed) rolling summary;
3. the system prompt (system.py), composed in the seed's order;
4. Drafts of those messages (request.py), then the input transformers in the seed's order
   (transformers/), then what the model can take (request.finalize);
5. the context budget (budget.py): the threshold of step 2 is the smaller of the profile's
   compressThreshold and what the model's window leaves for the history once the system
   prompt, the tool schemas, the reply so far (``continuation``) and the reserved output are
   counted; the built request is counted as it will be sent and, if it still exceeds the
   window, its oldest history is left out (``BuildInfo.budget.dropped``), or it is refused.
Whatever they do, they change only the returned request, never the stored branch.

``output`` is the OutputProcessor for the same profiles (think tags, images, output regex):
the generation loop wraps the provider stream with ``output.stream`` and passes the final
snapshot through ``await output.finish(session, snapshot)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio
import msgspec

from protocol.context import AssistantProfile
from protocol.types import Citation, ContentPart, FilePart, ImagePart, SessionV2, TextPart
from sidecar.errors import SidecarError
from sidecar.pipeline import budget as bg
from sidecar.pipeline import planner
from sidecar.pipeline import tokens as tk
from sidecar.pipeline.budget import BudgetParts, ContextOverflow, CountCache
from sidecar.pipeline.calls import ModelResolver, ProviderModelCall, UsageSink
from sidecar.pipeline.context import BranchRead, ContextWindow, RollingContext
from sidecar.pipeline.output import OutputProcessor
from sidecar.pipeline.profiles import ProfileResolver, SessionProfile
from sidecar.pipeline.request import build_drafts, finalize, lead_with_user
from sidecar.pipeline.summary import Summarizer
from sidecar.pipeline.system import SoulFiles, compose_system_prompt
from sidecar.memory.service import basic_text as basic_memory_text
from sidecar.memory.soul import effective_soul
from sidecar.pipeline.token_cache import TokenLedger
from sidecar.pipeline.transformers import default_transformers, run_transformers
from sidecar.pipeline.transformers.base import (
    Draft,
    InputTransformer,
    ModelCall,
    TransformContext,
)
from sidecar.pipeline.transformers.retrieval import (
    KnowledgeRetriever,
    MemoryRetriever,
    NoKnowledge,
    NoMemory,
)
from sidecar.providers.types import ChatRequest, GenerationParams, ModelInfo, RequestMessage, ToolSpec
from sidecar.retrieval.citations import CitationLedger
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore

__all__ = ["RequestBuilder", "BuildInfo", "ContextOverflow"]

T = TypeVar("T")

SUMMARY_SHARE = 0.3
"""Of the room the budget leaves for the history: at most this much for a refreshed summary."""
MIN_SUMMARY_TOKENS = 128
MAX_LAST_BUDGETS = 1000
COUNT_IN_THREAD_CHARS = 50_000
"""Text not counted yet above which counting a request runs in a worker thread."""


def local_now() -> dt.datetime:
    return dt.datetime.now().astimezone()


class BuildInfo(msgspec.Struct, kw_only=True):
    """How a request was built (for tests, benchmarks and the retrieval citations)."""

    window: ContextWindow
    assistant: AssistantProfile
    applied: list[str]
    """Input transformers that changed the request, in the order they ran."""
    citations: list[Citation]
    """The knowledge chunks this request sent, with their markers."""
    system_prompt: str | None
    budget: BudgetParts = msgspec.field(default_factory=BudgetParts)
    """The request's token parts as sent (``dropped``: history left out so it fits)."""


class Prepared(msgspec.Struct, kw_only=True):
    """The reads of one build (``RequestBuilder.prepare``), valid for its ``leaf_id``."""

    leaf_id: str
    encoding: str
    model_id: str = ""
    profile: SessionProfile
    soul: str | None
    memory_text: str | None = None
    """The basic memory block (memory on, memory RAG off; sidecar/memory/service.py)."""
    reserved: int = 0
    """Estimated tokens of Soul.md and the basic memory text, taken off the history's share."""
    read: BranchRead
    """The branch as RollingContext.read_branch returned it."""


class _Plan(msgspec.Struct, kw_only=True):
    parts: BudgetParts
    """The fixed parts (window, reserve, tools) and the threshold in effect."""
    limit: int | None
    """Tokens the input may take (None: no window known)."""
    summary_max: int | None
    """Bound of a refreshed summary (None: the summarizer's default)."""


class RequestBuilder:
    """One per process (sidecar/app.py builds it and hands it to the generation loop and
    chat:context:*, which share its token cache, summary checks and summary locks)."""

    def __init__(
        self,
        store: AsyncStore,
        attachments: AttachmentStore,
        *,
        providers: ModelResolver | None = None,
        call_model: ModelCall | None = None,
        knowledge: KnowledgeRetriever | None = None,
        memory: MemoryRetriever | None = None,
        transformers: Sequence[InputTransformer] | None = None,
        now: Callable[[], dt.datetime] = local_now,
        side_usage: UsageSink | None = None,
    ) -> None:
        """``providers``: the engine's ProviderService (its ``resolve``), used for summary and
        OCR calls unless ``call_model`` is given; ``side_usage`` attributes their usage to
        the session (sidecar/engine/usage.py)."""
        self._store = store
        self._attachments = attachments
        repos = store.blocking
        self.profiles = ProfileResolver(repos.assistants, repos.context)
        call = call_model or (ProviderModelCall(providers, usage=side_usage) if providers is not None else None)
        self._call_model = call
        self.ledger = TokenLedger(repos.context, file_size=self._file_size)
        summarizer = Summarizer(call, limits=self._limits if providers is not None else None) if call is not None else None
        self._providers = providers
        self.context = RollingContext(store, self.ledger, summarizer)
        self._souls = SoulFiles(attachments.root.parent)
        self._knowledge = knowledge or NoKnowledge()
        self._memory = memory or NoMemory()
        self._transformers = list(transformers) if transformers is not None else default_transformers()
        self._now = now
        self.counts = CountCache()
        self._last: dict[str, BudgetParts] = {}
        """session id -> the budget of the last request built for it (a context meter)."""
        self.output = OutputProcessor(
            assistant_for=lambda session: self.profiles.for_session(session.id).assistant,
            image_dir=attachments.root,
            offload=self._in_store_thread,
        )

    async def build(
        self,
        *,
        session: SessionV2,
        leaf_id: str,
        model: ModelInfo,
        params: GenerationParams,
        tools: Sequence[ToolSpec] = (),
        tool_prompts: Sequence[str] = (),
        capability_note: str | None = None,
        prepared: Prepared | None = None,
        citations: CitationLedger | None = None,
        continuation: Sequence[ContentPart] = (),
    ) -> ChatRequest:
        """``tools`` are sent when the model supports tools; ``tool_prompts`` (the system
        prompts the registered tools contribute) and ``capability_note`` (what a model
        without tool support is told instead) go into the system prompt; ``prepared`` are
        this build's reads made ahead by ``prepare`` (made here when absent); ``citations``
        is the reply's citation ledger (the knowledge block's markers); ``continuation``: the
        reply's steps so far (text, tool calls and their results), sent as the last assistant
        message and counted in the budget."""
        request, _ = await self.build_detailed(
            session=session, leaf_id=leaf_id, model=model, params=params, tools=tools,
            tool_prompts=tool_prompts, capability_note=capability_note, prepared=prepared,
            citations=citations, continuation=continuation,
        )
        return request

    async def build_detailed(
        self,
        *,
        session: SessionV2,
        leaf_id: str,
        model: ModelInfo,
        params: GenerationParams,
        tools: Sequence[ToolSpec] = (),
        tool_prompts: Sequence[str] = (),
        capability_note: str | None = None,
        prepared: Prepared | None = None,
        citations: CitationLedger | None = None,
        continuation: Sequence[ContentPart] = (),
    ) -> tuple[ChatRequest, BuildInfo]:
        if prepared is None or prepared.leaf_id != leaf_id:
            prepared = await self.prepare(session=session, leaf_id=leaf_id, model=model)
        assistant = prepared.profile.assistant
        encoding = prepared.encoding
        specs = list(tools) if model.supports_tools else []
        plan = self._plan(session, assistant, prepared, model, params, specs, tool_prompts, capability_note, continuation)
        window = await self.context.prepare(
            session=session,
            leaf_id=leaf_id,
            assistant=assistant,
            strategy=prepared.profile.strategy,
            encoding=encoding,
            read=prepared.read,
            threshold=plan.parts.threshold,
            summary_max_tokens=plan.summary_max,
            reserved=prepared.reserved,
        )
        summary = window.summary
        system = compose_system_prompt(
            session=session,
            assistant=assistant,
            soul=prepared.soul,
            capability_note=capability_note,
            summary=summary.text if summary else None,
            summary_count=summary.covered_count if summary else 0,
            tool_prompts=tool_prompts,
            memory_text=prepared.memory_text,
        )
        drafts = build_drafts(window.messages)
        if system:
            drafts.insert(0, Draft(role="system", parts=[TextPart(text=system)]))
        ctx = TransformContext(
            session=session,
            assistant=assistant,
            model=model,
            now=self._now(),
            attachments=self._attachments,
            call_model=self._call_model,
            knowledge=self._knowledge,
            memory=self._memory,
            ledger=citations,
        )
        drafts = lead_with_user([d for d in await run_transformers(drafts, ctx, self._transformers) if d.parts])
        if any(isinstance(p, (ImagePart, FilePart)) for d in drafts for p in d.parts):
            # stored images and files are read from disk: a worker thread (file work, no
            # database: anyio's own limiter, not the store's)
            messages = await anyio.to_thread.run_sync(
                lambda: finalize(drafts, model=model, attachments=self._attachments)
            )
        else:  # no file is read: pure and short, no worker-thread hop
            messages = finalize(drafts, model=model, attachments=self._attachments)
        sources = [d.source_id for d in drafts]
        if continuation:
            messages.append(RequestMessage(role="assistant", parts=list(continuation)))
            sources.append(None)
        messages, parts = await self._fit(
            messages, sources, plan, model, encoding, summary.tokens if summary else 0, window.tokens, continuation
        )
        request = ChatRequest(
            model=model, messages=messages, tools=specs, params=bg.sent_params(params, plan.parts.reserved_output)
        )
        first = drafts[0] if drafts and drafts[0].role == "system" else None
        info = BuildInfo(
            window=window, assistant=assistant, applied=list(ctx.applied), citations=list(ctx.citations),
            system_prompt="\n".join(p.text for p in first.parts if isinstance(p, TextPart)) if first else None,
            budget=parts,
        )
        self._remember(session.id, parts)
        return request, info

    async def plan_budget(
        self,
        *,
        session: SessionV2,
        leaf_id: str,
        model: ModelInfo,
        params: GenerationParams,
        tools: Sequence[ToolSpec] = (),
        tool_prompts: Sequence[str] = (),
        capability_note: str | None = None,
    ) -> BudgetParts:
        """The budget of the next request under ``leaf_id`` as it would be planned now,
        without calling a model (the current summary, no refresh) or running the input
        transformers: the context meter of ``chat:context:get``."""
        prepared = await self.prepare(session=session, leaf_id=leaf_id, model=model)
        assistant = prepared.profile.assistant
        specs = list(tools) if model.supports_tools else []
        plan = self._plan(session, assistant, prepared, model, params, specs, tool_prompts, capability_note, ())
        window = await self.context.prepare(
            session=session, leaf_id=leaf_id, assistant=assistant, strategy=prepared.profile.strategy,
            encoding=prepared.encoding, read=prepared.read, threshold=plan.parts.threshold, refresh=False,
        )
        summary = window.summary
        system = compose_system_prompt(
            session=session, assistant=assistant, soul=prepared.soul, capability_note=capability_note,
            summary=summary.text if summary else None, summary_count=summary.covered_count if summary else 0,
            tool_prompts=tool_prompts, memory_text=prepared.memory_text,
        )
        encoding = prepared.encoding
        parts = msgspec.structs.replace(plan.parts)
        parts.system_prompt = (self.counts.count(system, encoding) + tk.MESSAGE_OVERHEAD) if system else 0
        parts.summary = summary.tokens if summary else 0
        costs = list(window.tokens)
        roles = [m.role for m in window.messages]
        limit = plan.limit
        if limit is not None:
            room = limit - parts.system_prompt - parts.tools
            user = max((i for i, r in enumerate(roles) if r == "user"), default=len(roles))
            dropped = set(bg.fit(costs, roles, droppable=[True] * len(costs), pinned_from=user, limit=room))
            parts.dropped = len(dropped)
            costs = [c for i, c in enumerate(costs) if i not in dropped]
            kept = [m for i, m in enumerate(window.messages) if i not in dropped]
        else:
            kept = window.messages
        parts.messages = sum(costs)
        parts.message_count = len(costs)
        parts.attachments = sum(
            tk.attachment_tokens(p, file_size=self._file_size) for m in kept for p in (m.parts or ())
        )
        return parts

    def last_budget(self, session_id: str) -> BudgetParts | None:
        """The budget of the last request built for the session in this process."""
        return self._last.get(session_id)

    def forget(self, session_id: str) -> None:
        """Drop what is remembered about a session (it was deleted)."""
        self._last.pop(session_id, None)
        self.context.forget(session_id)

    async def prepare(self, *, session: SessionV2, leaf_id: str, model: ModelInfo) -> Prepared:
        """Every database and file read a build starts with, in one worker-thread hop: the
        session's profile, its Soul.md and the branch with its token counts. The generation
        loop runs it beside the tool assembly and hands it to ``build_detailed``."""
        return await self._store.run(lambda _: self.prepare_blocking(session, leaf_id, model.id))

    def prepare_blocking(self, session: SessionV2, leaf_id: str, model_id: str) -> Prepared:
        """``prepare`` for a caller already in a worker thread (a send stores its turn and
        makes the first request's reads in the same hop)."""
        encoding = tk.encoding_for_model(model_id).encoding
        profile = self.profiles.for_session(session.id)
        assistant = profile.assistant
        store = self._store.blocking
        soul = None
        if assistant.context.use_soul:
            soul = effective_soul(store, self._souls, assistant.id).content.strip() or None
        memory_text = basic_memory_text(store, assistant)
        reserved = sum(tk.count_text(t, encoding) for t in (soul, memory_text) if t)
        branch = self.context.read_branch(session.id, leaf_id, encoding, profile.strategy)
        return Prepared(
            leaf_id=leaf_id, encoding=encoding, profile=profile, soul=soul, read=branch, model_id=model_id,
            memory_text=memory_text, reserved=reserved,
        )

    # ---- internals --------------------------------------------------------------------

    def _plan(
        self,
        session: SessionV2,
        assistant: AssistantProfile,
        prepared: Prepared,
        model: ModelInfo,
        params: GenerationParams,
        specs: Sequence[ToolSpec],
        tool_prompts: Sequence[str],
        capability_note: str | None,
        continuation: Sequence[ContentPart],
    ) -> _Plan:
        """The fixed parts of the budget and the threshold that leaves room for them."""
        encoding = prepared.encoding
        counts = self.counts
        exact = tk.encoding_for_model(model.id).exact
        reserve = bg.reserved_output(model, params)
        limit = bg.input_limit(model.context_window, reserve, exact)
        tools_cost = bg.tool_tokens(specs, encoding, counts)
        threshold = planner.effective_threshold(assistant.context.compress_threshold)
        # Soul.md and the basic memory text come out of the history's share (never below half)
        threshold = max(threshold - max(0, prepared.reserved), threshold // 2)
        summary_max: int | None = None
        if limit is not None:
            base = compose_system_prompt(
                session=session, assistant=assistant, soul=prepared.soul, capability_note=capability_note,
                tool_prompts=tool_prompts, memory_text=prepared.memory_text,
            )
            base_cost = (counts.count(base, encoding) + tk.MESSAGE_OVERHEAD) if base else 0
            reply_cost = sum(bg.part_tokens(p, encoding, counts)[0] for p in continuation)
            reply_cost += tk.MESSAGE_OVERHEAD if continuation else 0
            room = limit - base_cost - tools_cost - reply_cost
            threshold = max(1, min(threshold, room))
            summary_max = max(MIN_SUMMARY_TOKENS, int(max(room, 0) * SUMMARY_SHARE))
        parts = BudgetParts(
            context_window=model.context_window, reserved_output=reserve, tools=tools_cost, threshold=threshold,
            exact=exact, model_id=model.id,
        )
        return _Plan(parts=parts, limit=limit, summary_max=summary_max)

    async def _fit(
        self,
        messages: list[RequestMessage],
        sources: list[str | None],
        plan: _Plan,
        model: ModelInfo,
        encoding: str,
        summary_tokens: int,
        estimates: Sequence[int],
        continuation: Sequence[ContentPart],
    ) -> tuple[list[RequestMessage], BudgetParts]:
        """Count the request as it will be sent; leave out its oldest history when it does
        not fit the window (see budget.py), refuse it when even that is not enough. Without
        a window nothing is cut, and the messages are reported by ``estimates`` (the ledger's
        counts of the stored messages) instead of being counted again."""
        counts = self.counts
        if plan.limit is None:
            return messages, self._estimated(messages, plan, encoding, summary_tokens, estimates, continuation)
        texts = [t for m in messages for t in bg.part_texts(m.parts)]

        def count() -> list[tuple[int, int]]:
            return [bg.message_tokens(m, encoding, counts) for m in messages]

        if counts.uncached_chars(texts, encoding) > COUNT_IN_THREAD_CHARS:
            costed = await anyio.to_thread.run_sync(count)  # tokenizing, no database
        else:
            costed = count()
        parts = msgspec.structs.replace(plan.parts, summary=summary_tokens)
        has_system = bool(messages) and messages[0].role == "system"
        parts.system_prompt = costed[0][0] if has_system else 0
        dropped: list[int] = []
        limit = plan.limit
        if limit is not None and sum(c for c, _ in costed) + parts.tools > limit:
            roles = [m.role for m in messages]
            # the turn being answered: the latest stored user message and all after it
            pinned_from = max(
                (i for i, (r, src) in enumerate(zip(roles, sources, strict=True)) if r == "user" and src is not None),
                default=len(messages),
            )
            droppable = [src is not None and not (has_system and i == 0) for i, src in enumerate(sources)]
            dropped = bg.fit(
                [c for c, _ in costed], roles, droppable=droppable, pinned_from=pinned_from,
                limit=limit - parts.tools,
            )
            gone = set(dropped)
            messages = [m for i, m in enumerate(messages) if i not in gone]
            costed = [c for i, c in enumerate(costed) if i not in gone]
            if sum(c for c, _ in costed) + parts.tools > limit:
                raise ContextOverflow(
                    f"the request does not fit the context window of {model.id} ({model.context_window:,} tokens): "
                    f"the system prompt takes {parts.system_prompt:,}, the tools {parts.tools:,}, the latest "
                    f"message and the reply so far {sum(c for c, _ in costed) - parts.system_prompt:,}, and "
                    f"{parts.reserved_output:,} are kept for the answer"
                )
        body = costed[1:] if has_system else costed
        parts.messages = sum(c for c, _ in body)
        parts.attachments = sum(a for _, a in body)
        parts.message_count = len(body)
        parts.dropped = len(dropped)
        return messages, parts

    def _estimated(
        self,
        messages: list[RequestMessage],
        plan: _Plan,
        encoding: str,
        summary_tokens: int,
        estimates: Sequence[int],
        continuation: Sequence[ContentPart],
    ) -> BudgetParts:
        """The parts of a request without a window: the system message counted, the history
        by its stored estimates (the hot path of a model nobody gave a window: no tokenizer
        pass over the history)."""
        parts = msgspec.structs.replace(plan.parts, summary=summary_tokens)
        has_system = bool(messages) and messages[0].role == "system"
        if has_system:
            parts.system_prompt = bg.message_tokens(messages[0], encoding, self.counts)[0]
        reply = bg.message_tokens(RequestMessage(role="assistant", parts=list(continuation)), encoding, self.counts)
        parts.messages = sum(estimates) + (reply[0] if continuation else 0)
        parts.attachments = sum(
            tk.IMAGE_TOKENS for m in messages for p in m.parts if isinstance(p, ImagePart)
        ) + (reply[1] if continuation else 0)
        parts.message_count = len(messages) - (1 if has_system else 0)
        return parts

    def _remember(self, session_id: str, parts: BudgetParts) -> None:
        self._last.pop(session_id, None)
        self._last[session_id] = parts
        while len(self._last) > MAX_LAST_BUDGETS:
            self._last.pop(next(iter(self._last)))

    async def _limits(self, provider_id: str, model_id: str) -> ModelInfo | None:
        """The facts of a side-call model (its window bounds a summary call)."""
        if self._providers is None:
            return None
        try:
            return (await self._providers.resolve(provider_id, model_id)).model
        except SidecarError:
            return None

    async def _in_store_thread(self, fn: Callable[[], T]) -> T:
        return await self._store.run(lambda _: fn())

    def _file_size(self, uri: str) -> int | None:
        path = self._attachments.local_path(uri)
        if path is None:
            return None
        try:
            return path.stat().st_size
        except OSError:
            return None
