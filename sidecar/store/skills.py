"""SkillProposalRepo: the ``skill_proposals`` table (migration ``m_skill_proposals``): the
SKILL.md files the model proposed, ``pending`` until accepted or rejected. A proposal is
only a row: the skill's folder is written by SkillService once it is accepted.

Synchronous: ``Store.skills`` through ``AsyncStore.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.skills import SkillProposal
from sidecar.errors import NotFound
from sidecar.store.db import Database, fetch_all
from sidecar.store.ids import new_id, now_ms

__all__ = ["SkillProposalRepo"]

_COLUMNS = "id, session_id, message_id, name, description, content, reason, status, created_at"


def _proposal(row: tuple[Any, ...]) -> SkillProposal:
    return SkillProposal(id=row[0], session_id=row[1], message_id=row[2], name=row[3], description=row[4],
                         content=row[5], reason=row[6], status=row[7], created_at=row[8])


class SkillProposalRepo:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._clock = clock

    def add(self, *, session_id: str, message_id: str, name: str, description: str, content: str,
            reason: str) -> SkillProposal:
        proposal_id = new_id()
        with self._db.write() as conn:
            conn.execute(
                f"INSERT INTO skill_proposals({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
                (proposal_id, session_id, message_id, name, description, content, reason, self._clock()),
            )
            return _proposal(fetch_all(conn, f"SELECT {_COLUMNS} FROM skill_proposals WHERE id = ?",
                                       (proposal_id,))[0])

    def get(self, proposal_id: str) -> SkillProposal:
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_COLUMNS} FROM skill_proposals WHERE id = ?", (proposal_id,))
        if not rows:
            raise NotFound(f"skill proposal {proposal_id!r} not found", data={"proposalId": proposal_id})
        return _proposal(rows[0])

    def pending(self, session_id: str | None, limit: int) -> list[SkillProposal]:
        where, args = ("status = 'pending' AND session_id = ?", [session_id]) if session_id else ("status = 'pending'", [])
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_COLUMNS} FROM skill_proposals WHERE {where}"
                                   " ORDER BY created_at, id LIMIT ?", [*args, limit])
        return [_proposal(r) for r in rows]

    def decide(self, proposal_id: str, status: str) -> bool:
        """``pending`` -> ``status``; False when it was decided already (or is gone)."""
        with self._db.write() as conn:
            conn.execute("UPDATE skill_proposals SET status = ?, decided_at = ? WHERE id = ? AND status = 'pending'",
                         (status, self._clock(), proposal_id))
            return bool(conn.changes())
