"""``kb:*``: knowledge bases, their documents, search and settings (Citation is in types.py).

A knowledge base (KnowledgeBase) holds documents added from a file under one of the roots
the host allowed (``kb:settings:update {allowedRoots}``) or as a name and a text. Each
document is extracted (text, Markdown, code, JSON, CSV, HTML, PDF with page numbers),
chunked (structure-aware, sized in tokens) and, when the base has an embedding model,
embedded; search is hybrid (vectors + the CJK-aware full-text index, reciprocal-rank
fusion) or lexical when there is no embedding model or the embedding call fails.

Ingestion runs in the background: ``kb:document:add`` answers at once with the document
(status ``pending``); its status then moves ``indexing`` -> ``ready`` or ``error`` (with
``error`` and ``errorCode``), or ``embedding_pending`` when the embedding provider failed:
the document is chunked and found by the full-text index at once, and the knowledge
service makes its vectors later (retries with a doubling delay, kept across restarts:
``embeddingAttempts``, ``nextRetryAt``, the last failure in ``error``), then it is
``ready``. A caller that passes ``progressToken`` receives ``sidecar:progress``
notifications with that token, the last one with ``done == total``.

Chunk ids are content-addressed (document id + a hash of the chunk's heading path and
normalized text), so a citation of a chunk still resolves after a re-index that keeps its
text in the same section. Offsets are in Unicode code points of the document's extracted
text.
"""

from __future__ import annotations

from typing import Literal

from protocol.common import EmptyParams, IdParams, MethodSpec, SuccessResult
from protocol.types import RetrievalMode, Struct

__all__ = [
    "LOCAL_EMBEDDING_PROVIDER",
    "DocumentStatus",
    "DocumentKind",
    "DocumentSource",
    "DocumentErrorCode",
    "EmbeddingModelRef",
    "KnowledgeBase",
    "KbCreateParams",
    "KbUpdateParams",
    "KbDocument",
    "KbChunk",
    "KbDocumentAddParams",
    "KbDocumentAddResult",
    "KbDocumentListParams",
    "KbDocumentGetParams",
    "KbDocumentDetail",
    "KbDocumentReindexParams",
    "KbSearchParams",
    "KbSearchHit",
    "KbSearchResult",
    "KbSettings",
    "KbSettingsUpdate",
]

LOCAL_EMBEDDING_PROVIDER = "@local"
"""The provider id of the embedders that run inside the sidecar (no server, no key):
``{providerId: "@local", modelId: "wordllama"}`` needs the optional extra
``pip install chat-sidecar[local-embeddings]``."""

DocumentStatus = Literal["pending", "indexing", "ready", "embedding_pending", "error"]
"""``embedding_pending``: chunked and in the full-text index (found lexically), its vectors
not made yet because the embedding provider failed; retried by the knowledge service
(``KbDocument.nextRetryAt``) until it is ``ready``."""
DocumentKind = Literal["text", "markdown", "code", "json", "csv", "html", "pdf"]
DocumentSource = Literal["path", "text"]
"""``path``: read from a file (its real path is kept); ``text``: given inline."""
DocumentErrorCode = Literal[
    "empty", "too_large", "binary", "corrupt", "encrypted", "no_text", "unreadable", "embedding_failed", "internal"
]
"""Why a document is in status ``error``: ``empty`` (0 bytes or only whitespace),
``too_large`` (over ``maxDocumentBytes``, or a PDF whose text is past 8 characters per byte
of the file, at least 4 Mi and at most 64 Mi), ``binary`` (not text: NUL bytes, control
characters, undecodable bytes), ``corrupt`` (a PDF pypdf cannot parse), ``encrypted`` (a
PDF with a password), ``no_text`` (a PDF without a text layer), ``unreadable`` (the file
vanished or cannot be opened at indexing time), ``embedding_failed`` (status
``embedding_pending``: the last failure of the embedding provider, retried on its own;
``kb:document:reindex`` also starts over), ``internal``."""
"""``hybrid``: vector similarity and the full-text index, fused; ``lexical``: the full-text
index only (no embedding model, or the embedding call failed)."""


class EmbeddingModelRef(Struct, omit_defaults=False, kw_only=True):
    """An embedding model on a configured provider (``provider:upsert``): OpenAI-compatible
    (``POST {baseUrl}/embeddings``) or Ollama (``POST /api/embed``); or the local embedder
    (``providerId: "@local"``, ``modelId: "wordllama"``). The model's ``contextWindow`` in
    the provider's model list, when given, is its input limit in tokens (chunks are
    clamped to it)."""

    provider_id: str
    model_id: str


