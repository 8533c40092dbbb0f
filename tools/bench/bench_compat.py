#!/usr/bin/env python3
"""V1 endpoint benchmark: what ``/computer/chat`` costs on top of ``chat:send``, and what it
costs to have it.

    python3 dev.py bench bench_compat [--rounds 15]

One sidecar subprocess, the scripted provider on loopback as its default model. In the
same run, alternating, per round:
- send:   ``chat:send`` over stdio -> the first ``chat:stream`` text_delta of the reply
          (the baseline: the renderer's path);
- v1:     ``POST /computer/chat`` -> ``GET /computer/progress/{session_id}`` -> the first
          ``agent_message_chunk`` frame, by a client that behaves as the Qiming server's
          SandboxAgentClient (fixtures/v1_client.py: two HTTP requests, a new connection
          each, as Java's HttpClient does without keep-alive);
both on the same session (the V1 project's: a working directory, the same history), so
the pipeline behind them is the same and the difference is the endpoint's. Prints the medians, the ratio v1 / send
and the difference in milliseconds. Also: the sidecar's RSS before compat:start (the
endpoint off), after it, and after the V1 rounds, and how long compat:start took (the HTTP
stack is imported then, in a worker thread).

Then the siege (``--siege N``, default 1000; 0 skips it): how long an authenticated
``POST /computer/chat`` takes to be answered (its envelope; the reply then streams as
usual and is followed to its end before the next round), idle, then while N connections
without the key each send half a request line and nothing more (slowloris: each one the
server closes is opened again at once), then idle again, all in the same run. Prints the
medians, the ratio siege / idle (the target: at most 2), how many attacking connections
the server closed meanwhile, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
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

from fixtures.v1_client import SandboxClient, Turn, agent_request  # noqa: E402
from scripted_server import scripted_provider  # noqa: E402
from sidecar_proc import sidecar_command, spawn_sidecar  # noqa: E402

REPLY = {"text": "one two three four five six seven eight", "delay_ms": 1}
HALF_A_REQUEST_LINE = b"POST /computer/ch"


def rss_mib(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return float("nan")


async def settle(proc: Any) -> None:
    """Give the process a moment without work (RSS readings after a quiet period)."""
    await proc.call("compat:status", {})
    await anyio.sleep(0.5)


async def send_round(proc: Any, session_id: str, text: str) -> float:
    start_index = len(proc.messages)
    started = time.perf_counter()
    sent = await proc.request("chat:send", {"sessionId": session_id, "input": {"content": text}})
    _, first = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["sessionId"] == session_id and m["params"]["type"] == "text_delta",
        start=start_index, timeout=30,
    )
    elapsed = time.perf_counter() - started
    await proc.response(sent)
    await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == first["params"]["messageId"]
        and m["params"]["type"] in ("stream_end", "error", "aborted"),
        start=start_index, timeout=30,
    )
    return elapsed


async def v1_round(client: SandboxClient, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    data = await client.chat(body)
    turn = Turn(session_id=data["session_id"], chat=data)
    async with client.progress(turn.session_id) as (_, events):
        async for event in events:
            turn.events.append(event)
            client._on_event(turn, event)
            if turn.first_chunk_at is not None:
                elapsed = turn.first_chunk_at - started
                break
        else:
            raise RuntimeError("the progress stream ended without a chunk")
        await client.follow(turn, events)  # the rest of the turn, as the server reads it
    assert turn.completed and turn.error is None, turn
    return elapsed


async def v1_round_session(client: SandboxClient, body: dict[str, Any]) -> str:
    """A first V1 turn (creates the project's session); its session id."""
    data = await client.chat(body)
    turn = Turn(session_id=data["session_id"], chat=data)
    async with client.progress(turn.session_id) as (_, events):
        await client.follow(turn, events)
    return turn.session_id


async def answered(client: SandboxClient, body: dict[str, Any]) -> float:
    """An authenticated POST /computer/chat until its answer; then its reply to the end."""
    started = time.perf_counter()
    data = await client.chat(body)
    elapsed = time.perf_counter() - started
    turn = Turn(session_id=data["session_id"], chat=data)
    async with client.progress(turn.session_id) as (_, events):
        await client.follow(turn, events)
    assert turn.completed and turn.error is None, turn
    return elapsed


class Siege:
    """``count`` slowloris connections, each opened again as soon as the server closes it."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.closed_by_server = 0
        self.opened = 0
        self.ready = anyio.Event()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(self.count):
                tg.start_soon(self._one)

    async def _one(self) -> None:
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", self.port)
            except OSError:
                await anyio.sleep(0.01)
                continue
            async with stream:
                try:
                    await stream.send(HALF_A_REQUEST_LINE)
                    self.opened += 1
                    if self.opened >= self.count:
                        self.ready.set()
                    while await stream.receive():  # a 408, then the end; or a reset
                        pass
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    pass
            self.closed_by_server += 1


async def siege_rounds(client: SandboxClient, body: dict[str, Any], port: int, count: int, rounds: int) -> dict[str, Any]:
    """Idle rounds, rounds under the siege (run by another process, as an attacker is), idle again."""
    idle: list[float] = []
    besieged: list[float] = []
    for i in range(rounds):
        idle.append(await answered(client, {**body, "prompt": f"idle {i}"}))
    attacker = await anyio.open_process([sys.executable, __file__, "--attack", str(port), str(count)])
    try:
        assert attacker.stdout is not None
        with anyio.fail_after(120):
            line = b""
            while not line.endswith(b"\n"):
                line += await attacker.stdout.receive(64)
        for i in range(rounds):
            besieged.append(await answered(client, {**body, "prompt": f"siege {i}"}))
    finally:
        attacker.terminate()
        with anyio.CancelScope(shield=True):
            output = b""
            with anyio.move_on_after(10):
                async for chunk in attacker.stdout:  # type: ignore[union-attr]
                    output += chunk
            await attacker.wait()
            await attacker.aclose()
    closed = int(output.split()[-1]) if output.split() else -1
    for i in range(rounds):
        idle.append(await answered(client, {**body, "prompt": f"idle again {i}"}))
    return {"idle": idle, "siege": besieged, "closed": closed, "opened": count}


async def attack(port: int, count: int) -> None:
    """The attacker process: ``count`` slowloris connections; prints READY once they are
    open, and on SIGTERM how many the server closed."""
    import signal

    siege = Siege(port, count)
    async with anyio.create_task_group() as tg:
        tg.start_soon(siege.run)
        await siege.ready.wait()
        print("READY", flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                break
        print("CLOSED", siege.closed_by_server, flush=True)
        tg.cancel_scope.cancel()


LIMITED = (
    "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NOFILE, (n, n));"
    " os.execv(sys.executable, [sys.executable, '-m', 'sidecar', *sys.argv[2:]])"
)


async def run(rounds: int, siege: int, nofile: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-compat-") as data:
        command = None
        if nofile is not None:
            command = [sys.executable, "-c", LIMITED, str(nofile), *sidecar_command(data)[3:]]
        env = {"CHAT_SIDECAR_LOG_LEVEL": "WARNING"}
        async with scripted_provider() as server, spawn_sidecar(data, env=env, command=command) as proc:
            await proc.call("sidecar:initialize", {})
            provider = await proc.call("provider:upsert", {
                "name": "Scripted", "type": "openai-compat", "baseUrl": server.base_url,
                "models": [{"id": "scripted-1"}],
            })
            await proc.call("provider:setDefault", {"providerId": provider["id"], "modelId": "scripted-1"})
            await proc.call("settings:update", {"generateTitles": False})
            await server.script({**REPLY, "times": 10 * (rounds + 2)})
            warm = await proc.call("chat:session:create", {})
            await send_round(proc, warm["id"], "warm up")  # imports, first request
            await settle(proc)
            rss_off = rss_mib(proc.pid)
            started = time.perf_counter()
            info = await proc.call("compat:start", {"port": 0})
            start_ms = (time.perf_counter() - started) * 1000
            await settle(proc)
            rss_on = rss_mib(proc.pid)
            client = SandboxClient(info["url"], info["token"])
            body = agent_request("warm up", project_id="bench")
            session_id = body["session_id"] = await v1_round_session(client, body)
            send: list[float] = []
            v1: list[float] = []
            for i in range(rounds):
                order = (0, 1) if i % 2 == 0 else (1, 0)
                for which in order:
                    if which == 0:
                        send.append(await send_round(proc, session_id, f"round {i}"))
                    else:
                        v1.append(await v1_round(client, {**body, "prompt": f"round {i}"}))
            await settle(proc)
            rss_after = rss_mib(proc.pid)
            besieged: dict[str, Any] = {}
            if siege:
                status = await proc.call("compat:status", {})
                besieged = await siege_rounds(client, {**body, "project_id": "siege", "session_id": None},
                                              info["port"], siege, rounds)
                besieged["max_connections"] = status["maxConnections"]
            await client.aclose()
            await proc.close()
    return {
        "send": send, "v1": v1, "rss_off": rss_off, "rss_on": rss_on, "rss_after": rss_after, "start_ms": start_ms,
        "siege": besieged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--siege", type=int, default=1000, help="slowloris connections (0: no siege)")
    parser.add_argument("--nofile", type=int, default=None, help="the sidecar's RLIMIT_NOFILE (default: inherited)")
    parser.add_argument("--attack", nargs=2, type=int, metavar=("PORT", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        anyio.run(attack, *args.attack)
        return
    load_before = os.getloadavg()
    r = anyio.run(run, args.rounds, args.siege, args.nofile)
    load_after = os.getloadavg()
    send = statistics.median(r["send"]) * 1000
    v1 = statistics.median(r["v1"]) * 1000
    print(f"V1 /computer/chat: {args.rounds} rounds each, alternating (medians)")
    print(f"  chat:send -> first chat:stream delta            {send:8.2f} ms   (baseline)")
    print(f"  POST /computer/chat -> first SSE chunk          {v1:8.2f} ms")
    print(f"  ratio v1 / chat:send                            {v1 / send:8.2f}")
    print(f"  added by the V1 path                            {v1 - send:8.2f} ms")
    print(f"  compat:start (imports uvicorn, binds, serves)   {r['start_ms']:8.1f} ms")
    print(f"  RSS with the endpoint off                       {r['rss_off']:8.1f} MiB")
    print(f"  RSS after compat:start (idle)                   {r['rss_on']:8.1f} MiB   (+{r['rss_on'] - r['rss_off']:.1f} MiB)")
    print(f"  RSS after the V1 rounds                         {r['rss_after']:8.1f} MiB")
    if r["siege"]:
        b = r["siege"]
        idle = statistics.median(b["idle"]) * 1000
        besieged = statistics.median(b["siege"]) * 1000
        print(f"Siege: {args.siege} connections without the key, half a request line each (medians of {args.rounds})")
        print(f"  POST /computer/chat answered, idle              {idle:8.2f} ms")
        print(f"  POST /computer/chat answered, under the siege   {besieged:8.2f} ms   (max {max(b['siege']) * 1000:.2f})")
        print(f"  ratio siege / idle                              {besieged / idle:8.2f}   (target <= 2)")
        print(f"  attacking connections / closed by the endpoint  {b['opened']:8d} / {b['closed']}   (each reopened at once)")
        print(f"  connections the endpoint holds at most          {b['max_connections']:8d}")
    print(f"  load average before / after                     {load_before[0]:.2f} / {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
