"""The SQL of ``messages_v2`` on a connection: its rows and the message tree they form.

Owns: inserting messages, reading one, a path root -> leaf, a whole session, the newest
leaf below a message, streaming updates and finishing.
Must stay true:
- The tree is ``parent_id`` links inside one session; creation order is
  (created_at, id) — ids are UUIDv7, so ties within a millisecond keep their order.
- A streaming update is one UPDATE of the content columns and nothing else (no index,
  no counters); only a message that is still pending/streaming can be updated or finished.
- Every function runs inside the caller's transaction (MessageRepo's, or another
  repository's).
"""

from __future__ import annotations

import apsw

from protocol.errors import ErrorCode
from protocol.types import MessageV2
from sidecar.errors import NotFound, StoreError
from sidecar.store.files import data_dir_of, record_message_files, record_messages_files
from sidecar.store.rows import MESSAGE_COLUMNS, message_from_row, message_values

__all__ = ["MAX_DEPTH"]

MAX_DEPTH = 1_000_000
"""Guard on tree walks: a corrupted parent cycle ends the walk instead of looping."""

_INSERT = f"INSERT INTO messages_v2 ({MESSAGE_COLUMNS}) VALUES ({', '.join('?' * len(MESSAGE_COLUMNS.split(',')))})"
_M_COLUMNS = ", ".join("m." + c.strip() for c in MESSAGE_COLUMNS.split(","))
_SELECT_ONE = f"SELECT {MESSAGE_COLUMNS} FROM messages_v2 WHERE id = ?"
# The replies (and tool rows) below ?1 down to the next user messages, parents first.
_LEADING_REPLIES = (
    "WITH RECURSIVE r(id, depth) AS ("
    " SELECT id, 0 FROM messages_v2 WHERE parent_id = ?1 AND session_id = ?2 AND role IN ('assistant', 'tool')"
    " UNION ALL"
    " SELECT m.id, r.depth + 1 FROM r JOIN messages_v2 m ON m.parent_id = r.id"
    f" WHERE m.session_id = ?2 AND m.role IN ('assistant', 'tool') AND r.depth < {MAX_DEPTH})"
    " SELECT id FROM r ORDER BY depth, id"
)
# The walk carries the whole row up the parent links (one primary-key lookup per step,
# leaf first). Joining the ids back to messages_v2 afterwards made SQLite scan the table.
# ?3 is a stop id (its row is the last one walked; NULL = up to the root), ?4 a limit.
_PATH = (
    f"WITH RECURSIVE p({MESSAGE_COLUMNS}, depth) AS ("
    f" SELECT {MESSAGE_COLUMNS}, 0 FROM messages_v2 WHERE id = ?1 AND session_id = ?2"
    " UNION ALL"
    f" SELECT {_M_COLUMNS}, p.depth + 1 FROM p JOIN messages_v2 m ON m.id = p.parent_id"
    f" WHERE m.session_id = ?2 AND p.id IS NOT ?3 AND p.depth < {MAX_DEPTH}"
    " LIMIT ?4)"
    f" SELECT {MESSAGE_COLUMNS} FROM p"
)
_ANCESTOR_IDS = (
    "WITH RECURSIVE p(id, parent_id, depth) AS ("
    " SELECT id, parent_id, 0 FROM messages_v2 WHERE id = ?1 AND session_id = ?2"
    " UNION ALL"
    " SELECT m.id, m.parent_id, p.depth + 1 FROM p JOIN messages_v2 m ON m.id = p.parent_id"
    f" WHERE m.session_id = ?2 AND p.depth < {MAX_DEPTH})"
    " SELECT id FROM p"
)
_ALL = f"SELECT {MESSAGE_COLUMNS} FROM messages_v2 WHERE session_id = ? ORDER BY created_at, id"
_NEWEST_LEAF_BELOW = (
    "WITH RECURSIVE d(id, depth) AS ("
    " SELECT ?1, 0"
    " UNION ALL"
    f" SELECT m.id, d.depth + 1 FROM d JOIN messages_v2 m ON m.parent_id = d.id"
    f" WHERE d.depth < {MAX_DEPTH})"
    " SELECT m.id FROM d JOIN messages_v2 m ON m.id = d.id"
    " WHERE m.session_id = ?2"
    " AND NOT EXISTS (SELECT 1 FROM messages_v2 c WHERE c.parent_id = m.id)"
    " ORDER BY m.created_at DESC, m.id DESC LIMIT 1"
)
_NEWEST_LEAF = (
    "SELECT m.id FROM messages_v2 m WHERE m.session_id = ?"
    " AND NOT EXISTS (SELECT 1 FROM messages_v2 c WHERE c.parent_id = m.id)"
    " ORDER BY m.created_at DESC, m.id DESC LIMIT 1"
)
_SUBTREE = (
    "WITH RECURSIVE d(id, depth) AS ("
    " SELECT ?1, 0"
    " UNION ALL"
    " SELECT m.id, d.depth + 1 FROM d JOIN messages_v2 m ON m.parent_id = d.id"
    f" WHERE d.depth < {MAX_DEPTH})"
    " SELECT id FROM d"
)



def insert(conn: apsw.Connection, m: MessageV2) -> None:
    """Insert a message; it owns the data-dir files it references (files.py)."""
    conn.execute(_INSERT, message_values(m))
    if m.parts or (m.text_content and "file://" in m.text_content):
        record_message_files(conn, data_dir_of(conn), m.session_id, m.id, m.text_content, m.parts, m.created_at)


