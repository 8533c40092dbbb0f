"""The SQL of ``sessions_v2`` on a connection (the seed's SessionManager storage side).

Owns: inserting, reading, listing, updating and deleting sessions, their ``session_tags``
mirror, and the counters (message_count, last_message_at, updated_at, totals).
Must stay true:
- ``session_tags`` holds exactly the tags of the JSON ``tags`` column (written together).
- message_count is the number of messages of the session (all branches) and
  last_message_at the newest message's created_at (None without messages).
- Every function runs inside the caller's transaction (SessionRepo's, or another
  repository's) and raises NotFound for unknown ids.
"""

from __future__ import annotations

from typing import Any, cast

import apsw
from msgspec import UNSET

from protocol import limits
from protocol.sessions import SessionFilter, SessionListResult, SessionUpdates
from protocol.types import SessionV2, Usage, UsageTotals
from sidecar.errors import InvalidParams, NotFound, StoreError
from sidecar.store.checks import (
    SORT_COLUMNS,
    check_choice,
    check_date_range,
    check_range,
    check_tags,
    check_text,
    check_workspace_dir,
)
from sidecar.store.rows import SESSION_COLUMNS, decode_usage_by_kind, session_from_row, session_values, to_json
from sidecar.usage_counts import MAX_TOTAL, plus

__all__ = ["MAX_LIST_LIMIT", "DEFAULT_TITLE"]

MAX_LIST_LIMIT = limits.MAX_SESSION_PAGE
DEFAULT_TITLE = "New Chat"
MAX_LIST_OFFSET = limits.MAX_OFFSET
_FEW_MATCHES = 2000
"""Below this many tag matches a list page is fetched through the tag index."""

_INSERT = (
    f"INSERT INTO sessions_v2 ({SESSION_COLUMNS}) VALUES ({', '.join('?' * len(SESSION_COLUMNS.split(',')))})"
)
_SELECT_ONE = f"SELECT {SESSION_COLUMNS} FROM sessions_v2 WHERE id = ?"
_PREFIXED_COLUMNS = ", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))


