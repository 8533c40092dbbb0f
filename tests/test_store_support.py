"""Shared helpers of the store tests (no tests here): a manual clock, a database digest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import apsw

from sidecar.store import Store


class FakeClock:
    """Milliseconds that advance by one per reading (distinct, ordered timestamps)."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now

    def jump(self, ms: int) -> None:
        self.now += ms


def open_store(data_dir: Path, clock: FakeClock | None = None) -> Store:
    return Store(data_dir, clock=clock or FakeClock())


def db_digest(store: Store) -> str:
    """sha256 over every row of every data table (FTS shadow tables included) + user_version."""
    conn = apsw.Connection(str(store.path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        h = hashlib.sha256()
        h.update(repr(conn.execute("PRAGMA user_version").fetchall()).encode())
        tables = [
            name
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
            # sqlite_stat* are planner statistics (PRAGMA optimize), not data.
            if not (sql or "").upper().startswith("CREATE VIRTUAL") and not name.startswith("sqlite_")
        ]
        for t in tables:
            rows = sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{t}"'))
            h.update(t.encode())
            for r in rows:
                h.update(r.encode())
        return h.hexdigest()
    finally:
        conn.close()


def count(store: Store, sql: str, *args: object) -> int:
    conn = apsw.Connection(str(store.path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return int(conn.execute(sql, args).fetchall()[0][0])
    finally:
        conn.close()
