"""Lines a knowledge base's documents repeat (a "<Product> Help" header, a footer), kept out of its index.

Owns: the ``kb_lines`` table (per base: how many of its indexed documents hold each line, and
whether the line is common), counting a document's lines in and out (``count``), deciding the
base's common set (``settle``, ``common_of``), the text of a chunk that is indexed and
embedded (``stripped``, ``index_row``), and the full-text rows a change of the set alters
(``changed_rows``; KnowledgeRepo writes them).

A line is a line of a document's extracted text, compared folded, whitespace collapsed and
leading Markdown heading marks dropped; blank lines never count. It becomes common when at
least ``MIN_DOCS`` documents and ``ENTER_SHARE`` of the base's indexed documents hold it, and
stops being common below ``LEAVE_SHARE`` (or ``MIN_DOCS``): the gap keeps a line near the
threshold from flipping with every document added, since each flip rewrites rows.

Must stay true:
- only what is indexed changes: a chunk's stored text, offsets, id and the document's body
  keep every line (citations and chunk offsets are those of the document);
- the counts move in the transaction that indexes, re-indexes or deletes a document, and a
  change of the common set rewrites, in that transaction, the full-text row of every chunk of
  the base whose indexed text changes; vectors are not remade then (a chunk is embedded
  without the lines common when it is (re)indexed: re-indexing a document brings its vectors
  up to date, through its embedding provider);
- a table of the base's rows only, keyed by a digest of the line (no line text is stored).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

from sidecar.store import fts
from sidecar.store.db import fetch_all
from sidecar.store.kb_records import embed_text, heading_decoder

__all__ = [
    "MIN_DOCS", "ENTER_SHARE", "LEAVE_SHARE", "line_keys", "stripped", "embedded", "common_of", "count", "settle",
    "index_row", "changed_rows", "rows_of",
]

MIN_DOCS = 5
ENTER_SHARE = 0.5
LEAVE_SHARE = 0.4


def _key(line: str) -> int | None:
    folded = " ".join(fts.fold(line).split()).lstrip("# ").strip()
    if not folded:
        return None
    return int.from_bytes(hashlib.blake2b(folded.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big", signed=True)


def line_keys(text: str) -> set[int]:
    """The keys of the distinct non-blank lines of ``text``."""
    return {k for k in map(_key, text.splitlines()) if k is not None}


def stripped(text: str, common: frozenset[int]) -> str:
    """``text`` without its lines whose key is in ``common``."""
    if not common:
        return text
    lines = text.splitlines()
    kept = [line for line in lines if _key(line) not in common]
    return text if len(kept) == len(lines) else "\n".join(kept)


def embedded(text: str, common: frozenset[int]) -> str:
    """What is embedded of a chunk's embedded text: without the common lines, unless nothing
    else is left (a provider is never sent an empty text)."""
    kept = stripped(text, common)
    return kept if kept.strip() else text


def common_of(conn: Any, kb_id: str) -> frozenset[int]:
    return frozenset(r[0] for r in fetch_all(conn, "SELECT line FROM kb_lines WHERE kb_id = ? AND common = 1", (kb_id,)))


def count(conn: Any, kb_id: str, removed: str | None, added: str | None) -> None:
    """Count a document's lines out (``removed``: the body it had indexed) and in (``added``:
    the body it is indexed with now)."""
    out = line_keys(removed) if removed is not None else set()
    into = line_keys(added) if added is not None else set()
    conn.executemany(
        "UPDATE kb_lines SET docs = docs - 1 WHERE kb_id = ? AND line = ?", [(kb_id, k) for k in out - into]
    )
    conn.executemany(
        "INSERT INTO kb_lines(kb_id, line, docs, common) VALUES (?, ?, 1, 0)"
        " ON CONFLICT(kb_id, line) DO UPDATE SET docs = docs + 1",
        [(kb_id, k) for k in into - out],
    )
    conn.executemany(
        "DELETE FROM kb_lines WHERE kb_id = ? AND line = ? AND docs <= 0", [(kb_id, k) for k in out - into]
    )


def settle(conn: Any, kb_id: str, documents: int) -> tuple[frozenset[int], frozenset[int]]:
    """Bring the base's common set up to date for its ``documents`` counted documents:
    (the set before, the set after). Both updates are range scans of ``idx_kb_lines_common``
    (kb_id, common, docs): a document's indexing never reads every line of its base."""
    enter = max(MIN_DOCS, math.ceil(ENTER_SHARE * documents))
    leave = max(MIN_DOCS, math.ceil(LEAVE_SHARE * documents))
    before = common_of(conn, kb_id)
    conn.execute("UPDATE kb_lines SET common = 1 WHERE kb_id = ? AND common = 0 AND docs >= ?", (kb_id, enter))
    conn.execute("UPDATE kb_lines SET common = 0 WHERE kb_id = ? AND common = 1 AND docs < ?", (kb_id, leave))
    return before, common_of(conn, kb_id)


def index_row(heading: list[str], text: str, common: frozenset[int]) -> str:
    """The full-text row of a chunk: its embedded text without the base's common lines."""
    return fts.index_text(stripped(embed_text(heading, text), common))


def changed_rows(conn: Any, kb_id: str, before: frozenset[int], after: frozenset[int]) -> list[tuple[int, str]]:
    """(rowid, full-text row) of the base's chunks whose row differs between the common sets
    ``before`` and ``after``."""
    changed: list[tuple[int, str]] = []
    if before == after:
        return changed
    for rowid, heading, text in conn.execute("SELECT rowid, heading, text FROM kb_chunks WHERE kb_id = ?", (kb_id,)):
        full = embed_text(heading_decoder.decode(heading), text)
        now = stripped(full, after)
        if now != stripped(full, before):
            changed.append((rowid, fts.index_text(now)))
    return changed


def rows_of(conn: Any, kb_id: str) -> Iterable[tuple[int, str]]:
    """(rowid, full-text row) of every chunk of a base, for a rebuild of its table."""
    common = common_of(conn, kb_id)
    for rowid, heading, text in conn.execute("SELECT rowid, heading, text FROM kb_chunks WHERE kb_id = ?", (kb_id,)):
        yield rowid, index_row(heading_decoder.decode(heading), text, common)
