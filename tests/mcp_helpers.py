"""Helpers of the MCP tests: fixture servers, spawn records, process trees from /proc.

    async with http_fixture() as url: ...        fixtures/mcp_server.py on streamable HTTP
    await wait_status(proc, "fx", {"ready"})      poll mcp:server:list (sidecar subprocess)
    await wait_state(manager, "fx", {"ready"})    the same, in process
    tree = descendants(proc.pid)                  {(pid, start time)} of every descendant
    assert all(gone(p) for p in tree)

Every wait is bounded; /proc is Linux only (the tests that need it skip elsewhere).
"""

from __future__ import annotations

import os
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
HAS_PROC = Path("/proc/self/stat").exists()

Proc = tuple[int, int]
"""(pid, start time in clock ticks): a pid that was reused is not the same process."""


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


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> set[Proc]:
    """Every live process whose parent chain leads to ``root`` (not ``root`` itself)."""
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                parents[int(entry)] = stat[1]
                starts[int(entry)] = stat[2]
    out: set[Proc] = set()
    for pid in parents:
        seen = pid
        for _ in range(64):
            parent = parents.get(seen)
            if parent is None or parent <= 1:
                break
            if parent == root:
                out.add((pid, starts[pid]))
                break
            seen = parent
    return out


def gone(proc: Proc) -> bool:
    """The process no longer runs (exited and reaped, or a zombie, or its pid was reused)."""
    stat = _stat(proc[0])
    return stat is None or stat[0] == "Z" or stat[2] != proc[1]


def proc_of(pid: int) -> Proc | None:
    stat = _stat(pid)
    return None if stat is None else (pid, stat[2])


async def wait_gone(procs: Collection[Proc], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not all(gone(p) for p in procs):
            await anyio.sleep(0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def http_fixture() -> AsyncIterator[tuple[str, anyio.abc.Process]]:
    """fixtures/mcp_server.py serving streamable HTTP on loopback: (url, process), once it listens."""
    port = free_port()
    process = await anyio.open_process(
        [sys.executable, FIXTURE, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
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
