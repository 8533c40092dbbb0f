"""Run fixtures/scripted_provider.py as a subprocess for a test (a real server on loopback).

    async with scripted_provider() as server:
        await server.script({"text": "hello", "delay_ms": 20})
        ... base URL: server.base_url (OpenAI-compatible, ends in /v1)
        bodies = await server.requests()

The server processes are shared by the tests of one pytest process: one that a test is
done with waits, idle, for the next ``scripted_provider()``, which resets it first
(``/_reset``: a fresh server's queue, log, request count and config, and it refuses the
completions of connections accepted before the reset, so no test sees a request of the
one before). What must stay true: a server is used by one block at a time, and every
server is killed when the process exits.
"""

from __future__ import annotations

import atexit
import select
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scripted_provider.py"


class ScriptedServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.root}/v1"

    async def script(self, *replies: dict[str, Any]) -> None:
        async with httpx2.AsyncClient() as client:
            r = await client.post(f"{self.root}/_script", json={"replies": list(replies)})
            r.raise_for_status()

    async def requests(self) -> list[dict[str, Any]]:
        async with httpx2.AsyncClient() as client:
            r = await client.get(f"{self.root}/_requests")
            r.raise_for_status()
            return r.json()

    async def config(self, **settings: Any) -> None:
        """``streaming=False``: the endpoint refuses every streaming request with a 400."""
        async with httpx2.AsyncClient() as client:
            (await client.post(f"{self.root}/_config", json=settings)).raise_for_status()

    async def cancelled(self) -> list[int]:
        """Numbers of the requests whose client went away before their whole reply."""
        async with httpx2.AsyncClient() as client:
            r = await client.get(f"{self.root}/_cancelled")
            r.raise_for_status()
            return r.json()

    async def reset(self) -> None:
        async with httpx2.AsyncClient() as client:
            (await client.post(f"{self.root}/_reset", json={})).raise_for_status()


IDLE_KEEP = 2
"""Idle servers kept for reuse (a test may use two at once)."""
_idle: list[tuple[subprocess.Popen[bytes], int]] = []
_started: list[subprocess.Popen[bytes]] = []


@asynccontextmanager
async def scripted_provider() -> AsyncIterator[ScriptedServer]:
    process, port = _idle.pop() if _idle else await anyio.to_thread.run_sync(_start)
    server = ScriptedServer(port)
    reusable = False
    try:
        await server.reset()
        yield server
        reusable = True
    finally:
        if reusable and process.poll() is None and len(_idle) < IDLE_KEEP:
            _idle.append((process, port))
        else:
            _stop(process)


def _start() -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--port", "0"], stdout=subprocess.PIPE)
    _started.append(process)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 10)
        line = process.stdout.readline() if ready else b""
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"the scripted provider did not start: {line!r}")
        return process, int(line.split()[1])
    except BaseException:
        _stop(process)
        raise


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if process.stdout is not None:
        process.stdout.close()
    if process in _started:
        _started.remove(process)


@atexit.register
def _stop_all() -> None:
    for process in list(_started):
        _stop(process)
