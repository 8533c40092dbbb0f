"""The ranking function of message search: Okapi BM25 as an FTS5 auxiliary function.

Owns ``bm25`` and the name it is registered under on every connection (sidecar/store/db.py
``_configure``), which the search queries call it by (sidecar/store/search.py). It is
kept out of sidecar/store/fts.py (the indexed text and the queries), which opening a
connection does not need.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BM25_FUNCTION", "bm25"]

BM25_FUNCTION = "chat_bm25"
"""Name of ``bm25`` as an FTS5 auxiliary function (registered on every connection)."""
_K1 = 1.2
_B = 0.75


def bm25(api: Any, n_body: int, *doc_freqs: int) -> float:
    """Okapi BM25 of the current row over its ``body`` column (higher is better).

    FTS5's built-in bm25() first counts every document of each phrase to get its IDF,
    which costs as much as the phrase is common (25 ms for a word in 30% of a million
    messages) even when only a few thousand rows are ranked. Here the caller passes the
    document frequency of each of the first ``n_body`` phrases (the query's words; the
    phrases after them are the session/role filters and do not score), counted up to a
    cap; a negative value means "same IDF for all" (a one-word query, where IDF does not
    change the order). k1 = 1.2, b = 0.75, as FTS5.
    """
    ctx = api.aux_data
    if ctx is None:
        n_docs = max(1, api.row_count)
        avg_len = max(1.0, api.column_total_size(0) / n_docs)
        idf = [
            1.0 if df < 0 else max(1e-6, math.log((n_docs - df + 0.5) / (df + 0.5)))
            for df in doc_freqs
        ]
        ctx = api.aux_data = (avg_len, idf)
    avg_len, idf = ctx
    norm = _K1 * (1.0 - _B + _B * api.column_size(0) / avg_len)
    score = 0.0
    for i in range(n_body):
        tf = len(api.phrase_locations(i)[0])
        if tf:
            score += idf[i] * tf * (_K1 + 1.0) / (tf + norm)
    return score
