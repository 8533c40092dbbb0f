"""ContextRepo: rolling summaries, a session's context settings, the token-count cache,
and the branch reads the context planner needs (tables of migration ``m0xx_context``).

Owns:
- ``rolling_summaries``: one RollingContextSummary per session (seed 000 section 2): the
  text, the exact ids of the branch prefix it covers (JSON, read only to verify), the last
  covered id and their count (read on every request), its token count.
- ``session_context``: the assistant profile and truncation strategy a session chose
  (NULL = inherit). Both tables cascade with the session.
- ``message_tokens``: the token count of a message per encoding, keyed by a hash of its
  content, so a 10,000-message branch is tokenized once, not once per request or restart.
  Cascades with the message.

Must stay true: every method is one transaction of its own (``Database.read``/``write``);
nothing here decides whether a summary is valid, it only reads what the planner asks for.
Walks up the message tree are message_table.path (whole rows, one primary-key lookup per
step) stopped at a given id, so reading the part of a long branch after a
summary costs the length of that part, not of the branch.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from protocol.types import MessageV2
from sidecar.store.db import Database, fetch_all, fetch_iter
from sidecar.store import message_table

__all__ = ["ContextRepo", "StoredSummary"]

_ids_decoder = msgspec.json.Decoder(list[str])


class StoredSummary(msgspec.Struct, kw_only=True):
    session_id: str
    text: str
    last_covered_id: str
    covered_count: int
    tokens: int
    model_id: str | None = None
    updated_at: int


class ContextRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    # ---- branch reads -----------------------------------------------------------------

    def walk(
        self, session_id: str, leaf_id: str, *, stop_id: str | None = None, limit: int | None = None
    ) -> list[MessageV2]:
        """Root-side-first messages from ``stop_id`` (inclusive, when it is an ancestor) or
        the root down to ``leaf_id``; at most ``limit`` (the newest ones)."""
        with self._db.read() as conn:
            return message_table.path(conn, session_id, leaf_id, limit, stop_id=stop_id)

    def path_ids(self, session_id: str, leaf_id: str) -> list[str]:
        """Ids root -> ``leaf_id``."""
        with self._db.read() as conn:
            ids = message_table.ancestor_ids(conn, session_id, leaf_id)
        ids.reverse()
        return ids

    def active_leaf(self, session_id: str) -> str | None:
        with self._db.read() as conn:
            rows = fetch_all(conn, "SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,))
        return rows[0][0] if rows else None

    # ---- summaries --------------------------------------------------------------------

    def get_summary(self, session_id: str) -> StoredSummary | None:
        with self._db.read() as conn:
            rows = fetch_all(
                conn,
                "SELECT text, last_covered_id, covered_count, tokens, model_id, updated_at"
                " FROM rolling_summaries WHERE session_id = ?",
                (session_id,),
            )
        if not rows:
            return None
        text, last, count, tokens, model_id, updated = rows[0]
        return StoredSummary(
            session_id=session_id, text=text, last_covered_id=last, covered_count=count,
            tokens=tokens, model_id=model_id, updated_at=updated,
        )

    def summary_ids(self, session_id: str) -> list[str] | None:
        """The exact covered ids (read only to verify a summary once per process)."""
        with self._db.read() as conn:
            rows = fetch_all(
                conn,
                "SELECT covered_ids FROM rolling_summaries WHERE session_id = ?", (session_id,)
            )
        return _ids_decoder.decode(rows[0][0]) if rows else None

    def put_summary(
        self, session_id: str, *, text: str, covered_ids: list[str], tokens: int, model_id: str | None, now: int
    ) -> StoredSummary:
        if not covered_ids:
            raise ValueError("a summary covers at least one message")
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO rolling_summaries(session_id, text, covered_ids, last_covered_id,"
                " covered_count, tokens, model_id, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(session_id) DO UPDATE SET text = excluded.text,"
                " covered_ids = excluded.covered_ids, last_covered_id = excluded.last_covered_id,"
                " covered_count = excluded.covered_count, tokens = excluded.tokens,"
                " model_id = excluded.model_id, updated_at = excluded.updated_at",
                (session_id, text, msgspec.json.encode(covered_ids).decode(), covered_ids[-1],
                 len(covered_ids), tokens, model_id, now),
            )
        return StoredSummary(
            session_id=session_id, text=text, last_covered_id=covered_ids[-1],
            covered_count=len(covered_ids), tokens=tokens, model_id=model_id, updated_at=now,
        )

    def delete_summary(self, session_id: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM rolling_summaries WHERE session_id = ?", (session_id,))

    # ---- per-session settings ---------------------------------------------------------

    def get_session_settings(self, session_id: str) -> tuple[str | None, str | None]:
        """(assistant_id, truncation_strategy) the session chose; (None, None) = inherit."""
        with self._db.read() as conn:
            rows = fetch_all(
                conn,
                "SELECT assistant_id, truncation_strategy FROM session_context WHERE session_id = ?",
                (session_id,),
            )
        return (rows[0][0], rows[0][1]) if rows else (None, None)

    def set_session_settings(
        self, session_id: str, *, assistant_id: str | None, truncation_strategy: str | None
    ) -> None:
        with self._db.write() as conn:
            if assistant_id is None and truncation_strategy is None:
                conn.execute("DELETE FROM session_context WHERE session_id = ?", (session_id,))
                return
            conn.execute(
                "INSERT INTO session_context(session_id, assistant_id, truncation_strategy) VALUES (?, ?, ?)"
                " ON CONFLICT(session_id) DO UPDATE SET assistant_id = excluded.assistant_id,"
                " truncation_strategy = excluded.truncation_strategy",
                (session_id, assistant_id, truncation_strategy),
            )

    # ---- token cache ------------------------------------------------------------------

    def get_token_counts(self, encoding: str, message_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """message id -> (content hash, tokens) for the ids that have a count."""
        ids = list(message_ids)
        out: dict[str, tuple[str, int]] = {}
        if not ids:
            return out
        with self._db.read() as conn:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for mid, digest, tokens in fetch_iter(
                    conn,
                    f"SELECT message_id, content_hash, tokens FROM message_tokens"
                    f" WHERE encoding = ? AND message_id IN ({marks})",
                    (encoding, *chunk),
                ):
                    out[mid] = (digest, tokens)
        return out

    def put_token_counts(self, encoding: str, counts: Iterable[tuple[str, str, int]]) -> None:
        """(message id, content hash, tokens) rows; ids that no longer exist are skipped."""
        rows = [(mid, encoding, digest, tokens) for mid, digest, tokens in counts]
        if not rows:
            return
        with self._db.write() as conn:
            conn.executemany(
                "INSERT INTO message_tokens(message_id, encoding, content_hash, tokens)"
                " SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM messages_v2 WHERE id = ?1)"
                " ON CONFLICT(message_id, encoding) DO UPDATE SET content_hash = excluded.content_hash,"
                " tokens = excluded.tokens",
                rows,
            )
