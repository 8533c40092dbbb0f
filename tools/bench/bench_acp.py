#!/usr/bin/env python3
"""ACP benchmark: 10,000 agent_message_chunk updates through the sidecar.

    python3 dev.py bench bench_acp [--chunks 10000] [--rounds 5]

The scripted agent (fixtures/acp/scripted_agent.py, ``flood N``) sends N
``agent_message_chunk`` updates as fast as it can and reports its own send time in its
last chunk. In one run this measures, per round:
- agent:    the agent's own time to write the N updates (its report): the floor;
- raw:      a minimal client (plain ``json.loads`` per line, no sidecar) driving the same
            agent over pipes, from ``session/prompt`` sent to its result: the baseline of
            "an ACP client that only reads";
- sidecar:  ``chat:send`` -> final ``stream_end`` through a real sidecar subprocess over
            stdio (user message stored, N updates mapped into the reply, coalesced
            ``text_delta`` events sent, raw updates kept in ``acp_parts``, reply stored);
and prints medians, the ratios sidecar / agent and sidecar / raw, the sidecar's CPU
seconds for the N updates (from /proc) and the number of events the renderer received.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anyio  # noqa: E402
from sidecar_proc import spawn_sidecar  # noqa: E402

AGENT = ROOT / "fixtures" / "acp" / "scripted_agent.py"
TICKS = os.sysconf("SC_CLK_TCK")
REPORT = re.compile(r"\[flood: (\d+) chunks sent in ([0-9.]+) ms\]")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def raw_round(chunks: int) -> tuple[float, float]:
    """(seconds from session/prompt to its result, the agent's reported ms) without the sidecar."""
    proc = subprocess.Popen(
        [sys.executable, str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict) -> None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    def until(request_id: int) -> tuple[dict, list[dict]]:
        seen = []
        for line in proc.stdout:
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message, seen
            seen.append(message)
        raise EOFError

    try:
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {}}}})
        until(0)
        send({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}})
        session_id = until(1)[0]["result"]["sessionId"]
        started = time.perf_counter()
        send({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
              "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": f"flood {chunks}"}]}})
        _, updates = until(2)
        elapsed = time.perf_counter() - started
        text = "".join(u["params"]["update"]["content"]["text"] for u in updates)
        match = REPORT.search(text)
        assert match and int(match.group(1)) == chunks and len(updates) == chunks + 1
        return elapsed, float(match.group(2))
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


async def sidecar_rounds(chunks: int, rounds: int) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-acp-") as data:
        async with spawn_sidecar(data, env={"CHAT_SIDECAR_LOG_LEVEL": "WARNING"}) as proc:
            await proc.call("sidecar:initialize", {})
            engine = await proc.call(
                "provider:upsert",
                {"name": "Flood", "type": "acp-engine", "engine": {"command": sys.executable, "args": [str(AGENT)]}},
            )
            for _ in range(rounds + 1):  # the first round warms up (engine start, imports)
                session = await proc.call(
                    "chat:session:create", {"mode": "acp", "providerId": engine["id"], "modelId": "agent"}
                )
                cpu0 = cpu_seconds(proc.pid)
                started = time.perf_counter()
                sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": f"flood {chunks}"}})
                _, final = await proc.wait_for(
                    lambda m, mid=sent["messageId"]: isinstance(m, dict) and m.get("method") == "chat:stream"
                    and m["params"]["messageId"] == mid and m["params"]["type"] in ("stream_end", "error", "aborted"),
                    timeout=120,
                )
                elapsed = time.perf_counter() - started
                cpu = cpu_seconds(proc.pid) - cpu0
                assert final["params"]["type"] == "stream_end", final
                events = [
                    m["params"] for m in proc.messages
                    if isinstance(m, dict) and m.get("method") == "chat:stream"
                    and m["params"]["messageId"] == sent["messageId"]
                ]
                text = "".join(e.get("text", "") for e in events if e["type"] == "text_delta")
                match = REPORT.search(text)
                assert match and int(match.group(1)) == chunks, text[-200:]
                messages = await proc.call(
                    "chat:messages:get", {"sessionId": session["id"], "options": {"includeAcpParts": True}}
                )
                reply = messages[-1]
                assert reply["status"] == "completed" and reply["textContent"] == text
                assert len(reply["acpParts"]) == chunks + 1
                results.append({
                    "elapsed": elapsed, "agent_ms": float(match.group(2)), "cpu": cpu, "events": len(events),
                })
                del proc.messages[:]  # keep the client's bookkeeping flat across rounds
                del proc.lines[:]
                proc._cursors.clear()
            await proc.close()
    return results[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    raw = [raw_round(args.chunks) for _ in range(args.rounds)]
    side = anyio.run(sidecar_rounds, args.chunks, args.rounds)

    raw_s = statistics.median(r[0] for r in raw)
    raw_agent_ms = statistics.median(r[1] for r in raw)
    side_s = statistics.median(r["elapsed"] for r in side)
    side_agent_ms = statistics.median(r["agent_ms"] for r in side)
    cpu = statistics.median(r["cpu"] for r in side)
    events = statistics.median(r["events"] for r in side)
    n = args.chunks
    print(f"ACP flood: {n} agent_message_chunk updates, {args.rounds} rounds (medians)")
    print(f"  agent send time (its own report)       {side_agent_ms:8.1f} ms   (raw-client rounds: {raw_agent_ms:.1f} ms)")
    print(f"  raw client: prompt -> result           {raw_s * 1000:8.1f} ms   ({raw_s / n * 1e6:.1f} us/update)")
    print(f"  sidecar: chat:send -> stream_end       {side_s * 1000:8.1f} ms   ({side_s / n * 1e6:.1f} us/update)")
    print(f"  sidecar CPU for the turn               {cpu * 1000:8.1f} ms   ({cpu / n * 1e6:.1f} us/update)")
    print(f"  chat:stream events the renderer got    {events:8.0f}      (text deltas coalesced)")
    print(f"  ratio sidecar / agent send time        {side_s * 1000 / side_agent_ms:8.2f}")
    print(f"  ratio sidecar / raw client             {side_s / raw_s:8.2f}")


if __name__ == "__main__":
    main()
