#!/usr/bin/env python3
"""RPC throughput over a real pipe: pipelined requests/s and notifications/s from the sidecar.

Both figures come from a ``python -m sidecar --bench`` subprocess (``--bench`` enables two
hidden methods that are not part of the contract: ``sidecar:bench:ping`` and
``sidecar:bench:notify {count, size}``), measured end to end by this client:

- requests/s: N ``sidecar:bench:ping`` requests written back to back (pipelined), timed
  until the N-th reply arrives; also N ``sidecar:initialize`` (a real method, ~700-byte
  reply). Baseline in the same run: a naive synchronous NDJSON server in Python (decode
  each line with msgspec, encode the reply, write and flush per line). Target >= 10,000/s.
- notifications/s: one ``sidecar:bench:notify`` making the sidecar emit N ``chat:stream``
  text-delta events whose JSON is 120 bytes (lines ~170 bytes with the envelope), timed
  until the reply that follows the last event arrives. Baseline in the same run: a
  process that only encodes the same events with msgspec and writes them in 64 KiB
  batches (the floor for producing those bytes in Python). Target >= 200,000/s.

    python3 dev.py bench bench_rpc [--requests N] [--notifications N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import anyio
import msgspec
from anyio.abc import Process

ROOT = Path(__file__).resolve().parents[2]

NAIVE_SERVER = r"""
import sys, msgspec
class Req(msgspec.Struct):
    id: int
    method: str
decoder = msgspec.json.Decoder(Req)
encoder = msgspec.json.Encoder()
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    req = decoder.decode(line)
    out.write(encoder.encode({"jsonrpc": "2.0", "id": req.id, "result": "pong"}) + b"\n")
    out.flush()
"""

RAW_EMITTER = r"""
import os, sys, msgspec
sys.path.insert(0, sys.argv[3])
from protocol.events import TextDeltaEvent
count, text = int(sys.argv[1]), "x" * int(sys.argv[2])
encoder = msgspec.json.Encoder()
os.write(1, b"ready\n")
sys.stdin.buffer.read(1)  # the client starts its clock, then says go
batch, size = [], 0
for seq in range(1, count + 1):
    event = TextDeltaEvent(session_id="s1", message_id="m1", timestamp=1700000000000, seq=seq, text=text)
    line = encoder.encode({"jsonrpc": "2.0", "method": "chat:stream", "params": event}) + b"\n"
    batch.append(line)
    size += len(line)
    if size >= 65536:
        os.write(1, b"".join(batch)); batch, size = [], 0
