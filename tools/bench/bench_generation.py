#!/usr/bin/env python3
"""Generation benchmark: the sidecar's streaming overhead against raw httpx.

    python3 dev.py bench bench_generation [--chunks 10000] [--rounds 5] [--sessions 50]

A loopback OpenAI-compatible server (fixtures/scripted_provider.py, its own process)
streams N small chunks as fast as it can. In one run this measures:
- raw:      httpx2 streaming the same request, parsing every SSE event (json.loads) to the
            end: the baseline;
- sidecar:  ``chat:send`` -> ``stream_end`` through a real sidecar subprocess over stdio
            (user message stored, reply streamed, coalesced events sent, reply stored);
and prints the medians and the ratio sidecar / raw (target <= 1.3), the sidecar's CPU
seconds per N chunks (from /proc), the latency the sidecar adds to the first delta
(median of first-text_delta-after-send minus raw time-to-first-content-chunk, target
< 5 ms), and the sidecar's RSS with M sessions streaming at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anyio  # noqa: E402
import httpx2  # noqa: E402

from scripted_server import scripted_provider  # noqa: E402
from sidecar_proc import spawn_sidecar  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mib(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return float("nan")


async def raw_read(base_url: str, body: dict[str, Any]) -> tuple[float, float, int]:
    """(seconds to the end, seconds to the first content chunk, chunks with content)."""
    async with httpx2.AsyncClient(timeout=60) as client:
        start = time.perf_counter()
        first = 0.0
        chunks = 0
        async with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                choices = event.get("choices") or []
                if choices and choices[0]["delta"].get("content"):
                    chunks += 1
                    if not first:
                        first = time.perf_counter() - start
        return time.perf_counter() - start, first, chunks


async def sidecar_send(proc: Any, session_id: str, text: str) -> tuple[float, float]:
    """(seconds from send to stream_end, seconds from send to the first text_delta)."""
    start_index = len(proc.messages)
    start = time.perf_counter()
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}}, timeout=120)
    mid = sent["messageId"]
    _, first_msg = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == mid and m["params"]["type"] == "text_delta",
        timeout=120, start=start_index,
    )
    first = time.perf_counter() - start
    _, end = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == mid and m["params"]["type"] in ("stream_end", "error", "aborted"),
        timeout=120, start=start_index,
    )
    elapsed = time.perf_counter() - start
    if end["params"]["type"] != "stream_end":
        raise SystemExit(f"generation failed: {end['params']}")
    return elapsed, first


class LeanClient:
    """A second sidecar driven with blocking pipe I/O and json (no event loop, no harness):
    what a minimal Electron-like client sees, to separate the sidecar's latency from the
    async test harness's own (~0.4 ms per message)."""

    def __init__(self, data_dir: str, base_url: str) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "--data-dir", data_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
            env={**os.environ, "CHAT_SIDECAR_LOG_LEVEL": "WARNING"},
        )
        self.next_id = 0
        self.call("sidecar:initialize", {})
        provider = self.call("provider:upsert", {
            "name": "bench", "type": "openai-compat", "baseUrl": base_url, "models": [{"id": "bench-1"}],
        })
        self.call("provider:setDefault", {"providerId": provider["id"], "modelId": "bench-1"})
        self.call("settings:update", {"generateTitles": False})
        self.session = self.call("chat:session:create", {"title": "lean"})["id"]

    def _send(self, method: str, params: Any) -> int:
        assert self.proc.stdin is not None
        self.next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def _next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the lean sidecar closed its stdout")
        return json.loads(line)

    def call(self, method: str, params: Any) -> Any:
        request_id = self._send(method, params)
        while True:
            message = self._next()
            if message.get("id") == request_id:
                if "error" in message:
                    raise SystemExit(f"{method}: {message['error']}")
                return message["result"]

    def first_delta(self, text: str) -> float:
        start = time.perf_counter()
        self._send("chat:send", {"sessionId": self.session, "input": {"content": text}})
        first = 0.0
        while True:
            message = self._next()
            params = message.get("params") or {}
            if message.get("method") == "chat:stream":
                if params["type"] == "text_delta" and not first:
                    first = time.perf_counter() - start
                if params["type"] in ("stream_end", "error", "aborted"):
                    return first

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


async def main(args: argparse.Namespace) -> None:
    data_dir = tempfile.mkdtemp(prefix="bench-generation-")
    try:
        await run(args, data_dir)
    finally:  # both sidecars have exited here (their context managers closed)
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(data_dir + "-lean", ignore_errors=True)


