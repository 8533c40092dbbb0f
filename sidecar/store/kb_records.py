"""The records of the knowledge tables (migration ``m_knowledge``) and how their rows read.

Owns: the column lists and row decoding of bases (``KbRecord``) and documents
(``DocRecord``), what an indexing run hands to the repository (``NewChunk``), what a
committed write changed in the vectors (``IndexDelta``), a search hit (``ChunkHit``), the
text of a chunk that is embedded and full-text indexed (``embed_text``), a chunk's
content-addressed id (``chunk_id``). KnowledgeRepo (knowledge.py) and its vectors (kb_vectors.py) share
them; nothing here touches the database.

Chunk ids (what citations keep): ``{documentId}:{blake2b of the heading path and the
normalized text}`` (NFKC, whitespace collapsed; a chunk without a heading path hashes its
text alone), so the same text in another section is another chunk, and the same text in
the same section keeps its id after any re-index whatever was inserted elsewhere. The
chunker numbers repeats of one (heading path, text) in one document ``.2``, ``.3``... in
document order: only a repeat in a section with the same heading path can shift them. An
id depends on nothing but the chunk's own heading path and text, so it stays content-
addressed however chunks are cut (several small sections merged into one chunk keep the
heading path the chunker gives it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from protocol.kb import DocumentErrorCode, DocumentKind, DocumentSource, DocumentStatus, KbDocument
from sidecar.store import fts

__all__ = [
    "KbRecord",
    "DocRecord",
    "NewChunk",
    "IndexDelta",
    "ChunkHit",
    "VectorSink",
    "embed_text",
    "chunk_id",
    "doc_of",
    "kb_of",
    "DOC_COLUMNS",
    "KB_COLUMNS",
    "CHUNK_COLUMNS",
    "READY",
    "heading_decoder",
]

DOC_COLUMNS = (
    "id, kb_id, name, kind, source, path, size_bytes, content_hash, status, error, error_code, "
    "chunk_count, pages, revision, created_at, updated_at, indexed_at, embed_attempts, embed_retry_at"
)
KB_COLUMNS = (
    "id, name, description, embed_provider_id, embed_model_id, chunk_size, chunk_overlap, "
    "vector_model, vector_dims, created_at, updated_at"
)
CHUNK_COLUMNS = "id, document_id, ordinal, heading, char_start, char_end, page, tokens, text"
heading_decoder = msgspec.json.Decoder(list[str])
_pages_decoder = msgspec.json.Decoder(list[int])


class KbRecord(msgspec.Struct, kw_only=True):
    id: str
    name: str
    description: str
    embed_provider_id: str | None
    embed_model_id: str | None
    chunk_size: int
    chunk_overlap: int
    vector_model: str | None
    vector_dims: int | None
    created_at: int
    updated_at: int

    @property
    def embed_model(self) -> str | None:
        """The model key new vectors are made with (``providerId/modelId``)."""
        if self.embed_provider_id and self.embed_model_id:
            return f"{self.embed_provider_id}/{self.embed_model_id}"
        return None


class DocRecord(msgspec.Struct, kw_only=True):
    id: str
    kb_id: str
    name: str
    kind: DocumentKind
    source: DocumentSource
    path: str | None
    size_bytes: int
    content_hash: str | None
    status: DocumentStatus
    error: str | None
    error_code: DocumentErrorCode | None
    chunk_count: int
    pages: list[int] | None
    """Start offset of each page in the body (PDFs)."""
    revision: int
    created_at: int
    updated_at: int
    indexed_at: int | None
    embed_attempts: int = 0
    """Failed attempts to make its vectors since it was indexed (``embedding_pending``)."""
    embed_retry_at: int | None = None
    """When the next attempt is due (ms since the epoch; ``embedding_pending`` only)."""

    def to_wire(self) -> KbDocument:
        return KbDocument(
            id=self.id, kb_id=self.kb_id, name=self.name, kind=self.kind,
            source=self.source,
            path=self.path, size_bytes=self.size_bytes, content_hash=self.content_hash,
            status=self.status,
            error=self.error, error_code=self.error_code,
            chunk_count=self.chunk_count, page_count=len(self.pages) if self.pages is not None else None,
            embedding_attempts=self.embed_attempts, next_retry_at=self.embed_retry_at,
            created_at=self.created_at, updated_at=self.updated_at, indexed_at=self.indexed_at,
        )


class NewChunk(msgspec.Struct, kw_only=True):
    """A chunk as an indexing run made it (``vector``: its float32 bytes for ``model``)."""

    id: str
    ordinal: int
    heading: list[str]
    start: int
    end: int
    page: int | None
    tokens: int
    embed_hash: str
    text: str
    embed_text: str
    """Heading path + text: what is embedded and full-text indexed."""
    vector: bytes | None = None


class IndexDelta(msgspec.Struct, kw_only=True):
    """What a committed write changed in a base's vectors (for the in-memory index)."""

    kb_id: str
    model: str | None
    upserted: list[tuple[int, bytes]] = []
    removed: list[int] = []


class ChunkHit(msgspec.Struct, kw_only=True):
    rowid: int
    id: str
    kb_id: str
    document_id: str
    document_name: str
    ordinal: int
    heading: list[str]
    start: int
    end: int
    page: int | None
    tokens: int
    text: str


class VectorSink(Protocol):
    """Receives a base's vectors in rowid order (``read_vectors``)."""

    def reserve(self, count: int, dims: int) -> None: ...

    def put(self, index: int, rowid: int, vector: bytes) -> None: ...


_WS = re.compile(r"\s+")


def normalized(text: str) -> str:
    return _WS.sub(" ", fts.nfkc(text)).strip()


def chunk_id(document_id: str, heading: Sequence[str], text: str) -> str:
    """The id of a chunk (module docstring), before any repeat number."""
    key = normalized(text)
    if heading:
        key = "\x1f".join(normalized(h) for h in heading) + "\x00" + key
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()
    return f"{document_id}:{digest}"


def embed_text(heading: list[str], text: str) -> str:
    """What is embedded and full-text indexed of a chunk: its heading path, a blank line, its text."""
    return (" > ".join(heading) + "\n\n" + text) if heading else text


def doc_of(row: tuple[Any, ...]) -> DocRecord:
    (doc_id, kb_id, name, kind, source, path, size, chash, status, error, code, count, pages, revision,
     created, updated, indexed, attempts, retry_at) = row
    return DocRecord(
        id=doc_id, kb_id=kb_id, name=name, kind=kind, source=source, path=path, size_bytes=size,
        content_hash=chash, status=status, error=error, error_code=code, chunk_count=count,
        pages=_pages_decoder.decode(pages) if pages else None, revision=revision,
        created_at=created, updated_at=updated, indexed_at=indexed, embed_attempts=attempts,
        embed_retry_at=retry_at,
    )


def kb_of(row: tuple[Any, ...]) -> KbRecord:
    kb_id, name, desc, provider, model, size, overlap, vmodel, vdims, created, updated = row
    return KbRecord(
        id=kb_id, name=name, description=desc, embed_provider_id=provider, embed_model_id=model,
        chunk_size=size, chunk_overlap=overlap, vector_model=vmodel, vector_dims=vdims,
        created_at=created, updated_at=updated,
    )


READY = "status = 'ready', error = NULL, error_code = NULL, embed_attempts = 0, embed_retry_at = NULL"
"""The columns of a document that has every vector it needs (or needs none)."""
