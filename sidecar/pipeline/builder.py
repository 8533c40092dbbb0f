"""RequestBuilder: one provider request from a session's stored branch (DESIGN.md section 4).

The single entry point the generation loop calls before each model step:
1. the session's assistant profile and truncation strategy (profiles.py), Soul.md and the
   basic memory text (sidecar/memory), whose tokens are taken off the history's share;
2. the context window (context.py, RollingContext): which messages of the branch root ->
   ``leaf_id`` are carried, with a validated (possibly refreshed) rolling summary;
3. the system prompt (system.py), composed in the seed's order;
4. Drafts of those messages (request.py), then the input transformers in the seed's order
   (transformers/), then what the model can take (request.finalize).
Whatever they do, they change only the returned request, never the stored branch.

``output`` is the OutputProcessor for the same profiles (think tags, images, output regex):
the generation loop wraps the provider stream with ``output.stream`` and passes the final
snapshot through ``await output.finish(session, snapshot)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import msgspec

from protocol.context import AssistantProfile
from protocol.types import FilePart, ImagePart, SessionV2, TextPart
from sidecar.pipeline import tokens as tk
from sidecar.pipeline.calls import ModelResolver, ProviderModelCall
from sidecar.pipeline.context import BranchRead, ContextWindow, RollingContext
from sidecar.pipeline.output import OutputProcessor
from sidecar.pipeline.profiles import ProfileResolver, SessionProfile
from sidecar.pipeline.request import build_drafts, finalize
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
from sidecar.providers.types import ChatRequest, GenerationParams, ModelInfo, ToolSpec
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore

__all__ = ["RequestBuilder", "BuildInfo"]

T = TypeVar("T")


def local_now() -> dt.datetime:
    return dt.datetime.now().astimezone()


class BuildInfo(msgspec.Struct, kw_only=True):
    """How a request was built (for tests, benchmarks and the retrieval citations)."""

    window: ContextWindow
    assistant: AssistantProfile
    applied: list[str]
    """Input transformers that changed the request, in the order they ran."""
    citations: list[Any]
    system_prompt: str | None


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
    ) -> None:
        """``providers``: the engine's ProviderService (its ``resolve``), used for summary and
        OCR calls unless ``call_model`` is given."""
        self._store = store
        self._attachments = attachments
        repos = store.sync
        self.profiles = ProfileResolver(repos.assistants, repos.context)
        call = call_model or (ProviderModelCall(providers) if providers is not None else None)
        self._call_model = call
        self.ledger = TokenLedger(repos.context, file_size=self._file_size)
        self.context = RollingContext(store, self.ledger, Summarizer(call) if call is not None else None)
        self._souls = SoulFiles(attachments.root.parent)
        self._knowledge = knowledge or NoKnowledge()
        self._memory = memory or NoMemory()
        self._transformers = list(transformers) if transformers is not None else default_transformers()
        self._now = now
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
    ) -> ChatRequest:
        """``tools`` are sent when the model supports tools; ``tool_prompts`` (the system
        prompts the registered tools contribute) and ``capability_note`` (what a model
        without tool support is told instead) go into the system prompt; ``prepared`` are
        this build's reads made ahead by ``prepare`` (made here when absent)."""
        request, _ = await self.build_detailed(
            session=session, leaf_id=leaf_id, model=model, params=params, tools=tools,
            tool_prompts=tool_prompts, capability_note=capability_note, prepared=prepared,
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
    ) -> tuple[ChatRequest, BuildInfo]:
        if prepared is None or prepared.leaf_id != leaf_id:
            prepared = await self.prepare(session=session, leaf_id=leaf_id, model=model)
        assistant = prepared.profile.assistant
        window = await self.context.prepare(
            session=session,
            leaf_id=leaf_id,
            assistant=assistant,
            strategy=prepared.profile.strategy,
            encoding=prepared.encoding,
            read=prepared.read,
            reserved=prepared.reserved,
        )
        soul = prepared.soul
        summary = window.summary
        system = compose_system_prompt(
            session=session,
            assistant=assistant,
            soul=soul,
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
        )
        drafts = await run_transformers(drafts, ctx, self._transformers)
        if any(isinstance(p, (ImagePart, FilePart)) for d in drafts for p in d.parts):
            # stored images and files are read from disk: a worker thread (file work, no
            # database: anyio's own limiter, not the store's)
            messages = await anyio.to_thread.run_sync(
                lambda: finalize(drafts, model=model, attachments=self._attachments)
            )
        else:  # no file is read: pure and short, no worker-thread hop
            messages = finalize(drafts, model=model, attachments=self._attachments)
        request = ChatRequest(
            model=model,
            messages=messages,
            tools=list(tools) if model.supports_tools else [],
            params=params,
        )
        first = drafts[0] if drafts and drafts[0].role == "system" else None
        info = BuildInfo(
            window=window, assistant=assistant, applied=list(ctx.applied), citations=list(ctx.citations),
            system_prompt="\n".join(p.text for p in first.parts if isinstance(p, TextPart)) if first else None,
        )
        return request, info

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
        store = self._store.sync
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
