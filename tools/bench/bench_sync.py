#!/usr/bin/env python3
"""Qiming sync benchmark: ``sync:pull`` of 1,000 conversations x 50 messages from the fake server.

    python3 dev.py bench bench_sync [--conversations 1000] [--messages 50] [--rounds 1]

Per round, on loopback, into a fresh data dir:
- sidecar: ``sync:pull`` through a real sidecar subprocess over stdio, from the request to
  its result: list pages, message pages (``messagePageSize`` 100: one page and the empty
  page that ends each walk), mapping, one transaction per conversation, search indexing;
- server:  the fake server's own serving time for the same requests (the time its
  handlers spent, read from ``/_control/stats`` before and after): the floor no client
  can go under;
- fetch:   a minimal client (httpx2, the same requests in the same order, the same
  concurrency, nothing stored): what fetching alone costs on this machine;
and prints the wall times, the ratios sidecar / server and sidecar / fetch, the sidecar's
CPU seconds, and messages stored per second. Also checks the import: every conversation
and message is there once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anyio  # noqa: E402
import httpx2  # noqa: E402
from qiming_helpers import PASSWORD, USER, QimingServer, qiming_server  # noqa: E402
from sidecar_proc import spawn_sidecar  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
WORKERS = 4
PAGE = 100


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def serving_ms(server: QimingServer) -> float:
    return float((await server.get("stats"))["servingMs"])


async def fetch_only(server: QimingServer) -> float:
    """The same list walk and message pages with a bare client: seconds."""
    async with httpx2.AsyncClient(base_url=server.url, timeout=60, headers={"X-Client-Type": "desktop"}) as client:
        login = (await client.post("/api/user/passwordLogin", json={"phoneOrEmail": USER, "password": PASSWORD})).json()
        headers = {"Authorization": f"Bearer {login['data']['token']}"}
        client.cookies.clear()
        started = time.perf_counter()
        ids: list[int] = []
        seen: set[int] = set()
        last_id = None
        while True:
            body = {"limit": PAGE} if last_id is None else {"limit": PAGE, "lastId": last_id}
            page = (await client.post("/api/agent/conversation/list", json=body, headers=headers)).json()["data"]
            for conv in page:
                if conv["id"] not in seen:
                    seen.add(conv["id"])
                    ids.append(conv["id"])
            if len(page) < PAGE:
                break
            last_id = page[-1]["id"]
        send, receive = anyio.create_memory_object_stream[int](0)

        async def worker(stream) -> None:
            async with stream:
                async for cid in stream:
                    index = None
                    while True:
                        body = {"conversationId": cid, "size": PAGE, **({"index": index} if index else {})}
                        rows = (await client.post("/api/agent/conversation/message/list", json=body,
                                                  headers=headers)).json()["data"]
                        if not rows:
                            break
                        index = min(r["index"] for r in rows)

        async with anyio.create_task_group() as tg:
            for _ in range(WORKERS):
                tg.start_soon(worker, receive.clone())
            receive.close()
            async with send:
                for cid in ids:
                    await send.send(cid)
        return time.perf_counter() - started


async def sidecar_round(server: QimingServer, conversations: int, messages: int) -> tuple[float, float, float]:
    """(wall seconds of sync:pull, the server's serving ms meanwhile, sidecar CPU seconds)."""
    with tempfile.TemporaryDirectory() as data_dir:
        async with spawn_sidecar(data_dir) as proc:
            await proc.call("sidecar:initialize", {})
            await proc.call("server:configure", {"serviceUrl": server.url, "username": USER, "password": PASSWORD},
                            timeout=60)
            await proc.call("sync:settings:update", {"messagePageSize": PAGE, "listPageSize": PAGE})
            served_before = await serving_ms(server)
            cpu_before = cpu_seconds(proc.pid)
            started = time.perf_counter()
            result = await proc.call("sync:pull", {}, timeout=3600)
            wall = time.perf_counter() - started
            cpu = cpu_seconds(proc.pid) - cpu_before
            served = await serving_ms(server) - served_before
            assert result["errors"] == [], result["errors"][:3]
            assert result["pulled"] == conversations and result["messagesPulled"] == conversations * messages, result
            again = await proc.call("sync:pull", {}, timeout=3600)
            assert again["pulled"] == 0 and again["messagesPulled"] == 0
            await proc.close(timeout=60)
    return wall, served, cpu


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    async with qiming_server() as server:
        seeded = time.perf_counter()
        for start in range(0, args.conversations, 100):
            await server.control("seed", {"count": min(100, args.conversations - start), "messages": args.messages,
                                          "thinkEvery": 3, "attachmentEvery": 5})
        print(f"seeded {args.conversations} conversations x {args.messages} messages "
              f"in {time.perf_counter() - seeded:.1f} s")
        walls, served, cpus, fetches = [], [], [], []
        for _ in range(args.rounds):
            wall, serve, cpu = await sidecar_round(server, args.conversations, args.messages)
            walls.append(wall)
            served.append(serve / 1000)
            cpus.append(cpu)
            fetches.append(await fetch_only(server))
    total = args.conversations * args.messages
    wall, serve, cpu, fetch = (statistics.median(v) for v in (walls, served, cpus, fetches))
    print(f"sidecar sync:pull     {wall:8.2f} s wall   ({cpu:.2f} s CPU in the sidecar)")
    print(f"server serving time   {serve:8.2f} s        (the fake server's own handler time)")
    print(f"fetch only            {fetch:8.2f} s wall   (bare httpx2 client, same requests, nothing stored)")
    print(f"ratio sidecar/server  {wall / serve:8.2f}")
    print(f"ratio sidecar/fetch   {wall / fetch:8.2f}")
    print(f"messages stored/s     {total / wall:8.0f}   ({total} messages, {args.conversations} conversations)")
    print(f"machine load average  {os.getloadavg()[0]:8.2f}   (wall times stretch with it; CPU seconds less so)")


if __name__ == "__main__":
    anyio.run(main)
