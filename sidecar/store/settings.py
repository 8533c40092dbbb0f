"""SettingsRepo: the ``settings`` key/value table (default_provider_id, default_model_id...),
and ``setting``/``put_setting`` on a connection inside another repository's transaction.

Must stay true: a key has at most one value; setting None removes the key.
"""

from __future__ import annotations

import apsw

from sidecar.store.checks import check_text
from sidecar.store.db import Database, fetch_all

__all__ = ["SettingsRepo", "DEFAULT_PROVIDER_KEY", "DEFAULT_MODEL_KEY", "setting", "put_setting"]

DEFAULT_PROVIDER_KEY = "default_provider_id"
DEFAULT_MODEL_KEY = "default_model_id"


def setting(conn: apsw.Connection, key: str) -> str | None:
    rows = fetch_all(conn, "SELECT value FROM settings WHERE key = ?", (key,))
    return rows[0][0] if rows else None


def put_setting(conn: apsw.Connection, key: str, value: str | None) -> None:
    if value is None:
        conn.execute("DELETE FROM settings WHERE key = ?", (key,))
    else:
        conn.execute(
            "INSERT INTO settings(key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


class SettingsRepo:
    """The ``settings`` key/value table: one transaction per call."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self, key: str) -> str | None:
        with self._db.read() as conn:
            return setting(conn, key)

    def set(self, key: str, value: str | None) -> None:
        check_text("key", key, optional=False)
        check_text("value", value)
        with self._db.write() as conn:
            put_setting(conn, key, value)
