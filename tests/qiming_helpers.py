"""Run fixtures/qiming_server.py (the fake Qiming server) for a test, and drive the sidecar against it.

    async with qiming_server() as server:
        await server.control("seed", {"count": 3, "messages": 4})
        ... server.url is the service URL for server:configure
        convs = await server.conversations()
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
SCRIPT = ROOT / "fixtures" / "qiming_server.py"
USER = "demo@example.com"
PASSWORD = "pw-Demo-7f3a91"
SYNC_TIMEOUT = 120.0


class QimingServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    async def control(self, name: str, body: dict[str, Any] | None = None) -> Any:
        async with httpx2.AsyncClient(timeout=30) as client:
            r = await client.post(f"{self.url}/_control/{name}", json=body or {})
            r.raise_for_status()
            return r.json()

    async def get(self, name: str) -> Any:
        async with httpx2.AsyncClient(timeout=30) as client:
            r = await client.get(f"{self.url}/_control/{name}")
            r.raise_for_status()
            return r.json()

    async def conversations(self) -> list[dict[str, Any]]:
        return await self.get("conversations")

    async def requests(self) -> list[dict[str, Any]]:
        return await self.get("requests")

    async def fault(self, *rules: dict[str, Any]) -> None:
        await self.control("fault", {"rules": list(rules)})

    async def token(self, **body: Any) -> str:
        return (await self.control("token", body))["token"]


@asynccontextmanager
async def qiming_server() -> AsyncIterator[QimingServer]:
    process = await anyio.open_process([sys.executable, str(SCRIPT), "--port", "0"])
    try:
        assert process.stdout is not None
        with anyio.fail_after(10):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(64)
        yield QimingServer(int(line.split()[1]))
    finally:
        with anyio.CancelScope(shield=True):
            process.kill()
            with anyio.move_on_after(5):
                await process.wait()
            await process.aclose()


async def configure(proc: Any, server: QimingServer, **extra: Any) -> dict[str, Any]:
    """server:configure with the fixture's demo login (or ``token=...``)."""
    params: dict[str, Any] = {"serviceUrl": server.url, **extra}
    if "token" not in params:
        params.setdefault("username", USER)
        params.setdefault("password", PASSWORD)
    return await proc.call("server:configure", params, timeout=30)


async def sync(proc: Any, method: str = "sync:pull", params: dict[str, Any] | None = None) -> dict[str, Any]:
    return await proc.call(method, params or {}, timeout=SYNC_TIMEOUT)


async def all_sessions(proc: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = await proc.call("chat:session:list", {"limit": 500, "offset": offset})
        out.extend(page["sessions"])
        offset += len(page["sessions"])
        if offset >= page["total"] or not page["sessions"]:
            return out


async def all_messages(proc: Any, session_id: str) -> list[dict[str, Any]]:
    return await proc.call("chat:messages:get", {"sessionId": session_id, "options": {"allBranches": True}})
