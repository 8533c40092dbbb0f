"""Indexer: one document from ``pending`` to ``ready`` (or ``error``), and re-embedding a base.

``index(doc_id, progress)``: claim the document (``indexing``), read it (a file again
through the confinement of ``paths.py``, under the roots allowed now; a text from its
row), extract, chunk, embed what has no stored vector yet, then write chunks, index rows,
vectors and ``ready`` in ONE transaction (KnowledgeRepo.write_index) and hand the committed
delta to the in-memory indexes. When the embedding provider fails (after its own retries),
the document is written all the same, with the vectors that were made, in status
``embedding_pending`` (found lexically at once; its first failed attempt, the next one due
``retry_delay_ms(1)`` later). Every other failure ends in ``error`` with a DocumentErrorCode and a
message; a cancellation (document deleted, shutdown) writes nothing and leaves the
document ``indexing``, which the next start resumes.

``embed_pending(doc_id)``: one attempt at the vectors an ``embedding_pending`` document
lacks (KnowledgeService's retry schedule calls it); it becomes ``ready`` in the
transaction that stores the last of them. A failure is raised (SidecarError) for the
schedule to count.

``reembed(kb_id, progress)``: embed every chunk of a base that has no vector for its
``embed_model`` yet, committing a batch at a time under the new model (invisible to search:
the old ``vector_model`` serves), then switch the base to the new model in one
transaction. A restart resumes it where it was (the stored vectors are kept).

Progress: ``progress(done, total, message)``; only the last call has ``done == total``
(indexing: one unit per chunk embedded plus one for the final write; an error: 0 of 0).

Ingestion belongs to no session: the usage its embedding calls report is charged to nobody
(a document serves every session that retrieves from its base).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from sidecar.errors import SidecarError
from sidecar.retrieval import chunking
from sidecar.retrieval.extract import DocumentError, detect_kind, extract, extract_text
from sidecar.retrieval.indexes import KnowledgeIndexes
from sidecar.retrieval.paths import confine, read_bounded
from sidecar.store.async_store import AsyncStore
from sidecar.store.knowledge import DocRecord, KbRecord, KnowledgeRepo, NewChunk

__all__ = ["Indexer", "Progress", "REEMBED_BATCH"]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], Awaitable[None]]
REEMBED_BATCH = 256
T = TypeVar("T")
EMBED_BATCH = 64


class _Done(Exception):
    """The document is gone or superseded: stop quietly."""


class Indexer:
    def __init__(
        self,
        store: AsyncStore,
        indexes: KnowledgeIndexes,
        embedder_for: Callable[[str], Awaitable[Any]],
        limits: Callable[[], tuple[list[str], int]],
        retry_delay_ms: Callable[[int], int],
    ) -> None:
        """``limits()`` -> (allowed roots, max document bytes) in force now; ``retry_delay_ms(n)``
        -> how long to wait before the vectors of a document are tried again after its n-th
        failed attempt."""
        self._store = store
        self._indexes = indexes
        self._embedder_for = embedder_for
        self._limits = limits
        self._retry_delay_ms = retry_delay_ms

    async def _db(self, fn: Callable[[KnowledgeRepo], T]) -> T:
        return await self._store.run(lambda s: fn(s.knowledge))

    # ---- one document -------------------------------------------------------------

    async def index(self, doc_id: str, progress: Progress) -> str:
        """Index one queued document; its final status (or "skipped")."""
        doc: DocRecord | None = await self._db(lambda k: k.claim(doc_id))
        if doc is None:
            return "skipped"
        try:
            kb: KbRecord = await self._db(lambda k: k.get_kb(doc.kb_id))
            body = await self._db(lambda k: k.document_body(doc.id)) if doc.source == "text" else None
            # file and CPU work, no database: anyio's own worker threads
            extracted = await anyio.to_thread.run_sync(self._extract, doc, body)
            model = kb.embed_model
            embedder: Any = None
            failure: str | None = None
            if model is not None:
                try:
                    embedder = await self._embedder_for(model)
                except SidecarError as exc:  # its provider is gone or disabled: lexical until it is back
                    failure = exc.message
            size = chunking.effective_size(kb.chunk_size, embedder.input_limit if embedder is not None else None)
            common = await self._db(lambda k: k.common_lines(doc.kb_id))
            chunks: list[NewChunk] = await anyio.to_thread.run_sync(
                lambda: chunking.chunk_document(
                    doc.id, extracted.kind, extracted.text, extracted.pages, size=size, overlap=kb.chunk_overlap,
                    common=common,
                )
            )
            # one unit per chunk embedded, plus the final write: done == total only at the end
            total = len(chunks) + 1
            await progress(0, total, f"{len(chunks)} chunks")
            dims: int | None = None
            if embedder is not None and model is not None:
                dims, failure = await self._embed_chunks(doc, model, embedder, chunks, progress)
            pending = None
            if failure is not None and chunks:
                pending = (f"embedding failed: {failure}", self._retry_delay_ms(1))
                log.warning("document %s (%s) is searchable lexically; its vectors are retried: %s",
                            doc.id, doc.name, failure)
            delta = await self._db(
                lambda k: k.write_index(
                    doc, body=extracted.text, pages=extracted.pages, kind=extracted.kind,
                    chunks=chunks, model=model if dims is not None else None, dims=dims, embedding_failed=pending,
                )
            )
            if delta is None:
                raise _Done
            await self._indexes.apply(delta)
            status = "embedding_pending" if pending is not None else "ready"
            await progress(total, total, status)
            return status
        except _Done:
            log.info("document %s was deleted or re-queued while indexing", doc_id)
            return "skipped"
        except DocumentError as exc:
            return await self._fail(doc, exc.reason, exc.message, progress)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # a bug: the document must not stay "indexing"
            log.exception("indexing document %s failed", doc_id)
            return await self._fail(doc, "internal", f"internal error while indexing: {type(exc).__name__}", progress)

    async def _fail(self, doc: DocRecord, code: str, message: str, progress: Progress) -> str:
        with anyio.CancelScope(shield=True):
            written = await self._db(lambda k: k.mark_error(doc, code, message))
            await progress(0, 0, f"error: {message}")
        if written:
            log.info("document %s (%s): %s", doc.id, doc.name, message)
        return "error" if written else "skipped"

    def _extract(self, doc: DocRecord, body: str | None) -> Any:
        """The document's text (blocking file and CPU work): the stored ``body`` of a text, or
        the file read again."""
        roots, limit = self._limits()
        what = f"{doc.name!r}"
        if doc.source == "text":
            body = body or ""
            if len(body.encode("utf-8", "surrogatepass")) > limit:
                raise DocumentError("too_large", f"{what} is larger than the limit of {limit} bytes")
            return extract_text(doc.kind, body, what)
        try:
            real = confine(doc.path or "", roots)
            read = read_bounded(real, limit)
        except SidecarError as exc:
            raise DocumentError("unreadable", f"{what} cannot be read now: {exc.message}") from None
        if read.data is None:
            raise DocumentError("too_large", f"{what} is {read.size} bytes, more than the limit of {limit}")
        kind: str = doc.kind
        if kind == "text" and read.data.startswith(b"%PDF-"):
            kind = detect_kind(doc.name, read.data[:1024])
        return extract(kind, read.data, what)

    async def _embed_chunks(
        self, doc: DocRecord, model: str, embedder: Any, chunks: list[NewChunk], progress: Progress
    ) -> tuple[int | None, str | None]:
        """Vectors for ``chunks`` (stored ones reused when the embedded text is the same):
        (their dimensions, None) or, when the provider fails, (those of the vectors made
        before it did, why)."""
        stored: dict[str, tuple[str, bytes]] = await self._db(lambda k: k.stored_vectors(doc.id, model))
        todo: list[NewChunk] = []
        dims: int | None = None
        for c in chunks:
            known = stored.get(c.id)
            if known is not None and known[0] == c.embed_hash:
                c.vector = known[1]
                dims = len(known[1]) // 4
            else:
                todo.append(c)
        done = len(chunks) - len(todo)
        if done:
            await progress(done, len(chunks) + 1, f"{done} vectors kept")
        for i in range(0, len(todo), EMBED_BATCH):
            batch = todo[i : i + EMBED_BATCH]
            try:
                dims = await self._embed_into(embedder, batch, dims)
            except SidecarError as exc:
                return (dims if chunks else None), exc.message
            done += len(batch)
            await progress(done, len(chunks) + 1, f"{done} of {len(chunks)} chunks embedded")
        return (dims if chunks else None), None

    @staticmethod
    async def _embed_into(embedder: Any, batch: list[NewChunk], dims: int | None) -> int:
        """Embed a batch into its chunks' ``vector``; their dimensions (SidecarError when
        they differ from ``dims``, those of the vectors before)."""
        vectors = (await embedder.embed([c.embed_text for c in batch])).vectors
        if dims is not None and vectors.shape[1] != dims:
            raise SidecarError(f"the model answered {vectors.shape[1]} dimensions, earlier {dims}")
        for c, row in zip(batch, vectors):
            c.vector = row.astype("<f4").tobytes()
        return int(vectors.shape[1])

    # ---- the vectors a pending document lacks ------------------------------------------

    async def embed_pending(self, doc: DocRecord) -> bool:
        """One attempt at the vectors of an ``embedding_pending`` document: True when it is
        ``ready``, False when it changed meanwhile (deleted, re-indexed, its base's model
        changed or cleared). SidecarError when the provider fails (nothing is written)."""
        kb: KbRecord = await self._db(lambda k: k.get_kb(doc.kb_id))
        model = kb.embed_model
        if model is None:  # the base needs no vectors any more (update_kb made it ready)
            return False
        embedder = await self._embedder_for(model)
        todo = await self._db(lambda k: k.pending_vectors(doc.id, model))
        dims = kb.vector_dims if kb.vector_model == model else None
        rows: list[tuple[int, str, bytes]] = []
        for i in range(0, len(todo), EMBED_BATCH):
            batch = todo[i : i + EMBED_BATCH]
            vectors = (await embedder.embed([text for _, _, text in batch])).vectors
            if dims is not None and vectors.shape[1] != dims:
                raise SidecarError(f"the model answered {vectors.shape[1]} dimensions, the base has {dims}")
            dims = int(vectors.shape[1])
            rows.extend((rowid, ehash, row.astype("<f4").tobytes()) for (rowid, ehash, _), row in zip(batch, vectors))
        written = await self._db(lambda k: k.finish_embedding(doc, model, dims, rows))
        if written is None:
            return False
        await self._indexes.apply(written[0])
        return written[1]

    # ---- a change of model ----------------------------------------------------------

    async def reembed(self, kb_id: str, progress: Progress) -> bool:
        """Embed the base's chunks with its ``embed_model`` and switch to it; True when done."""
        kb: KbRecord = await self._db(lambda k: k.get_kb(kb_id))
        model = kb.embed_model
        if model is None or model == kb.vector_model and not (await self._db(lambda k: k.missing_vectors(kb_id, model, 1))):
            return True
        embedder = await self._embedder_for(model)
        total, done, dims = await self._db(lambda k: k.count_vectors(kb_id, model))
        await progress(done, total + 1, f"re-embedding {total} chunks with {model}")
        while True:
            rows = await self._db(lambda k: k.missing_vectors(kb_id, model, REEMBED_BATCH))
            if not rows:
                break
            vectors = (await embedder.embed([text for _, _, text in rows])).vectors
            dims = int(vectors.shape[1])
            blobs = [(rowid, ehash, row.astype("<f4").tobytes()) for (rowid, ehash, _), row in zip(rows, vectors)]
            await self._db(lambda k: k.write_vectors(kb_id, model, dims, blobs))
            done = min(total, done + len(rows))
            await progress(done, total + 1, f"{done} of {total} chunks re-embedded")
        if dims is None and total:
            return False  # chunks but no vector: cannot happen unless they changed meanwhile
        # (a base without chunks switches at once: its next vectors set the dimensions)
        switched = await self._db(lambda k: k.switch_vector_model(kb_id, model, dims))
        if switched:
            self._indexes.drop(kb_id, keep_model=model)
        await progress(total + 1, total + 1, "ready" if switched else "superseded")
        return switched
