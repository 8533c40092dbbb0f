"""The full-text index of knowledge chunks: one contentless FTS5 table per base.

Owns: the name of a base's table (``table_of``), creating and dropping it, writing and
deleting its rows, rebuilding every base's table from ``kb_chunks`` (after a change of
``fts.index_text``), and the lexical leg of a search over bases (``LexicalIndex.search``).

Why one table per base: BM25's statistics (rows, average length, the document frequency
behind each term's IDF) and the pruning of common terms are a table's. With one table for
every base, a base's ranking changed when another base, never searched, was added, and
every query paid for the doclists of all bases. Now a base ranks the same whatever else
the data dir holds, and a search of several bases ranks each base on its own statistics
and merges by score (BM25 scores of bases of like text are comparable; a base's own order
is never changed by the merge).

Must stay true:
- a table name is built only from a hex digest of the base id, never from user text;
- every chunk has its row in its base's table, written, rewritten and deleted in the
  transaction that writes, changes or deletes the chunk (KnowledgeRepo); a base's table is
  dropped with the base;
- user text reaches MATCH only through ``fts`` quoting (``fts.retrieval_terms`` /
  ``fts.retrieval_match``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sidecar.store import fts, kb_segment
from sidecar.store.db import fetch_all

__all__ = ["table_of", "create", "drop", "write", "delete", "rebuild_all", "LexicalIndex", "LEXICAL_BUDGET"]

LEXICAL_BUDGET = 10_000
"""Chunks of one base a lexical query ranks at most (about 10 ms at 10^5 chunks): see ``search``."""
DF_CACHE_ENTRIES = 50_000
TOKENIZER = "porter unicode61 remove_diacritics 2"


def table_of(kb_id: str) -> str:
    """The FTS5 table of a base: ``kb_fts_`` and a digest of its id (safe as an identifier)."""
    return "kb_fts_" + hashlib.blake2b(kb_id.encode(), digest_size=8).hexdigest()


def create(conn: Any, kb_id: str) -> None:
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {table_of(kb_id)} USING fts5("
        f"body, content = '', contentless_delete = 1, tokenize = '{TOKENIZER}')"
    )


def drop(conn: Any, kb_id: str) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table_of(kb_id)}")


def write(conn: Any, kb_id: str, rows: Iterable[tuple[int, str]]) -> None:
    """Index (chunk rowid, ``fts.index_text`` of its embed text) rows of a base."""
    conn.executemany(f"INSERT INTO {table_of(kb_id)}(rowid, body) VALUES (?, ?)", rows)


def delete(conn: Any, kb_id: str, rowids: Sequence[int]) -> None:
    conn.executemany(f"DELETE FROM {table_of(kb_id)} WHERE rowid = ?", [(r,) for r in rowids])


def rebuild_all(conn: Any, rows_of: Callable[[Any, str], Iterable[tuple[int, str]]] | None = None) -> int:
    """Write every base's table again from its chunks (created when missing); how many rows.
    ``rows_of(conn, kb_id)``: the (rowid, row text) of a base's chunks (``kb_common.rows_of``,
    their common lines left out); None: every chunk's whole embedded text (the schema before
    ``kb_lines``, migrations 26 and 30)."""
    from sidecar.store.kb_records import embed_text, heading_decoder

    def whole(conn: Any, kb_id: str) -> Iterable[tuple[int, str]]:
        for rowid, heading, text in conn.execute("SELECT rowid, heading, text FROM kb_chunks WHERE kb_id = ?", (kb_id,)):
            yield rowid, fts.index_text(embed_text(heading_decoder.decode(heading), text))

    count = 0
    for (kb_id,) in fetch_all(conn, "SELECT id FROM kb_bases"):
        create(conn, kb_id)
        count += fts.rebuild(conn, table_of(kb_id), ("body",), (rows_of or whole)(conn, kb_id))
    return count


class LexicalIndex:
    """The lexical leg over the bases' tables, with a cache of document frequencies per base."""

    def __init__(self) -> None:
        self._df: dict[tuple[str, str], tuple[int, int]] = {}
        self._lock = threading.Lock()

    def search(self, conn: Any, sizes: dict[str, int], query: str, limit: int) -> list[tuple[int, float]]:
        """(rowid, BM25 score, higher is better) of the best ``limit`` chunks of the bases
        ``sizes`` names (base id -> its number of chunks), each base ranked on its own table.

        What keeps it fast at 10^5 chunks (measured in tools/bench/bench_retrieval.py):
        ranking is paid per matching chunk, so the terms a base ranks are
        ``fts.affordable_terms`` within LEXICAL_BUDGET of its chunks: rarest first, the
        commonest dropped while a rarer one remains (they weigh least in BM25 anyway), from
        the base's own document frequencies (a count capped just above the budget, cached:
        they change slowly, and only this decision uses them); a query whose rarest term
        alone is in more of the base's chunks than the budget ranks the newest
        LEXICAL_BUDGET of them (a term that common barely separates chunks: the vector leg
        carries such a query). A bigram of an unspaced CJK run that straddles a word boundary
        in the base (``kb_segment.straddling_terms``) scores only in chunks that also match
        one of the query's other kept terms."""
        terms = fts.retrieval_terms(query)
        if not terms:
            return []
        found: list[tuple[int, float]] = []
        for kb_id, size in sizes.items():
            if size > 0:
                found.extend(self._search_base(conn, kb_id, size, query, terms, limit))
        found.sort(key=lambda hit: (-hit[1], hit[0]))
        return found[:limit]

    def _search_base(
        self, conn: Any, kb_id: str, size: int, query: str, terms: list[str], limit: int
    ) -> list[tuple[int, float]]:
        table = table_of(kb_id)

        def doc_freq(term: str) -> int:
            return self._doc_freq(conn, kb_id, table, term, LEXICAL_BUDGET + 1, size)

        counts = [doc_freq(t) for t in terms]
        kept = fts.affordable_terms(counts, size, LEXICAL_BUDGET)
        if not kept:
            return []
        sampled = len(kept) == 1 and counts[kept[0]] > LEXICAL_BUDGET
        expr = fts.retrieval_match([terms[i] for i in kept])
        ranked = f"SELECT rowid AS id, bm25({table}) AS r FROM {table} WHERE {table} MATCH ?"
        if sampled:
            ranked += f" ORDER BY rowid DESC LIMIT {LEXICAL_BUDGET}"
        args: list[Any] = [expr]
        straddling = kb_segment.straddling_terms(query, doc_freq, size) if len(kept) > 1 else set()
        words = [terms[i] for i in kept if terms[i] not in straddling]
        if words and len(words) < len(kept):
            # a bigram across a word boundary of the query counts only beside one of its words;
            # ``+id``: a rowid constraint pushed into the FTS table would run the MATCH once per id
            ranked = f"SELECT id, r FROM ({ranked}) WHERE +id IN (SELECT rowid FROM {table} WHERE {table} MATCH ?)"
            args.append(fts.retrieval_match(words))
        rows = fetch_all(conn, f"SELECT id, r FROM ({ranked}) ORDER BY r, id LIMIT ?", [*args, limit])
        return [(rowid, -score) for rowid, score in rows]

    def _doc_freq(self, conn: Any, kb_id: str, table: str, term: str, cap: int, size: int) -> int:
        """How many of a base's chunks hold ``term``, counted up to ``cap`` (cached while the
        base's number of chunks stays within a fifth of what it was)."""
        key = (kb_id, term)
        with self._lock:
            known = self._df.get(key)
        if known is not None and abs(known[1] - size) <= size // 5:
            return known[0]
        count = int(fetch_all(conn,
            f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT ?)", (term, cap)
        )[0][0])
        with self._lock:
            if len(self._df) >= DF_CACHE_ENTRIES:
                self._df.clear()
            self._df[key] = (count, size)
        return count
