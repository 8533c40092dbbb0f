"""AcpRepo: the ACP-only columns and table (issue 7).

Owns:
- ``acp_turns``: for every reply of an ACP session, the engine and the agent session that
  holds the conversation up to and including that reply. A send continues from the
  agent session of the reply it follows; regenerate and edit-and-resend fork it;
- ``sessions_v2.acp_session_id``: the agent session of the session's newest turn (what
  the renderer sees; the branch logic reads ``acp_turns``);
- ``messages_v2.acp_message_id`` / ``acp_parts``: the agent's message id and every
  ``session/update`` of the reply, verbatim (JSON array of the raw update objects).

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

    def agent_sessions(self, session_id: str) -> list[tuple[str, str]]:
        """Distinct (engine_id, agent_session_id) pairs used by a session, oldest first."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT engine_id, agent_session_id, MIN(created_at) AS first FROM acp_turns"
                " WHERE session_id = ? GROUP BY engine_id, agent_session_id ORDER BY first",
                (session_id,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def write_raw(self, message_id: str, acp_message_id: str | None, acp_parts: list[Any]) -> None:
        """Store the reply's raw updates (items may be msgspec.Raw: written verbatim)."""
        text = _encoder.encode(acp_parts).decode() if acp_parts else None
        with self._db.write() as conn:
            conn.execute(
                "UPDATE messages_v2 SET acp_message_id = ?, acp_parts = ? WHERE id = ?",
                (acp_message_id, text, message_id),
            )