async def run(args: argparse.Namespace, data_dir: str) -> None:
    big = {"text": "tok ", "repeat": args.chunks}
    small = {"text": "hello there", "chunks": 2}
    async with scripted_provider() as server, spawn_sidecar(data_dir, env={"CHAT_SIDECAR_LOG_LEVEL": "WARNING"}) as proc:
        await proc.call("sidecar:initialize", {})
        provider = await proc.call("provider:upsert", {
            "name": "bench", "type": "openai-compat", "baseUrl": server.base_url, "models": [{"id": "bench-1"}],
        })
        await proc.call("provider:setDefault", {"providerId": provider["id"], "modelId": "bench-1"})
        await proc.call("settings:update", {"generateTitles": False})
        body = {"model": "bench-1", "stream": True, "messages": [{"role": "user", "content": "go"}],
                "stream_options": {"include_usage": True}}

        # warm both paths once (imports, connection setup, tiktoken-free paths)
        await server.script(big)
        await raw_read(server.base_url, body)
        session = await proc.call("chat:session:create", {"title": "bench"})
        await server.script(big)
        await sidecar_send(proc, session["id"], "warm up")

        raw_times, side_times, cpu, raw_first, side_first = [], [], [], [], []
        for _ in range(args.rounds):
            await server.script(big)
            total, _, chunks = await raw_read(server.base_url, body)
            assert chunks == args.chunks, chunks
            raw_times.append(total)
            session = await proc.call("chat:session:create", {"title": "bench"})
            await server.script(big)
            before = cpu_seconds(proc.pid)
            elapsed, _ = await sidecar_send(proc, session["id"], "stream please")
            cpu.append(cpu_seconds(proc.pid) - before)
            side_times.append(elapsed)
        lean_first: list[float] = []
        lean = await anyio.to_thread.run_sync(LeanClient, data_dir + "-lean", server.base_url)
        try:
            for _ in range(args.rounds * 4):
                await server.script(small)
                _, first, _ = await raw_read(server.base_url, body)
                raw_first.append(first)
                await server.script(small)
                _, first = await sidecar_send(proc, session["id"], "first delta please")
                side_first.append(first)
                await server.script(small)
                lean_first.append(await anyio.to_thread.run_sync(lean.first_delta, "first delta please"))
        finally:
            await anyio.to_thread.run_sync(lean.close)

        raw_med, side_med = statistics.median(raw_times), statistics.median(side_times)
        print(f"chunks per reply:                 {args.chunks}")
        print(f"raw httpx2 read + parse (median): {raw_med * 1000:8.1f} ms")
        print(f"sidecar send -> stream_end:       {side_med * 1000:8.1f} ms")
        print(f"ratio sidecar / raw:              {side_med / raw_med:8.2f}   (target <= 1.3)")
        print(f"sidecar CPU per {args.chunks} chunks:    {statistics.median(cpu):8.3f} s")
        added = statistics.median(side_first) - statistics.median(raw_first)
        lean_added = statistics.median(lean_first) - statistics.median(raw_first)
        print(f"first delta: raw {statistics.median(raw_first) * 1000:.2f} ms, sidecar "
              f"{statistics.median(side_first) * 1000:.2f} ms, added {added * 1000:.2f} ms (target < 5 ms)")
        print(f"  same with a lean blocking pipe client instead of the async test harness: sidecar "
              f"{statistics.median(lean_first) * 1000:.2f} ms, added {lean_added * 1000:.2f} ms")

        # RSS with many sessions streaming at once
        sessions = [await proc.call("chat:session:create", {"title": f"c{i}"}) for i in range(args.sessions)]
        await server.script(*[{"text": "word ", "repeat": 400, "delay_ms": 5} for _ in sessions])
        rss_before = rss_mib(proc.pid)
        ids = []
        for s in sessions:
            ids.append((await proc.call("chat:send", {"sessionId": s["id"], "input": {"content": "go"}}))["messageId"])
        peak = rss_before
        pending = set(ids)
        with anyio.fail_after(300):
            while pending:
                await anyio.sleep(0.1)
                peak = max(peak, rss_mib(proc.pid))
                done = {e["messageId"] for e in proc.notifications("chat:stream") if e["type"] in ("stream_end", "error", "aborted")}
                pending -= done
        print(f"RSS: idle {rss_before:.1f} MiB, peak with {args.sessions} sessions streaming {peak:.1f} MiB")
        await proc.close(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=50)
    anyio.run(main, parser.parse_args())
