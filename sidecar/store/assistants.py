"""AssistantRepo: assistant profiles (table ``assistants``) and which one is the default.

Owns: storing an AssistantProfile as one row (its configuration as the wire JSON of the
profile, so fields added later need no migration), and the default-profile setting.
Must stay true:
- There is always a default profile: the migration creates ``default`` (named "Default"),
  ``set_default`` only accepts an existing id, and the default profile cannot be deleted.
- Sessions referencing a deleted profile are not touched here: whoever resolves a session's
  profile falls back to the default (``session_context`` rows keep the stale id harmlessly).
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.context import AssistantProfile, AssistantUpsertParams
from protocol.errors import ErrorCode
from sidecar.errors import NotFound, StoreError
from sidecar.store.db import Database
from sidecar.store.ids import new_id
from sidecar.store.settings import put_setting, setting

__all__ = ["AssistantRepo", "DEFAULT_ASSISTANT_ID", "DEFAULT_ASSISTANT_KEY"]

DEFAULT_ASSISTANT_ID = "default"
DEFAULT_ASSISTANT_KEY = "default_assistant_id"

_decode_profile = msgspec.json.Decoder(AssistantProfile)


class AssistantRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    def list(self) -> list[AssistantProfile]:
        with self._db.read() as conn:
            default = self._default_id(conn)
            rows = conn.execute(
                "SELECT id, name, config, created_at, updated_at FROM assistants ORDER BY created_at, id"
            ).fetchall()
        return [_profile(row, default) for row in rows]

    def get(self, assistant_id: str) -> AssistantProfile:
        with self._db.read() as conn:
            return self._get(conn, assistant_id)

    def default(self) -> AssistantProfile:
        with self._db.read() as conn:
            return self._get(conn, self._default_id(conn))

    def resolve(self, assistant_id: str | None) -> AssistantProfile:
        """The given profile, or the default when it is None or no longer exists."""
        with self._db.read() as conn:
            default = self._default_id(conn)
            if assistant_id:
                rows = conn.execute(
                    "SELECT id, name, config, created_at, updated_at FROM assistants WHERE id = ?",
                    (assistant_id,),
                ).fetchall()
                if rows:
                    return _profile(rows[0], default)
            return self._get(conn, default)

    def exists(self, assistant_id: str) -> bool:
        with self._db.read() as conn:
            return bool(conn.execute("SELECT 1 FROM assistants WHERE id = ?", (assistant_id,)).fetchall())

    def upsert(self, params: AssistantUpsertParams, now: int) -> AssistantProfile:
        # the wire (camelCase) encoding of the profile's settings, as AssistantProfile decodes it
        config = msgspec.json.decode(msgspec.json.encode(params))
        for key in ("id", "name"):
            config.pop(key, None)
        raw = msgspec.json.encode(config).decode()
        with self._db.write() as conn:
            assistant_id = params.id or new_id()
            rows = conn.execute("SELECT created_at FROM assistants WHERE id = ?", (assistant_id,)).fetchall()
            if rows:
                conn.execute(
                    "UPDATE assistants SET name = ?, config = ?, updated_at = ? WHERE id = ?",
                    (params.name, raw, now, assistant_id),
                )
            else:
                conn.execute(
                    "INSERT INTO assistants(id, name, config, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                    (assistant_id, params.name, raw, now, now),
                )
            return self._get(conn, assistant_id)

    def delete(self, assistant_id: str) -> None:
        with self._db.write() as conn:
            self._get(conn, assistant_id)
            if assistant_id == self._default_id(conn):
                raise StoreError(
                    "the default assistant cannot be deleted: make another one the default first",
                    code=ErrorCode.BAD_STATE,
                )
            conn.execute("DELETE FROM assistants WHERE id = ?", (assistant_id,))

    def set_default(self, assistant_id: str) -> AssistantProfile:
        with self._db.write() as conn:
            self._get(conn, assistant_id)
            put_setting(conn, DEFAULT_ASSISTANT_KEY, assistant_id)
            return self._get(conn, assistant_id)

    # ---- internals ------------------------------------------------------------------

    def _default_id(self, conn: Any) -> str:
        chosen = setting(conn, DEFAULT_ASSISTANT_KEY)
        if chosen and conn.execute("SELECT 1 FROM assistants WHERE id = ?", (chosen,)).fetchall():
            return chosen
        return DEFAULT_ASSISTANT_ID

    def _get(self, conn: Any, assistant_id: str) -> AssistantProfile:
        rows = conn.execute(
            "SELECT id, name, config, created_at, updated_at FROM assistants WHERE id = ?", (assistant_id,)
        ).fetchall()
        if not rows:
            raise NotFound(f"assistant {assistant_id!r} not found", data={"assistantId": assistant_id})
        return _profile(rows[0], self._default_id(conn))


def _profile(row: tuple[Any, ...], default_id: str) -> AssistantProfile:
    assistant_id, name, config, created, updated = row
    try:
        fields = msgspec.json.decode(config)
        if not isinstance(fields, dict):
            raise msgspec.ValidationError("not an object")
        fields.update(id=assistant_id, name=name, isDefault=assistant_id == default_id,
                      createdAt=created, updatedAt=updated)
        return _decode_profile.decode(msgspec.json.encode(fields))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StoreError(f"stored assistant {assistant_id!r} is not valid: {exc}") from exc