def insert_many(conn: apsw.Connection, messages: list[MessageV2]) -> None:
    conn.executemany(_INSERT, [message_values(m) for m in messages])
    if messages:
        record_messages_files(conn, data_dir_of(conn), messages, messages[0].created_at)


def get(conn: apsw.Connection, message_id: str) -> MessageV2:
    rows = conn.execute(_SELECT_ONE, (message_id,)).fetchall()
    if not rows:
        raise NotFound(f"message {message_id!r} not found", data={"messageId": message_id})
    return message_from_row(rows[0])


def get_in_session(conn: apsw.Connection, session_id: str, message_id: str) -> MessageV2:
    """The message, which must belong to ``session_id`` (NotFound otherwise)."""
    m = get(conn, message_id)
    if m.session_id != session_id:
        raise NotFound(
            f"message {message_id!r} is not in session {session_id!r}",
            data={"sessionId": session_id, "messageId": message_id},
        )
    return m


def path(
    conn: apsw.Connection,
    session_id: str,
    leaf_id: str,
    limit: int | None = None,
    *,
    stop_id: str | None = None,
    acp_parts: bool = True,
) -> list[MessageV2]:
    """Root -> ``leaf_id`` (which must be in the session); only the last ``limit``
    messages of it when given (the walk stops there), and only from ``stop_id``
    (inclusive, when it is an ancestor) when given. ``acp_parts=False`` leaves the raw
    ACP logs out."""
    rows = conn.execute(
        _PATH, (leaf_id, session_id, stop_id, -1 if limit is None else limit)
    ).fetchall()
    rows.reverse()
    return [message_from_row(r, acp_parts=acp_parts) for r in rows]


def ancestor_ids(conn: apsw.Connection, session_id: str, leaf_id: str) -> list[str]:
    """Ids of ``leaf_id`` and its ancestors, leaf first."""
    return [r[0] for r in conn.execute(_ANCESTOR_IDS, (leaf_id, session_id))]


def all_messages(conn: apsw.Connection, session_id: str, *, acp_parts: bool = True) -> list[MessageV2]:
    return [message_from_row(r, acp_parts=acp_parts) for r in conn.execute(_ALL, (session_id,))]


def newest_leaf(conn: apsw.Connection, session_id: str, below: str | None = None) -> str | None:
    """The newest leaf of the session, or of the subtree rooted at ``below``."""
    if below is None:
        rows = conn.execute(_NEWEST_LEAF, (session_id,)).fetchall()
    else:
        rows = conn.execute(_NEWEST_LEAF_BELOW, (below, session_id)).fetchall()
    return str(rows[0][0]) if rows else None


def subtree_ids(conn: apsw.Connection, message_id: str) -> list[str]:
    return [r[0] for r in conn.execute(_SUBTREE, (message_id,))]


def delete_ids(conn: apsw.Connection, target: MessageV2, mode: str) -> list[str]:
    """The messages a delete of ``target`` removes: mode ``branch`` its subtree; mode
    ``message`` the message alone, except a user message that is a root: the replies
    below it go with it, down to the next user messages (they answered it; moved up,
    they would start a conversation with the assistant, which providers refuse), and
    those user messages become roots."""
    if mode == "branch":
        return subtree_ids(conn, target.id)
    if target.parent_id is not None or target.role != "user":
        return [target.id]
    return [target.id, *(r[0] for r in conn.execute(_LEADING_REPLIES, (target.id, target.session_id)))]


def update_partial(
    conn: apsw.Connection,
    message_id: str,
    *,
    text_content: str | None,
    parts: str | None,
    status: str,
    seq: int | None,
    now: int,
) -> None:
    conn.execute(
        "UPDATE messages_v2 SET text_content = ?, parts = ?,"
        " content_type = CASE WHEN ? IS NOT NULL THEN 'multipart' ELSE content_type END,"
        " status = ?, seq = coalesce(?, seq), updated_at = ?"
        " WHERE id = ? AND status IN ('pending', 'streaming')",
        (text_content, parts, parts, status, seq, now, message_id),
    )
    if conn.changes() == 0:
        _explain_not_open(conn, message_id)


def finish(
    conn: apsw.Connection,
    message_id: str,
    *,
    status: str,
    text_content: str | None,
    parts: str | None,
    tool_calls: str | None,
    usage: str | None,
    latency_ms: int | None,
    model_id: str | None,
    error: str | None,
    seq: int | None,
    now: int,
) -> None:
    conn.execute(
        "UPDATE messages_v2 SET status = ?, text_content = ?, parts = ?,"
        " content_type = CASE WHEN ? IS NOT NULL THEN 'multipart' ELSE content_type END,"
        " tool_calls = coalesce(?, tool_calls), usage = coalesce(?, usage),"
        " latency_ms = coalesce(?, latency_ms), model_id = coalesce(?, model_id),"
        " error = coalesce(?, error), seq = coalesce(?, seq), updated_at = ?"
        " WHERE id = ? AND status IN ('pending', 'streaming')",
        (status, text_content, parts, parts, tool_calls, usage, latency_ms, model_id,
         error, seq, now, message_id),
    )
    if conn.changes() == 0:
        _explain_not_open(conn, message_id)


def _explain_not_open(conn: apsw.Connection, message_id: str) -> None:
    rows = conn.execute("SELECT status FROM messages_v2 WHERE id = ?", (message_id,)).fetchall()
    if not rows:
        raise NotFound(f"message {message_id!r} not found", data={"messageId": message_id})
    raise StoreError(
        f"message {message_id!r} is already {rows[0][0]}; only a pending or streaming"
        " message can be updated",
        code=ErrorCode.BAD_STATE,
        data={"messageId": message_id, "status": rows[0][0]},
    )