def _like_pattern(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"



def insert(conn: apsw.Connection, s: SessionV2) -> None:
    conn.execute(_INSERT, session_values(s))
    _write_tags(conn, s.id, s.tags)


def get(conn: apsw.Connection, session_id: str) -> SessionV2:
    rows = conn.execute(_SELECT_ONE, (session_id,)).fetchall()
    if not rows:
        raise NotFound(f"session {session_id!r} not found", data={"sessionId": session_id})
    return session_from_row(rows[0])


def exists(conn: apsw.Connection, session_id: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM sessions_v2 WHERE id = ?", (session_id,)).fetchall())


def require(conn: apsw.Connection, session_id: str) -> None:
    if not exists(conn, session_id):
        raise NotFound(f"session {session_id!r} not found", data={"sessionId": session_id})


def list_page(conn: apsw.Connection, flt: SessionFilter) -> SessionListResult:
    limit = check_range("limit", flt.limit, 1, MAX_LIST_LIMIT)
    offset = check_range("offset", flt.offset, 0, MAX_LIST_OFFSET)
    sort = check_choice("sortBy", flt.sort_by, SORT_COLUMNS)
    where: list[str] = []
    args: list[Any] = []
    if flt.search is not None:
        text = check_text("search", flt.search)
        if text and text.strip():
            where.append("(s.title LIKE ? ESCAPE '\\' OR s.summary LIKE ? ESCAPE '\\')")
            pat = _like_pattern(text.strip())
            args += [pat, pat]
    if flt.folder is not None:
        where.append("s.folder = ?")
        args.append(check_text("folder", flt.folder))
    tags = check_tags("tags", flt.tags) if flt.tags is not None else []
    if flt.is_archived is not None:
        where.append("s.is_archived = ?")
        args.append(_flag("isArchived", flt.is_archived))
    if flt.is_pinned is not None:
        where.append("s.is_pinned = ?")
        args.append(_flag("isPinned", flt.is_pinned))
    if flt.channel_id is not None:
        where.append("s.channel_id = ?")
        args.append(check_text("channelId", flt.channel_id))
    dates = check_date_range("dateRange", flt.date_range)
    if dates is not None:
        where.append(f"s.{sort} BETWEEN ? AND ?")
        args += list(dates)
    order = f" ORDER BY s.is_pinned DESC, s.{sort} DESC, s.id DESC"
    if not tags:
        return _page(conn, where, args, order, limit, offset)
    # Tags: the shape of the query decides which index drives it (measured on 100k
    # sessions, see tools/bench/bench_store.py). Rarest tag first: it drives, or is
    # the first probe to fail.
    if len(tags) > 1:
        freq: dict[str, int] = {str(t): cast(int, n) for t, n in conn.execute(
            "SELECT tag, count(*) FROM session_tags"
            f" WHERE tag IN ({', '.join('?' * len(tags))}) GROUP BY tag",
            tags,
        ).fetchall()}
        tags = sorted(tags, key=lambda t: freq.get(t, 0))
    # One EXISTS probe per tag (a correlated count(*) over the tags was 2.6x slower).
    has_tags = [
        "EXISTS (SELECT 1 FROM session_tags t WHERE t.session_id = s.id AND t.tag = ?)"
    ] * len(tags)
    if flt.folder is not None:
        # The folder's index (in list order, covering the id) drives one pass that
        # yields every match in order: the total and the page's ids at once.
        ids = [r[0] for r in conn.execute(
            f"SELECT s.id FROM sessions_v2 s WHERE {' AND '.join([*where, *has_tags])}{order}",
            [*args, *tags],
        )]
        return SessionListResult(
            sessions=_by_ids(conn, ids[offset : offset + limit]), total=len(ids)
        )
    # No folder: count inside the tag index; for few matches fetch them through it
    # too, for many walk the list order and stop after the page.
    tagged = "SELECT a.session_id FROM session_tags a WHERE a.tag = ?" + "".join(
        " AND EXISTS (SELECT 1 FROM session_tags b WHERE b.session_id = a.session_id"
        " AND b.tag = ?)"
        for _ in tags[1:]
    )
    tag_in = [f"s.id IN ({tagged})"]
    if where:
        total = cast(int, conn.execute(
            f"SELECT count(*) FROM sessions_v2 s WHERE {' AND '.join([*where, *tag_in])}",
            [*args, *tags],
        ).fetchall()[0][0])
    else:
        # Tags alone: counted in the tag index (every row has its session: foreign key).
        total = cast(int, conn.execute(f"SELECT count(*) FROM ({tagged})", tags).fetchall()[0][0])
    if offset >= total:
        return SessionListResult(sessions=[], total=total)
    shape = tag_in if total <= _FEW_MATCHES else has_tags
    page = _page(
        conn, [*where, *shape], [*args, *tags], order, limit, offset, total=total
    )
    return page


def _page(
    conn: apsw.Connection,
    where: list[str],
    args: list[Any],
    order: str,
    limit: int,
    offset: int,
    *,
    total: int | None = None,
) -> SessionListResult:
    """One page; the total is counted unless given (or evident from a short first page)."""
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    rows = conn.execute(
        f"SELECT {_PREFIXED_COLUMNS} FROM sessions_v2 s{clause}{order} LIMIT ? OFFSET ?",
        [*args, limit, offset],
    ).fetchall()
    sessions = [session_from_row(r) for r in rows]
    if total is not None:
        pass
    elif offset == 0 and len(sessions) < limit:
        total = len(sessions)
    else:
        total = cast(int, conn.execute(f"SELECT count(*) FROM sessions_v2 s{clause}", args).fetchall()[0][0])
    return SessionListResult(sessions=sessions, total=total)


def _by_ids(conn: apsw.Connection, ids: list[str]) -> list[SessionV2]:
    """Sessions in the order of ``ids``."""
    if not ids:
        return []
    found = {
        r[0]: session_from_row(r)
        for r in conn.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions_v2 WHERE id IN ({', '.join('?' * len(ids))})",
            ids,
        )
    }
    return [found[i] for i in ids if i in found]


def update(conn: apsw.Connection, session_id: str, u: SessionUpdates, now: int) -> bool:
    """Apply the fields that are given: a field left out (UNSET) keeps its value, None
    clears it to the default; returns False when there was nothing to change."""
    if not isinstance(u, SessionUpdates):
        raise InvalidParams("updates must be a SessionUpdates object")
    sets: list[str] = []
    args: list[Any] = []

    def put(column: str, value: Any) -> None:
        sets.append(f"{column} = ?")
        args.append(value)

    if u.title is not UNSET:
        if u.title is None:
            put("title", DEFAULT_TITLE)
        else:
            title = check_text("updates.title", u.title)
            if not title or not title.strip():
                raise InvalidParams("updates.title must not be empty")
            put("title", title)
    # Optional text fields: None or "" clears them (stored NULL).
    for field, column in (
        ("summary", "summary"),
        ("systemPrompt", "system_prompt"),
        ("folder", "folder"),
        ("channelId", "channel_id"),
    ):
        value = getattr(u, column)
        if value is not UNSET:
            put(column, check_text(f"updates.{field}", value) or None)
            if column == "summary":  # the user's own summary (never replaced automatically)
                put("summary_source", "user" if value else None)
    # None: the configured default (resolved when a reply starts)
    for field, column in (("providerId", "provider_id"), ("modelId", "model_id")):
        value = getattr(u, column)
        if value is not UNSET:
            put(column, check_text(f"updates.{field}", value) or "")
    if u.is_pinned is not UNSET:
        put("is_pinned", _flag("updates.isPinned", u.is_pinned if u.is_pinned is not None else False))
    if u.is_archived is not UNSET:
        put("is_archived", _flag("updates.isArchived", u.is_archived if u.is_archived is not None else False))
    if u.workspace_dir is not UNSET:
        workspace = None if u.workspace_dir is None else check_workspace_dir("updates.workspaceDir", u.workspace_dir)
        put("workspace_dir", workspace or None)
    if u.channel_meta is not UNSET:
        if u.channel_meta is not None and not isinstance(u.channel_meta, dict):
            raise InvalidParams("updates.channelMeta must be an object")
        put("channel_meta", to_json(u.channel_meta) if u.channel_meta else None)
    tags: list[str] | None = None
    if u.tags is not UNSET:
        tags = check_tags("updates.tags", u.tags) if u.tags is not None else []
        put("tags", to_json(tags))
    require(conn, session_id)
    if not sets:
        return False
    put("updated_at", now)
    conn.execute(f"UPDATE sessions_v2 SET {', '.join(sets)} WHERE id = ?", [*args, session_id])
    if tags is not None:
        _write_tags(conn, session_id, tags, replace=True)
    return True


def set_summary(
    conn: apsw.Connection, session_id: str, text: str, source: str, now: int, *, keep_users: bool
) -> bool:
    """Write ``summary`` as written by ``source``; with ``keep_users`` a summary that is not
    the sidecar's own (``summary_source`` other than 'ai') is left as it is. Returns
    whether it was written."""
    check_text("summary", text)
    check_choice("summarySource", source, frozenset({"user", "ai"}))
    guard = " AND (summary IS NULL OR summary = '' OR summary_source = 'ai')" if keep_users else ""
    conn.execute(
        f"UPDATE sessions_v2 SET summary = ?, summary_source = ?, updated_at = ? WHERE id = ?{guard}",
        (text or None, source if text else None, now, session_id),
    )
    if conn.changes():
        return True
    require(conn, session_id)
    return False


def set_flag(conn: apsw.Connection, session_id: str, column: str, value: bool, now: int) -> None:
    assert column in ("is_pinned", "is_archived")
    conn.execute(
        f"UPDATE sessions_v2 SET {column} = ?, updated_at = ? WHERE id = ?",
        (_flag(column, value), now, session_id),
    )
    if conn.changes() == 0:
        raise NotFound(f"session {session_id!r} not found", data={"sessionId": session_id})


def delete(conn: apsw.Connection, session_id: str) -> None:
    # Messages, search_docs (and through its trigger the FTS rows) and session_tags go
    # with the session by ON DELETE CASCADE.
    conn.execute("DELETE FROM sessions_v2 WHERE id = ?", (session_id,))
    if conn.changes() == 0:
        raise NotFound(f"session {session_id!r} not found", data={"sessionId": session_id})


def after_append(
    conn: apsw.Connection, session_id: str, created_at: int, leaf_id: str | None, now: int
) -> None:
    """Counters after one new message (and the active leaf when ``leaf_id`` is given)."""
    conn.execute(
        "UPDATE sessions_v2 SET message_count = coalesce(message_count, 0) + 1,"
        " last_message_at = max(coalesce(last_message_at, ?1), ?1),"
        " active_leaf_id = coalesce(?2, active_leaf_id), updated_at = ?3 WHERE id = ?4",
        (created_at, leaf_id, now, session_id),
    )


def recount(conn: apsw.Connection, session_id: str) -> None:
    """Recompute message_count and last_message_at from the messages themselves."""
    conn.execute(
        "UPDATE sessions_v2 SET"
        " message_count = (SELECT count(*) FROM messages_v2 WHERE session_id = ?1),"
        " last_message_at = (SELECT max(created_at) FROM messages_v2 WHERE session_id = ?1)"
        " WHERE id = ?1",
        (session_id,),
    )


def set_active_leaf(conn: apsw.Connection, session_id: str, leaf_id: str | None) -> None:
    conn.execute(
        "UPDATE sessions_v2 SET active_leaf_id = ? WHERE id = ?", (leaf_id, session_id)
    )


def touch(conn: apsw.Connection, session_id: str, now: int) -> None:
    conn.execute("UPDATE sessions_v2 SET updated_at = ? WHERE id = ?", (now, session_id))


def add_usage(conn: apsw.Connection, session_id: str, usage: Usage | None, cost: float, kind: str) -> None:
    """Add one call's usage and cost to the totals and to ``usage_by_kind[kind]``."""
    rows = conn.execute("SELECT usage_by_kind FROM sessions_v2 WHERE id = ?", (session_id,)).fetchall()
    if not rows:
        raise NotFound(f"session {session_id!r} not found", data={"sessionId": session_id})
    try:
        raw = rows[0][0]
        by_kind = decode_usage_by_kind(None if raw is None else str(raw), session_id)
    except StoreError:  # written by a newer build: start the breakdown again
        by_kind = {}
    u = usage or Usage()
    entry = by_kind.get(kind) or UsageTotals()

    def total(a: int, b: int | None) -> int:
        return plus(a, b, cap=MAX_TOTAL) or 0

    by_kind[kind] = UsageTotals(
        input_tokens=total(entry.input_tokens, u.input_tokens),
        output_tokens=total(entry.output_tokens, u.output_tokens),
        cache_read_tokens=total(entry.cache_read_tokens, u.cache_read_tokens),
        cache_write_tokens=total(entry.cache_write_tokens, u.cache_write_tokens),
        reasoning_tokens=total(entry.reasoning_tokens, u.reasoning_tokens),
        cost=entry.cost + cost,
        calls=entry.calls + 1,
    )
    tokens = total(u.input_tokens, u.output_tokens)
    conn.execute(
        "UPDATE sessions_v2 SET total_tokens = min(coalesce(total_tokens, 0), ? - ?) + ?,"
        " total_cost = coalesce(total_cost, 0) + ?, usage_by_kind = ? WHERE id = ?",
        (MAX_TOTAL, tokens, tokens, cost, to_json(dict(sorted(by_kind.items()))), session_id),
    )


def _write_tags(
    conn: apsw.Connection, session_id: str, tags: list[str], *, replace: bool = False
) -> None:
    if replace:
        conn.execute("DELETE FROM session_tags WHERE session_id = ?", (session_id,))
    if tags:
        conn.executemany(
            "INSERT OR IGNORE INTO session_tags(session_id, tag) VALUES (?, ?)",
            [(session_id, t) for t in tags],
        )


def _flag(field: str, value: Any) -> int:
    if not isinstance(value, bool):
        raise InvalidParams(f"{field} must be a boolean")
    return int(value)
