"""Secrets at rest, over the subprocess: no API key in the database files, legacy plaintext
re-sealed, another host key locks the secrets (and everything else still works), a host
key given later re-seals, the key file / keychain / fd sources."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest
from chat_helpers import API_KEY, configure_provider, wait_final
from scripted_server import scripted_provider
from sidecar_proc import ROOT, CallError, sidecar_command, spawn_sidecar

pytestmark = pytest.mark.anyio

HEADER_SECRET = "tok-HEADER-SECRET-91c2e7"
ENV_SECRET = "env-ENGINE-SECRET-5d0a1b"
MCP_SECRET = "env-MCP-SECRET-77f1aa"
KEY_A = base64.b64encode(b"A" * 32).decode()
KEY_B = base64.b64encode(b"B" * 32).decode()


def database_bytes(data: Path) -> bytes:
    return b"".join(p.read_bytes() for p in data.glob("chat.db*"))


async def add_secrets(proc: Any, base_url: str) -> dict[str, Any]:
    provider = await configure_provider(proc, base_url, headers={"Authorization": f"Bearer {HEADER_SECRET}", "X-Plain": "visible"})
    await proc.call(
        "provider:upsert",
        {"name": "Agent", "type": "acp-engine", "engine": {"command": sys.executable, "env": {"API_TOKEN": ENV_SECRET, "MODE": "plain"}}},
    )
    await proc.call("mcp:server:upsert", {"name": "fx", "command": sys.executable, "args": ["-V"], "env": {"TOKEN": MCP_SECRET}, "enabled": False})
    return provider


async def reply_type(proc: Any) -> dict[str, Any]:
    session = await proc.call("chat:session:create", {})
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hello"}})
    return await wait_final(proc, sent["messageId"])


async def test_the_database_files_hold_no_secret_in_plaintext(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        info = await proc.call("sidecar:initialize", {})
        assert info["secrets"] in (None, {"state": "ready", "source": "file", "locked": 0})
        await proc.call("provider:list", {})  # served once the store is open and the key settled
        key_file = data / "secret.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        await add_secrets(proc, server.base_url)
        assert (await reply_type(proc))["type"] == "stream_end"  # the key opens for the request
        listed = await proc.call("provider:list", {})
        assert listed[0]["hasApiKey"] is True and listed[0]["secretsLocked"] is False
        assert listed[0]["headers"] == {"Authorization": "***", "X-Plain": "***"}  # every value, any name
        await proc.close()
    raw = database_bytes(data)
    for secret in (API_KEY, HEADER_SECRET, ENV_SECRET, MCP_SECRET):
        assert secret.encode() not in raw, secret
    assert b"visible" not in raw and b"X-Plain" in raw  # every value is sealed; names stay readable


async def test_plaintext_rows_of_an_older_version_are_sealed_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        provider = await configure_provider(proc, server.base_url)
        await proc.close()
    legacy = "sk-LEGACY-PLAINTEXT-0a9b8c"
    conn = apsw.Connection(str(data / "chat.db"))
    conn.execute("UPDATE providers SET api_key = ?, headers = ? WHERE id = ?",
                 (legacy, '{"X-Api-Key":"%s"}' % HEADER_SECRET, provider["id"]))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert legacy.encode() in database_bytes(data)
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        listed = await proc.call("provider:list", {})
        assert listed[0]["hasApiKey"] is True and listed[0]["secretsLocked"] is False
        await proc.close()
    raw = database_bytes(data)
    assert legacy.encode() not in raw and HEADER_SECRET.encode() not in raw
    # and the sealed value is the legacy key (opened in-process with the data dir's key file)
    from sidecar.secrets.box import SecretBox
    from sidecar.store.store import Store

    store = Store(data, secrets=SecretBox(data, use_keychain=False))
    try:
        record = store.providers.get(provider["id"])
        assert record.api_key == legacy and record.headers == {"X-Api-Key": HEADER_SECRET}
    finally:
        store.close()


async def test_another_host_key_locks_the_secrets_and_nothing_else(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": KEY_A})
            assert info["secrets"] == {"state": "ready", "source": "host", "locked": 0}
            await add_secrets(proc, server.base_url)
            assert (await reply_type(proc))["type"] == "stream_end"
            await proc.close()
        assert not (data / "secret.key").exists()  # the host key is the only key

        async with spawn_sidecar(data) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": KEY_B})
            assert info["secrets"]["state"] == "locked" and info["secrets"]["locked"] == 6
            listed = {p["name"]: p for p in await proc.call("provider:list", {})}
            assert listed["Scripted"]["hasApiKey"] is True and listed["Scripted"]["secretsLocked"] is True
            assert listed["Agent"]["secretsLocked"] is True
            # every method that needs no secret works
            sessions = await proc.call("chat:session:list", {})
            assert sessions["total"] == 1
            sid = sessions["sessions"][0]["id"]
            assert len(await proc.call("chat:messages:get", {"sessionId": sid})) == 2
            assert await proc.call("chat:messages:search", {"query": "hello"})
            await proc.call("chat:session:export", {"id": sid})
            await proc.call("settings:get", {})
            final = await reply_type(proc)
            assert final["type"] == "error" and final["code"] == -32008, final
            acp = await proc.call("chat:session:create", {"mode": "acp", "providerId": listed["Agent"]["id"], "modelId": "a"})
            sent = await proc.call("chat:send", {"sessionId": acp["id"], "input": {"content": "hi"}})
            assert (await wait_final(proc, sent["messageId"]))["code"] == -32008
            await proc.close()

        # nothing was lost: the right key opens everything again
        async with spawn_sidecar(data) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": KEY_A})
            assert info["secrets"] == {"state": "ready", "source": "host", "locked": 0}
            assert (await reply_type(proc))["type"] == "stream_end"
            await proc.close()


async def test_a_host_key_given_later_reseals_and_retires_the_key_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            await add_secrets(proc, server.base_url)
            await proc.close()
        assert (data / "secret.key").exists()
        async with spawn_sidecar(data) as proc:
            info = await proc.call("sidecar:initialize", {"secretKey": KEY_A})
            assert info["secrets"] == {"state": "ready", "source": "host", "locked": 0}
            assert (await reply_type(proc))["type"] == "stream_end"
            await proc.close()
        assert not (data / "secret.key").exists()
        async with spawn_sidecar(data) as proc:  # the host key is now needed
            await proc.call("sidecar:initialize", {})
            assert all(p["secretsLocked"] for p in await proc.call("provider:list", {}))
            await proc.close()


@pytest.mark.parametrize("bad", ["short", "!!!not base64!!!", base64.b64encode(b"x" * 31).decode()])
async def test_a_bad_secret_key_is_invalid_params(tmp_path: Path, bad: str) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        with pytest.raises(CallError) as err:
            await proc.call("sidecar:initialize", {"secretKey": bad})
        assert err.value.code == -32602 and "secretKey" in err.value.message
        assert bad not in err.value.message or bad == "short"
        await proc.close()


async def test_the_host_key_on_an_inherited_fd(tmp_path: Path) -> None:
    data = tmp_path / "data"
    read_end, write_end = os.pipe()
    os.write(write_end, (KEY_A + "\n").encode())
    os.close(write_end)
    env = dict(os.environ, CHAT_SIDECAR_KEYCHAIN="off", CHAT_SIDECAR_LOG_LEVEL="INFO")
    command = sidecar_command(data, "--secret-key-fd", str(read_end))
    process = await anyio.open_process(command, env=env, cwd=ROOT, pass_fds=(read_end,))
    os.close(read_end)
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "sidecar:initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "provider:upsert",
         "params": {"name": "P", "type": "openai-compat", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": API_KEY}},
        {"jsonrpc": "2.0", "id": 3, "method": "sidecar:shutdown"},
    ]
    try:
        assert process.stdin is not None and process.stdout is not None
        for request in requests:
            await process.stdin.send((json.dumps(request) + "\n").encode())
        output = b""
        with anyio.fail_after(20):
            while output.count(b"\n") < 3:
                output += await process.stdout.receive()
        assert b'"error"' not in output, output
        await process.stdin.aclose()
        with anyio.fail_after(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()
    assert not (data / "secret.key").exists()
    async with spawn_sidecar(data) as proc:  # sealed with the fd's key: it opens with that key
        info = await proc.call("sidecar:initialize", {"secretKey": KEY_A})
        assert info["secrets"] == {"state": "ready", "source": "host", "locked": 0}
        await proc.close()


async def test_the_os_keychain_keeps_the_key_when_there_is_no_host_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    keyring_file = tmp_path / "keyring.json"
    env = {
        "CHAT_SIDECAR_KEYCHAIN": "on",
        "PYTHON_KEYRING_BACKEND": "toy_keyring.FileKeyring",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "fixtures" / "keyring"), os.environ.get("PYTHONPATH", "")]),
        "TOY_KEYRING_FILE": str(keyring_file),
    }
    async with scripted_provider() as server:
        async with spawn_sidecar(data, env=env) as proc:
            await configure_provider(proc, server.base_url)
            await proc.close()
        assert keyring_file.exists() and not (data / "secret.key").exists()
        async with spawn_sidecar(data, env=env) as proc:
            await proc.call("sidecar:initialize", {})
            assert (await reply_type(proc))["type"] == "stream_end"
            await proc.close()
