#!/usr/bin/env python3
"""MCP client benchmark: our client against the official SDK's, on the same real server.

    python3 dev.py bench bench_mcp_client [--rounds 5] [--calls 200]

The server is fixtures/mcp_server.py (built with the SDK's server), over stdio and over
streamable HTTP on loopback. Each round, for each transport, alternately ours
(sidecar/tools/mcp_transport.py + mcp_client.py) and the SDK's (``mcp.client.stdio`` /
``mcp.client.streamable_http`` + ``ClientSession``; a test dependency, the baseline):
- connect: open the link (a stdio server is spawned), ``initialize``, ``tools/list``;
- call: ``--calls`` sequential ``tools/call add`` round trips, per call.
Prints medians over the rounds and the ratio ours / SDK. Imports are done before timing
(both clients' modules are loaded first); the import cost itself is in docs/tools.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anyio  # noqa: E402
from mcp_helpers import FIXTURE, http_fixture  # noqa: E402

from sidecar.tools.mcp_client import McpSession  # noqa: E402
from sidecar.tools.mcp_config import McpServerConfig  # noqa: E402
from sidecar.tools.mcp_transport import open_link  # noqa: E402

Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


@asynccontextmanager
async def ours(transport: str, url: str) -> AsyncIterator[Call]:
    if transport == "http":
        config = McpServerConfig(name="bench", transport="http", url=url)
    else:
        config = McpServerConfig(name="bench", command=sys.executable, args=[FIXTURE])
    async with open_link(config) as link:
        session = McpSession(link.peer, on_version=link.use_version)
        await session.initialize()
        await session.list_tools()
        yield session.call_tool


@asynccontextmanager
async def sdk(transport: str, url: str) -> AsyncIterator[Call]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if transport == "http":
        async with httpx2.AsyncClient() as client, streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                yield session.call_tool
    else:
        with open(os.devnull, "w") as devnull:
            params = StdioServerParameters(command=sys.executable, args=[FIXTURE])
            async with stdio_client(params, errlog=devnull) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                yield session.call_tool


async def one(client: Any, transport: str, url: str, calls: int) -> tuple[float, float]:
    started = time.perf_counter()
    async with client(transport, url) as call:
        connected = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(calls):
            await call("add", {"a": i, "b": 1})
        per_call = (time.perf_counter() - started) / calls
    return connected, per_call


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    import mcp.client.stdio  # noqa: F401  (both clients loaded before any timing)
    import mcp.client.streamable_http  # noqa: F401

    import sidecar.tools.mcp_http  # noqa: F401

    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    async with http_fixture() as (url, _process):
        for transport in ("stdio", "http"):
            for name, client in (("ours", ours), ("sdk", sdk)):
                await one(client, transport, url, 5)  # warm-up, not counted
        for _ in range(args.rounds):
            for transport in ("stdio", "http"):
                for name, client in (("ours", ours), ("sdk", sdk)):
                    results.setdefault((transport, name), []).append(await one(client, transport, url, args.calls))
    print(f"MCP client vs the SDK's client: {args.rounds} rounds, {args.calls} calls each, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for transport in ("stdio", "http"):
        med = {
            name: (statistics.median(c for c, _ in results[(transport, name)]) * 1000,
                   statistics.median(p for _, p in results[(transport, name)]) * 1e6)
            for name in ("ours", "sdk")
        }
        print(f"  {transport:5} connect  ours {med['ours'][0]:8.1f} ms   sdk {med['sdk'][0]:8.1f} ms   ratio {med['ours'][0] / med['sdk'][0]:.2f}")
        print(f"  {transport:5} call     ours {med['ours'][1]:8.0f} us   sdk {med['sdk'][1]:8.0f} us   ratio {med['ours'][1] / med['sdk'][1]:.2f}")


if __name__ == "__main__":
    anyio.run(main)
