"""HybridRetriever: the one retrieval of knowledge chunks (requests, the knowledge tool,
``kb:search``).

``search(kb_ids, query, limit, budget)`` -> RetrievalResult:
1. the lexical leg: the chunks' FTS5 index (CJK bigrams, BM25), the best LEG_DEPTH;
2. the vector leg, for each model whose vectors serve the bases (their ``vector_model``):
   the query embedded by that model (at most QUERY_EMBED_TIMEOUT_S), cosine over the
   bases' in-memory indexes, the best LEG_DEPTH above the vector floor;
3. score fusion of the legs (each leg relative to its own best, a vector leg weighed by
   the spread of its cosines: ``fusion.fuse_scores``), the fused floor, at most PER_DOCUMENT chunks of one
   document unless nothing else passes, at most ``limit`` chunks within ``budget`` tokens
   (``fusion.py``). A chunk of the lexical leg that no vector leg that ran could have
   found (it has no vector of that model: its document is still ``embedding_pending``, or
   its base's query could not be embedded) is fused as ``unseen``: ranked by its words as
   if the vectors agreed, never dropped for lacking a vector.
Without an embedding model, or when embedding the query fails (the failure is logged and
named in ``notes``), the lexical leg alone answers: the result's ``mode`` and each chunk's
``mode`` say which ("hybrid" only for chunks that have a vector of a leg that ran).

Results are cached briefly per (bases, query, limit, budget) and the index generation, so
the model steps of one reply (the request is rebuilt for each) see the same chunks and
embed the query once.

Cost: a search made for a session (``session_id``: a request's retrieval, the knowledge
tool) charges each query-embedding request it makes to that session as a side call of kind
``side:embedding`` (``charge_embedding``: one ``usage`` record per request whose answer
reported its tokens, priced as the embedding model of its provider); a search for no
session (``kb:search``) and a cached result charge nothing. Recording never fails the
search (SideUsage logs and drops what it cannot add).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from sidecar.errors import SidecarError
from sidecar.retrieval import fusion
from sidecar.retrieval.results import RetrievalResult, RetrievedChunk
from sidecar.store.async_store import AsyncStore
from sidecar.store.knowledge import ChunkHit, KbRecord, KnowledgeRepo

if TYPE_CHECKING:
    import numpy as np

    from sidecar.providers.calls import UsageSink
    from sidecar.retrieval.embeddings import Embedded, Embedder
    from sidecar.retrieval.indexes import KnowledgeIndexes

__all__ = [
    "HybridRetriever",
    "RetrievedChunk",
    "RetrievalResult",
    "LEG_DEPTH",
    "DEFAULT_BUDGET_TOKENS",
    "QUERY_EMBED_TIMEOUT_S",
    "EMBEDDING_KIND",
    "embed_query",
    "charge_embedding",
]

log = logging.getLogger(__name__)

LEG_DEPTH = 50
DEFAULT_BUDGET_TOKENS = 4096
QUERY_EMBED_TIMEOUT_S = 15.0
CACHE_TTL_S = 60.0
CACHE_ENTRIES = 128
EMBEDDING_KIND = "side:embedding"
"""The side-call kind of the embeddings made for a session (its ``usageByKind``)."""

EmbedderFor = Callable[[str], Awaitable["Embedder"]]
"""``await embedder_for(model_key)`` -> an Embedder (sidecar/retrieval/embeddings.py)."""


async def charge_embedding(
    usage: UsageSink | None, session_id: str | None, model_key: str, embedded: Embedded
) -> None:
    """Charge the requests behind ``embedded`` to ``session_id`` as side calls of kind
    EMBEDDING_KIND: one record per request that reported its usage, priced as ``model_key``
    (``providerId/modelId``). Nothing without a session or a sink."""
    if usage is None or session_id is None:
        return
    provider_id, _, model_id = model_key.partition("/")
    for used in embedded.usage:
        await usage(session_id, provider_id, model_id, used, kind=EMBEDDING_KIND)


async def embed_query(
    embedder_for: EmbedderFor, model: str, query: str, notes: list[str], what: str,
    *, usage: UsageSink | None = None, session_id: str | None = None,
) -> np.ndarray | None:
    """``query`` embedded by ``model`` (a unit vector), or None when that takes longer than
    QUERY_EMBED_TIMEOUT_S or fails: then ``notes`` says why, and the caller's ``what``
    (its results) is lexical only. With a ``session_id`` the call is charged to it
    (``charge_embedding``)."""
    try:
        embedder = await embedder_for(model)
        with anyio.fail_after(QUERY_EMBED_TIMEOUT_S):
            embedded = await embedder.embed([query])
    except TimeoutError:
        notes.append(f"embedding the query with {model} took longer than {QUERY_EMBED_TIMEOUT_S:g}s")
        log.warning("query embedding with %s timed out; lexical %s only", model, what)
        return None
    except SidecarError as exc:
        notes.append(f"embedding the query with {model} failed: {exc.message}")
        log.warning("query embedding with %s failed (%s); lexical %s only", model, exc.message, what)
        return None
    await charge_embedding(usage, session_id, model, embedded)
    vector: np.ndarray = embedded.vectors[0]
    return vector


class HybridRetriever:
    def __init__(
        self, store: AsyncStore, indexes: KnowledgeIndexes, embedder_for: EmbedderFor,
        usage: UsageSink | None = None,
    ) -> None:
        self._store = store
        self._indexes = indexes
        self._embedder_for = embedder_for
        self.usage = usage
        """Where the query embeddings of a session's searches are charged (the engine's
        SideUsage; KnowledgeService.start sets it once it exists). None: nowhere."""
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, int, RetrievalResult]] = OrderedDict()

    async def search(
        self, kb_ids: Sequence[str], query: str, *, limit: int = 6, budget: int | None = DEFAULT_BUDGET_TOKENS,
        session_id: str | None = None,
    ) -> RetrievalResult:
        """``session_id``: the session the search is made for (its query embeddings are
        charged to it), None for none."""
        wanted = list(kb_ids)
        kbs = await self._store.run(lambda s: s.knowledge.kbs(wanted))
        if not kbs or not query.strip():
            return RetrievalResult(mode="lexical", chunks=[])
        key = (tuple(sorted(k.id for k in kbs)), query, limit, budget)
        cached = self._cache.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < CACHE_TTL_S and cached[1] == self._indexes.generation:
            self._cache.move_to_end(key)
            return cached[2]
        generation = self._indexes.generation
        result = await self._search(kbs, query, limit, budget, session_id=session_id)
        self._cache[key] = (now, generation, result)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return result

    async def _search(
        self, kbs: list[KbRecord], query: str, limit: int, budget: int | None, *, session_id: str | None = None
    ) -> RetrievalResult:
        notes: list[str] = []
        kb_ids = [k.id for k in kbs]
        by_model: dict[str, list[KbRecord]] = {}
        for kb in kbs:
            if kb.vector_model:
                by_model.setdefault(kb.vector_model, []).append(kb)
        lexical: list[tuple[int, float]] = []
        vector_legs: list[list[tuple[int, float]]] = []
        searched: list[tuple[str, str]] = []
        """The (base, model) indexes of the vector legs that ran."""

        async def lexical_leg() -> None:
            nonlocal lexical
            lexical = await self._store.run(lambda s: s.knowledge.lexical(kb_ids, query, LEG_DEPTH))

        async def vector_leg(model: str, members: list[KbRecord]) -> None:
            vector = await embed_query(self._embedder_for, model, query, notes, "results for its bases",
                                       usage=self.usage, session_id=session_id)
            if vector is None:
                return
            targets = [(kb.id, model) for kb in members]
            hits = await self._indexes.search(targets, vector, LEG_DEPTH)
            vector_legs.append(fusion.vector_floor(hits))
            searched.extend(targets)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lexical_leg)
            for model, members in by_model.items():
                tg.start_soon(vector_leg, model, members)

        lexical_ids = [rowid for rowid, _ in lexical]
        mode = "hybrid" if searched else "lexical"
        if not lexical and not any(vector_legs):
            return RetrievalResult(mode=mode, chunks=[], notes=notes)
        lexical_rank = {rowid: i for i, (rowid, _) in enumerate(lexical, start=1)}
        vector_rank: dict[int, tuple[int, float]] = {}
        for leg in vector_legs:
            for i, (rowid, cosine) in enumerate(leg, start=1):
                if rowid not in vector_rank or vector_rank[rowid][0] > i:
                    vector_rank[rowid] = (i, cosine)
        def pick(repo: KnowledgeRepo) -> tuple[list[tuple[int, float]], dict[int, ChunkHit], set[int]]:
            # in a worker thread: the vector indexes' locks and the store are blocking
            unseen = set(lexical_ids) - self._indexes.holding_blocking(searched, lexical_ids) if searched else set()
            fused = fusion.fused_floor(fusion.fuse_scores(lexical, vector_legs, unseen=unseen),
                                       fusion.SCORE_RELATIVE_FLOOR)
            # rank on the little ranking needs; read whole rows only for the chosen few
            meta = repo.chunk_meta([rowid for rowid, _ in fused])
            picked = fusion.select(
                [(rowid, score) for rowid, score in fused if rowid in meta],  # deleted since the legs ran
                limit=limit, budget=budget,
                document=lambda item: meta[item[0]][0], tokens=lambda item: meta[item[0]][1],
            )
            return picked, repo.hits([rowid for rowid, _ in picked]), unseen

        picked, hits, unseen = await self._store.run(lambda s: pick(s.knowledge))
        chosen = [
            RetrievedChunk(
                chunk=hits[rowid], score=score,
                mode="hybrid" if searched and rowid not in unseen else "lexical",
                lexical_rank=lexical_rank.get(rowid),
                vector_rank=vector_rank[rowid][0] if rowid in vector_rank else None,
                cosine=vector_rank[rowid][1] if rowid in vector_rank else None,
            )
            for rowid, score in picked
            if rowid in hits
        ]
        return RetrievalResult(mode=mode, chunks=chosen, notes=notes)
