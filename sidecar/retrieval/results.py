"""What a knowledge retrieval returns: ranked chunks with how they were found."""

from __future__ import annotations

import msgspec

from sidecar.store.knowledge import ChunkHit

__all__ = ["RetrievedChunk", "RetrievalResult"]


class RetrievedChunk(msgspec.Struct, kw_only=True):
    chunk: ChunkHit
    score: float
    """The fused (reciprocal-rank) score."""
    mode: str
    """hybrid | lexical: whether the vector leg of this chunk's base ran."""
    vector_rank: int | None = None
    lexical_rank: int | None = None
    cosine: float | None = None


class RetrievalResult(msgspec.Struct, kw_only=True):
    mode: str
    """hybrid | lexical"""
    chunks: list[RetrievedChunk]
    notes: list[str] = []
