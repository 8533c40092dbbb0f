#!/usr/bin/env python3
"""MCP isolation benchmark: a hung MCP server costs a reply nothing, and deleting it is quick.

    python3 dev.py bench bench_mcp [--rounds 10]

In one run, against one scripted provider on loopback (fixtures/scripted_provider.py):
- first delta: ``chat:send`` -> the reply's first ``text_delta``, measured by the client, in
  two sidecar subprocesses side by side, rounds interleaved (so load drift hits both):
  ``none`` has no MCP server, ``hung`` has an enabled stdio server that started and never
  answers ``initialize`` (fixtures/mcp_hung_server.py; its connect timeout is longer than
  the whole run, so it is connecting throughout); medians and the ratio hung / none;
- delete: ``mcp:server:delete`` of a hung server -> its answer (the answer comes once the
  process is gone), for a server that ends on SIGTERM and for one that ignores SIGTERM
  (SIGKILL after the stop's steps); medians;
- exit: ``sidecar:shutdown`` + EOF -> the process has exited, with no MCP server, after a
  stdio server was used (fixtures/mcp_server.py, ready and listed), with a hung server, and
  with a hung server that ignores SIGTERM; medians of ``--exit-rounds`` fresh sidecars each.
The first round of each sidecar warms up (provider client, imports) and is not counted.
"""

from __future__ import annotations

import argparse
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
from chat_helpers import configure_provider  # noqa: E402
from mcp_helpers import hung_server, spawns, stdio_server, wait_status  # noqa: E402
from scripted_server import scripted_provider  # noqa: E402
from sidecar_proc import SidecarProcess, spawn_sidecar  # noqa: E402

QUIET = {"CHAT_SIDECAR_LOG_LEVEL": "WARNING"}


async def first_delta(proc: SidecarProcess, session_id: str, n: int) -> float:
    started = time.perf_counter()
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": f"round {n}"}})
    mid = sent["messageId"]
    await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == mid and m["params"]["type"] == "text_delta",
        timeout=60,
    )
    elapsed = time.perf_counter() - started
    _, final = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == mid and m["params"]["type"] in ("stream_end", "error", "aborted"),
        timeout=60,
    )
    assert final["params"]["type"] == "stream_end", final
    return elapsed


async def wait_spawned(pid_file: Path, count: int) -> None:
    with anyio.fail_after(60):
        while len(spawns(pid_file)) < count:
            await anyio.sleep(0.02)


async def run(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        work = Path(tmp)
        pid_file = work / "spawns.txt"
        async with scripted_provider() as server, spawn_sidecar(work / "none", env=QUIET) as none, spawn_sidecar(
            work / "hung", env=QUIET
        ) as hung:
            for proc in (none, hung):
                await configure_provider(proc, server.base_url)
            await hung.call("mcp:server:upsert", hung_server("hung", pid_file, connectTimeoutS=3600))
            await wait_spawned(pid_file, 1)
            sessions = {
                "none": (await none.call("chat:session:create", {}))["id"],
                "hung": (await hung.call("chat:session:create", {}))["id"],
            }
            times: dict[str, list[float]] = {"none": [], "hung": []}
            for n in range(rounds + 1):
                for label, proc in (("none", none), ("hung", hung)):
                    elapsed = await first_delta(proc, sessions[label], n)
                    if n:
                        times[label].append(elapsed)
            status = [s["status"] for s in await hung.call("mcp:server:list")]
            assert status == ["connecting"], status
            assert len(spawns(pid_file)) == 1

            deletes: dict[str, list[float]] = {"sigterm": [], "ignores-sigterm": []}
            for label, flags in (("sigterm", ()), ("ignores-sigterm", ("--ignore-term",))):
                for _ in range(rounds):
                    before = len(spawns(pid_file))
                    await hung.call("mcp:server:upsert", hung_server("gone", pid_file, *flags, connectTimeoutS=3600))
                    await wait_spawned(pid_file, before + 1)
                    started = time.perf_counter()
                    assert await hung.call("mcp:server:delete", {"name": "gone"}, timeout=30) == {"success": True}
                    deletes[label].append(time.perf_counter() - started)
            for proc in (none, hung):
                await proc.close()
    return {"first": times, "delete": deletes}


EXIT_CASES = ("none", "stdio-used", "hung", "hung-ignores-sigterm")


async def exit_latency(case: str, work: Path) -> float:
    pid_file = work / "spawns.txt"
    async with spawn_sidecar(work / "data", env=QUIET) as proc:
        await proc.call("sidecar:initialize", {})
        if case == "stdio-used":
            await proc.call("mcp:server:upsert", stdio_server("fx"))
            await wait_status(proc, "fx", {"ready"}, timeout=60)
            session = await proc.call("chat:session:create", {})
            assert any(t["source"] == "mcp" for t in await proc.call("tool:list", {"sessionId": session["id"]}))
        elif case != "none":
            flags = ("--child", "--ignore-term") if case == "hung-ignores-sigterm" else ("--child",)
            await proc.call("mcp:server:upsert", hung_server("hung", pid_file, *flags, connectTimeoutS=3600))
            with anyio.fail_after(60):
                while not spawns(pid_file, "child"):
                    await anyio.sleep(0.02)
        started = time.perf_counter()
        assert await proc.call("sidecar:shutdown") == {"success": True}
        await proc.close_stdin()
        code = await proc.wait_exit(30)
        elapsed = time.perf_counter() - started
        assert code == 0, proc.stderr_text()[-2000:]
        return elapsed


async def exits(rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {case: [] for case in EXIT_CASES}
    for _ in range(rounds):
        for case in EXIT_CASES:  # interleaved, like the first-delta rounds
            with tempfile.TemporaryDirectory(prefix="bench-mcp-exit-") as tmp:
                out[case].append(await exit_latency(case, Path(tmp)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--exit-rounds", type=int, default=10)
    args = parser.parse_args()
    result = anyio.run(run, args.rounds)
    exit_times = anyio.run(exits, args.exit_rounds) if args.exit_rounds > 0 else {}
    first = {k: statistics.median(v) * 1000 for k, v in result["first"].items()}
    delete = {k: statistics.median(v) * 1000 for k, v in result["delete"].items()}
    print(f"MCP isolation: {args.rounds} rounds (medians)")
    print(f"  first text_delta, no MCP server          {first['none']:8.1f} ms")
    print(f"  first text_delta, a hung MCP server      {first['hung']:8.1f} ms")
    print(f"  ratio hung / none                        {first['hung'] / first['none']:8.2f}")
    print(f"  mcp:server:delete of a hung server       {delete['sigterm']:8.1f} ms   (it ends on SIGTERM)")
    print(f"  mcp:server:delete, SIGTERM ignored       {delete['ignores-sigterm']:8.1f} ms   (SIGKILL)")
    if exit_times:
        base = statistics.median(exit_times["none"])
        print(f"  exit after sidecar:shutdown + EOF ({args.exit_rounds} sidecars each, medians):")
        for case in EXIT_CASES:
            median = statistics.median(exit_times[case])
            worst = max(exit_times[case])
            print(f"    {case:<22} {median * 1000:8.1f} ms   (max {worst * 1000:.1f} ms, ratio to none {median / base:.2f})")


if __name__ == "__main__":
    main()
