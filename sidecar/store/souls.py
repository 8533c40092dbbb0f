"""SoulRepo: every version of every Soul.md (``soul_versions``; scope ``global`` or an
assistant id), numbered from 1 per scope.

Must stay true: a version is never rewritten; every method is one transaction; ``add``
with ``base_version`` refuses (BAD_STATE) when the current version moved on.
Synchronous: ``Store.souls``, reached from async code through ``AsyncStore.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.errors import ErrorCode
from protocol.memory import SoulSource
from sidecar.errors import NotFound, StoreError
from sidecar.store.db import Database, fetch_all, fetch_iter
from sidecar.store.ids import now_ms
from sidecar.store.memory_records import SOUL_COLUMNS, SoulRecord, soul_from_row

__all__ = ["SoulRepo"]


class SoulRepo:
    """Soul.md versions per scope (``global`` or an assistant id)."""

    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._clock = clock

    def current(self, scope: str) -> SoulRecord | None:
        with self._db.read() as conn:
            return self._current(conn, scope)

    def effective(self, assistant_id: str, global_scope: str) -> tuple[SoulRecord | None, SoulRecord | None]:
        """(the assistant's own current version, the global current version), one snapshot."""
        with self._db.read() as conn:
            own = self._current(conn, assistant_id)
            shared = self._current(conn, global_scope) if assistant_id != global_scope else own
            return own, shared

    def add(
        self,
        scope: str,
        content: str,
        *,
        source: SoulSource,
        reason: str | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
        reverted_from: int | None = None,
        base_version: int | None = None,
    ) -> SoulRecord:
        """The next version of ``scope``. ``base_version``: BAD_STATE unless it is still the
        current one (an edit proposed against an older text is refused, not merged blindly)."""
        with self._db.write() as conn:
            current = self._current(conn, scope)
            number = current.version if current is not None else 0
            if base_version is not None and base_version != number:
                raise StoreError(
                    f"Soul.md of {scope!r} is at version {number}, not {base_version}: it changed meanwhile",
                    code=ErrorCode.BAD_STATE, data={"version": number, "baseVersion": base_version},
                )
            conn.execute(
                f"INSERT INTO soul_versions({SOUL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (scope, number + 1, content, source, reason, session_id, message_id, reverted_from, self._clock()),
            )
            record = self._current(conn, scope)
            assert record is not None
            return record

    def version(self, scope: str, version: int) -> SoulRecord:
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {SOUL_COLUMNS} FROM soul_versions WHERE scope = ? AND version = ?",
                                (scope, version))
        if not rows:
            raise NotFound(f"Soul.md of {scope!r} has no version {version}", data={"version": version})
        return soul_from_row(rows[0])

    def history(self, scope: str, limit: int, offset: int) -> list[SoulRecord]:
        with self._db.read() as conn:
            return [soul_from_row(r) for r in fetch_iter(conn, 
                f"SELECT {SOUL_COLUMNS} FROM soul_versions WHERE scope = ? ORDER BY version DESC LIMIT ? OFFSET ?",
                (scope, limit, offset))]

    def delete_scope(self, scope: str) -> int:
        with self._db.write() as conn:
            conn.execute("DELETE FROM soul_versions WHERE scope = ?", (scope,))
            return int(conn.changes())

    def _current(self, conn: Any, scope: str) -> SoulRecord | None:
        rows = fetch_all(conn, 
            f"SELECT {SOUL_COLUMNS} FROM soul_versions WHERE scope = ? ORDER BY version DESC LIMIT 1", (scope,)
        )
        return soul_from_row(rows[0]) if rows else None
