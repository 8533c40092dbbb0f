"""The secret fields of the database and their sealing (see sidecar/secrets/box.py).

Owns the list of stored secrets and the re-seal pass:
- ``providers.api_key``; the values of secret-looking ``providers.headers`` and of the
  secret-looking ``env`` of an ``acp-engine`` provider's ``engine`` config;
- ``mcp_servers.config``: every ``env`` value, and secret-looking ``headers`` values;
- ``sync_account.token``: the Qiming server token;
- ``channel_secrets.value``: an IM channel's platform credentials and its remote agent's
  token (ChannelRepo).
``Sealer`` turns those fields of one row to and from their stored form; ProviderRepo,
ToolStore and SyncRepo call it on every read and write, so plaintext never reaches the file.
``SecretsRepo.settle`` decides the key (SecretBox.settle) and, in one transaction,
re-seals what is plaintext (rows of an older version) or sealed with another key we
have, and counts what is sealed with a key we do not have (locked). It then checkpoints
the WAL so no old page holding plaintext stays in the files (the writer connection
runs with ``secure_delete``), and removes a key file nothing is sealed with any more.

Must stay true: a value that cannot be opened is never rewritten or dropped (it stays as
stored, and opens again with the right key).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from sidecar.errors import SecretsLocked
from sidecar.secrets.box import SecretBox, SecretsStatus, is_sealed
from sidecar.secrets.keys import remove_key_file
from sidecar.secrets.names import is_secret_name
from sidecar.store.db import Database, fetch_all

API_KEY = "providers.api_key"
HEADERS = "providers.headers"
ENGINE_ENV = "providers.engine.env"
MCP_ENV = "mcp_servers.env"
MCP_HEADERS = "mcp_servers.headers"
SYNC_TOKEN = "sync_account.token"
CHANNEL_SECRET = "channel_secrets.value"

_obj = msgspec.json.Decoder(dict[str, Any])


class Sealer:
    """Seal/open the secret fields of stored rows with one SecretBox."""

    def __init__(self, box: SecretBox) -> None:
        self.box = box

    # values -------------------------------------------------------------------------

    def seal(self, value: str | None, purpose: str) -> str | None:
        if not value or is_sealed(value):
            return value
        return self.box.seal(value, purpose)

    def open(self, value: str | None, purpose: str) -> tuple[str | None, bool]:
        """(plaintext or None, locked)."""
        if not value:
            return value, False
        try:
            return self.box.open(value, purpose), False
        except SecretsLocked:
            return None, True

    # maps of name -> value (headers, env) -------------------------------------------

    def seal_map(self, values: dict[str, str], purpose: str, *, every: bool = False) -> dict[str, str]:
        return {k: (self.seal(v, purpose) or "") if every or is_secret_name(k) else v for k, v in values.items()}

    def open_map(self, values: dict[str, str], purpose: str) -> tuple[dict[str, str], bool]:
        """Opened values; a value that cannot be opened is left out (and locked is True)."""
        opened: dict[str, str] = {}
        locked = False
        for key, value in values.items():
            if is_sealed(value):
                plain, bad = self.open(value, purpose)
                if bad:
                    locked = True
                    continue
                opened[key] = plain or ""
            else:
                opened[key] = value
        return opened, locked

    # MCP server configs (a JSON object with ``env`` and ``headers``) ------------------

    def seal_mcp_config(self, config: str) -> str:
        data = _obj.decode(config)
        _map_fields(data, lambda values, purpose, every: self.seal_map(values, purpose, every=every))
        return msgspec.json.encode(data).decode()

    def open_mcp_config(self, config: str) -> tuple[str, bool]:
        data = _obj.decode(config)
        locked = False

        def opened(values: dict[str, str], purpose: str, every: bool) -> dict[str, str]:
            nonlocal locked
            result, bad = self.open_map(values, purpose)
            locked = locked or bad
            return result

        _map_fields(data, opened)
        return msgspec.json.encode(data).decode(), locked


def _map_fields(data: dict[str, Any], fn: Callable[[dict[str, str], str, bool], dict[str, str]]) -> None:
    for field, purpose, every in (("env", MCP_ENV, True), ("headers", MCP_HEADERS, False)):
        values = data.get(field)
        if isinstance(values, dict) and all(isinstance(v, str) for v in values.values()):
            data[field] = fn(values, purpose, every)


class SecretsRepo:
    def __init__(self, db: Database, sealer: Sealer, data_dir: Path) -> None:
        self._db = db
        self._sealer = sealer
        self._data_dir = data_dir

    def settle(self, host_key: bytes | None = None) -> SecretsStatus:
        box = self._sealer.box
        box.settle(host_key)
        kids: set[str | None] = set()
        locked = 0
        with self._db.write() as conn:
            for provider_id, api_key, headers, engine in fetch_all(
                conn,
                "SELECT id, api_key, headers, engine FROM providers"
            ):
                new_key, n = self._reseal(api_key, API_KEY, kids)
                locked += n
                new_headers, n = self._reseal_json_map(headers, None, HEADERS, kids, every=False)
                locked += n
                new_engine, n = self._reseal_json_map(engine, "env", ENGINE_ENV, kids, every=False)
                locked += n
                if (new_key, new_headers, new_engine) != (api_key, headers, engine):
                    conn.execute(
                        "UPDATE providers SET api_key = ?, headers = ?, engine = ? WHERE id = ?",
                        (new_key, new_headers, new_engine, provider_id),
                    )
            for name, config in fetch_all(conn, "SELECT name, config FROM mcp_servers"):
                data = _obj.decode(config)
                changed = False
                for field, purpose, every in (("env", MCP_ENV, True), ("headers", MCP_HEADERS, False)):
                    values = data.get(field)
                    if not isinstance(values, dict):
                        continue
                    resealed, n = self._reseal_map(values, purpose, kids, every=every)
                    locked += n
                    if resealed != values:
                        data[field] = resealed
                        changed = True
                if changed:
                    conn.execute(
                        "UPDATE mcp_servers SET config = ? WHERE name = ?", (msgspec.json.encode(data).decode(), name)
                    )
            for account_id, token in fetch_all(
                conn,
                "SELECT id, token FROM sync_account WHERE token IS NOT NULL"
            ):
                if not isinstance(token, str):
                    continue
                new_token, n = self._reseal(token, SYNC_TOKEN, kids)
                locked += n
                if new_token != token:
                    conn.execute("UPDATE sync_account SET token = ? WHERE id = ?", (new_token, account_id))
            for channel_id, name, value in fetch_all(conn, "SELECT channel_id, name, value FROM channel_secrets"):
                new_value, n = self._reseal(value, CHANNEL_SECRET, kids)
                locked += n
                if new_value != value:
                    conn.execute(
                        "UPDATE channel_secrets SET value = ? WHERE channel_id = ? AND name = ?",
                        (new_value, channel_id, name),
                    )
        # old page images (the plaintext of an older version, a rewritten value) must not
        # stay in the WAL file
        self._db.checkpoint()
        if box.primary_source != "file" and all(kid != _file_kid(box) for kid in kids):
            remove_key_file(self._data_dir)
        box.locked = locked
        return box.status()

    def _reseal(self, value: str | None, purpose: str, kids: set[str | None]) -> tuple[str | None, int]:
        """(stored form, 1 if locked else 0); the value is re-sealed with the primary key
        when it is plaintext or sealed with another key we have."""
        if not value:
            return value, 0
        box = self._sealer.box
        verdict = box.needs_reseal(value)
        if verdict is None:
            kids.add(box.key_of(value))
            return value, 1
        if verdict:
            value = box.seal(box.open(value, purpose), purpose)
        kids.add(box.key_of(value))
        return value, 0

    def _reseal_map(
        self, values: dict[str, Any], purpose: str, kids: set[str | None], *, every: bool
    ) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        locked = 0
        for key, value in values.items():
            if isinstance(value, str) and value and (every or is_secret_name(key) or is_sealed(value)):
                value, n = self._reseal(value, purpose, kids)
                locked += n
            out[key] = value
        return out, locked

    def _reseal_json_map(
        self, raw: str | None, field: str | None, purpose: str, kids: set[str | None], *, every: bool
    ) -> tuple[str | None, int]:
        if not raw:
            return raw, 0
        data = _obj.decode(raw)
        values = data if field is None else data.get(field)
        if not isinstance(values, dict):
            return raw, 0
        resealed, locked = self._reseal_map(values, purpose, kids, every=every)
        if resealed == values:
            return raw, locked
        if field is None:
            data = resealed
        else:
            data[field] = resealed
        return msgspec.json.encode(data).decode(), locked


def _file_kid(box: SecretBox) -> str | None:
    return box.kid_of_source("file")
