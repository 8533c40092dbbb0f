"""The message search index (FTS5) and chat:messages:search: SearchRepo, and the index
written on a connection by whoever stores a final message.

Owns: which messages are in ``messages_fts`` and how a query is answered.
Must stay true:
- A message is indexed when it reaches a final status (completed, error, aborted) and only
  then; streaming updates never touch the index (they are frequent and partial).
- Deleting a message removes its index row (search_docs cascades from messages_v2 and a
  trigger deletes the FTS row), so results never name a message that is gone.
- The MATCH expression is built by ``fts.build_match`` from quoted pieces only.
- Ranking is Okapi BM25 (``bm25.bm25``, higher is better) over the newest SEARCH_WINDOW
  matches that pass every filter (widened to reach the requested page), with document
  frequencies counted up to DOC_FREQ_CAP, so the cost of a query is bounded, not
  proportional to how common its words are; a query with fewer matches (and rarer words)
  is ranked exactly over all. Filters are applied before the window is cut, never after,
  so an old message inside a date range (or in a non-archived session) is always found.
"""

from __future__ import annotations

from collections.abc import Iterable

import apsw

from protocol import limits
from protocol.messages import SearchOptions
from protocol.types import FINAL_MESSAGE_STATUSES, SearchResult
from sidecar.errors import InvalidParams
from sidecar.store import bm25, fts
from sidecar.store.checks import ROLES, check_choice, check_date_range, check_range
from sidecar.store.rows import parts_or_none, searchable_text
from sidecar.store.db import Database, fetch_all

__all__ = ["SearchRepo", "SEARCH_WINDOW", "index", "reindex_all", "rebuild", "search"]

_INSERT_DOC = "INSERT INTO search_docs(message_id) VALUES (?)"
_INSERT_FTS = (
    "INSERT INTO messages_fts(rowid, body, sid, role)"
    " VALUES ((SELECT docid FROM search_docs WHERE message_id = ?), ?, ?, ?)"
)

SEARCH_WINDOW = 3000
"""How many of the newest matches are ranked (see search)."""
DOC_FREQ_CAP = 10_000
"""Document frequencies for IDF are counted up to this (beyond it a word is just common)."""

_RESULT_COLUMNS = (
    "d.message_id, m.session_id, s.title, m.role, m.text_content, m.parts, m.created_at"
)



def index(
    conn: apsw.Connection, docs: Iterable[tuple[str, str, str, str]], *, fresh: bool = False
) -> int:
    """Index (or re-index) messages, given as (message_id, session_id, role, searchable
    text); empty texts are skipped. ``fresh``: none of them is indexed yet."""
    rows = [d for d in docs if d[3].strip()]
    if not rows:
        return 0
    if not fresh:
        conn.executemany(
            "DELETE FROM search_docs WHERE message_id = ?", [(d[0],) for d in rows]
        )
    conn.executemany(_INSERT_DOC, [(d[0],) for d in rows])
    conn.executemany(
        _INSERT_FTS,
        [(mid, fts.index_text(text), fts.session_token(sid), role) for mid, sid, role, text in rows],
    )
    return len(rows)


def reindex_all(conn: apsw.Connection) -> int:
    """Rebuild the whole index from messages_v2 (used by the migration that creates it)."""
    conn.execute("DELETE FROM search_docs")
    final = tuple(sorted(FINAL_MESSAGE_STATUSES))
    cur = conn.execute(
        "SELECT id, session_id, role, text_content, parts FROM messages_v2"
        f" WHERE coalesce(status, 'completed') IN ({','.join('?' * len(final))})",
        final,
    )
    docs = [
        (mid, sid, role, searchable_text(text, parts_or_none(parts, mid)))
        for mid, sid, role, text, parts in cur
    ]
    return index(conn, docs, fresh=True)


def rebuild(conn: apsw.Connection) -> int:
    """Write every index row again from its message, keeping the docids (after a change
    of ``fts.index_text``: the migration that folds width and case)."""
    return fts.rebuild(conn, "messages_fts", ("body", "sid", "role"), (
        (docid, fts.index_text(searchable_text(text, parts_or_none(parts, mid))), fts.session_token(sid), role)
        for docid, mid, sid, role, text, parts in conn.execute(
            "SELECT d.docid, m.id, m.session_id, m.role, m.text_content, m.parts FROM search_docs d"
            " JOIN messages_v2 m ON m.id = d.message_id"
        )
    ))


