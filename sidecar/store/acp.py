"""AcpRepo: the ACP-only columns and table.

Owns:
- ``acp_turns``: for every reply of an ACP session, the engine and the agent session it
  ran on. A turn continues the agent session of the reply it follows when that reply is
  the session's newest turn (its ``head``); otherwise (a regenerate, an edit, a send on an
  older branch) it runs on a fork of it (sidecar/engine/acp_turn.py);
- ``acp_released``: agent sessions no reply runs on any more (a trigger journals one when
  the last ``acp_turns`` row naming it goes: a deleted session, branch or replaced import),
  to be closed at the engine (``released`` / ``forget_released``);
- ``sessions_v2.acp_session_id``: the agent session of the session's newest turn (what
  the renderer sees; the branch logic reads ``acp_turns``);
- ``messages_v2.acp_message_id`` / ``acp_parts``: the agent's message id and every
  ``session/update`` of the reply, verbatim (JSON array of the raw update objects). While
  the reply streams the updates are appended to ``acp_raw_chunks`` (one row per
  persistence tick, each a JSON array of the updates since the last: the cost of a tick is
  what arrived since the one before, never the whole list); its ending joins them into
  ``acp_parts`` (``finish_raw``, also run for replies a crash left with chunks).

Synchronous; async code calls it through ``AsyncStore.run`` (``s.acp``). Each method is one transaction.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sidecar.store.db import Database
from sidecar.store.ids import now_ms

_encoder = msgspec.json.Encoder()


class AcpTurn(msgspec.Struct, frozen=True, kw_only=True):
    message_id: str
    session_id: str
    engine_id: str
    agent_session_id: str


class AcpRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    def record_turn(self, message_id: str, session_id: str, engine_id: str, agent_session_id: str) -> None:
        """The reply ``message_id`` runs on ``agent_session_id``; also the session's current one."""
        with self._db.write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO acp_turns"
                " (message_id, session_id, engine_id, agent_session_id, created_at) VALUES (?,?,?,?,?)",
                (message_id, session_id, engine_id, agent_session_id, now_ms()),
            )
            conn.execute(
                "UPDATE sessions_v2 SET acp_session_id = ? WHERE id = ?", (agent_session_id, session_id)
            )

    def turn(self, message_id: str) -> AcpTurn | None:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT message_id, session_id, engine_id, agent_session_id FROM acp_turns WHERE message_id = ?",
                (message_id,),
            ).fetchone()
        if row is None:
            return None
        return AcpTurn(message_id=row[0], session_id=row[1], engine_id=row[2], agent_session_id=row[3])

    def head(self, engine_id: str, agent_session_id: str) -> str | None:
        """The newest reply that ran on the agent session (what the session holds last)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT message_id FROM acp_turns WHERE engine_id = ? AND agent_session_id = ?"
                " ORDER BY created_at DESC, message_id DESC LIMIT 1",
                (engine_id, agent_session_id),
            ).fetchone()
        return None if row is None else str(row[0])

    def append_raw(self, message_id: str, first: int, updates: list[Any], acp_message_id: str | None = None) -> None:
        """Raw updates number ``first``.. of a streaming reply (written again whole if this
        chunk was written before: a retried tick is idempotent)."""
        with self._db.write() as conn:
            if updates:
                conn.execute(
                    "INSERT OR REPLACE INTO acp_raw_chunks (message_id, first, body) VALUES (?, ?, ?)",
                    (message_id, first, _encoder.encode(updates).decode()),
                )
            if acp_message_id is not None:
                conn.execute(
                    "UPDATE messages_v2 SET acp_message_id = coalesce(acp_message_id, ?) WHERE id = ?",
                    (acp_message_id, message_id),
                )

    def finish_raw(self, message_id: str) -> None:
        """Join the reply's chunks into ``acp_parts`` (after any stored there) and drop them."""
        with self._db.write() as conn:
            _join_chunks(conn, message_id)

    def raw_parts(self, message_id: str) -> str | None:
        """The JSON array of a streaming reply's raw updates so far (chunks joined), or None."""
        with self._db.read() as conn:
            bodies = [r[0] for r in conn.execute(
                "SELECT body FROM acp_raw_chunks WHERE message_id = ? ORDER BY first", (message_id,)
            )]
        return _joined(None, bodies)

    def join_left_chunks(self) -> int:
        """Replies a dead process left with chunks (crash recovery): joined. Returns how many.
        Called at open only when ``recovery.left_behind`` found chunks (the table exists)."""
        with self._db.write() as conn:
            ids = [r[0] for r in conn.execute("SELECT DISTINCT message_id FROM acp_raw_chunks")]
            for message_id in ids:
                _join_chunks(conn, message_id)
        return len(ids)

    # ---- released agent sessions ------------------------------------------------------

    def released(self, engine_id: str | None = None) -> list[tuple[str, str]]:
        """(engine_id, agent_session_id) of agent sessions no reply runs on any more."""
        sql = "SELECT engine_id, agent_session_id FROM acp_released"
        args: tuple[Any, ...] = ()
        if engine_id is not None:
            sql += " WHERE engine_id = ?"
            args = (engine_id,)
        with self._db.read() as conn:
            return [(r[0], r[1]) for r in conn.execute(sql + " ORDER BY queued_at", args)]

    def forget_released(self, pairs: list[tuple[str, str]]) -> None:
        if pairs:
            with self._db.write() as conn:
                conn.executemany(
                    "DELETE FROM acp_released WHERE engine_id = ? AND agent_session_id = ?", pairs
                )


def _joined(existing: str | None, bodies: list[str]) -> str | None:
    """One JSON array from ``existing`` (an array or None) and chunk arrays, without decoding."""
    items = [b[1:-1].strip() for b in ([existing] if existing else []) + bodies]
    items = [i for i in items if i]
    return "[" + ",".join(items) + "]" if items else None


def _join_chunks(conn: Any, message_id: str) -> None:
    bodies = [r[0] for r in conn.execute(
        "SELECT body FROM acp_raw_chunks WHERE message_id = ? ORDER BY first", (message_id,)
    )]
    if not bodies:
        return
    row = conn.execute("SELECT acp_parts FROM messages_v2 WHERE id = ?", (message_id,)).fetchone()
    if row is not None:
        conn.execute(
            "UPDATE messages_v2 SET acp_parts = ? WHERE id = ?", (_joined(row[0], bodies), message_id)
        )
    conn.execute("DELETE FROM acp_raw_chunks WHERE message_id = ?", (message_id,))