os.write(1, b"".join(batch))
"""


async def read_lines_until(proc: Process, lines: int) -> int:
    """Read stdout until ``lines`` newlines have arrived; returns the bytes read."""
    assert proc.stdout is not None
    seen = 0
    total = 0
    while seen < lines:
        chunk = await proc.stdout.receive(1 << 20)
        seen += chunk.count(b"\n")
        total += len(chunk)
    return total


async def pipelined(proc: Process, payload: bytes, replies: int) -> float:
    assert proc.stdin is not None
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:

        async def write() -> None:
            assert proc.stdin is not None
            view = memoryview(payload)
            for offset in range(0, len(payload), 1 << 16):
                await proc.stdin.send(bytes(view[offset : offset + (1 << 16)]))

        tg.start_soon(write)
        await read_lines_until(proc, replies)
    return time.perf_counter() - started


def requests(method: str, count: int, first_id: int) -> bytes:
    return b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"%s"}\n' % (first_id + i, method.encode()) for i in range(count)
    )


async def spawn(*args: str) -> Process:
    env = dict(os.environ, CHAT_SIDECAR_LOG_LEVEL="WARNING")
    return await anyio.open_process([sys.executable, *args], cwd=ROOT, env=env, stderr=None)


async def bench_requests(data_dir: str, count: int) -> dict[str, float]:
    out: dict[str, float] = {}
    proc = await spawn("-m", "sidecar", "--bench", "--data-dir", data_dir)
    async with proc:
        # Warm up (and check the answers are what we think).
        assert proc.stdin is not None and proc.stdout is not None
        await proc.stdin.send(b'{"jsonrpc":"2.0","id":0,"method":"sidecar:bench:ping"}\n')
        first = await proc.stdout.receive()
        if msgspec.json.decode(first) != {"jsonrpc": "2.0", "id": 0, "result": "pong"}:
            raise SystemExit(f"unexpected reply {first!r}")
        await pipelined(proc, requests("sidecar:bench:ping", 2000, 1), 2000)
        out["ping"] = count / await pipelined(proc, requests("sidecar:bench:ping", count, 10_000), count)
        out["initialize"] = count / await pipelined(proc, requests("sidecar:initialize", count, 1_000_000), count)
        await proc.stdin.aclose()
        await proc.wait()
    naive = await spawn("-c", NAIVE_SERVER)
    async with naive:
        await pipelined(naive, requests("ping", 2000, 1), 2000)
        out["naive"] = count / await pipelined(naive, requests("ping", count, 10_000), count)
        assert naive.stdin is not None
        await naive.stdin.aclose()
        await naive.wait()
    return out


async def bench_notifications(data_dir: str, count: int, size: int) -> dict[str, float]:
    out: dict[str, float] = {}
    proc = await spawn("-m", "sidecar", "--bench", "--data-dir", data_dir)
    async with proc:
        assert proc.stdin is not None and proc.stdout is not None
        request = b'{"jsonrpc":"2.0","id":1,"method":"sidecar:bench:notify","params":{"count":%d,"size":%d}}\n'
        await proc.stdin.send(request % (1000, size))  # warm-up
        await read_lines_until(proc, 1001)
        started = time.perf_counter()
        await proc.stdin.send(request % (count, size))
        total = await read_lines_until(proc, count + 1)
        elapsed = time.perf_counter() - started
        out["sidecar"] = count / elapsed
        out["line_bytes"] = total / (count + 1)
        out["mb_per_s"] = total / elapsed / 1e6
        await proc.stdin.aclose()
        await proc.wait()
    text_len = size - len(
        msgspec.json.encode(
            {"type": "text_delta", "sessionId": "s1", "messageId": "m1", "timestamp": 1700000000000, "seq": count, "text": ""}
        )
    )
    raw = await spawn("-c", RAW_EMITTER, str(count), str(text_len), str(ROOT))
    async with raw:
        assert raw.stdin is not None and raw.stdout is not None
        assert await raw.stdout.receive() == b"ready\n"
        started = time.perf_counter()
        await raw.stdin.send(b"g")
        await read_lines_until(raw, count)
        out["raw"] = count / (time.perf_counter() - started)
        await raw.wait()
    return out


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as data_dir:
        req = await bench_requests(data_dir, args.requests)
        note = await bench_notifications(data_dir, args.notifications, args.size)
    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} cpus")
    print(f"requests over a pipe, {args.requests} pipelined:")
    print(f"  sidecar:bench:ping       {req['ping']:10,.0f} req/s")
    print(f"  sidecar:initialize       {req['initialize']:10,.0f} req/s")
    print(f"  baseline naive sync srv  {req['naive']:10,.0f} req/s")
    print(f"  ratio ping / baseline    {req['ping'] / req['naive']:10.2f}x   target >= 10,000 req/s: "
          f"{'met' if req['ping'] >= 10_000 else 'NOT met'}")
    print(f"notifications from the sidecar, {args.notifications} x {args.size}-byte events "
          f"({note['line_bytes']:.0f}-byte lines):")
    print(f"  sidecar (rpc writer)     {note['sidecar']:10,.0f} notifications/s  ({note['mb_per_s']:.1f} MB/s)")
    print(f"  baseline encode+write    {note['raw']:10,.0f} notifications/s")
    print(f"  ratio sidecar / baseline {note['sidecar'] / note['raw']:10.2f}x   target >= 200,000/s: "
          f"{'met' if note['sidecar'] >= 200_000 else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--notifications", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=120, help="bytes of each event's JSON")
    anyio.run(main_async, parser.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
