"""The secret fields of the database and their sealing (see sidecar/secrets/box.py).

Owns the list of stored secrets and the re-seal pass. Every value a user configures that
may carry a credential is sealed, whatever its name (a header called ``X-Trace`` can
hold a token as well as ``Authorization``):
- ``providers.api_key``; every value of ``providers.headers``; every field of
  ``providers.body`` (each value's JSON, sealed); the userinfo and every query value of
  ``providers.base_url`` (``sidecar/secrets/urls.py``: the rest of the URL stays
  readable); every ``env`` value of an ``acp-engine`` provider's ``engine`` config;
- ``mcp_servers.config``: every ``env`` value, every ``headers`` value, the ``url``'s
  userinfo and query values;
- ``sync_account.token``: the Qiming server token;
- ``channel_secrets.value``: an IM channel's platform credentials and its remote agent's
  token (ChannelRepo).
Names (header and env names, body and query keys) stay readable: they are what the
listings show (masked values, ``sidecar/secrets/mask.py``). A sealed URL part is stored
percent-encoded in its place, so the stored URL still parses.
``Sealer`` turns those fields of one row to and from their stored form; ProviderRepo,
ToolStore and SyncRepo call it on every read and write, so plaintext never reaches the file.
``SecretsRepo.settle`` decides the key (SecretBox.settle) and, in one transaction,
re-seals what is plaintext (rows of an older version, which sealed only secret-looking
names: this pass is their migration, as it needs the key, which the schema migrations
run without) or sealed with another key we have, and counts what is sealed with a key
we do not have (locked). It then checkpoints the WAL so no old page holding plaintext
stays in the files (the writer connection runs with ``secure_delete``), and removes a
key file nothing is sealed with any more.

Must stay true: a value that cannot be opened is never rewritten or dropped (it stays as
stored, and opens again with the right key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from sidecar.datadir import StrPath
from sidecar.errors import SecretsLocked
from sidecar.secrets.box import SecretBox, SecretsStatus, is_sealed
from sidecar.secrets.keys import remove_key_file
from sidecar.store.db import Database, fetch_all
from sidecar.store.stored_json import lenient_json

API_KEY = "providers.api_key"
HEADERS = "providers.headers"
BODY = "providers.body"
BASE_URL = "providers.base_url"
ENGINE_ENV = "providers.engine.env"
MCP_ENV = "mcp_servers.env"
MCP_HEADERS = "mcp_servers.headers"
MCP_URL = "mcp_servers.url"
SYNC_TOKEN = "sync_account.token"
_MCP_MAPS = (("env", MCP_ENV), ("headers", MCP_HEADERS))
CHANNEL_SECRET = "channel_secrets.value"

_obj = msgspec.json.Decoder(dict[str, Any])
_any = msgspec.json.Decoder()
_UNREADABLE = object()


def _map_url(url: str, fn: Callable[[str, str | None], str | None]) -> str:
    """``url`` with each part that may hold a secret (sidecar/secrets/urls.py) replaced by
    ``fn(part, token)``: ``token`` is the sealed value the part holds (None: it is plaintext)."""
    # here, not at the top: urllib.parse is ~2 ms of the handshake, whose re-seal pass often reads no URL
    from urllib.parse import unquote

    from sidecar.secrets.urls import map_secret_parts

    def mapped(part: str) -> str | None:
        text = unquote(part)
        return fn(part, text if is_sealed(text) else None)

    return map_secret_parts(url, mapped)


def _quoted(sealed: str) -> str:
    """A sealed value as a URL part (called back by ``_map_url``, which loaded urllib.parse)."""
    from urllib.parse import quote

    return quote(sealed, safe="")


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

    def seal_map(self, values: dict[str, str], purpose: str) -> dict[str, str]:
        return {k: self.seal(v, purpose) or "" for k, v in values.items()}

    def open_map(self, values: dict[str, str], purpose: str) -> tuple[dict[str, str], bool]:
        """Opened values; a value that cannot be opened is left out (and locked is True)."""
        opened: dict[str, str] = {}
        locked = False
        for key, value in values.items():
            plain, bad = self.open(value, purpose)
            if bad:
                locked = True
                continue
            opened[key] = plain or ""
        return opened, locked

    # maps of name -> any JSON value (a provider's body) ------------------------------

    def seal_json_map(self, values: dict[str, Any], purpose: str) -> dict[str, str]:
        """Each value's JSON, sealed (a value that is sealed already is kept as it is)."""
        return {
            k: v if isinstance(v, str) and is_sealed(v) else self.box.seal(msgspec.json.encode(v).decode(), purpose)
            for k, v in values.items()
        }

    def open_json_map(self, values: dict[str, Any], purpose: str, row: str) -> tuple[dict[str, Any], bool]:
        """The values (JSON decoded); one that cannot be opened is left out (locked True),
        one that does not decode (or nests too deep to serve) is left out and logged.
        A value that is not sealed (an older version's row) is itself."""
        opened: dict[str, Any] = {}
        locked = False
        for key, value in values.items():
            if not (isinstance(value, str) and is_sealed(value)):
                opened[key] = value
                continue
            plain, bad = self.open(value, purpose)
            if bad or plain is None:
                locked = True
                continue
            decoded = lenient_json(_any, plain, f"{purpose} field {key!r}", row, _UNREADABLE)
            if decoded is not _UNREADABLE:
                opened[key] = decoded
        return opened, locked

    # URLs: the userinfo and the query values ----------------------------------------

    def seal_url(self, url: str, purpose: str) -> str:
        def seal(part: str, token: str | None) -> str:
            return part if token else _quoted(self.box.seal(part, purpose))

        return _map_url(url, seal)

    def open_url(self, url: str, purpose: str) -> tuple[str, bool]:
        """The URL as given; a part that cannot be opened is left out (locked True)."""
        locked = False

        def opened(part: str, token: str | None) -> str | None:
            nonlocal locked
            if token is None:
                return part
            plain, bad = self.open(token, purpose)
            locked = locked or bad
            return None if bad else plain

        return _map_url(url, opened), locked

    # MCP server configs (a JSON object with ``env``, ``headers`` and ``url``) ---------

    def seal_mcp_config(self, config: str) -> str:
        data = _obj.decode(config)
        for field, purpose in _MCP_MAPS:
            values = _str_map(data.get(field))
            if values is not None:
                data[field] = self.seal_map(values, purpose)
        if isinstance(data.get("url"), str):
            data["url"] = self.seal_url(data["url"], MCP_URL)
        return msgspec.json.encode(data).decode()

    def open_mcp_config(self, config: str, name: str) -> tuple[str, bool]:
        """The config with its secrets opened (one that cannot be opened left out: locked
        True); a config that does not decode comes back as stored (its reader logs it)."""
        data = lenient_json(_obj, config, "config", f"MCP server {name!r}", None)
        if data is None:
            return config, False
        locked = False
        for field, purpose in _MCP_MAPS:
            values = _str_map(data.get(field))
            if values is not None:
                data[field], bad = self.open_map(values, purpose)
                locked = locked or bad
        if isinstance(data.get("url"), str):
            data["url"], bad = self.open_url(data["url"], MCP_URL)
            locked = locked or bad
        return msgspec.json.encode(data).decode(), locked