def search(conn: apsw.Connection, query: str, options: SearchOptions) -> list[SearchResult]:
    if not isinstance(query, str):
        raise InvalidParams("query must be a string")
    if len(query) > fts.MAX_QUERY_CHARS:
        raise InvalidParams(f"query is longer than {fts.MAX_QUERY_CHARS} characters")
    limit = check_range("options.limit", options.limit, 1, limits.MAX_SEARCH_PAGE)
    offset = check_range("options.offset", options.offset, 0, limits.MAX_SEARCH_OFFSET)
    dates = check_date_range("options.dateRange", options.date_range)
    pieces = fts.parse_query(query)
    expr = fts.build_match(pieces)
    if expr is None:
        return []
    if options.session_id is not None:
        expr += ' AND {sid} : "' + fts.session_token(options.session_id) + '"'
    if options.role is not None:
        expr += ' AND {role} : "' + check_choice("options.role", options.role, ROLES) + '"'

    # Filters that FTS cannot answer (the exact session id, dates, archived) are
    # applied inside the ranking window, so the window holds the newest matches that
    # pass them: a match older than the newest SEARCH_WINDOW unfiltered ones is still
    # found when the filters leave fewer than that.
    where: list[str] = []
    args: list[object] = []
    if options.session_id is not None:
        # The sid token is a hash: confirm the real id (a collision would only drop rows).
        where.append("m.session_id = ?")
        args.append(options.session_id)
    if dates is not None:
        where.append("d.created_at BETWEEN ? AND ?")  # no message row needed for dates
        args.extend(dates)
    if not options.include_archived:
        where.append("coalesce(s.is_archived, 0) = 0")
    need_message = options.session_id is not None or not options.include_archived

    # Ranking window: bm25 is computed for the newest SEARCH_WINDOW matches (FTS5
    # walks the doclist newest-first and stops there), and the best of those are
    # returned. A query matching fewer messages is ranked over all of them; a very
    # common word costs the same as one matching SEARCH_WINDOW messages instead of
    # growing with the whole history (see bm25.bm25 for why not FTS5's own bm25).
    window = max(SEARCH_WINDOW, offset + limit)
    doc_freqs = [-1] if len(pieces) == 1 else [
        fetch_all(
            conn,
            "SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ?"
            " LIMIT ?)",
            (fts.build_match([p]), DOC_FREQ_CAP),
        )[0][0]
        for p in pieces
    ]
    score_args = ", ".join(["?"] * (1 + len(doc_freqs)))
    filter_joins = ""
    if where:
        filter_joins = (
            " JOIN search_docs d ON d.docid = messages_fts.rowid"
            + (" JOIN messages_v2 m ON m.id = d.message_id" if need_message else "")
            + (" JOIN sessions_v2 s ON s.id = m.session_id" if not options.include_archived else "")
        )
    ranked = (
        "w(docid, score) AS MATERIALIZED ("
        f" SELECT messages_fts.rowid, {bm25.BM25_FUNCTION}(messages_fts, {score_args})"
        f" FROM messages_fts{filter_joins}"
        " WHERE messages_fts MATCH ?"
        + "".join(" AND " + w for w in where)
        + " ORDER BY messages_fts.rowid DESC LIMIT ?)"
    )
    # Only the requested page of the window is joined for its columns.
    sql = (
        f"WITH {ranked}, h(docid, score) AS MATERIALIZED ("
        " SELECT docid, score FROM w ORDER BY score DESC, docid DESC LIMIT ? OFFSET ?)"
        f" SELECT {_RESULT_COLUMNS}, h.score FROM h"
        " JOIN search_docs d ON d.docid = h.docid"
        " JOIN messages_v2 m ON m.id = d.message_id"
        " JOIN sessions_v2 s ON s.id = m.session_id"
        " ORDER BY h.score DESC, h.docid DESC"
    )
    rows = fetch_all(
        conn,
        sql, [len(pieces), *doc_freqs, expr, *args, window, limit, offset]
    )
    results: list[SearchResult] = []
    for mid, sid, title, role, text, parts, created_at, score in rows:
        body = searchable_text(text, parts_or_none(parts, mid))
        results.append(
            SearchResult(
                session_id=sid,
                session_title=title,
                message_id=mid,
                role=role,
                snippet=fts.snippet(body, pieces),
                created_at=created_at,
                score=float(score),
            )
        )
    return results


class SearchRepo:
    """Full-text search of messages (the index is written by MessageRepo and imports)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def messages(self, query: str, options: SearchOptions | None = None) -> list[SearchResult]:
        o = options if options is not None else SearchOptions()
        if not isinstance(o, SearchOptions):
            raise InvalidParams("options must be SearchOptions")
        with self._db.read() as conn:
            return search(conn, query, o)
