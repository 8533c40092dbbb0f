#!/usr/bin/env python3
"""Provider adapter benchmark: a loopback server streams N small chunks as fast as it can;
each wire format is read by raw httpx2 and by the sidecar's adapter, in the same run.

    python3 dev.py bench bench_providers [--chunks 10000] [--rounds 7]

Per format (OpenAI SSE, Anthropic SSE, Ollama NDJSON) it prints the median wall and CPU
time of:
- raw lines:   httpx2 ``aiter_lines`` counting lines (the floor: no parsing at all);
- raw parse:   httpx2's EventSource (or aiter_lines) + ``json.loads`` of every event,
               what a hand-written client would do;
- adapter:     ``create_provider(...).stream()`` consumed to the end (typed parts);
and the ratios adapter / raw lines and adapter / raw parse, plus the adapter's cost per
chunk over raw lines. The server runs in a subprocess so it does not share our event loop.
A second table does the same through an in-memory ScriptedTransport (no sockets), where
the adapter also runs its idle watchdog per body chunk (an injected non-HTTP transport
does not enforce read timeouts itself): it shows what the adapter costs when the network
costs nothing. On a busy machine prefer the CPU figures: the wall clock includes waiting
for a core.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import httpx2  # noqa: E402

from protocol.types import TextPart  # noqa: E402
from sidecar.providers import ChatRequest, ModelInfo, ProviderSettings, RequestMessage, create_provider  # noqa: E402
from sidecar.providers.replay import Reply, ScriptedTransport  # noqa: E402

FORMATS = ("openai-compat", "anthropic", "ollama")
PATHS = {"openai-compat": "/v1/chat/completions", "anthropic": "/v1/messages", "ollama": "/api/chat"}
BASES = {"openai-compat": "/v1", "anthropic": "", "ollama": ""}


# -- the streams ---------------------------------------------------------------------------


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def events(kind: str, n: int) -> tuple[str, list[bytes]]:
    """(content type, one body piece per event) for ``n`` one-token chunks."""
    out: list[str] = []
    if kind == "openai-compat":
        head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "bench"}
        for i in range(n):
            out.append("data: " + dumps({**head, "choices": [{"index": 0, "delta": {"content": f"t{i % 10} "}, "finish_reason": None}]}) + "\n\n")
        out.append("data: " + dumps({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + "\n\n")
        out.append("data: " + dumps({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}) + "\n\n")
        out.append("data: [DONE]\n\n")
        return "text/event-stream", [s.encode() for s in out]
    if kind == "anthropic":
        def ev(t: str, o: dict[str, Any]) -> str:
            return f"event: {t}\ndata: {dumps({'type': t, **o})}\n\n"
        out.append(ev("message_start", {"message": {"id": "msg", "type": "message", "role": "assistant", "content": [], "model": "bench", "usage": {"input_tokens": 5, "output_tokens": 1}}}))
        out.append(ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
        for i in range(n):
            out.append(ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"t{i % 10} "}}))
        out.append(ev("content_block_stop", {"index": 0}))
        out.append(ev("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": n}}))
        out.append(ev("message_stop", {}))
        return "text/event-stream", [s.encode() for s in out]
    for i in range(n):
        out.append(dumps({"model": "bench", "created_at": "2025-01-01T00:00:00Z", "message": {"role": "assistant", "content": f"t{i % 10} "}, "done": False}) + "\n")
    out.append(dumps({"model": "bench", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop", "prompt_eval_count": 5, "eval_count": n}) + "\n")
    return "application/x-ndjson", [s.encode() for s in out]


# -- the loopback server (subprocess) ---------------------------------------------------------


def serve(port: int, n: int) -> None:
    responses: dict[bytes, bytes] = {}
    for kind in FORMATS:
        ctype, pieces = events(kind, n)
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        head = f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ntransfer-encoding: chunked\r\n\r\n".encode()
        responses[PATHS[kind].encode()] = head + chunked

    async def handle(stream: anyio.abc.SocketStream) -> None:
        buf = b""
        async with stream:
            while True:
                try:
                    while b"\r\n\r\n" not in buf:
                        buf += await stream.receive()
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(rest) < length:
                        rest += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                buf = rest[length:]
                path = head.split(b" ")[1]
                await stream.send(responses.get(path, b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"))

    async def main() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        print("ready", flush=True)
        await listener.serve(handle)

    anyio.run(main)


# -- the readers ------------------------------------------------------------------------------


REQUEST = ChatRequest(model=ModelInfo(id="bench"), messages=[RequestMessage(role="user", parts=[TextPart(text="go")])])
BODY = b'{"model":"bench","stream":true}'


async def raw_lines(client: httpx2.AsyncClient, url: str) -> int:
    count = 0
    async with client.stream("POST", url, content=BODY) as response:
        async for _ in response.aiter_lines():
            count += 1
    return count


async def raw_parse(client: httpx2.AsyncClient, url: str, kind: str) -> int:
    count = 0
    async with client.stream("POST", url, content=BODY) as response:
        if kind == "ollama":
            async for line in response.aiter_lines():
                if line:
                    json.loads(line)
                    count += 1
        else:
            async for event in httpx2.EventSource(response):
                if event.data != "[DONE]":
                    json.loads(event.data)
                count += 1
    return count


async def adapter(provider: Any) -> int:
    count = 0
    async with aclosing(provider.stream(REQUEST)) as parts:
        async for _ in parts:
            count += 1
    return count


async def measure(fn: Callable[[], Awaitable[int]], rounds: int) -> tuple[float, float, int]:
    """Median wall and median CPU seconds of ``rounds`` runs after a warm-up."""
    await fn()  # warm-up: connection, caches
    walls: list[float] = []
    cpus: list[float] = []
    count = 0
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        count = await fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), count


def row(label: str, wall: float, cpu: float, count: int) -> None:
    print(f"  {label:<12} wall {wall * 1000:8.1f} ms   cpu {cpu * 1000:8.1f} ms   ({count} items)")


async def bench_loopback(port: int, n: int, rounds: int) -> None:
    base = f"http://127.0.0.1:{port}"
    print(f"loopback server, {n} chunks per stream, median of {rounds} rounds")
    async with httpx2.AsyncClient(timeout=30) as client:
        for kind in FORMATS:
            settings = ProviderSettings(type=kind, base_url=base + BASES[kind], api_key="bench-key")  # type: ignore[arg-type]
            provider = create_provider(settings)
            url = base + PATHS[kind]
            lines = await measure(lambda: raw_lines(client, url), rounds)
            parsed = await measure(lambda: raw_parse(client, url, kind), rounds)
            ours = await measure(lambda: adapter(provider), rounds)
            await provider.aclose()
            print(kind)
            row("raw lines", *lines)
            row("raw parse", *parsed)
            row("adapter", *ours)
            print(
                f"  ratio adapter/raw lines {ours[0] / lines[0]:.2f}x wall, {ours[1] / lines[1]:.2f}x cpu;"
                f" adapter/raw parse {ours[0] / parsed[0]:.2f}x wall;"
                f" adapter cost over raw lines {(ours[0] - lines[0]) / n * 1e6:.1f} us/chunk"
            )


async def bench_memory(n: int, rounds: int) -> None:
    print(f"\nin-memory ScriptedTransport (one body chunk per event), {n} chunks")
    for kind in FORMATS:
        ctype, pieces = events(kind, n)

        def transport() -> ScriptedTransport:
            return ScriptedTransport(*[Reply(headers={"content-type": ctype}, chunks=pieces) for _ in range(rounds + 1)])

        raw_transport = transport()
        client = httpx2.AsyncClient(transport=raw_transport)
        url = "http://bench.local" + PATHS[kind]
        lines = await measure(lambda: raw_lines(client, url), rounds)
        await client.aclose()
        settings = ProviderSettings(type=kind, base_url="http://bench.local" + BASES[kind])  # type: ignore[arg-type]
        provider = create_provider(settings, transport=transport())
        ours = await measure(lambda: adapter(provider), rounds)
        await provider.aclose()
        bare = create_provider(settings, transport=transport())
        # Reach past the IdleTimeoutTransport wrapper, to show what the watchdog itself costs.
        bare._client._transport = bare._client._transport._inner  # type: ignore[attr-defined]
        unwatched = await measure(lambda: adapter(bare), rounds)
        await bare.aclose()
        print(kind)
        row("raw lines", *lines)
        row("adapter", *ours)
        row("no watchdog", *unwatched)
        print(
            f"  ratio adapter/raw lines {ours[0] / lines[0]:.2f}x wall, {(ours[0] - lines[0]) / n * 1e6:.1f} us/chunk;"
            f" watchdog {(ours[1] - unwatched[1]) / n * 1e6:.1f} us/chunk cpu"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.chunks)
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--chunks", str(args.chunks)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != b"ready":
            print("the benchmark server did not start", file=sys.stderr)
            return 1
        anyio.run(bench_loopback, port, args.chunks, args.rounds)
        anyio.run(bench_memory, args.chunks, args.rounds)
    finally:
        server.terminate()
        server.wait(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
