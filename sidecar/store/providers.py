"""ProviderRepo: the ``providers`` table (provider:* configuration, API keys included).

Keys are stored in the database file in the user's data dir (the OS keychain is the
desktop app's business) and leave this module only inside ProviderRecord, which the
engine uses to build requests; ``to_info`` is the only shape that goes on the wire and it
carries ``hasApiKey`` instead of the key.

Synchronous; call through ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import msgspec

from protocol.params import ModelConfig, ProviderInfo, ProviderKind, ProviderUpsertParams
from sidecar.errors import InvalidParams, NotFound
from sidecar.store.db import Database
from sidecar.store.ids import new_id, now_ms

_SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.IGNORECASE)
_COLUMNS = (
    "id, name, type, base_url, api_key, api_key_env, headers, body, models, enabled, "
    "created_at, updated_at"
)


class ProviderRecord(msgspec.Struct, kw_only=True):
    id: str
    name: str
    type: ProviderKind
    base_url: str
    api_key: str | None
    api_key_env: str | None
    headers: dict[str, str]
    body: dict[str, Any]
    models: list[ModelConfig]
    enabled: bool
    created_at: int
    updated_at: int

    def __repr__(self) -> str:  # never print the key, even in a traceback
        return f"ProviderRecord(id={self.id!r}, name={self.name!r}, type={self.type!r})"

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def to_info(self, *, is_default: bool) -> ProviderInfo:
        return ProviderInfo(
            id=self.id,
            name=self.name,
            type=self.type,
            base_url=self.base_url,
            has_api_key=bool(self.api_key),
            api_key_env=self.api_key_env,
            headers={k: ("***" if _SECRET_HEADER.search(k) else v) for k, v in self.headers.items()},
            body=self.body,
            models=self.models,
            enabled=self.enabled,
            is_default=is_default,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


_models = msgspec.json.Decoder(list[ModelConfig])
_obj = msgspec.json.Decoder(dict[str, Any])
_headers = msgspec.json.Decoder(dict[str, str])


def _row(row: tuple[Any, ...]) -> ProviderRecord:
    return ProviderRecord(
        id=row[0],
        name=row[1],
        type=row[2],
        base_url=row[3],
        api_key=row[4],
        api_key_env=row[5],
        headers=_headers.decode(row[6]),
        body=_obj.decode(row[7]),
        models=_models.decode(row[8]),
        enabled=bool(row[9]),
        created_at=row[10],
        updated_at=row[11],
    )


def validate(params: ProviderUpsertParams) -> None:
    if not params.name.strip():
        raise InvalidParams("invalid params: name must not be empty - at `$.name`")
    url = urlparse(params.base_url)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise InvalidParams("invalid params: baseUrl must be an http(s) URL - at `$.baseUrl`")
    seen: set[str] = set()
    for i, model in enumerate(params.models):
        field = f"$.models[{i}]"
        if not model.id.strip():
            raise InvalidParams(f"invalid params: model id must not be empty - at `{field}.id`")
        if model.id in seen:
            raise InvalidParams(f"invalid params: duplicate model id {model.id!r} - at `{field}.id`")
        seen.add(model.id)
        if model.input_price < 0 or model.output_price < 0:
            raise InvalidParams(f"invalid params: prices must be >= 0 - at `{field}`")
        for name in ("context_window", "max_output_tokens"):
            value = getattr(model, name)
            if value is not None and value <= 0:
                raise InvalidParams(f"invalid params: {name} must be positive - at `{field}`")
    for key in params.headers:
        if not key or any(c in key for c in "\r\n:"):
            raise InvalidParams(f"invalid params: bad header name {key!r} - at `$.headers`")


class ProviderRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    def list(self) -> list[ProviderRecord]:
        with self._db.read() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM providers ORDER BY created_at, id").fetchall()
        return [_row(r) for r in rows]

    def get(self, provider_id: str) -> ProviderRecord:
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (provider_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no provider {provider_id!r}")
        return _row(row)

    def upsert(self, params: ProviderUpsertParams) -> ProviderRecord:
        validate(params)
        now = now_ms()
        enc = msgspec.json.encode
        with self._db.write() as conn:
            existing = None
            if params.id is not None:
                existing = conn.execute(
                    "SELECT api_key, created_at FROM providers WHERE id = ?", (params.id,)
                ).fetchone()
            provider_id = params.id or new_id()
            if params.api_key is None:
                api_key = existing[0] if existing else None
            else:
                api_key = params.api_key or None
            conn.execute(
                f"INSERT OR REPLACE INTO providers ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    provider_id,
                    params.name.strip(),
                    params.type,
                    params.base_url.rstrip("/"),
                    api_key,
                    params.api_key_env or None,
                    enc(params.headers).decode(),
                    enc(params.body).decode(),
                    enc(params.models).decode(),
                    int(params.enabled),
                    existing[1] if existing else now,
                    now,
                ),
            )
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (provider_id,)
            ).fetchone()
        return _row(row)

    def delete(self, provider_id: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM providers WHERE id = ?", (provider_id,))
            if conn.changes() == 0:
                raise NotFound(f"no provider {provider_id!r}")
