"""Secrets at rest, over the subprocess: every value a provider, an ACP engine or an MCP
server is configured with that may hold a secret (every header value, every body field,
the base URL's query and credentials, every env value) is sealed in the database files,
whatever its name, and shown masked by the listings; a masked value sent back keeps the
stored one; rows an older version stored in plaintext are sealed at start; with the wrong
key nothing is lost."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import apsw
import pytest
from chat_helpers import wait_final
from scripted_server import ScriptedServer, scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

BODY = "body-SECRET-a1b2c3"
QUERY = "query-SECRET-d4e5f6"
USERINFO = "userinfo-SECRET-0f9e8d"
HEADER = "header-SECRET-071829"
ENV = "env-SECRET-3a4b5c"
MCP_HEADER = "mcp-header-SECRET-6d7e8f"
MCP_QUERY = "mcp-query-SECRET-909192"
MCP_ENV = "mcp-env-SECRET-a3a4a5"
SECRETS = (BODY, QUERY, USERINFO, HEADER, ENV, MCP_HEADER, MCP_QUERY, MCP_ENV)
KEY_A = base64.b64encode(b"A" * 32).decode()
KEY_B = base64.b64encode(b"B" * 32).decode()


def database_bytes(data: Path) -> bytes:
    return b"".join(p.read_bytes() for p in data.glob("chat.db*"))


def provider_params(server: ScriptedServer) -> dict[str, Any]:
    # none of these names looks secret: each value is a secret all the same
    return {
        "name": "Scripted", "type": "openai-compat",
        "baseUrl": f"{server.base_url}?key={QUERY}&api-version=2024-10-01",
        "headers": {"X-Trace": HEADER, "X-Title": "chat"},
        "body": {"api_key": BODY, "temperature": 0.25},
        "models": [{"id": "scripted-1"}],
    }


ENGINE = {"name": "Agent", "type": "acp-engine", "engine": {"command": sys.executable, "env": {"PLAIN": ENV}}}
MCP_HTTP = {"name": "web", "transport": "http", "url": f"http://{USERINFO}@127.0.0.1:9/mcp?token={MCP_QUERY}",
            "headers": {"X-Custom": MCP_HEADER}, "enabled": False}
MCP_STDIO = {"name": "local", "command": sys.executable, "args": ["-V"], "env": {"MODE": MCP_ENV}, "enabled": False}


async def configure(proc: SidecarProcess, server: ScriptedServer, **initialize: Any) -> dict[str, Any]:
    await proc.call("sidecar:initialize", initialize)
    provider = await proc.call("provider:upsert", provider_params(server))
    await proc.call("provider:setDefault", {"providerId": provider["id"], "modelId": "scripted-1"})
    await proc.call("provider:upsert", ENGINE)
    await proc.call("mcp:server:upsert", MCP_HTTP)
    await proc.call("mcp:server:upsert", MCP_STDIO)
    return provider


async def listings(proc: SidecarProcess) -> str:
    return json.dumps(await proc.call("provider:list", {})) + json.dumps(await proc.call("mcp:server:list", {}))


async def reply_uses_every_value(proc: SidecarProcess, server: ScriptedServer) -> None:
    """A reply goes out with the stored values (nothing lost, nothing masked)."""
    session = await proc.call("chat:session:create", {})
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hello"}})
    final = await wait_final(proc, sent["messageId"])
    assert final["type"] == "stream_end", final
    body = (await server.requests())[-1]
    target = (await server.targets())[-1]
    assert body["api_key"] == BODY and body["temperature"] == 0.25
    assert f"key={QUERY}" in target["target"] and "api-version=2024-10-01" in target["target"]
    headers = {k.lower(): v for k, v in target["headers"].items()}
    assert headers["x-trace"] == HEADER and headers["x-title"] == "chat"


def stored_values(data: Path, key: str) -> str:
    """Every stored secret as the sidecar opens it (in process, with the host key)."""
    from sidecar.secrets.box import SecretBox
    from sidecar.secrets.keys import parse_key
    from sidecar.store.store import Store

    store = Store(data, secrets=SecretBox(data, host_key=parse_key(key), use_keychain=False))
    try:
        store.secrets.settle()
        opened = [
            (r.base_url, r.headers, r.body, r.engine.env if r.engine else None, r.secrets_locked)
            for r in store.providers.list()
        ]
        return json.dumps(opened) + json.dumps(store.tools.mcp_servers())
    finally:
        store.close()


def assert_masked(listed: str) -> None:
    leaked = [s for s in SECRETS if s in listed]
    assert not leaked, leaked


async def test_every_value_is_sealed_at_rest_and_masked_in_the_listings(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure(proc, server)
        listed = await listings(proc)
        assert_masked(listed)
        providers = {p["name"]: p for p in await proc.call("provider:list", {})}
        scripted = providers["Scripted"]
        assert scripted["headers"] == {"X-Trace": "***", "X-Title": "***"}
        assert scripted["body"] == {"api_key": "***", "temperature": "***"}
        assert scripted["baseUrl"] == f"{server.base_url}?key=***&api-version=***"
        assert providers["Agent"]["engine"]["env"] == {"PLAIN": "***"}
        web = next(s for s in await proc.call("mcp:server:list", {}) if s["name"] == "web")
        assert web["url"] == "http://***@127.0.0.1:9/mcp?token=***"
        await reply_uses_every_value(proc, server)
        await proc.close()
    raw = database_bytes(data)
    leaked = [s for s in SECRETS if s.encode() in raw]
    assert not leaked, leaked


async def test_a_listing_sent_back_keeps_every_stored_value(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure(proc, server, secretKey=KEY_A)
        for provider in await proc.call("provider:list", {}):
            sent_back = {k: provider[k] for k in ("id", "name", "type", "baseUrl", "headers", "body", "models", "engine")}
            await proc.call("provider:upsert", sent_back)
        web = next(s for s in await proc.call("mcp:server:list", {}) if s["name"] == "web")
        await proc.call("mcp:server:upsert", {**MCP_HTTP, "url": web["url"]})
        await reply_uses_every_value(proc, server)
        await proc.close()
    opened = stored_values(data, KEY_A)
    for secret in SECRETS:
        assert secret in opened, secret
    assert "***" not in opened


async def test_plaintext_of_an_older_version_is_sealed_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            provider = await configure(proc, server, secretKey=KEY_A)
            await proc.close()
        # the rows as an older version stored them: only secret-looking names were sealed
        conn = apsw.Connection(str(data / "chat.db"))
        conn.execute(
            "UPDATE providers SET base_url = ?, headers = ?, body = ? WHERE id = ?",
            (f"{server.base_url}?key={QUERY}&api-version=2024-10-01",
             json.dumps({"X-Trace": HEADER, "X-Title": "chat"}),
             json.dumps({"api_key": BODY, "temperature": 0.25}), provider["id"]),
        )
        conn.execute(
            "UPDATE providers SET engine = ? WHERE type = 'acp-engine'",
            (json.dumps({"command": sys.executable, "env": {"PLAIN": ENV}}),),
        )
        conn.execute("UPDATE mcp_servers SET config = ? WHERE name = 'web'", (json.dumps(MCP_HTTP),))
        conn.execute("UPDATE mcp_servers SET config = ? WHERE name = 'local'", (json.dumps(MCP_STDIO),))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        assert BODY.encode() in database_bytes(data)
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {"secretKey": KEY_A})
            assert_masked(await listings(proc))
            await reply_uses_every_value(proc, server)
            await proc.close()
    raw = database_bytes(data)
    leaked = [s for s in SECRETS if s.encode() in raw]
    assert not leaked, leaked
    opened = stored_values(data, KEY_A)
    for secret in SECRETS:
        assert secret in opened, secret


async def test_with_another_key_the_values_are_locked_and_nothing_is_lost(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            await configure(proc, server, secretKey=KEY_A)
            await proc.close()
        async with spawn_sidecar(data) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": KEY_B})
            assert info["secrets"]["state"] == "locked"
            listed = await listings(proc)
            assert_masked(listed)
            providers = {p["name"]: p for p in await proc.call("provider:list", {})}
            scripted = providers["Scripted"]
            assert scripted["secretsLocked"] is True and providers["Agent"]["secretsLocked"] is True
            # the names of what is locked are still listed (masked), so an edit keeps them
            assert set(scripted["headers"]) == {"X-Trace", "X-Title"} and set(scripted["body"]) == {"api_key", "temperature"}
            assert "key=***" in scripted["baseUrl"]
            # a reply needs them: a typed error, no request with half the values
            session = await proc.call("chat:session:create", {})
            before = len(await server.requests())
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hello"}})
            final = await wait_final(proc, sent["messageId"])
            assert final["type"] == "error" and final["code"] == -32008, final
            assert len(await server.requests()) == before
            # an edit of the locked provider (its listing sent back, the name changed) loses nothing
            sent_back = {k: scripted[k] for k in ("id", "type", "baseUrl", "headers", "body", "models")}
            await proc.call("provider:upsert", {**sent_back, "name": "Renamed"})
            await proc.close()
        async with spawn_sidecar(data) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": KEY_A})
            assert info["secrets"] == {"state": "ready", "source": "host", "locked": 0}
            await reply_uses_every_value(proc, server)
            await proc.close()
    opened = stored_values(data, KEY_A)
    for secret in SECRETS:
        assert secret in opened, secret