def _str_map(values: Any) -> dict[str, str] | None:
    if isinstance(values, dict) and all(isinstance(v, str) for v in values.values()):
        return values
    return None


class SecretsRepo:
    def __init__(self, db: Database, sealer: Sealer, data_dir: StrPath) -> None:
        self._db = db
        self._sealer = sealer
        self._data_dir = data_dir

    def settle(self, host_key: bytes | None = None) -> SecretsStatus:
        box = self._sealer.box
        box.settle(host_key)
        pass_ = _Reseal(box)
        with self._db.write() as conn:
            for provider_id, api_key, headers, body, base_url, engine in fetch_all(
                conn,
                "SELECT id, api_key, headers, body, base_url, engine FROM providers"
            ):
                row = f"provider {provider_id!r}"
                new = (
                    pass_.value(api_key, API_KEY),
                    pass_.json_field(headers, None, HEADERS, pass_.map, row),
                    pass_.json_field(body, None, BODY, pass_.json_values, row),
                    pass_.url(base_url, BASE_URL),
                    pass_.json_field(engine, "env", ENGINE_ENV, pass_.map, row),
                )
                if new != (api_key, headers, body, base_url, engine):
                    conn.execute(
                        "UPDATE providers SET api_key = ?, headers = ?, body = ?, base_url = ?, engine = ? WHERE id = ?",
                        (*new, provider_id),
                    )
            for name, config in fetch_all(conn, "SELECT name, config FROM mcp_servers"):
                resealed = config
                for field, purpose in _MCP_MAPS:
                    resealed = pass_.json_field(resealed, field, purpose, pass_.map, f"MCP server {name!r}")
                data = lenient_json(_obj, resealed, "config", f"MCP server {name!r}", None)
                if data is not None and isinstance(data.get("url"), str):
                    url = pass_.url(data["url"], MCP_URL)
                    if url != data["url"]:
                        data["url"] = url
                        resealed = msgspec.json.encode(data).decode()
                if resealed != config:
                    conn.execute("UPDATE mcp_servers SET config = ? WHERE name = ?", (resealed, name))
            for account_id, token in fetch_all(
                conn,
                "SELECT id, token FROM sync_account WHERE token IS NOT NULL"
            ):
                if not isinstance(token, str):
                    continue
                new_token = pass_.value(token, SYNC_TOKEN)
                if new_token != token:
                    conn.execute("UPDATE sync_account SET token = ? WHERE id = ?", (new_token, account_id))
            for channel_id, name, value in fetch_all(conn, "SELECT channel_id, name, value FROM channel_secrets"):
                new_value = pass_.value(value, CHANNEL_SECRET)
                if new_value != value:
                    conn.execute(
                        "UPDATE channel_secrets SET value = ? WHERE channel_id = ? AND name = ?",
                        (new_value, channel_id, name),
                    )
        # old page images (the plaintext of an older version, a rewritten value) must not
        # stay in the WAL file
        self._db.checkpoint()
        if box.primary_source != "file" and all(kid != box.kid_of_source("file") for kid in pass_.kids):
            remove_key_file(self._data_dir)
        box.locked = pass_.locked
        return box.status()


