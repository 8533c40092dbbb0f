"""Hybrid ranking: fusion of ranked legs, the relevance floors, per-document diversity and
the token budget. Pure functions over ids; no I/O.

    fuse_scores       knowledge retrieval: each leg's scores relative to its own best, summed.
                      The lexical leg's BM25 as (score / best) ** LEXICAL_POWER; a vector leg's
                      cosine as (cos - base) / (best - base) with base = VECTOR_BASE * best
                      (0 below it), times SCORE_VECTOR_WEIGHT; each leg times its evidence:
                      its spread (best minus 10th score, relative to the best) over
                      SPREAD_FULL (LEXICAL_SPREAD_FULL), at most 1 (a leg whose scores are
                      level tells nothing apart and weighs in proportion). An id no vector leg could find (``unseen``) counts in each
                      vector leg as its lexical share, so it ranks as the words rank it
    fuse(legs, w)     memory retrieval, weighted RRF: score(id) = sum over legs of
                      w / (RRF_K + rank), rank from 1; the lexical leg weighs 1, a vector leg VECTOR_WEIGHT; an id no vector
                      leg could find (``unseen``: a chunk without a vector of a model that
                      ran, e.g. a document still waiting for its vectors) counts in the
                      vector leg at its lexical rank, so it ranks as the words rank it
                      instead of falling below the floor beside ids both legs found
    vector_floor      a vector leg keeps ids with cosine >= max(MIN_COSINE, best * VECTOR_RELATIVE_FLOOR)
    fused_floor       the fused list keeps ids with score >= best * FUSED_RELATIVE_FLOOR (RRF)
                      or SCORE_RELATIVE_FLOOR (``fuse_scores``)
    select            at most ``limit`` items, at most PER_DOCUMENT of one document unless
                      nothing else passes, within a budget of tokens

Why these floors: a vector leg always returns nearest neighbours, relevant or not, and
the absolute cosine of a relevant passage depends on the model (wordllama's paraphrase
matches sit around 0.3, a fixed floor above ~0.25 drops them), so the vector floor is
relative to the best cosine of the query with a small absolute minimum; the fused floor
is rank-based (RRF scores depend on ranks only): with the defaults an item found by one
leg only survives beside an item both legs ranked first down to rank 19 of the lexical leg
or rank 4 of a vector leg.
Why score fusion with evidence for knowledge: rank fusion (RRF) counts a leg's rank 1 the
same whether it is far ahead of rank 2 or level with it, so a weak vector leg moved a
clear lexical winner down ("Oct Function" below other "... Function" pages), and hybrid
was worse than the lexical leg on the Chinese half of the Debian set (MRR@10 0.603
against 0.676). Relative scores keep a leg's margins: a confident leg's winner stays ahead,
a leg whose scores are level (a weak model's cosines for a language it does not know sit
within a few percent of each other) adds little, and an id both legs score well rises.
The constants were calibrated on the calibration half of the Debian set (tools/bench/
bench_retrieval.py, ``in_calibration``: a hash of the page name) under the constraint that
hybrid recall@6 and MRR@10 be no lower than the better leg in each language there, then
checked on the held-out half (figures in the bench's output); LEXICAL_POWER again on the
calibration halves of the Debian set and of the LibreOffice help set together, all with
512-token chunks. With 412-token chunks the constraint held for each set as a whole but not
in every group (docs/knowledge.md: what was tried, and why a zero weight for a level vector
leg is not here). The constants fit wordllama: with a stronger model (all-MiniLM-L6-v2 in
English) hybrid ranked under the vector leg, and none of 16 settings tried held for three
models at once (docs/knowledge.md); the spread of a leg's scores does not tell a strong
model from a weak one.

The RRF constants below were tuned on the Debian evaluation set of tools/bench/bench_retrieval.py
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
    "LEXICAL_POWER",
    "SCORE_VECTOR_WEIGHT",
    "VECTOR_BASE",
    "SPREAD_FULL",
    "LEXICAL_SPREAD_FULL",
    "LEXICAL_KEPT_SHARE",
    "SCORE_RELATIVE_FLOOR",
    "fuse_scores",
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
LEXICAL_POWER = 2.5
"""How sharply the lexical leg's relative BM25 falls off below its best. 1.5 (calibrated on the
Debian set alone) left hybrid MRR@10 under the lexical leg's on the English LibreOffice help
set, whose pages are single chunks that share the query's words; 2.5 is the lowest of
1.5/2/2.5/3 under which hybrid recall@6 and MRR@10 are at least the better leg's in every
language of the calibration halves of both sets (then checked on their held-out halves)."""
SCORE_VECTOR_WEIGHT = 0.5
VECTOR_BASE = 0.8
SPREAD_FULL = 0.1
LEXICAL_SPREAD_FULL = 0.1
LEXICAL_KEPT_SHARE = 0.074
"""A chunk only the words found is kept down to this share of the best BM25 when the best
fused score is the lexical leg's alone (what the floor of 2% kept while LEXICAL_POWER was
1.5: 0.074 ** 1.5 = 0.02); with 2.5 and a floor of 2% it was 21%, and small bases lost
chunks a reply had cited."""
SCORE_RELATIVE_FLOOR = LEXICAL_KEPT_SHARE ** LEXICAL_POWER
"""The fused floor of ``fuse_scores``: a chunk under this share of the best fused score
(about 0.15%) is left out; it follows LEXICAL_POWER, so a sharper power moves the lexical
leg's order without dropping the chunks it ranks lower (a lower floor only adds chunks
after the ones kept: it never moves a rank)."""
SPREAD_RANK = 10


def _evidence(ordered: Sequence[float], full: float) -> float:
    """How much a leg's scores (best first) tell apart: its spread (best minus the
    SPREAD_RANK-th, relative to the best) over ``full``, at most 1; 1 for a short leg."""
    if len(ordered) < SPREAD_RANK or ordered[0] <= 0:
        return 1.0
    return min(1.0, max(0.0, ordered[0] - ordered[SPREAD_RANK - 1]) / ordered[0] / full)


def fuse_scores(
    lexical: Sequence[tuple[K, float]], vector_legs: Sequence[Sequence[tuple[K, float]]],
    *, unseen: Collection[K] = (),
) -> list[tuple[K, float]]:
    """Ids of the lexical leg's (id, BM25) and the vector legs' (id, cosine, above the vector
    floor) by their fused score (module docstring), best first (ties: first appearance)."""
    scores: dict[K, float] = {}
    lexical_share: dict[K, float] = {}
    if lexical:
        ordered = sorted((score for _, score in lexical), reverse=True)
        best = ordered[0]
        weight = _evidence(ordered, LEXICAL_SPREAD_FULL)
        for key, score in lexical:
            share = (max(0.0, score) / best) ** LEXICAL_POWER if best > 0 else 0.0
            lexical_share[key] = share
            scores[key] = scores.get(key, 0.0) + weight * share
    for leg in vector_legs:
        if not leg:
            continue
        cosines = sorted((cosine for _, cosine in leg), reverse=True)
        best = cosines[0]
        if best <= 0:
            continue
        weight = SCORE_VECTOR_WEIGHT * _evidence(cosines, SPREAD_FULL)
        base = VECTOR_BASE * best
        for key, cosine in leg:
            scores[key] = scores.get(key, 0.0) + weight * max(0.0, (cosine - base) / (best - base))
        for key in unseen:
            if key in lexical_share:
                scores[key] = scores.get(key, 0.0) + weight * lexical_share[key]
    order = {key: i for i, key in enumerate(dict.fromkeys(
        [key for key, _ in lexical] + [key for leg in vector_legs for key, _ in leg]))}
    return sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))


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


def fused_floor(ranked: Sequence[tuple[K, float]], relative: float = FUSED_RELATIVE_FLOOR) -> list[tuple[K, float]]:
    if not ranked:
        return []
    floor = ranked[0][1] * relative
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
