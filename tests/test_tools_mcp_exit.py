"""The sidecar exits after MCP servers were used, whatever state they are in (over the subprocess).

Each case configures an MCP server and gets it into a state, then ends the sidecar one of
four ways (``sidecar:shutdown`` + EOF, EOF alone, SIGTERM, its parent SIGKILLed while the
stdin pipe stays open) and checks: exit code 0 (where we are its parent) within
EXIT_BOUND_S, and every process that descended from the sidecar (the server, and what the
server started) is gone. The target is 2 s; tools/bench/bench_mcp.py measures it (medians and
maxima per case). The bound here leaves room for a loaded machine, where the exit of a
sidecar without any MCP server alone varies between 0.2 and 1 s; the failures it guards
against are a process that never exits, and stop schedules of seconds per server. States: a stdio server that was used, an HTTP server that was
used, a stdio server that crashed (killed from outside), a hung server (started, never
answers ``initialize``) with a grandchild in its process group, and the same with both
ignoring SIGTERM (only the SIGKILL to the group ends them).

The regression behind it: the connections used to run in the engine's task group, which the
engine cancels at shutdown while they were open; the teardown then unwound a cancellation
through an exit stack holding an anyio task group, a CancelledError became its own
``__context__``, and anyio's task bookkeeping looped on it forever (the process spun at
80 % CPU and never read a signal again).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mcp_helpers import http_fixture, hung_server, spawns, stdio_server, wait_status
from proc_tree import HAS_PROC, descendants, gone, proc_of, wait_gone
from sidecar_proc import SidecarProcess
from supervision_helpers import spawn_sidecar_under

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not HAS_PROC, reason="needs /proc (Linux)")]

EXIT_BOUND_S = 3.0
SCENARIOS = ["stdio-used", "http-used", "crashed", "hung", "hung-ignores-sigterm"]
MODES = ["shutdown+eof", "eof", "sigterm", "parent-death"]


@asynccontextmanager
async def _http_if(scenario: str) -> AsyncIterator[str | None]:
    if scenario != "http-used":
        yield None
        return
    async with http_fixture() as (url, _process):
        yield url


async def _prepare(proc: SidecarProcess, pid: int, scenario: str, url: str | None, tmp_path: Path) -> int:
    """Get a server into the scenario's state; how many processes must be gone at the end."""
    await proc.call("sidecar:initialize", {"protocolVersion": 1})
    session = await proc.call("chat:session:create", {})
    if scenario in ("stdio-used", "crashed"):
        await proc.call("mcp:server:upsert", stdio_server("fx"))
        await wait_status(proc, "fx", {"ready"})
        names = {t["name"] for t in await proc.call("tool:list", {"sessionId": session["id"]})}
        assert "mcp__fx__echo" in names
        if scenario == "crashed":
            (server,) = descendants(pid)
            os.kill(server[0], signal.SIGKILL)
            info = await wait_status(proc, "fx", {"failed"})
            assert "killed by SIGKILL" in info["error"], info
            return 0  # waiting out the backoff (or already connecting again)
        return 1
    if scenario == "http-used":
        await proc.call("mcp:server:upsert", {"name": "web", "transport": "http", "url": url})
        await wait_status(proc, "web", {"ready"})
        names = {t["name"] for t in await proc.call("tool:list", {"sessionId": session["id"]})}
        assert "mcp__web__echo" in names
        return 0
    pid_file = tmp_path / "spawns.txt"
    flags = ["--child"] + (["--ignore-term"] if scenario == "hung-ignores-sigterm" else [])
    await proc.call("mcp:server:upsert", hung_server("hung", pid_file, *flags, connectTimeoutS=30))
    with anyio.fail_after(30):
        while not spawns(pid_file, "child"):
            await anyio.sleep(0.05)
    assert (await wait_status(proc, "hung", {"connecting"}))["tools"] == []
    return 2


async def _end(proc: SidecarProcess, mode: str) -> None:
    if mode == "shutdown+eof":
        assert await proc.call("sidecar:shutdown") == {"success": True}
        await proc.close_stdin()
    elif mode == "eof":
        await proc.close_stdin()
    elif mode == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:  # its parent dies (SIGKILL) while the stdin pipe stays open
        proc.process.kill()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_the_sidecar_exits_and_leaves_no_process(tmp_path: Path, scenario: str, mode: str) -> None:
    via_parent = mode == "parent-death"
    async with _http_if(scenario) as url, spawn_sidecar_under(tmp_path / "data", via_parent=via_parent) as (proc, pid):
        expected = await _prepare(proc, pid, scenario, url, tmp_path)
        tree = descendants(pid)
        assert len(tree) >= expected, tree
        started = anyio.current_time()
        await _end(proc, mode)
        with anyio.move_on_after(EXIT_BOUND_S):
            while not gone_pid(pid):
                await anyio.sleep(0.005)
        elapsed = anyio.current_time() - started
        assert gone_pid(pid), f"no exit within {EXIT_BOUND_S} s; stderr:\n{proc.stderr_text()[-3000:]}"
        if not via_parent:
            code = await proc.process.wait()
            assert code == 0, f"exit code {code} after {elapsed:.2f} s; stderr:\n{proc.stderr_text()[-3000:]}"
            await proc.assert_exit(0)
        # a SIGKILLed process is gone at once; the grace only covers the kernel's delivery
        await wait_gone(tree, timeout=1.0)
        assert all(gone(p) for p in tree)
        proc.assert_all_jsonrpc()


def gone_pid(pid: int) -> bool:
    found = proc_of(pid)
    return found is None or gone(found)
