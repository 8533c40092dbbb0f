"""One MCP server that hangs never stalls a reply (over the subprocess).

The hung fixture (fixtures/mcp_hung_server.py) starts, records its pid and the time in a
file, and never answers ``initialize``. With it configured: a plain reply streams while the
server is still connecting (its connect timeout is far longer than the whole reply), the
model is told the server's tools are unavailable, the server is spawned once per backoff
step whatever the number of replies (never two at once), a delete answers once the process
and its process group are gone, and a stored server starts connecting at start-up without
any request.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from chat_helpers import configure_provider, events_of, wait_final
from mcp_helpers import hung_server, spawns, wait_status
from proc_tree import HAS_PROC, gone, proc_of, wait_gone
from scripted_server import scripted_provider
from sidecar.tools.mcp_supervisor import backoff_delay
from sidecar_proc import spawn_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(not HAS_PROC, reason="needs /proc (Linux)")]


async def _spawned(pid_file: Path, count: int, kind: str = "server", timeout: float = 30.0) -> list[tuple[int, float]]:
    with anyio.fail_after(timeout):
        while len(found := spawns(pid_file, kind)) < count:
            await anyio.sleep(0.05)
    return found


def _system_prompt(body: dict) -> str:  # type: ignore[type-arg]
    return "\n".join(str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "system")


async def test_a_hung_server_never_delays_a_reply_and_its_delete_stops_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "spawns.txt"
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)
        info = await proc.call("mcp:server:upsert", hung_server("hung", pid_file, "--child", connectTimeoutS=120))
        assert info["status"] == "connecting"
        ((pid, _),) = await _spawned(pid_file, 1)
        ((child, _),) = await _spawned(pid_file, 1, "child")
        server_proc, child_proc = proc_of(pid), proc_of(child)
        assert server_proc is not None and child_proc is not None

        session = await proc.call("chat:session:create", {})
        for round_ in range(3):
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": f"hello {round_}"}})
            # the connect cannot end before 120 s: a reply that waited for it would time out here
            final = await wait_final(proc, sent["messageId"], timeout=30)
            assert final["type"] == "stream_end", final
            assert any(e["type"] == "text_delta" for e in events_of(proc, sent["messageId"]))
        listed = await proc.call("mcp:server:list")
        assert [(s["name"], s["status"], s["tools"]) for s in listed] == [("hung", "connecting", [])]
        assert len(spawns(pid_file)) == 1  # not once per reply

        bodies = [b for b in await server.requests() if b.get("stream")]
        assert len(bodies) == 3
        for body in bodies:
            assert "hung (still connecting)" in _system_prompt(body)
            assert not any(t["function"]["name"].startswith("mcp__") for t in body.get("tools", []))
        tools = await proc.call("tool:list", {"sessionId": session["id"]})
        assert not any(t["source"] == "mcp" for t in tools)

        with anyio.fail_after(10):
            assert await proc.call("mcp:server:delete", {"name": "hung"}) == {"success": True}
        assert gone(server_proc)  # reaped before the answer
        await wait_gone([child_proc], timeout=1.0)  # SIGKILLed with its group before the answer
        assert await proc.call("mcp:server:list") == []
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "after"}})
        assert (await wait_final(proc, sent["messageId"], timeout=30))["type"] == "stream_end"
        last = [b for b in await server.requests() if b.get("stream")][-1]
        assert "MCP" not in _system_prompt(last)
        await proc.close()
        assert len(spawns(pid_file)) == 1


async def test_a_failing_server_is_spawned_once_per_backoff_step(tmp_path: Path) -> None:
    pid_file = tmp_path / "spawns.txt"
    connect_timeout = 1.0
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("mcp:server:upsert", hung_server("hung", pid_file, connectTimeoutS=connect_timeout))
        session = await proc.call("chat:session:create", {})
        replies = 0
        seen_failed = None
        with anyio.fail_after(90):
            while len(spawns(pid_file)) < 3:
                sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": f"hi {replies}"}})
                assert (await wait_final(proc, sent["messageId"], timeout=30))["type"] == "stream_end"
                replies += 1
                alive = [p for p, _ in spawns(pid_file) if (q := proc_of(p)) is not None and not gone(q)]
                assert len(alive) <= 1, alive  # never two processes of one server at once
                for s in await proc.call("mcp:server:list"):
                    if s["status"] == "failed":
                        seen_failed = s
        recorded = spawns(pid_file)
        # each start comes after the previous attempt's connect timeout and its backoff step;
        # the connect timeout is the slack for the fixture's own start-up time varying
        for k in range(1, len(recorded)):
            gap = recorded[k][1] - recorded[k - 1][1]
            assert gap >= backoff_delay(k), (k, gap, recorded)
        if seen_failed is None:
            seen_failed = await wait_status(proc, "hung", {"failed"})
        assert f"no answer to initialize within {connect_timeout:g} s" in seen_failed["error"]
        assert isinstance(seen_failed["retryAt"], int) and seen_failed["tools"] == []
        await proc.close()


async def test_a_stored_server_starts_connecting_at_start_up(tmp_path: Path) -> None:
    pid_file = tmp_path / "spawns.txt"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("mcp:server:upsert", hung_server("hung", pid_file, connectTimeoutS=120))
        await _spawned(pid_file, 1)
        await proc.close()
    async with spawn_sidecar(tmp_path / "data") as proc:
        await _spawned(pid_file, 2)  # no request at all: the stored server is started by itself
        await proc.close()