class KnowledgeBase(Struct, omit_defaults=False, kw_only=True):
    id: str
    name: str
    description: str = ""
    embedding_model: EmbeddingModelRef | None = None
    """The model new vectors are made with; None: lexical search only."""
    chunk_size: int = 512
    """Tokens per chunk (clamped to the embedding model's input limit)."""
    chunk_overlap: int = 64
    """Tokens a chunk shares with the previous one when a section is split."""
    vector_model: str | None = None
    """The model whose vectors answer searches now (``providerId/modelId``); differs from
    ``embeddingModel`` while a change of model is being re-embedded in the background."""
    vector_dims: int | None = None
    reembedding: bool = False
    """True while the chunks are being embedded with a new ``embeddingModel`` (the old
    vectors serve until it is done)."""
    document_count: int = 0
    chunk_count: int = 0
    documents_indexing: int = 0
    """Documents ``pending`` or ``indexing``."""
    documents_embedding_pending: int = 0
    """Documents found lexically whose vectors are still to be made (``embedding_pending``)."""
    documents_failed: int = 0
    created_at: int
    updated_at: int


class KbCreateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``kb:create``."""

    name: str
    description: str = ""
    embedding_model: EmbeddingModelRef | None = None
    chunk_size: int = 512
    """64..8192 tokens."""
    chunk_overlap: int = 64
    """0..chunkSize/2 tokens."""


class KbUpdateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``kb:update``: the fields given change. A new ``embeddingModel`` re-embeds every chunk
    in the background (old vectors serve until it is done); a new chunk size or overlap
    re-chunks every document (``progressToken`` reports either)."""

    id: str
    name: str | None = None
    description: str | None = None
    embedding_model: EmbeddingModelRef | None = None
    clear_embedding_model: bool = False
    """True: no embedding model any more (lexical search only; stored vectors are dropped)."""
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    progress_token: int | str | None = None


class KbDocument(Struct, omit_defaults=False, kw_only=True):
    id: str
    kb_id: str
    name: str
    kind: DocumentKind
    source: DocumentSource
    path: str | None = None
    """The real path it was read from (``source: "path"``)."""
    size_bytes: int = 0
    content_hash: str | None = None
    """sha256 of the bytes (file) or of the UTF-8 text; adding the same content to the same
    base again is a no-op. None when the file was too large to read."""
    status: DocumentStatus
    error: str | None = None
    """Why it is in status ``error``; in status ``embedding_pending``, the last failure of
    the embedding provider."""
    error_code: DocumentErrorCode | None = None
    chunk_count: int = 0
    page_count: int | None = None
    """PDFs: how many pages."""
    embedding_attempts: int = 0
    """Failed attempts to embed it since it was indexed (``embedding_pending``); 0 otherwise."""
    next_retry_at: int | None = None
    """``embedding_pending``: when its vectors are tried next (ms since the epoch); the delay
    doubles after each failure (2 s, 4 s, 8 s... at most 10 minutes)."""
    created_at: int
    updated_at: int
    indexed_at: int | None = None


class KbChunk(Struct, omit_defaults=False, kw_only=True):
    id: str
    """Content-addressed: ``{documentId}:{hash of the heading path and the normalized text}``,
    with ``.2``, ``.3``... for repeats of the same text under the same heading path."""
    document_id: str
    ordinal: int
    heading: list[str] = []
    """The Markdown/HTML heading path above the chunk (CSV: the header row)."""
    start: int
    """Offset of the chunk in the document's text (code points)."""
    end: int
    page: int | None = None
    """PDFs: the page (from 1) the chunk is on."""
    tokens: int
    text: str


class KbDocumentAddParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``kb:document:add {kbId, path}`` or ``{kbId, name, text}``."""

    kb_id: str
    path: str | None = None
    """Absolute path of a file under one of ``allowedRoots`` (symlinks out of them refused)."""
    name: str | None = None
    """Shown in citations; default for a path: its file name. Required with ``text``."""
    text: str | None = None
    kind: DocumentKind | None = None
    """Default: from the file name (and, for files, the content)."""
    progress_token: int | str | None = None


class KbDocumentAddResult(Struct, omit_defaults=False, kw_only=True):
    document: KbDocument
    duplicate: bool = False
    """True: the base already had this content; ``document`` is the existing one and
    nothing was added."""


class KbDocumentListParams(Struct, forbid_unknown_fields=True, kw_only=True):
    kb_id: str
    status: DocumentStatus | None = None
    limit: int = 100
    """1..1000, oldest first."""
    offset: int = 0


class KbDocumentGetParams(Struct, forbid_unknown_fields=True, kw_only=True):
    id: str
    include_chunks: bool = False


class KbDocumentDetail(Struct, omit_defaults=False, kw_only=True):
    document: KbDocument
    chunks: list[KbChunk] | None = None


class KbDocumentReindexParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """Extract (a path is read again, under the current roots), chunk and embed again;
    chunks whose text is unchanged keep their id and their vectors."""

    id: str
    progress_token: int | str | None = None


class KbSearchParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``kb:search``: exactly the retrieval a request uses (for a search box, for debugging)."""

    kb_ids: list[str]
    query: str
    limit: int = 6
    """1..50."""
    budget_tokens: int | None = None
    """The chunks' tokens stay within this (default 4,096)."""


class KbSearchHit(Struct, omit_defaults=False, kw_only=True):
    chunk_id: str
    kb_id: str
    document_id: str
    document_name: str
    heading: list[str] = []
    start: int
    end: int
    page: int | None = None
    text: str
    tokens: int
    score: float
    """The fused score (reciprocal-rank fusion; lexical: of the one leg)."""
    mode: RetrievalMode
    vector_rank: int | None = None
    """1-based rank in the vector leg (None: not found there)."""
    lexical_rank: int | None = None
    cosine: float | None = None


class KbSearchResult(Struct, omit_defaults=False, kw_only=True):
    mode: RetrievalMode
    hits: list[KbSearchHit]
    notes: list[str] = []
    """Why a leg did not run (e.g. the embedding call failed), for debugging."""


class KbSettings(Struct, omit_defaults=False, kw_only=True):
    """``kb:settings:get`` / ``kb:settings:update``."""

    allowed_roots: list[str] = []
    """Absolute directories files may be added from (their real paths; symlinks leading out
    are refused). Empty: no file may be added, only ``name`` + ``text``."""
    max_document_bytes: int = 32 * 1024 * 1024
    """A file (or a text) larger than this is refused (``too_large``). 1 KiB..256 MiB."""


class KbSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    allowed_roots: list[str] | None = None
    max_document_bytes: int | None = None


METHODS: dict[str, MethodSpec] = {
    "kb:create": MethodSpec(KbCreateParams, KnowledgeBase, "Create a knowledge base."),
    "kb:list": MethodSpec(
        EmptyParams, list[KnowledgeBase],
        "Knowledge bases with their document and chunk counts.",
    ),
    "kb:get": MethodSpec(IdParams, KnowledgeBase, "One knowledge base."),
    "kb:update": MethodSpec(
        KbUpdateParams, KnowledgeBase,
        "Rename, describe, change the embedding model (re-embedded in the background) or the chunking.",
    ),
    "kb:delete": MethodSpec(IdParams, SuccessResult, "Delete a knowledge base with its documents, chunks and vectors."),
    "kb:document:add": MethodSpec(
        KbDocumentAddParams, KbDocumentAddResult,
        "Add a file (under the allowed roots) or a text; indexed in the background.",
    ),
    "kb:document:list": MethodSpec(KbDocumentListParams, list[KbDocument], "The documents of a knowledge base."),
    "kb:document:get": MethodSpec(KbDocumentGetParams, KbDocumentDetail, "One document, optionally with its chunks."),
    "kb:document:delete": MethodSpec(IdParams, SuccessResult, "Delete a document (its indexing stops)."),
    "kb:document:reindex": MethodSpec(
        KbDocumentReindexParams, KbDocument, "Extract, chunk and embed a document again."
    ),
    "kb:search": MethodSpec(KbSearchParams, KbSearchResult, "Search knowledge bases as a request does."),
    "kb:settings:get": MethodSpec(
        EmptyParams, KbSettings,
        "Knowledge settings (allowed roots, size limit).",
    ),
    "kb:settings:update": MethodSpec(KbSettingsUpdate, KbSettings, "Change the knowledge settings."),
}
"""The methods of this domain (see ``protocol.methods``)."""
