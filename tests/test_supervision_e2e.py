"""The sidecar always exits, within its deadline, whatever it was doing, and leaves no child.

Each case starts a real sidecar subprocess in a state, stops it one of the four ways a
host can (``sidecar:shutdown`` + EOF, EOF alone, SIGTERM, its parent SIGKILLed while the
stdin pipe stays open) and checks: it exits (code 0 where we are its parent) within
EXIT_LIMIT_S of the trigger, and every process it had started is gone (/proc).
EXIT_LIMIT_S is the 2 s of the contract plus slack for a loaded test machine; the exit
benchmark (tools/bench/bench_exit.py) measures the real figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import msgspec
import pytest
from chat_helpers import wait_final
from scripted_server import scripted_provider
from proc_tree import descendants, proc_of, wait_gone
from supervision_helpers import TRIGGERS, make_busy_reply, make_stubborn_agent, spawn_sidecar_under, trigger

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks /proc"),
]

EXIT_LIMIT_S = 3.5


async def _stop_and_check(proc, pid: int, how: str, before: set[tuple[int, int]]) -> float:
    me = proc_of(pid)
    assert me is not None
    started = await trigger(proc, how)
    ended = await wait_gone([me], timeout=15)
    if how != "parent_death":
        assert await proc.wait_exit() == 0, proc.stderr_text()[-3000:]
    await wait_gone(before, timeout=10)  # nothing it started is left
    elapsed = ended - started
    assert elapsed < EXIT_LIMIT_S, f"exit took {elapsed:.2f} s after {how}"
    return elapsed


@pytest.mark.parametrize("how", TRIGGERS)
async def test_exit_when_idle(tmp_path: Path, how: str) -> None:
    async with spawn_sidecar_under(tmp_path / "data", via_parent=how == "parent_death") as (proc, pid):
        await proc.call("sidecar:initialize", {})
        await proc.call("chat:session:list", {})
        await _stop_and_check(proc, pid, how, descendants(pid))


@pytest.mark.parametrize("how", TRIGGERS)
async def test_exit_with_a_reply_running_a_command(tmp_path: Path, how: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with scripted_provider() as server, spawn_sidecar_under(
        tmp_path / "data", via_parent=how == "parent_death"
    ) as (proc, pid):
        message_id = await make_busy_reply(proc, server, workspace)
        command_pid = int((workspace / "pid.txt").read_text())
        before = descendants(pid)
        assert command_pid in {p for p, _ in before}
        await _stop_and_check(proc, pid, how, before)
        if how == "shutdown":  # the final event came before the answer
            final_at = next(
                i for i, m in enumerate(proc.messages)
                if isinstance(m, dict) and m.get("method") == "chat:stream"
                and m["params"]["messageId"] == message_id and m["params"]["type"] == "aborted"
            )
            answer_at = max(  # the shutdown was the last request
                i for i, m in enumerate(proc.messages) if isinstance(m, dict) and "result" in m
            )
            assert final_at < answer_at


@pytest.mark.parametrize("how", TRIGGERS)
async def test_exit_with_a_stubborn_acp_agent_mid_turn(tmp_path: Path, how: str) -> None:
    async with spawn_sidecar_under(tmp_path / "data", via_parent=how == "parent_death") as (proc, pid):
        await make_stubborn_agent(proc, tmp_path / "agent-pids")
        before = descendants(pid)
        assert before, "the agent runs"
        await _stop_and_check(proc, pid, how, before)


async def test_a_stubborn_agent_turn_ends_aborted_before_the_shutdown_answer(tmp_path: Path) -> None:
    # the agent never answers session/cancel (its cancelTimeoutMs is the default 5 s, longer
    # than the whole shutdown deadline): the turn waits only its share of the deadline, then
    # ends aborted, row and final event, before sidecar:shutdown is answered
    async with spawn_sidecar_under(tmp_path / "data", via_parent=False) as (proc, pid):
        message_id = await make_stubborn_agent(proc, tmp_path / "agent-pids")
        shutdown_id = await proc.request("sidecar:shutdown", {})
        answer = await proc.response(shutdown_id)
        assert answer["result"] == {"success": True}
        answer_at = proc.messages.index(answer)
        final = await wait_final(proc, message_id, timeout=1)  # already received
        assert final["type"] == "aborted" and "did not stop within" in (final.get("reason") or ""), final
        final_at = next(
            i for i, m in enumerate(proc.messages)
            if isinstance(m, dict) and m.get("method") == "chat:stream" and m["params"] is final
        )
        assert final_at < answer_at
        await proc.close_stdin()
        assert await proc.wait_exit() == 0
    async with spawn_sidecar_under(tmp_path / "data", via_parent=False) as (proc, _):
        session = (await proc.call("chat:session:list", {}))["sessions"][0]
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert messages[-1]["id"] == message_id and messages[-1]["status"] == "aborted"
        await proc.close()


async def test_requests_after_shutdown_are_refused_busy(tmp_path: Path) -> None:
    async with spawn_sidecar_under(tmp_path / "data", via_parent=False) as (proc, pid):
        await proc.call("sidecar:initialize", {})
        # pipelined: the list arrives with the shutdown (one write), before it is handled
        shutdown_id, list_id = proc.new_id(), proc.new_id()
        await proc.send_line(b"".join(msgspec.json.encode(
            {"jsonrpc": "2.0", "id": i, "method": m, "params": {}}) + b"\n"
            for i, m in ((shutdown_id, "sidecar:shutdown"), (list_id, "chat:session:list"))))
        assert (await proc.response(shutdown_id))["result"] == {"success": True}
        refused = await proc.response(list_id)
        assert refused["error"]["code"] == -32002, refused
        await proc.close_stdin()
        assert await proc.wait_exit() == 0


async def test_a_reply_final_event_precedes_the_shutdown_answer(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar_under(tmp_path / "data", via_parent=False) as (proc, pid):
        from chat_helpers import configure_provider

        await configure_provider(proc, server.base_url)
        await server.script({"text": "word " * 400, "chunks": 400, "delay_ms": 20})
        session = await proc.call("chat:session:create", {})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "go"}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["type"] == "text_delta"
        )
        shutdown_id = await proc.request("sidecar:shutdown", {})
        answer = await proc.response(shutdown_id)
        answer_at = proc.messages.index(answer)
        final = await wait_final(proc, sent["messageId"], timeout=1)  # already received
        assert final["type"] == "aborted"
        final_at = next(
            i for i, m in enumerate(proc.messages)
            if isinstance(m, dict) and m.get("method") == "chat:stream" and m["params"] is final
        )
        assert final_at < answer_at
        await proc.close_stdin()
        assert await proc.wait_exit() == 0
    # the aborted reply is stored with what it had streamed
    async with spawn_sidecar_under(tmp_path / "data", via_parent=False) as (proc, _):
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert messages[-1]["status"] == "aborted" and messages[-1]["textContent"].startswith("word")
        await proc.close()
