"""SIGKILL during a pull, restart, run again: no duplicates, no half-imported conversations."""

from __future__ import annotations

import signal

import anyio
import pytest

from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

COUNT = 120
PER = 12


async def check_whole(proc, server_counts: dict[str, int]) -> list[dict]:
    sessions = await all_sessions(proc)
    assert len({s["title"] for s in sessions}) == len(sessions), "no conversation imported twice"
    for s in sessions:
        messages = await all_messages(proc, s["id"])
        assert len(messages) == s["messageCount"] == server_counts[s["title"]], s["title"]
        assert len({m["id"] for m in messages}) == len(messages)
    return sessions


@pytest.mark.sidecar_subprocess  # a SIGKILL, and the restart after it
async def test_sigkill_during_a_pull_then_restart_and_pull_again(tmp_path):
    async with qiming_server() as server:
        await server.control("seed", {"count": COUNT, "messages": PER})
        server_counts = {c["topic"]: c["messageCount"] for c in await server.conversations()}
        # slow message pages, so the kill lands in the middle of the import
        await server.fault({"path": "/api/agent/conversation/message/list", "fault": "delay", "delayMs": 40,
                            "times": -1})
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            await configure(proc, server)
            await proc.call("sync:settings:update", {"messagePageSize": 5})
            await proc.request("sync:pull", {"progressToken": "p"})
            await proc.wait_for(
                lambda m: isinstance(m, dict) and m.get("method") == "sidecar:progress"
                and m["params"]["kind"] == "report" and m["params"]["done"] >= 15,
                timeout=120,
            )
            proc.send_signal(signal.SIGKILL)
            await proc.wait_exit(timeout=20)
            assert proc.returncode == -signal.SIGKILL

        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            survived = await check_whole(proc, server_counts)
            assert 15 <= len(survived) < COUNT, len(survived)
            await server.control("clear_faults")
            result = await sync(proc, "sync:pull")
            assert result["errors"] == [] and result["pulled"] == COUNT - len(survived)
            sessions = await check_whole(proc, server_counts)
            assert len(sessions) == COUNT
            again = await sync(proc, "sync:pull")
            assert again["pulled"] == 0 and again["messagesPulled"] == 0
            with anyio.fail_after(30):
                await proc.close()
