#!/usr/bin/env python3
"""Exit benchmark: how long the sidecar takes to exit after each stop trigger, per state.

    python3 dev.py bench bench_exit [--rounds 10] [--states idle,starting,reply,acp]

For every state (idle: the services open; starting: only the store open yet; a reply running a workspace command; a stubborn ACP agent mid-turn
that ignores cancel, EOF and SIGTERM; more with --states) and every trigger
(``sidecar:shutdown`` + EOF, EOF alone, SIGTERM, the parent SIGKILLed while stdin stays
open) it starts a real sidecar subprocess, puts it in the state, triggers the stop and
measures trigger -> the process is gone. It prints the median and max of ``--rounds``
runs per cell against the contract (2 s) and, as the same-run baseline, the exit time of
a bare ``python -c "import sys; sys.stdin.read()"`` on EOF (what any Python child costs).
It also checks that no child process was left behind.
"""

from __future__ import annotations

import argparse
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

from scripted_server import scripted_provider  # noqa: E402
from proc_tree import descendants, proc_of, wait_gone  # noqa: E402
from supervision_helpers import TRIGGERS, make_busy_reply, make_stubborn_agent, spawn_sidecar_under, trigger  # noqa: E402

CONTRACT_S = 2.0


def baseline_exit() -> float:
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    time.sleep(0.3)
    started = time.monotonic()
    assert process.stdin is not None
    process.stdin.close()
    process.wait()
    return time.monotonic() - started


async def one(state: str, how: str, server: object) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="bench-exit-") as tmp:
        tmp_path = Path(tmp)
        async with spawn_sidecar_under(tmp_path / "data", via_parent=how == "parent_death") as (proc, pid):
            if state == "idle":
                await proc.call("sidecar:initialize", {})
                await proc.call("settings:get", {})  # a services method: they are open
            elif state == "starting":  # the services are still loading (only the store is open)
                await proc.call("sidecar:initialize", {})
                await proc.call("chat:session:list", {})
            elif state == "reply":
                workspace = tmp_path / "ws"
                workspace.mkdir()
                await make_busy_reply(proc, server, workspace)
            elif state == "acp":
                await make_stubborn_agent(proc, tmp_path / "agent-pids")
            else:
                raise SystemExit(f"unknown state {state!r}")
            before = descendants(pid)
            me = proc_of(pid)
            assert me is not None
            started = await trigger(proc, how)
            ended = await wait_gone([me], timeout=30)
            left = 0
            try:
                await wait_gone(before, timeout=5)
            except TimeoutError:
                left = len(before)
            return ended - started, left


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--states", default="idle,starting,reply,acp")
    args = parser.parse_args()
    states = args.states.split(",")
    base = statistics.median(baseline_exit() for _ in range(5))
    print(f"baseline: a bare Python child exits {base * 1000:.1f} ms after EOF (median of 5)")
    print(f"{'state':<8} {'trigger':<14} {'median ms':>10} {'max ms':>8} {'vs 2 s':>7} {'ratio':>7}  children left")
    async with scripted_provider() as server:
        for state in states:
            for how in TRIGGERS:
                times: list[float] = []
                left = 0
                for _ in range(args.rounds):
                    await server.reset()
                    elapsed, leftover = await one(state, how, server)
                    times.append(elapsed)
                    left += leftover
                median = statistics.median(times)
                ok = "ok" if max(times) < CONTRACT_S else "OVER"
                print(
                    f"{state:<8} {how:<14} {median * 1000:>10.1f} {max(times) * 1000:>8.1f} {ok:>7} "
                    f"{median / base:>6.1f}x  {left}"
                )


if __name__ == "__main__":
    anyio.run(main)
