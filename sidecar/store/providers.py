"""ProviderRepo: the ``providers`` table (provider:* configuration, API keys included).

Keys are stored in the database file in the user's data dir (the OS keychain is the
desktop app's business) and leave this module only inside ProviderRecord, which the
engine uses to build requests; ``to_info`` is the only shape that goes on the wire and it
carries ``hasApiKey`` instead of the key.

Agent engines (type ``acp-engine``) keep their AcpEngineConfig in the ``engine``
column (migration of sidecar/store/acp.py); its ``env`` may hold secrets and gets the same
treatment as the key: values whose name looks secret are masked in ``to_info``, and an
update that sends a masked value back keeps the stored one. Custom headers likewise: a
secret-looking header shown as ``***`` and sent back unchanged keeps its stored value.
Which names look secret is decided by ``sidecar.secrets.names.is_secret_name`` (one list).

Secrets at rest: the key, secret-looking header values and secret-looking engine ``env``
values are stored sealed (sidecar/store/secrets.py, Sealer); a record whose secrets cannot
be opened (sealed with a key this process was not given) has ``secrets_locked`` set and
those values left out, and stays listable and editable: a new key sent with upsert
replaces the locked one.

Synchronous; async code calls it through ``AsyncStore.run`` (``s.providers``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import msgspec

from protocol.providers import AcpEngineConfig, ModelConfig, ProviderInfo, ProviderKind, ProviderUpsertParams
from sidecar.errors import InvalidParams, NotFound
from sidecar.secrets.names import is_secret_name
from sidecar.store.db import Database
from sidecar.store.ids import new_id, now_ms
from sidecar.store.secrets import API_KEY, ENGINE_ENV, HEADERS, Sealer
from sidecar.store.rows import lenient_json

_COLUMNS = (
    "id, name, type, base_url, api_key, api_key_env, headers, body, models, enabled, "
    "created_at, updated_at, engine, stream, timeout_s, max_retries"
)
MASK = "***"
ACP_TOOL_KINDS = frozenset(
    {"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"}
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
    engine: AcpEngineConfig | None = None
    secrets_locked: bool = False
    """A stored secret of this provider could not be opened (it is left out above)."""
    has_stored_key: bool = False
    """A key is stored (``api_key`` is None when it is locked)."""
    stream: bool = True
    """False: the endpoint cannot stream (every model is asked for whole replies)."""
    timeout_s: float | None = None
    max_retries: int | None = None

    def __repr__(self) -> str:  # never print the key, even in a traceback
        return f"ProviderRecord(id={self.id!r}, name={self.name!r}, type={self.type!r})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list every field, the key and header values included
        return [("id", self.id), ("name", self.name), ("type", self.type)]

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def to_info(self, *, is_default: bool) -> ProviderInfo:
        return ProviderInfo(
            id=self.id,
            name=self.name,
            type=self.type,
            base_url=self.base_url,
            has_api_key=self.has_stored_key,
            secrets_locked=self.secrets_locked,
            api_key_env=self.api_key_env,
            headers=_masked(self.headers),
            body=self.body,
            models=self.models,
            enabled=self.enabled,
            stream=self.stream,
            engine=_masked_engine(self.engine),
            is_default=is_default,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


_models = msgspec.json.Decoder(list[ModelConfig])
_obj = msgspec.json.Decoder(dict[str, Any])
_headers = msgspec.json.Decoder(dict[str, str])
_engine = msgspec.json.Decoder(AcpEngineConfig)


def _masked(values: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else v) for k, v in values.items()}


def _unmasked(sent: dict[str, str], stored: dict[str, str]) -> dict[str, str]:
    """``sent`` with every masked value sent back replaced by the stored one."""
    return {k: (stored.get(k, v) if v == MASK else v) for k, v in sent.items()}


def _masked_engine(engine: AcpEngineConfig | None) -> AcpEngineConfig | None:
    if engine is None:
        return None
    return msgspec.structs.replace(engine, env=_masked(engine.env))


def _row(row: tuple[Any, ...], sealer: Sealer) -> ProviderRecord:
    api_key, key_locked = sealer.open(row[4], API_KEY)
    headers, headers_locked = sealer.open_map(_headers.decode(row[6]), HEADERS)
    engine = _engine.decode(row[12]) if row[12] else None
    env_locked = False
    if engine is not None:
        env, env_locked = sealer.open_map(engine.env, ENGINE_ENV)
        engine = msgspec.structs.replace(engine, env=env)
    return ProviderRecord(
        id=row[0],
        name=row[1],
        type=row[2],
        base_url=row[3],
        api_key=api_key,
        api_key_env=row[5],
        headers=headers,
        body=lenient_json(_obj, row[7], "body", f"provider {row[0]!r}", {}),
        models=_models.decode(row[8]),
        enabled=bool(row[9]),
        created_at=row[10],
        updated_at=row[11],
        engine=engine,
        secrets_locked=key_locked or headers_locked or env_locked,
        has_stored_key=bool(row[4]),
        stream=row[13] is None or bool(row[13]),
        timeout_s=row[14],
        max_retries=row[15],
    )


def validate(params: ProviderUpsertParams) -> None:
    if not params.name.strip():
        raise InvalidParams("invalid params: name must not be empty - at `$.name`")
    if params.type == "acp-engine":
        _validate_engine(params.engine)
        return
    if params.engine is not None:
        raise InvalidParams("invalid params: engine is only for providers of type acp-engine - at `$.engine`")
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
        prices = (model.input_price, model.output_price, model.cache_read_price, model.cache_write_price)
        if any(p is not None and not 0 <= p < 1e9 for p in prices):
            raise InvalidParams(f"invalid params: prices must be >= 0 - at `{field}`")
        for name in ("context_window", "max_output_tokens"):
            value = getattr(model, name)
            if value is not None and value <= 0:
                raise InvalidParams(f"invalid params: {name} must be positive - at `{field}`")
    for key in params.headers:
        if not key or any(c in key for c in "\r\n:"):
            raise InvalidParams(f"invalid params: bad header name {key!r} - at `$.headers`")


def _validate_engine(engine: AcpEngineConfig | None) -> None:
    if engine is None:
        raise InvalidParams("invalid params: an acp-engine provider needs engine.command - at `$.engine`")
    if not engine.command.strip() or "\0" in engine.command:
        raise InvalidParams("invalid params: engine.command must not be empty - at `$.engine.command`")
    for i, arg in enumerate(engine.args):
        if "\0" in arg:
            raise InvalidParams(f"invalid params: NUL byte in an argument - at `$.engine.args[{i}]`")
    for key, value in engine.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidParams(f"invalid params: bad environment variable {key!r} - at `$.engine.env`")
    for name in ("startup_timeout_ms", "request_timeout_ms", "cancel_timeout_ms", "shutdown_timeout_ms"):
        value = getattr(engine, name)
        if not 1 <= value <= 3_600_000:
            raise InvalidParams(f"invalid params: engine.{name} must be 1..3600000 - at `$.engine`")
    for kind in engine.auto_allow:
        if kind not in ACP_TOOL_KINDS:
            raise InvalidParams(
                f"invalid params: unknown tool kind {kind!r} (one of {', '.join(sorted(ACP_TOOL_KINDS))})"
                " - at `$.engine.autoAllow`"
            )


class ProviderRepo:
    def __init__(self, db: Database, sealer: Sealer) -> None:
        self._db = db
        self._sealer = sealer

    def list(self) -> list[ProviderRecord]:
        with self._db.read() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM providers ORDER BY created_at, id").fetchall()
        return [_row(r, self._sealer) for r in rows]

    def get(self, provider_id: str) -> ProviderRecord:
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (provider_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no provider {provider_id!r}")
        return _row(row, self._sealer)

    def upsert(self, params: ProviderUpsertParams) -> ProviderRecord:
        validate(params)
        now = now_ms()
        enc = msgspec.json.encode
        with self._db.write() as conn:
            existing = None
            if params.id is not None:
                existing = conn.execute(
                    "SELECT api_key, created_at, engine, headers FROM providers WHERE id = ?", (params.id,)
                ).fetchone()
            provider_id = params.id or new_id()
            if params.api_key is msgspec.UNSET:  # left out: the stored key stays
                api_key = existing[0] if existing else None
            else:  # null or "" clears it
                api_key = self._sealer.seal(params.api_key, API_KEY) if params.api_key else None
            engine = params.engine if params.type == "acp-engine" else None
            if engine is not None:
                # a masked secret sent back (provider:list -> edit -> upsert) keeps the stored
                # (sealed) value; the others are sealed now
                stored_env = _engine.decode(existing[2]).env if existing is not None and existing[2] else {}
                env = self._sealer.seal_map(_unmasked(engine.env, stored_env), ENGINE_ENV)
                engine = msgspec.structs.replace(engine, env=env)
            stored_headers = _headers.decode(existing[3]) if existing is not None and existing[3] else {}
            headers = self._sealer.seal_map(_unmasked(params.headers, stored_headers), HEADERS)
            conn.execute(
                f"INSERT OR REPLACE INTO providers ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    provider_id,
                    params.name.strip(),
                    params.type,
                    params.base_url.rstrip("/"),
                    api_key,
                    params.api_key_env or None,
                    enc(headers).decode(),
                    enc(params.body).decode(),
                    enc(params.models).decode(),
                    int(params.enabled),
                    existing[1] if existing else now,
                    now,
                    enc(engine).decode() if engine is not None else None,
                    int(params.stream),
                    params.timeout_s,
                    params.max_retries,
                ),
            )
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (provider_id,)
            ).fetchone()
        assert row is not None  # written just above, in this transaction
        return _row(row, self._sealer)

    def set_model_stream(self, provider_id: str, model_id: str, stream: bool) -> ProviderRecord:
        """Set one model's ``stream`` (a model the provider does not list yet is added with
        the defaults); the rest of the configuration stays as it is."""
        with self._db.write() as conn:
            row = conn.execute("SELECT models FROM providers WHERE id = ?", (provider_id,)).fetchone()
            if row is None:
                raise NotFound(f"no provider {provider_id!r}")
            models = _models.decode(row[0])
            if any(m.id == model_id for m in models):
                models = [msgspec.structs.replace(m, stream=stream) if m.id == model_id else m for m in models]
            else:
                models.append(ModelConfig(id=model_id, stream=stream))
            conn.execute(
                "UPDATE providers SET models = ?, updated_at = ? WHERE id = ?",
                (msgspec.json.encode(models).decode(), now_ms(), provider_id),
            )
            row = conn.execute(f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (provider_id,)).fetchone()
        if row is None:  # not reachable inside the transaction that just updated it
            raise NotFound(f"no provider {provider_id!r}")
        return _row(row, self._sealer)

    def delete(self, provider_id: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM providers WHERE id = ?", (provider_id,))
            if conn.changes() == 0:
                raise NotFound(f"no provider {provider_id!r}")
