"""SettingsRepo: the ``settings`` key/value table (default_provider_id, default_model_id...).

Must stay true: a key has at most one value; setting None removes the key.
"""

from __future__ import annotations

import apsw
from sidecar.store.db import fetch_all

__all__ = ["SettingsRepo", "DEFAULT_PROVIDER_KEY", "DEFAULT_MODEL_KEY"]

DEFAULT_PROVIDER_KEY = "default_provider_id"
DEFAULT_MODEL_KEY = "default_model_id"


class SettingsRepo:
    @staticmethod
    def get(conn: apsw.Connection, key: str) -> str | None:
        rows = fetch_all(conn, "SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    @staticmethod
    def set(conn: apsw.Connection, key: str, value: str | None) -> None:
        if value is None:
            conn.execute("DELETE FROM settings WHERE key = ?", (key,))
        else:
            conn.execute(
                "INSERT INTO settings(key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