class _Reseal:
    """One re-seal pass: every stored form brought to "sealed with the primary key"
    (plaintext sealed, values of another key we have re-sealed); values sealed with a
    key we do not have are kept as they are and counted (``locked``); ``kids`` collects
    the key ids the stored values are sealed with afterwards."""

    def __init__(self, box: SecretBox) -> None:
        self.box = box
        self.kids: set[str | None] = set()
        self.locked = 0

    def value(self, value: str | None, purpose: str) -> str | None:
        if not value:
            return value
        verdict = self.box.needs_reseal(value)
        if verdict is None:
            self.kids.add(self.box.key_of(value))
            self.locked += 1
            return value
        if verdict:
            value = self.box.seal(self.box.open(value, purpose), purpose)
        self.kids.add(self.box.key_of(value))
        return value

    def map(self, values: dict[str, Any], purpose: str) -> dict[str, Any]:
        return {k: self.value(v, purpose) if isinstance(v, str) else v for k, v in values.items()}

    def json_values(self, values: dict[str, Any], purpose: str) -> dict[str, Any]:
        """A body: a sealed value is re-sealed like any other, a plain one (any JSON) sealed."""
        return {
            k: self.value(v if isinstance(v, str) and is_sealed(v) else msgspec.json.encode(v).decode(), purpose)
            for k, v in values.items()
        }

    def url(self, url: str | None, purpose: str) -> str | None:
        if not url:
            return url

        def part(text: str, token: str | None) -> str:
            return _quoted(self.value(token if token is not None else text, purpose) or "")

        return _map_url(url, part)

    def json_field(
        self, raw: str | None, field: str | None, purpose: str,
        fn: Callable[[dict[str, Any], str], dict[str, Any]], row: str,
    ) -> str | None:
        """``raw`` (a JSON object) with its map (itself, or its ``field``) passed through
        ``fn``; ``raw`` itself when nothing changed, or when it does not decode (or nests
        too deep to serve: it is left as stored, and logged)."""
        if not raw:
            return raw
        data = lenient_json(_obj, raw, purpose, row, None)
        if data is None:
            return raw
        values = data if field is None else data.get(field)
        if not isinstance(values, dict):
            return raw
        resealed = fn(values, purpose)
        if resealed == values:
            return raw
        if field is None:
            data = resealed
        else:
            data[field] = resealed
        return msgspec.json.encode(data).decode()
