"""Helpers of the MCP tests: fixture servers, spawn records, process trees from /proc.

    async with http_fixture() as (url, process): ...   fixtures/mcp_server.py on streamable HTTP
    async with http_fixture(RAW_HTTP, SCRIPT) as ...:   fixtures/mcp_raw_http_server.py (scripted)
    await wait_status(proc, "fx", {"ready"})      poll mcp:server:list (sidecar subprocess)
    await wait_state(manager, "fx", {"ready"})    the same, in process

Process trees (who descends from the sidecar, whether it is gone) are in proc_tree.py.
Every wait is bounded.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = str(ROOT / "fixtures" / "mcp_server.py")
HUNG = str(ROOT / "fixtures" / "mcp_hung_server.py")
RAW_HTTP = str(ROOT / "fixtures" / "mcp_raw_http_server.py")


# Valid answers of a server with two tools, which the property tests mutate: to initialize,
# tools/list, and three tools/call (text; image and resource; structured content).
INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": True}},
              "serverInfo": {"name": "raw", "version": "1"}}
TOOLS = {"tools": [
    {"name": "echo", "description": "Return the text.", "inputSchema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "look", "title": "Look", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
]}
CALLS = [
    {"content": [{"type": "text", "text": "hello"}], "isError": False},
    {"content": [{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                 {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "a", "mimeType": "text/plain"}}]},
    {"content": [{"type": "text", "text": "{\"n\": 1}"}], "structuredContent": {"n": 1}},
]


async def a_turn_through_its_tools(proc: Any, provider: Any, upsert: dict[str, Any], context: Any) -> None:
    """Add the MCP server ``upsert`` (a server with CALLS' two tools) with policy auto, wait
    until it is ready or failed, and run a turn whose model calls ``echo`` and ``look`` three
    times: the turn ends once, well ordered, with a result for every call when it completes;
    the conversation and the server list still answer. ``context`` is shown on a failure."""
    from chat_helpers import FINAL_TYPES, assert_well_ordered, configure_provider, events_of, wait_final

    name = upsert["name"]
    await configure_provider(proc, provider.base_url)
    await proc.call("mcp:server:upsert", upsert)
    await proc.call("tool:policy:set", {"key": f"mcp:{name}", "policy": "auto"})
    info = await wait_status(proc, name, {"ready", "failed"})
    session = await proc.call("chat:session:create", {"title": "mcp"})
    await provider.script(
        {"tool_calls": [{"id": "c1", "name": f"mcp__{name}__echo", "arguments": {"text": "hi"}},
                        {"id": "c2", "name": f"mcp__{name}__look", "arguments": {}}]},
        {"tool_calls": [{"id": "c3", "name": f"mcp__{name}__echo", "arguments": {"text": "again"}}]},
        {"text": "done"},
    )
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "use the tools"}})
    final = await wait_final(proc, sent["messageId"], timeout=60)
    assert final["type"] in FINAL_TYPES, (final, info, context)
    events = events_of(proc, sent["messageId"])
    assert_well_ordered(events)
    answered = {e["toolResult"]["toolCallId"] for e in events if e["type"] == "tool_result"}
    assert final["type"] != "stream_end" or answered == {"c1", "c2", "c3"}, (answered, info, context)
    await proc.call("chat:messages:get", {"sessionId": session["id"]})
    await proc.call("mcp:server:list")


def stdio_server(name: str = "fx", *args: str, **extra: Any) -> dict[str, Any]:
    """``mcp:server:upsert`` params of the fixture server (camelCase extras as given)."""
    return {"name": name, "command": sys.executable, "args": [FIXTURE, *args], **extra}


def hung_server(name: str, pid_file: Path, *flags: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": sys.executable, "args": [HUNG, "--pid-file", str(pid_file), *flags], **extra}


def spawns(pid_file: Path, kind: str = "server") -> list[tuple[int, float]]:
    """(pid, time) of every start the hung fixture recorded."""
    try:
        text = pid_file.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == kind:
            out.append((int(parts[1]), float(parts[2])))
    return out

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def http_fixture(server: str = FIXTURE, script: Path | None = None) -> AsyncIterator[tuple[str, anyio.abc.Process]]:
    """An MCP server on streamable HTTP on loopback: (url, process), once it listens.
    fixtures/mcp_server.py by default; with ``script``, ``server`` is run as ``server PORT SCRIPT``."""
    port = free_port()
    argv = [server, "--http", str(port)] if script is None else [server, str(port), str(script)]
    process = await anyio.open_process([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while True:
                try:
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                except OSError:
                    await anyio.sleep(0.05)
                    continue
                await stream.aclose()
                break
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            with anyio.move_on_after(5):
                await process.wait()
            await process.aclose()


async def wait_status(proc: Any, name: str, statuses: Collection[str], timeout: float = 30.0) -> dict[str, Any]:
    """Poll ``mcp:server:list`` until server ``name`` has one of ``statuses``; its entry."""
    with anyio.fail_after(timeout):
        while True:
            for info in await proc.call("mcp:server:list"):
                if info["name"] == name and info["status"] in statuses:
                    return info  # type: ignore[no-any-return]
            await anyio.sleep(0.05)


async def wait_state(manager: Any, name: str, statuses: Collection[str], timeout: float = 30.0) -> Any:
    """The in-process ``wait_status`` (McpManager.list_servers)."""
    with anyio.fail_after(timeout):
        while True:
            for info in await manager.list_servers():
                if info.name == name and info.status in statuses:
                    return info
            await anyio.sleep(0.05)


def modules_loaded_by(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` are in ``sys.modules`` after ``code`` runs in a fresh interpreter
    (from the repository root)."""
    script = code + f"import json, sys\nprint(json.dumps(sorted(m for m in {names!r} if m in sys.modules)))\n"
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded
