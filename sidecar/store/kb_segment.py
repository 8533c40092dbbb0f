"""Where an unspaced CJK query run crosses a word boundary, judged from one base's own statistics.

Owns: ``straddling_terms``, the MATCH terms of a query's bigrams that straddle a boundary
between its words in a base.

Why: the index holds CJK text as overlapping bigrams (``fts.index_text``), and a query run
such as 定义对象边框 (define / object / border) also yields the bigrams across its word
boundaries (义对, 象边). Those are rare in a base, so BM25 weighs them most, and chunks that
hold them inside other words (意义对照, 形象边缘) but none of the query's words outrank the
pages about the words. Dropping them costs more than it saves (measured on the Debian set):
a page that holds the query's phrase holds its straddling bigrams too, and they are its
best evidence. So a straddling bigram keeps its weight, but counts only in a chunk that
also holds one of the query's other terms (kb_lexical.py filters the ranking).

A dictionary would say where the words are; the bundle has no room for one, and the base
itself says enough: the characters of a word are adjacent in far more chunks than chance
predicts, the two characters of a straddling bigram in fewer. A bigram ``ab`` straddles
when its cohesion, ``df(ab) * N / (df(a) * df(b))`` over the base's N chunks (df: chunks
that hold it, ``a*`` counting those that hold the character), is below ``MIN_COHESION``.

Must stay true:
- plain bigrams are the fallback: a run none of whose bigrams is cohesive (a base that does
  not know its characters, a phrase of particles) has no straddling term, and a run of two
  characters is one bigram, never split;
- only counts of the base's own index decide (a base ranks the same whatever other bases
  hold); a capped character count makes a bigram look more cohesive, so a cap errs on the
  side of plain bigrams.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.store import fts

__all__ = ["straddling_terms", "MIN_COHESION"]

MIN_COHESION = 1.0
"""Characters adjacent in fewer chunks than two independent characters would share are
taken for the two sides of a word boundary."""


def straddling_terms(query: str, doc_freq: Callable[[str], int], size: int) -> set[str]:
    """The MATCH terms (as ``fts.retrieval_terms`` writes them) of the query's CJK bigrams
    that straddle a word boundary in a base of ``size`` chunks; ``doc_freq(term)`` counts
    the base's chunks that match a MATCH term."""
    found: set[str] = set()
    for piece in fts.parse_query(query[: fts.MAX_QUERY_CHARS]):
        if piece.cjk and len(piece.text) > 2 and size > 0:
            found |= _straddling(piece.text, doc_freq, size)
    return found


def _straddling(run: str, doc_freq: Callable[[str], int], size: int) -> set[str]:
    chars = {c: doc_freq(_term(c)) for c in run}
    apart: set[str] = set()
    cohesive = False
    for a, b in zip(run[:-1], run[1:]):
        term = _term(a + b)
        both = doc_freq(term)
        if both > 0 and both * size >= MIN_COHESION * chars[a] * chars[b]:
            cohesive = True
        else:
            apart.add(term)
    return apart if cohesive else set()


def _term(unit: str) -> str:
    term = fts.build_match([fts.QueryPiece(unit, True)])
    assert term is not None  # a CJK unit of one or two characters always has its term
    return term
