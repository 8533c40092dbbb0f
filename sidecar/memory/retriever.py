"""MemoryRetriever: the one retrieval of memories (requests, ``memory_search``, ``memory:search``).

``search(scopes, query, limit, model)`` -> MemorySearch, built on the knowledge retrieval
core (sidecar/retrieval): the same FTS terms (``fts.retrieval_terms``: CJK bigrams, BM25),
the same in-memory VectorIndexes (keyed by scope, source ``Store.memory``), the same
weighted reciprocal-rank fusion and relevance floors (``fusion.py``):
1. the lexical leg: ``memories_fts`` within the scopes, the best LEG_DEPTH;
2. the vector leg when the viewing assistant has an embedding model: the query embedded by
   it (at most QUERY_EMBED_TIMEOUT_S), cosine over the scopes' vectors of that model only
   (a vector of another model is not comparable and is never used), the best LEG_DEPTH
   above the vector floor;
3. fusion, the fused floor, at most ``limit``.
Without a model, or when embedding the query fails (logged, named in ``notes``), the
lexical leg alone answers (``mode`` says which). Only active memories of the named scopes
can come out: the legs filter by scope, and the chosen rows are re-read active-only.

Results are cached briefly per (scopes, query, limit, model) and ``generation`` (bumped by
every memory write), so the model steps of one reply embed the query once.

A search made for a session (``session_id``: a request's retrieval, ``memory_search``)
charges its query embedding to it as a side call (``side:embedding``, the knowledge
retriever's ``charge_embedding``); ``memory:search`` and a cached result charge nothing.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from protocol.memory import MemorySearchMode
from sidecar.retrieval import fusion
from sidecar.retrieval.indexes import VectorIndexes
from sidecar.retrieval.retriever import LEG_DEPTH, EmbedderFor, embed_query
from sidecar.store.async_store import AsyncStore
from sidecar.store.memory_records import MemoryRecord

if TYPE_CHECKING:
    from sidecar.providers.calls import UsageSink

__all__ = ["MemoryRetriever", "MemorySearch", "MemoryFound"]

log = logging.getLogger(__name__)

CACHE_TTL_S = 60.0
CACHE_ENTRIES = 128


class MemoryFound(msgspec.Struct, kw_only=True):
    record: MemoryRecord
    score: float
    lexical_rank: int | None = None
    vector_rank: int | None = None
    cosine: float | None = None


class MemorySearch(msgspec.Struct, kw_only=True):
    mode: MemorySearchMode
    hits: list[MemoryFound]
    notes: list[str] = []


class MemoryRetriever:
    def __init__(
        self, store: AsyncStore, indexes: VectorIndexes, embedder_for: EmbedderFor, usage: UsageSink | None = None
    ) -> None:
        self._store = store
        self._indexes = indexes
        self._embedder_for = embedder_for
        self.usage = usage
        """Where the query embeddings of a session's searches are charged (the engine's
        SideUsage; MemoryService.start sets it). None: nowhere."""
        self.generation = 0
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, int, MemorySearch]] = OrderedDict()

    async def search(
        self, scopes: Sequence[str], query: str, *, limit: int, model: str | None, session_id: str | None = None
    ) -> tuple[MemorySearch, bool]:
        """(the result, whether it came from the cache); ``session_id``: the session it is made
        for (charged for the query embedding), None for none."""
        scopes = sorted(set(scopes))
        if not scopes or not query.strip():
            return MemorySearch(mode="lexical", hits=[]), False
        key = (tuple(scopes), query, limit, model)
        now = time.monotonic()
        generation = self.generation
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < CACHE_TTL_S and cached[1] == generation:
            self._cache.move_to_end(key)
            return cached[2], True
        result = await self._search(scopes, query, limit, model, session_id=session_id)
        self._cache[key] = (now, generation, result)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return result, False

    async def search_vectors(
        self, scopes: Sequence[str], query: str, *, limit: int, model: str, vector: Any
    ) -> MemorySearch:
        """``search`` with the query's vector given (benchmarks: the embedding call excluded)."""
        return await self._search(sorted(set(scopes)), query, limit, model, vector)

    async def _search(
        self, scopes: list[str], query: str, limit: int, model: str | None, vector: Any = None,
        *, session_id: str | None = None,
    ) -> MemorySearch:
        notes: list[str] = []
        lexical: list[tuple[int, float]] = []
        vector_hits: list[tuple[int, float]] | None = None

        async def lexical_leg() -> None:
            nonlocal lexical
            lexical = await self._store.run(lambda s: s.memory.lexical(scopes, query, LEG_DEPTH))

        async def vector_leg(model: str) -> None:
            nonlocal vector_hits
            query_vector = vector
            if query_vector is None:
                query_vector = await embed_query(self._embedder_for, model, query, notes, "memory retrieval",
                                                 usage=self.usage, session_id=session_id)
                if query_vector is None:
                    return
            hits = await self._indexes.search([(scope, model) for scope in scopes], query_vector, LEG_DEPTH)
            vector_hits = fusion.vector_floor(hits)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lexical_leg)
            if model is not None:
                tg.start_soon(vector_leg, model)

        mode: MemorySearchMode = "hybrid" if vector_hits is not None else "lexical"
        legs = [[rowid for rowid, _ in lexical]]
        weights = [1.0]
        if vector_hits:
            legs.append([rowid for rowid, _ in vector_hits])
            weights.append(fusion.VECTOR_WEIGHT)
        fused = fusion.fused_floor(fusion.fuse(legs, weights))
        if not fused:
            return MemorySearch(mode=mode, hits=[], notes=notes)
        lexical_rank = {rowid: i for i, (rowid, _) in enumerate(lexical, start=1)}
        vector_rank = {rowid: (i, cos) for i, (rowid, cos) in enumerate(vector_hits or [], start=1)}
        wanted = [rowid for rowid, _ in fused[: limit * 2]]
        records = await self._store.run(lambda s: s.memory.by_rowids(wanted, active_only=True))
        allowed = set(scopes)
        hits: list[MemoryFound] = []
        for rowid, score in fused:
            record = records.get(rowid)
            if record is None or record.scope not in allowed:  # changed since the legs ran
                continue
            rank = vector_rank.get(rowid)
            hits.append(MemoryFound(
                record=record, score=score, lexical_rank=lexical_rank.get(rowid),
                vector_rank=rank[0] if rank else None, cosine=rank[1] if rank else None,
            ))
            if len(hits) >= limit:
                break
        return MemorySearch(mode=mode, hits=hits, notes=notes)
