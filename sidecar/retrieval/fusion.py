"""Hybrid ranking: reciprocal-rank fusion of ranked legs, the relevance floor, per-document
diversity and the token budget. Pure functions over ids; no I/O.

    fuse(legs, w)     weighted RRF: score(id) = sum over legs of w / (RRF_K + rank), rank from 1;
                      the lexical leg weighs 1, a vector leg VECTOR_WEIGHT; an id no vector
                      leg could find (``unseen``: a chunk without a vector of a model that
                      ran, e.g. a document still waiting for its vectors) counts in the
                      vector leg at its lexical rank, so it ranks as the words rank it
                      instead of falling below the floor beside ids both legs found
    vector_floor      a vector leg keeps ids with cosine >= max(MIN_COSINE, best * VECTOR_RELATIVE_FLOOR)
    fused_floor       the fused list keeps ids with score >= best * FUSED_RELATIVE_FLOOR
    select            at most ``limit`` items, at most PER_DOCUMENT of one document unless
                      nothing else passes, within a budget of tokens

Why these floors: a vector leg always returns nearest neighbours, relevant or not, and
the absolute cosine of a relevant passage depends on the model (wordllama's paraphrase
matches sit around 0.3, a fixed floor above ~0.25 drops them), so the vector floor is
relative to the best cosine of the query with a small absolute minimum; the fused floor
is rank-based (RRF scores depend on ranks only): with the defaults an item found by one
leg only survives beside an item both legs ranked first down to rank 19 of the lexical leg
or rank 4 of a vector leg.
The constants were tuned on the Debian evaluation set of tools/bench/bench_retrieval.py
(673 known-item queries, English and Chinese, wordllama vectors): plain RRF (k = 60, equal
weights) made hybrid WORSE than the lexical leg alone (recall@6 0.725 against 0.793: the
English-centric vectors push noise above exact Chinese matches); k = 10 with the vector leg
at half weight gives 0.819 (MRR 0.619 against 0.610), better than either leg in both
languages. A small k lets the top ranks of each leg decide. Memory retrieval uses the
same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import TypeVar

__all__ = [
    "RRF_K",
    "VECTOR_WEIGHT",
    "MIN_COSINE",
    "VECTOR_RELATIVE_FLOOR",
    "FUSED_RELATIVE_FLOOR",
    "PER_DOCUMENT",
    "fuse",
    "vector_floor",
    "fused_floor",
    "select",
]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

RRF_K = 10
VECTOR_WEIGHT = 0.5
MIN_COSINE = 0.05
VECTOR_RELATIVE_FLOOR = 0.5
FUSED_RELATIVE_FLOOR = 0.25
PER_DOCUMENT = 3


def fuse(
    legs: Sequence[Sequence[K]], weights: Sequence[float] | None = None, k: int = RRF_K,
    *, unseen: Collection[K] = (), unseen_weight: float = VECTOR_WEIGHT,
) -> list[tuple[K, float]]:
    """Ids of all legs by their weighted RRF score, best first (ties: first appearance).
    An id of ``unseen`` (one the other legs could not have found) also scores
    ``unseen_weight`` at its rank in the first leg."""
    scores: dict[K, float] = {}
    for i, leg in enumerate(legs):
        weight = weights[i] if weights is not None else 1.0
        for rank, key in enumerate(leg, start=1):
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    if unseen and legs:
        for rank, key in enumerate(legs[0], start=1):
            if key in unseen:
                scores[key] += unseen_weight / (k + rank)
    order = {key: i for i, key in enumerate(dict.fromkeys(key for leg in legs for key in leg))}
    return sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))


def vector_floor(hits: Sequence[tuple[K, float]]) -> list[tuple[K, float]]:
    """A vector leg's (id, cosine) hits, best first, without those below the floor."""
    if not hits:
        return []
    best = max(score for _, score in hits)
    floor = max(MIN_COSINE, best * VECTOR_RELATIVE_FLOOR)
    return [(key, score) for key, score in hits if score >= floor]


def fused_floor(ranked: Sequence[tuple[K, float]]) -> list[tuple[K, float]]:
    if not ranked:
        return []
    floor = ranked[0][1] * FUSED_RELATIVE_FLOOR
    return [(key, score) for key, score in ranked if score >= floor]


def select(
    items: Sequence[T],
    *,
    limit: int,
    budget: int | None,
    document: Callable[[T], Hashable],
    tokens: Callable[[T], int],
    per_document: int = PER_DOCUMENT,
) -> list[T]:
    """Items in their order: at most ``per_document`` of one document while others pass
    (then the held-back ones fill what is left, in order), at most ``limit``, and their
    ``tokens`` adding up to at most ``budget`` (an item that does not fit is skipped)."""
    chosen: list[T] = []
    held: list[T] = []
    per: dict[Hashable, int] = {}
    spent = 0

    def fits(item: T) -> bool:
        return budget is None or spent + tokens(item) <= budget

    for item in items:
        if len(chosen) >= limit:
            break
        doc = document(item)
        if per.get(doc, 0) >= per_document:
            held.append(item)
            continue
        if not fits(item):
            continue
        chosen.append(item)
        spent += tokens(item)
        per[doc] = per.get(doc, 0) + 1
    for item in held:
        if len(chosen) >= limit:
            break
        if fits(item):
            chosen.append(item)
            spent += tokens(item)
    if len(chosen) > 1:
        position = {id(item): i for i, item in enumerate(items)}
        chosen.sort(key=lambda item: position[id(item)])
    return chosen
