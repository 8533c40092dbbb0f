"""Run fixtures/scripted_provider.py as a subprocess for a test (a real server on loopback).

    async with scripted_provider() as server:
        await server.script({"text": "hello", "delay_ms": 20})
        ... base URL: server.base_url (OpenAI-compatible, ends in /v1)
        bodies = await server.requests()
"""

from __future__ import annotations

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

    async def targets(self) -> list[dict[str, Any]]:
        """The request target (path and query) and headers of each completion request."""
        async with httpx2.AsyncClient() as client:
            r = await client.get(f"{self.root}/_targets")
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


@asynccontextmanager
async def scripted_provider() -> AsyncIterator[ScriptedServer]:
    process = await anyio.open_process([sys.executable, str(SCRIPT), "--port", "0"])
    try:
        assert process.stdout is not None
        with anyio.fail_after(10):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(64)
        port = int(line.split()[1])
        yield ScriptedServer(port)
    finally:
        with anyio.CancelScope(shield=True):
            process.kill()
            with anyio.move_on_after(5):
                await process.wait()
            await process.aclose()
