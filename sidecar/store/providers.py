"""ProviderRepo: the ``providers`` table (provider:* configuration, API keys included).

Keys are stored in the database file in the user's data dir (the OS keychain is the
desktop app's business) and leave this module only inside ProviderRecord, which the
engine uses to build requests; ``to_info`` is the only shape that goes on the wire and it
carries ``hasApiKey`` instead of the key.

Agent engines (type ``acp-engine``) keep their AcpEngineConfig in the ``engine``
column (migration of sidecar/store/acp.py). Any configured value may hold a secret,
whatever its name: ``to_info`` masks every header value, every body field, the base URL's
userinfo and query values and every engine ``env`` value (``sidecar/secrets/mask.py``),
and an update that sends a masked value back keeps the stored one.

Secrets at rest: the key and all of those values are stored sealed
(sidecar/store/secrets.py, Sealer); a record whose secrets cannot be opened (sealed with
a key this process was not given) has ``secrets_locked`` set and those values left out
of what requests use, and stays listable (the locked entries masked like the others) and
editable: its listing sent back keeps every locked value, a new value replaces one.

Synchronous; async code calls it through ``AsyncStore.run`` (``s.providers``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import msgspec

from protocol.providers import AcpEngineConfig, ModelConfig, ProviderInfo, ProviderKind, ProviderUpsertParams
from sidecar.errors import InvalidParams, NotFound
from sidecar.http_fields import headers_problem, value_problem
from sidecar.secrets.mask import mask_map, mask_url, unmask_map, unmask_url
from sidecar.store.db import Database
from sidecar.store.ids import new_id, now_ms
from sidecar.store.secrets import API_KEY, BASE_URL, BODY, ENGINE_ENV, HEADERS, Sealer
from sidecar.store.stored_json import lenient_json

_COLUMNS = (
    "id, name, type, base_url, api_key, api_key_env, headers, body, models, enabled, "
    "created_at, updated_at, engine, stream, timeout_s, max_retries"
)
ACP_TOOL_KINDS = frozenset(
    {"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"}
)


class Listed(msgspec.Struct, frozen=True, kw_only=True):
    """What ``provider:list`` shows of the stored secrets: every value masked, names kept
    (made from the stored form, so a locked entry is listed too)."""

    base_url: str
    headers: dict[str, str]
    body: dict[str, str]
    env: dict[str, str]


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
    listed: Listed
    """The masked view of the stored values (``to_info``)."""

    def __repr__(self) -> str:  # never print the key, even in a traceback
        return f"ProviderRecord(id={self.id!r}, name={self.name!r}, type={self.type!r})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list every field, the key and header values included
        return [("id", self.id), ("name", self.name), ("type", self.type)]

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def to_info(self, *, is_default: bool) -> ProviderInfo:
        listed = self.listed
        engine = msgspec.structs.replace(self.engine, env=listed.env) if self.engine is not None else None
        return ProviderInfo(
            id=self.id,
            name=self.name,
            type=self.type,
            base_url=listed.base_url,
            has_api_key=self.has_stored_key,
            secrets_locked=self.secrets_locked,
            api_key_env=self.api_key_env,
            headers=listed.headers,
            body=listed.body,
            models=self.models,
            enabled=self.enabled,
            stream=self.stream,
            engine=engine,
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


def _row(row: tuple[Any, ...], sealer: Sealer) -> ProviderRecord:
    api_key, key_locked = sealer.open(row[4], API_KEY)
    stored_headers = _headers.decode(row[6])
    headers, headers_locked = sealer.open_map(stored_headers, HEADERS)
    stored_body = lenient_json(_obj, row[7], "body", f"provider {row[0]!r}", {})
    body, body_locked = sealer.open_json_map(stored_body, BODY, f"provider {row[0]!r}")
    base_url, url_locked = sealer.open_url(row[3], BASE_URL)
    engine = _engine.decode(row[12]) if row[12] else None
    env_locked = False
    stored_env: dict[str, str] = {}
    if engine is not None:
        stored_env = engine.env
        env, env_locked = sealer.open_map(stored_env, ENGINE_ENV)
        engine = msgspec.structs.replace(engine, env=env)
    return ProviderRecord(
        id=row[0],
        name=row[1],
        type=row[2],
        base_url=base_url,
        api_key=api_key,
        api_key_env=row[5],
        headers=headers,
        body=body,
        models=_models.decode(row[8]),
        enabled=bool(row[9]),
        created_at=row[10],
        updated_at=row[11],
        engine=engine,
        secrets_locked=key_locked or headers_locked or body_locked or url_locked or env_locked,
        has_stored_key=bool(row[4]),
        stream=row[13] is None or bool(row[13]),
        timeout_s=row[14],
        max_retries=row[15],
        listed=Listed(
            base_url=mask_url(row[3]), headers=mask_map(stored_headers), body=mask_map(stored_body),
            env=mask_map(stored_env),
        ),
    )


def validate(params: ProviderUpsertParams) -> None:
    if not params.name.strip():
        raise InvalidParams("invalid params: name must not be empty - at `$.name`")
    if params.type == "acp-engine":
        _validate_engine(params.engine)
        return
    if params.engine is not None:
        raise InvalidParams("invalid params: engine is only for providers of type acp-engine - at `$.engine`")
    try:
        url = urlparse(params.base_url)
    except ValueError:
        url = urlparse("")
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
    if isinstance(params.api_key, str) and (problem := value_problem(params.api_key)):
        raise InvalidParams(f"invalid params: apiKey {problem} - at `$.apiKey`")
    if problem := headers_problem(params.headers):
        raise InvalidParams(f"invalid params: {problem} - at `$.headers`")


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
        with self._db.write() as conn:
            values = self._stored_form(conn, params)
            conn.execute(
                f"INSERT OR REPLACE INTO providers ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", values
            )
            row = conn.execute(f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (values[0],)).fetchone()
        assert row is not None  # written just above, in this transaction
        return _row(row, self._sealer)

    def edited(self, params: ProviderUpsertParams) -> ProviderRecord:
        """The record an upsert of ``params`` (validated by the caller) would store, without
        storing it: masked values sent back and a left-out key are the stored ones."""
        with self._db.read() as conn:
            return _row(self._stored_form(conn, params), self._sealer)

    def _stored_form(self, conn: Any, params: ProviderUpsertParams) -> tuple[Any, ...]:
        """The row (``_COLUMNS``) ``params`` make: secrets sealed; a value sent back masked
        (provider:list -> edit -> upsert) is the stored (sealed, or locked) one."""
        existing = None
        if params.id is not None:
            existing = conn.execute(
                "SELECT api_key, created_at, engine, headers, body, base_url FROM providers WHERE id = ?",
                (params.id,),
            ).fetchone()
        if params.api_key is msgspec.UNSET:  # left out: the stored key stays
            api_key = existing[0] if existing else None
        else:  # null or "" clears it
            api_key = self._sealer.seal(params.api_key, API_KEY) if params.api_key else None
        engine = params.engine if params.type == "acp-engine" else None
        if engine is not None:
            stored_env = _engine.decode(existing[2]).env if existing is not None and existing[2] else {}
            env = self._sealer.seal_map(unmask_map(engine.env, stored_env), ENGINE_ENV)
            engine = msgspec.structs.replace(engine, env=env)
        stored_headers = _headers.decode(existing[3]) if existing is not None and existing[3] else {}
        headers = self._sealer.seal_map(unmask_map(params.headers, stored_headers), HEADERS)
        stored_body = lenient_json(_obj, existing[4], "body", "the stored provider", {}) if existing else {}
        body = self._sealer.seal_json_map(unmask_map(params.body, stored_body), BODY)
        base_url = params.base_url.rstrip("/")
        if existing is not None:
            base_url = unmask_url(base_url, existing[5])
        now = now_ms()
        enc = msgspec.json.encode
        return (
            params.id or new_id(),
            params.name.strip(),
            params.type,
            self._sealer.seal_url(base_url, BASE_URL),
            api_key,
            params.api_key_env or None,
            enc(headers).decode(),
            enc(body).decode(),
            enc(params.models).decode(),
            int(params.enabled),
            existing[1] if existing else now,
            now,
            enc(engine).decode() if engine is not None else None,
            int(params.stream),
            params.timeout_s,
            params.max_retries,
        )

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
