"""KnowledgeService: the ``kb:*`` methods, background ingestion and what requests retrieve.

Owns:
- the ``kb:*`` methods (validation first: a bad field is INVALID_PARAMS naming it, an
  unknown base or document NOT_FOUND, a path outside the allowed roots INVALID_PARAMS);
- the knowledge settings (settings table, key ``knowledge``: allowed roots, size limit);
- the ingestion queue: INGEST_WORKERS tasks index queued documents one at a time each
  (Indexer); ``kb:document:add`` answers at once; at start every document left
  ``pending``/``indexing`` is queued again and every base whose embedding model changed
  resumes its re-embedding, so a restart resumes ingestion;
- the embedding retry schedule of the documents indexed while their embedding provider
  failed (``embedding_pending``, searchable lexically meanwhile): EmbeddingRetries
  (retries.py), run in this service's task group, woken when a document becomes pending or
  a base's re-embedding is done;
- cancellation: deleting a document (or its base) cancels its running indexing, which then
  writes nothing; shutdown cancels the workers (their documents resume at the next start);
- progress: ``sidecar:progress`` (begin, reports, end) for a caller's ``progressToken``,
  whose message starts with ``kb:index`` (per document) or ``kb:reembed`` (per base);
- embedders: one per model key, built from the provider's stored configuration
  (``ProviderService.connection``) and rebuilt when it changes; the local ``@local`` one;
- for requests: ``retrieve`` (the HybridRetriever of ``retriever.py``, bases that no
  longer exist skipped), ``offer(session)`` (``knowledge_search`` and the retrieval
  capabilities for ToolService) and ``tool_search`` (what the tool runs, numbering its
  passages in the reply's citation ledger); both charge their query embeddings to the
  session they run for (``side:embedding``, through the SideUsage given to ``start``).
  ``kb:search`` runs for no session and ingestion (indexing, re-embedding) belongs to none:
  their embeddings are charged to nobody.

Lifetime: ``async with KnowledgeService(...)`` runs its task group, ``start()`` starts the
workers and resumes; leaving it cancels ingestion and closes the embedders' HTTP clients.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import msgspec

from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.context import AssistantProfile
from protocol.kb import (
    LOCAL_EMBEDDING_PROVIDER,
    EmbeddingModelRef,
    KbCreateParams,
    KbDocument,
    KbDocumentAddParams,
    KbDocumentAddResult,
    KbDocumentDetail,
    KbDocumentGetParams,
    KbDocumentListParams,
    KbDocumentReindexParams,
    KbSearchHit,
    KbSearchParams,
    KbSearchResult,
    KbSettings,
    KbSettingsUpdate,
    KbUpdateParams,
    KnowledgeBase,
)
from protocol.types import Citation, SessionV2
from sidecar.progress import WorkProgress
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar import parts
from sidecar.retrieval import chunking
from sidecar.retrieval.citations import CitationLedger, render_results
from sidecar.retrieval.extract import KINDS, detect_kind
from sidecar.retrieval.indexes import KnowledgeIndexes
from sidecar.retrieval.ingest import Indexer
from sidecar.retrieval.paths import confine, normalize_root, read_bounded
from sidecar.retrieval.results import RetrievalResult
from sidecar.retrieval.retries import EmbeddingRetries, retry_delay_ms
from sidecar.retrieval.retriever import DEFAULT_BUDGET_TOKENS, HybridRetriever
from sidecar.providers.types import ProviderSettings
from sidecar.store.async_store import AsyncStore
from sidecar.store.knowledge import IndexDelta, KbRecord
from sidecar.store.providers import ProviderRecord
from sidecar.notify import Notifier

if TYPE_CHECKING:
    from sidecar.providers.calls import UsageSink
    from sidecar.retrieval.embeddings import Embedder

__all__ = ["KnowledgeService", "SETTINGS_KEY", "INGEST_WORKERS", "MAX_SEARCH_LIMIT"]

log = logging.getLogger(__name__)

SETTINGS_KEY = "knowledge"
INGEST_WORKERS = 2
MAX_SEARCH_LIMIT = 50
MAX_QUERY_CHARS = 4000
MAX_NAME_CHARS = 512
MIN_DOCUMENT_BYTES_LIMIT = 1024
MAX_DOCUMENT_BYTES_LIMIT = 256 * 1024 * 1024
REEMBED_RETRIES = 5
REEMBED_RETRY_BASE_S = 2.0


class Connections(Protocol):
    """ProviderService.connection: (record, ProviderSettings) of an enabled HTTP provider."""

    async def connection(self, provider_id: str) -> tuple[ProviderRecord, ProviderSettings]: ...


class KnowledgeService:
    def __init__(
        self,
        *,
        store: AsyncStore,
        notify: Notifier,
        connections: Connections | None,
        assistant_for: Callable[[str | None], Awaitable[AssistantProfile]],
        transport: Any = None,
        workers: int = INGEST_WORKERS,
    ) -> None:
        self._store = store
        self._notify = notify
        self._connections = connections
        self._assistant_for = assistant_for
        self._transport = transport
        self._workers = workers
        self._settings = KbSettings()
        self.indexes = KnowledgeIndexes(store)
        self.retriever = HybridRetriever(store, self.indexes, self.embedder_for)
        self._indexer = Indexer(store, self.indexes, self.embedder_for, self._limits, retry_delay_ms)
        self._embedders: dict[str, tuple[int, Embedder]] = {}
        self._retired: list[Embedder] = []
        self._send, self._receive = anyio.create_memory_object_stream[str](math.inf)
        self._queued: set[str] = set()
        self._running: dict[str, anyio.CancelScope] = {}
        self._tokens: dict[str, int | str] = {}
        self._reembedding: dict[str, anyio.CancelScope] = {}
        self.retries = EmbeddingRetries(store, self._indexer, self._running)
        self._tg: anyio.abc.TaskGroup | None = None

    # ---- lifetime -------------------------------------------------------------------

    async def __aenter__(self) -> KnowledgeService:
        raw = await self._store.run(lambda s: s.settings.get(SETTINGS_KEY))
        if raw:
            try:
                self._settings = msgspec.json.decode(raw, type=KbSettings)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.error("stored knowledge settings are unreadable; using the defaults")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def start(self, connections: Connections | None = None, usage: UsageSink | None = None) -> None:
        """Start the ingestion workers and resume what a previous run left: documents still
        ``pending``/``indexing`` and bases whose embedding model changed. ``usage``: where
        the query embeddings of a session's retrievals are charged (the engine's SideUsage)."""
        assert self._tg is not None, "enter the service first"
        if connections is not None:
            self._connections = connections
        if usage is not None:
            self.retriever.usage = usage
        for _ in range(self._workers):
            self._tg.start_soon(self._worker)
        self._tg.start_soon(self.retries.run)
        for doc_id in await self._store.run(lambda s: s.knowledge.open_documents()):
            self._enqueue(doc_id)
        for kb in await self._store.run(lambda s: s.knowledge.kbs()):
            if kb.embed_model and kb.embed_model != kb.vector_model:
                self._start_reembed(kb.id, None)

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(*exc)
        finally:
            self._tg = None
            self._send.close()
            self._receive.close()
            with anyio.CancelScope(shield=True):
                for _, embedder in list(self._embedders.values()):
                    await embedder.aclose()
                for embedder in self._retired:
                    await embedder.aclose()
                self._embedders.clear()
                self._retired.clear()

    # ---- settings -------------------------------------------------------------------

    def _limits(self) -> tuple[list[str], int]:
        s = self._settings
        return list(s.allowed_roots), s.max_document_bytes

    async def get_settings(self, params: EmptyParams | None = None) -> KbSettings:
        return self._settings

    async def update_settings(self, params: KbSettingsUpdate) -> KbSettings:
        changes: dict[str, Any] = {}
        if params.allowed_roots is not None:
            if len(params.allowed_roots) > 100:
                raise InvalidParams("invalid params: at most 100 allowed roots - at `$.allowedRoots`")
            changes["allowed_roots"] = list(dict.fromkeys(normalize_root(r) for r in params.allowed_roots))
        if params.max_document_bytes is not None:
            if not MIN_DOCUMENT_BYTES_LIMIT <= params.max_document_bytes <= MAX_DOCUMENT_BYTES_LIMIT:
                raise InvalidParams(
                    f"invalid params: maxDocumentBytes must be {MIN_DOCUMENT_BYTES_LIMIT}..{MAX_DOCUMENT_BYTES_LIMIT}"
                    " - at `$.maxDocumentBytes`"
                )
            changes["max_document_bytes"] = params.max_document_bytes
        updated = msgspec.structs.replace(self._settings, **changes)
        value = msgspec.json.encode(updated).decode()
        await self._store.run(lambda s: s.settings.set(SETTINGS_KEY, value))
        self._settings = updated
        return updated

    # ---- embedders ------------------------------------------------------------------

    async def embedder_for(self, model_key: str) -> Embedder:
        """The Embedder of ``providerId/modelId`` (SidecarError when it cannot be had)."""
        parts.require("vectors")
        from sidecar.retrieval.embeddings import HttpEmbedder, LocalEmbedder

        provider_id, _, model_id = model_key.partition("/")
        if provider_id == LOCAL_EMBEDDING_PROVIDER:
            cached = self._embedders.get(model_key)
            if cached is None:
                cached = self._embedders[model_key] = (0, LocalEmbedder(model_id))
            return cached[1]
        if self._connections is None:
            raise SidecarError("no providers are configured for embeddings")
        record, settings = await self._connections.connection(provider_id)
        cached = self._embedders.get(model_key)
        if cached is not None and cached[0] == record.updated_at:
            return cached[1]
        if cached is not None:
            self._retired.append(cached[1])  # a call may still run on it: closed at exit
        model = record.model(model_id)
        embedder = HttpEmbedder(
            settings, model_id, key=model_key, name=record.name, transport=self._transport,
            input_limit=model.context_window if model is not None else None,
        )
        self._embedders[model_key] = (record.updated_at, embedder)
        return embedder

    async def _check_model(self, ref: EmbeddingModelRef) -> tuple[str, str]:
        parts.require("vectors")
        from sidecar.retrieval.embeddings import LOCAL_MODELS, local_embeddings_available

        where = "$.embeddingModel"
        if not ref.model_id.strip():
            raise InvalidParams(f"invalid params: modelId must not be empty - at `{where}.modelId`")
        if ref.provider_id == LOCAL_EMBEDDING_PROVIDER:
            if ref.model_id not in LOCAL_MODELS:
                raise InvalidParams(
                    f"invalid params: the local embedder has the models {sorted(LOCAL_MODELS)} - at `{where}.modelId`"
                )
            if not local_embeddings_available():
                raise InvalidParams(
                    "invalid params: the local embedder is not installed (pip install "
                    f"'chat-sidecar[local-embeddings]') - at `{where}.providerId`"
                )
            return ref.provider_id, ref.model_id
        if "/" in ref.provider_id:
            raise InvalidParams(f"invalid params: a provider id with '/' cannot embed - at `{where}.providerId`")
        if self._connections is None:
            raise InvalidParams(f"invalid params: no providers are configured - at `{where}.providerId`")
        try:
            record, _ = await self._connections.connection(ref.provider_id)
        except SidecarError as exc:
            raise InvalidParams(f"invalid params: {exc.message} - at `{where}.providerId`") from exc
        if record.type not in ("openai-compat", "ollama"):
            raise InvalidParams(
                f"invalid params: provider {record.name!r} ({record.type}) has no embeddings endpoint; use an "
                f"OpenAI-compatible or Ollama provider, or {LOCAL_EMBEDDING_PROVIDER} - at `{where}.providerId`"
            )
        return ref.provider_id, ref.model_id

    # ---- background work --------------------------------------------------------------

    def _enqueue(self, doc_id: str) -> None:
        if doc_id not in self._queued:
            self._queued.add(doc_id)
            self._send.send_nowait(doc_id)

    async def _worker(self) -> None:
        async for doc_id in self._receive:
            self._queued.discard(doc_id)
            token = self._tokens.get(doc_id)
            with anyio.CancelScope() as scope:
                self._running[doc_id] = scope
                try:
                    if await self._indexer.index(doc_id, self._progress(token, "kb:index")) == "embedding_pending":
                        self.retries.wake()
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception:  # the Indexer ends every document itself; this is a bug
                    log.exception("the ingestion of %s failed", doc_id)
                finally:
                    self._running.pop(doc_id, None)
            if scope.cancelled_caught:
                log.info("indexing of %s was cancelled", doc_id)
            if self._tokens.get(doc_id) == token:
                self._tokens.pop(doc_id, None)

    def _progress(self, token: int | str | None, work: str) -> Callable[[int, int, str], Awaitable[None]]:
        """The Indexer's progress callback as ``sidecar:progress`` (a WorkProgress): ``begin``
        at the first call, throttled ``report``s, ``end`` at the last (``done == total``, as
        the Indexer promises); ``work`` (``kb:index``, ``kb:reembed``) leads each message."""
        progress = WorkProgress(self._notify, token, work) if token is not None else None

        async def report(done: int, total: int, message: str) -> None:
            if progress is None:
                return
            text = f"{work}: {message}"
            try:
                await progress.begin(total, text)
                if done == total:
                    progress.done, progress.total = done, total
                    await progress.end(text)
                else:
                    await progress.report(done, total, text)
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:  # the client went away: the work goes on
                log.debug("progress notification failed", exc_info=True)

        return report

    def _cancel_document(self, doc_id: str) -> None:
        running = self._running.get(doc_id)
        if running is not None:
            running.cancel()

    def _start_reembed(self, kb_id: str, token: int | str | None) -> None:
        if self._tg is None:
            return
        old = self._reembedding.pop(kb_id, None)
        if old is not None:
            old.cancel()
        scope = anyio.CancelScope()
        self._reembedding[kb_id] = scope
        self._tg.start_soon(self._reembed_job, kb_id, token, scope)

    async def _reembed_job(self, kb_id: str, token: int | str | None, scope: anyio.CancelScope) -> None:
        report = self._progress(token, "kb:reembed")
        switched = False
        with scope:
            try:
                for attempt in range(REEMBED_RETRIES + 1):
                    try:
                        if await self._indexer.reembed(kb_id, report):
                            switched = True
                            break
                    except NotFound:
                        break
                    except SidecarError as exc:
                        log.warning("re-embedding base %s failed (%s)", kb_id, exc.message)
                        if attempt == REEMBED_RETRIES:
                            await report(0, 0, f"error: {exc.message}")
                            break
                        await anyio.sleep(REEMBED_RETRY_BASE_S * 2**attempt)
            except Exception:
                log.exception("re-embedding base %s failed", kb_id)
            finally:
                if self._reembedding.get(kb_id) is scope:
                    del self._reembedding[kb_id]
        if switched:  # after the base stops saying it re-embeds: its pending documents have their vectors now
            await self.retries.base_now(kb_id)

    # ---- kb:* ---------------------------------------------------------------------

    @staticmethod
    def _name(value: str, field: str = "name") -> str:
        name = value.strip() if isinstance(value, str) else ""
        if not name or len(name) > MAX_NAME_CHARS or "\x00" in name:
            raise InvalidParams(f"invalid params: {field} must be 1..{MAX_NAME_CHARS} characters - at `$.{field}`")
        return name

    @staticmethod
    def _chunking(size: int, overlap: int) -> None:
        if not chunking.MIN_CHUNK_SIZE <= size <= chunking.MAX_CHUNK_SIZE:
            raise InvalidParams(
                f"invalid params: chunkSize must be {chunking.MIN_CHUNK_SIZE}..{chunking.MAX_CHUNK_SIZE} - at `$.chunkSize`"
            )
        if not 0 <= overlap <= size // 2:
            raise InvalidParams(f"invalid params: chunkOverlap must be 0..{size // 2} - at `$.chunkOverlap`")

    async def _info(self, kb_id: str) -> KnowledgeBase:
        reembedding = frozenset(self._reembedding)
        infos = await self._store.run(lambda s: s.knowledge.kb_infos([kb_id], reembedding=reembedding))
        if not infos:
            raise NotFound(f"knowledge base {kb_id!r} not found", data={"kbId": kb_id})
        return infos[0]

    async def create_kb(self, params: KbCreateParams) -> KnowledgeBase:
        name = self._name(params.name)
        if len(params.description) > 10_000:
            raise InvalidParams("invalid params: description is longer than 10000 characters - at `$.description`")
        self._chunking(params.chunk_size, params.chunk_overlap)
        embed = await self._check_model(params.embedding_model) if params.embedding_model else None
        record = await self._store.run(
            lambda s: s.knowledge.create_kb(
                name=name, description=params.description, embed=embed,
                chunk_size=params.chunk_size, chunk_overlap=params.chunk_overlap,
            )
        )
        return await self._info(record.id)

    async def list_kbs(self, params: EmptyParams | None = None) -> list[KnowledgeBase]:
        reembedding = frozenset(self._reembedding)
        return await self._store.run(lambda s: s.knowledge.kb_infos(None, reembedding=reembedding))

    async def get_kb(self, params: IdParams) -> KnowledgeBase:
        return await self._info(params.id)

    async def update_kb(self, params: KbUpdateParams) -> KnowledgeBase:
        kb = await self._store.run(lambda s: s.knowledge.get_kb(params.id))
        changes: dict[str, Any] = {}
        if params.name is not None:
            changes["name"] = self._name(params.name)
        if params.description is not None:
            changes["description"] = params.description
        size = params.chunk_size if params.chunk_size is not None else kb.chunk_size
        overlap = params.chunk_overlap if params.chunk_overlap is not None else kb.chunk_overlap
        if params.chunk_size is not None or params.chunk_overlap is not None:
            self._chunking(size, overlap)
            if (size, overlap) != (kb.chunk_size, kb.chunk_overlap):
                changes["chunk_size"], changes["chunk_overlap"] = size, overlap
        if params.clear_embedding_model and params.embedding_model is not None:
            raise InvalidParams("invalid params: embeddingModel and clearEmbeddingModel exclude each other")
        new_model: str | None = None
        if params.clear_embedding_model:
            if kb.embed_model is not None or kb.vector_model is not None:
                changes["embed"] = None
        elif params.embedding_model is not None:
            embed = await self._check_model(params.embedding_model)
            if f"{embed[0]}/{embed[1]}" != kb.embed_model:
                changes["embed"] = embed
                new_model = f"{embed[0]}/{embed[1]}"
        if not changes:
            return await self._info(kb.id)
        await self._store.run(lambda s: s.knowledge.update_kb(kb.id, **changes))
        if "embed" in changes and changes["embed"] is None:
            old = self._reembedding.pop(kb.id, None)
            if old is not None:
                old.cancel()
            self.indexes.drop(kb.id)
        if "chunk_size" in changes:
            for doc_id in await self._store.run(lambda s: s.knowledge.request_reindex_all(kb.id)):
                self._cancel_document(doc_id)
                if params.progress_token is not None:
                    self._tokens[doc_id] = params.progress_token
                self._enqueue(doc_id)
        if new_model is not None:
            self._start_reembed(kb.id, params.progress_token if "chunk_size" not in changes else None)
        return await self._info(kb.id)

    async def delete_kb(self, params: IdParams) -> SuccessResult:
        await self._store.run(lambda s: s.knowledge.get_kb(params.id))
        docs = await self._store.run(lambda s: s.knowledge.list_documents(params.id, None, 1_000_000, 0))
        for doc in docs:
            self._cancel_document(doc.id)
        scope = self._reembedding.pop(params.id, None)
        if scope is not None:
            scope.cancel()
        await self._store.run(lambda s: s.knowledge.delete_kb(params.id))
        self.indexes.drop(params.id)
        return SuccessResult()

    # ---- documents ----------------------------------------------------------------

    async def add_document(self, params: KbDocumentAddParams) -> KbDocumentAddResult:
        if (params.path is None) == (params.text is None):
            raise InvalidParams("invalid params: give either path or name + text - at `$.path`")
        if params.kind is not None and params.kind not in KINDS:
            raise InvalidParams(f"invalid params: kind must be one of {', '.join(KINDS)} - at `$.kind`")
        await self._store.run(lambda s: s.knowledge.get_kb(params.kb_id))  # NOT_FOUND before anything else
        roots, limit = self._limits()
        error: tuple[str, str] | None = None
        body: str | None = None
        if params.text is not None:
            if params.name is None:
                raise InvalidParams("invalid params: name is required with text - at `$.name`")
            name = self._name(params.name)
            kind = params.kind or detect_kind(name)
            if kind == "pdf":
                raise InvalidParams("invalid params: a PDF must be added as a file (path) - at `$.kind`")
            data = params.text.encode("utf-8", "surrogatepass")
            size = len(data)
            source, path, digest = "text", None, None
            if size > limit:
                error = ("too_large", f"{name!r} is {size} bytes, more than the limit of {limit}")
            else:
                import hashlib

                digest = hashlib.sha256(data).hexdigest()
                body = params.text
        else:
            assert params.path is not None
            path_given = params.path
            # file work, no database: anyio's own worker threads
            real = await anyio.to_thread.run_sync(lambda: confine(path_given, roots))
            read = await anyio.to_thread.run_sync(lambda: read_bounded(real, limit))
            name = self._name(params.name) if params.name is not None else (os.path.basename(read.path) or read.path)
            kind = params.kind or detect_kind(os.path.basename(read.path), read.data[:1024] if read.data else b"")
            source, path, size, digest = "path", read.path, read.size, read.sha256
            if read.data is None:
                error = ("too_large", f"{name!r} is {read.size} bytes, more than the limit of {limit}")
        doc, duplicate = await self._store.run(
            lambda s: s.knowledge.add_document(
                kb_id=params.kb_id, name=name, kind=kind, source=source, path=path,
                size_bytes=size, content_hash=digest, body=body, error=error,
            )
        )
        if not duplicate and error is None:
            if params.progress_token is not None:
                self._tokens[doc.id] = params.progress_token
            self._enqueue(doc.id)
        elif params.progress_token is not None:
            await self._progress(params.progress_token, "kb:index")(
                0, 0, f"error: {error[1]}" if error and not duplicate else "duplicate"
            )
        return KbDocumentAddResult(document=doc.to_wire(), duplicate=duplicate)

    async def list_documents(self, params: KbDocumentListParams) -> list[KbDocument]:
        if not 1 <= params.limit <= 1000:
            raise InvalidParams("invalid params: limit must be 1..1000 - at `$.limit`")
        if not 0 <= params.offset <= 10_000_000:
            raise InvalidParams("invalid params: offset must be 0..10000000 - at `$.offset`")
        docs = await self._store.run(lambda s: s.knowledge.list_documents(params.kb_id, params.status, params.limit, params.offset))
        return [d.to_wire() for d in docs]

    async def get_document(self, params: KbDocumentGetParams) -> KbDocumentDetail:
        doc = await self._store.run(lambda s: s.knowledge.get_document(params.id))
        chunks = await self._store.run(lambda s: s.knowledge.chunks(params.id)) if params.include_chunks else None
        return KbDocumentDetail(document=doc.to_wire(), chunks=chunks)

    async def delete_document(self, params: IdParams) -> SuccessResult:
        self._cancel_document(params.id)
        kb_id, rowids = await self._store.run(lambda s: s.knowledge.delete_document(params.id))
        self._tokens.pop(params.id, None)
        if rowids:
            await self.indexes.apply(IndexDelta(kb_id=kb_id, model=None, removed=rowids))
        else:
            self.indexes.generation += 1
        return SuccessResult()

    async def reindex_document(self, params: KbDocumentReindexParams) -> KbDocument:
        doc = await self._store.run(lambda s: s.knowledge.request_reindex(params.id))
        self._cancel_document(params.id)
        if params.progress_token is not None:
            self._tokens[doc.id] = params.progress_token
        self._enqueue(doc.id)
        return doc.to_wire()

    # ---- search -------------------------------------------------------------------

    async def search(self, params: KbSearchParams) -> KbSearchResult:
        if not params.kb_ids or len(params.kb_ids) > 100:
            raise InvalidParams("invalid params: kbIds must name 1..100 knowledge bases - at `$.kbIds`")
        if not params.query.strip() or len(params.query) > MAX_QUERY_CHARS:
            raise InvalidParams(f"invalid params: query must be 1..{MAX_QUERY_CHARS} characters - at `$.query`")
        if not 1 <= params.limit <= MAX_SEARCH_LIMIT:
            raise InvalidParams(f"invalid params: limit must be 1..{MAX_SEARCH_LIMIT} - at `$.limit`")
        if params.budget_tokens is not None and not 1 <= params.budget_tokens <= 1_000_000:
            raise InvalidParams("invalid params: budgetTokens must be 1..1000000 - at `$.budgetTokens`")
        known = {k.id for k in await self._store.run(lambda s: s.knowledge.kbs(params.kb_ids))}
        missing = [k for k in params.kb_ids if k not in known]
        if missing:
            raise NotFound(f"knowledge base {missing[0]!r} not found", data={"kbId": missing[0]})
        budget = params.budget_tokens if params.budget_tokens is not None else max(
            DEFAULT_BUDGET_TOKENS, params.limit * 1024
        )
        result = await self.retriever.search(params.kb_ids, params.query, limit=params.limit, budget=budget)
        return KbSearchResult(
            mode=result.mode,  # type: ignore[arg-type]
            notes=result.notes,
            hits=[
                KbSearchHit(
                    chunk_id=r.chunk.id, kb_id=r.chunk.kb_id, document_id=r.chunk.document_id,
                    document_name=r.chunk.document_name, heading=r.chunk.heading, start=r.chunk.start,
                    end=r.chunk.end, page=r.chunk.page, text=r.chunk.text, tokens=r.chunk.tokens,
                    score=round(r.score, 6), mode=r.mode,  # type: ignore[arg-type]
                    vector_rank=r.vector_rank, lexical_rank=r.lexical_rank,
                    cosine=round(r.cosine, 6) if r.cosine is not None else None,
                )
                for r in result.chunks
            ],
        )

    # ---- for requests ---------------------------------------------------------------

    async def retrieve(
        self, *, query: str, knowledge_base_ids: list[str], limit: int, session_id: str
    ) -> RetrievalResult:
        """The chunks a request of ``session_id`` gets (KnowledgeRetrievalTransformer); unknown
        bases are skipped."""
        return await self.retriever.search(
            knowledge_base_ids, query[:MAX_QUERY_CHARS], limit=limit, session_id=session_id
        )

    async def tool_search(
        self, ledger: CitationLedger, kb_ids: list[str], query: str, limit: int, *, session_id: str
    ) -> tuple[str, list[Citation]]:
        """What ``knowledge_search`` runs for ``session_id``: the passages numbered in the
        reply's ``ledger``."""
        result = await self.retriever.search(kb_ids, query[:MAX_QUERY_CHARS], limit=limit, session_id=session_id)
        citations = ledger.cite(result.chunks)
        return render_results(citations, query), citations

    async def offered_bases(self, session: SessionV2 | None) -> tuple[bool, list[KbRecord]]:
        """The knowledge bases of ``session``'s assistant (that still exist), and whether its
        requests retrieve from them automatically; the tools layer makes the offer of them
        (sidecar/tools/knowledge.py)."""
        assistant = await self._assistant_for(session.id if session is not None else None)
        ids = list(assistant.knowledge_base_ids)
        kbs = await self._store.run(lambda s: s.knowledge.kbs(ids)) if ids else []
        return assistant.transformers.knowledge_retrieval, kbs
