"""The data dir over the subprocess: another local user can read nothing of it. A data dir
the sidecar creates is 0700 and every file it writes there 0600 from creation (chat.db and
SQLite's -wal/-shm, the lock, the key file, attachments, generated images, tool output
spills), under the usual umask 022; a dir or file an older version left wider is
tightened at start, and the log says so. Files the model writes in the user's workspace
keep the modes the umask gives."""

from __future__ import annotations

import base64
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import configure_provider, wait_final
from mcp_helpers import wait_status
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.name == "nt", reason="POSIX modes; Windows relies on the profile's ACL (README)"),
]

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = str(ROOT / "fixtures" / "mcp_server.py")
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """The umask the sidecar inherits (it is read at spawn)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(data: Path) -> dict[str, int]:
    """Mode bits of everything under ``data`` (itself as "."), symlinks not followed."""
    found = {".": stat.S_IMODE(data.lstat().st_mode)}
    for path in data.rglob("*"):
        found[path.relative_to(data).as_posix()] = stat.S_IMODE(path.lstat().st_mode)
    return found


def wider(found: dict[str, int], data: Path) -> dict[str, str]:
    return {
        rel: oct(mode) for rel, mode in found.items()
        if mode & 0o077 or ((data / rel).is_dir() and mode != 0o700) or (not (data / rel).is_dir() and mode != 0o600)
    }


async def fill(p: Any, s: Any, workspace: Path) -> None:
    """Make the sidecar write one of each kind of file it keeps in the data dir."""
    await configure_provider(p, s.base_url)
    await p.call("mcp:server:upsert", {"name": "fx", "command": sys.executable, "args": [FIXTURE]})
    await p.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
    await p.call("tool:policy:set", {"key": "workspace_write_file", "policy": "auto"})
    await wait_status(p, "fx", {"ready"})
    session = await p.call("chat:session:create", {})
    image = "![dot](data:image/png;base64," + base64.b64encode(PNG).decode() + ")"
    await s.script(
        {"tool_calls": [{"id": "c_big", "name": "mcp__fx__echo", "arguments": {"text": "x" * 50_000}}]},
        {"text": "Here is a picture " + image},
    )
    sent = await p.call("chat:send", {"sessionId": session["id"], "input": {
        "content": [{"type": "text", "text": "look"},
                    {"type": "image", "mimeType": "image/png", "base64": base64.b64encode(PNG).decode()}],
        "attachments": [{"name": "notes.txt", "data": base64.b64encode(b"notes").decode(), "mimeType": "text/plain"}],
    }})
    assert (await wait_final(p, sent["messageId"], timeout=60))["type"] == "stream_end"
    # a workspace session: what the model writes there is the user's, not ours
    ws_session = await p.call("chat:session:create", {"workspaceDir": str(workspace)})
    await s.script(
        {"tool_calls": [{"id": "c_w", "name": "workspace_write_file", "arguments": {"path": "made.txt", "content": "hi"}}]},
        {"text": "written"},
    )
    sent = await p.call("chat:send", {"sessionId": ws_session["id"], "input": {"content": "write"}})
    assert (await wait_final(p, sent["messageId"]))["type"] == "stream_end"
    # an ACP session without a workspace: its working directory is made in the data dir
    engine = await add_engine(p)
    acp = await acp_session(p, engine["id"])
    assert (await send_and_wait(p, acp["id"], "hello"))[1]["type"] == "stream_end"


async def test_what_the_sidecar_creates_is_private_from_creation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with umask(0o022):
        async with scripted_provider() as server, spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            await proc.call("chat:session:list", {})  # the store is open
            # while it runs: the database's companions exist now, made by SQLite itself
            assert {"chat.db", "chat.db-wal", "chat.db-shm", "chat-sidecar.lock"} <= {p.name for p in data.iterdir()}
            await fill(proc, server, workspace)
            found = modes(data)
            await proc.close()
    kinds = {rel.split("/")[0] for rel in found}
    assert {"attachments", "tool_outputs", "acp", "chat.db", "chat.db-wal", "chat.db-shm", "secret.key"} <= kinds, sorted(found)
    assert any(rel.startswith("attachments/generated-") for rel in found), sorted(found)
    assert not wider(found, data), wider(found, data)
    # the model's file in the user's workspace: what the umask gives, as any program's
    assert stat.S_IMODE((workspace / "made.txt").stat().st_mode) == 0o644


async def test_a_wider_data_dir_of_an_older_version_is_tightened_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        await fill(proc, server, workspace)
        await proc.close()
    # what an older version (umask 022) left: everything readable by others
    for path in [data, *data.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    with umask(0o022):
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            await proc.call("chat:session:list", {})  # the store is open
            found = modes(data)
            await proc.close()
    ours = {rel: mode for rel, mode in found.items() if not rel.startswith("acp/")}
    assert not wider(ours, data), wider(ours, data)
    assert found["acp"] == 0o700
    assert "tightened" in proc.stderr_text() and str(data) in proc.stderr_text()
