"""The tool loop over a real subprocess and the scripted loopback provider.

Covers: a call that runs automatically and a second step that answers; parallel calls with
one pending; denied; answered; the 256-step cap; abort while a slow tool runs (its process
is killed); restart while pending, then approve; a crash while a tool runs (the call gets
a cancelled result before the next send); bad calls from the model.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import assert_well_ordered, configure_provider, events_of, wait_final
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


def call(call_id: str, name: str, arguments: Any = None) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": {} if arguments is None else arguments}


async def wait_event(proc: SidecarProcess, message_id: str, kind: str, timeout: float = 20) -> dict[str, Any]:
    _, message = await proc.wait_for(
        lambda m: isinstance(m, dict)
        and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == message_id
        and m["params"]["type"] == kind,
        timeout=timeout,
    )
    return message["params"]


async def start(proc: SidecarProcess, server: Any, workspace: Path | None = None) -> str:
    await configure_provider(proc, server.base_url)
    opts: dict[str, Any] = {"title": "tools"}
    if workspace is not None:
        opts["workspaceDir"] = str(workspace)
    session = await proc.call("chat:session:create", opts)
    return session["id"]


async def send(proc: SidecarProcess, session_id: str, text: str = "go") -> str:
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}})
    return sent["messageId"]


async def reply_of(proc: SidecarProcess, session_id: str) -> dict[str, Any]:
    return (await proc.call("chat:messages:get", {"sessionId": session_id}))[-1]


def tool_parts(message: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for p in message.get("parts") or []:
        if p["type"] == "tool_use":
            out.append(("use", p["id"]))
        elif p["type"] == "tool_result":
            out.append(("result", p["toolUseId"], p["content"], p.get("isError", False)))
    return out


async def test_auto_call_then_a_second_step_answers(tmp_path):
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server)
        await server.script(
            {"text": "Let me check.", "tool_calls": [call("call_t1", "get_current_time", {"timezone": "UTC"})]},
            {"text": "It is late."},
        )
        mid = await send(proc, sid, "what time is it?")
        final = await wait_final(proc, mid)
        assert final["type"] == "stream_end", final
        events = events_of(proc, mid)
        assert_well_ordered(events)
        kinds = [e["type"] for e in events]
        assert kinds.index("tool_call_start") < kinds.index("tool_result") < kinds.index("stream_end")
        result = next(e for e in events if e["type"] == "tool_result")["toolResult"]
        assert result["toolCallId"] == "call_t1" and not result.get("isError")
        assert result["output"].endswith("+00:00")
        reply = await reply_of(proc, sid)
        assert reply["status"] == "completed"
        assert [p["type"] for p in reply["parts"]] == ["text", "tool_use", "tool_result", "text"]
        assert reply["textContent"] == "Let me check.It is late."
        # the second request carried the call and its result in OpenAI's shape
        bodies = await server.requests()
        streamed = [b for b in bodies if b.get("stream")]
        assert len(streamed) == 2
        assert any(t["function"]["name"] == "get_current_time" for t in streamed[0]["tools"])
        second = streamed[1]["messages"]
        assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["id"] == "call_t1"
        assert second[-1] == {"role": "tool", "tool_call_id": "call_t1", "content": result["output"]}
        audit = await proc.call("tool:audit:list", {"sessionId": sid})
        assert [(a["toolCallId"], a["decision"], a["actor"]) for a in audit] == [
            ("call_t1", "policy:auto", "policy")
        ]
        await proc.close()


async def test_parallel_calls_one_pending_then_approved(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha")
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server, ws)
        await server.script(
            {"tool_calls": [
                call("c_list", "workspace_list", {}),
                call("c_write", "workspace_write_file", {"path": "out/b.txt", "content": "beta"}),
            ]},
            {"text": "Done."},
        )
        mid = await send(proc, sid)
        pending = await wait_event(proc, mid, "tool_approval_required")
        assert pending["toolCall"] == {
            "id": "c_write", "name": "workspace_write_file",
            "arguments": json.dumps({"path": "out/b.txt", "content": "beta"}),
        }
        assert pending["decisions"] == ["approved", "denied", "answered"]
        # the automatic call ran, the pending one did not
        listed = next(e for e in events_of(proc, mid) if e["type"] == "tool_result")
        assert listed["toolResult"]["toolCallId"] == "c_list" and "a.txt" in listed["toolResult"]["output"]
        assert not (ws / "out" / "b.txt").exists()
        with anyio.fail_after(10):
            while (await reply_of(proc, sid))["status"] != "paused":
                await anyio.sleep(0.02)
        listing = await proc.call("tool:pending:list", {"sessionId": sid})
        assert [(p["toolCallId"], p["messageId"]) for p in listing] == [("c_write", mid)]
        # a new send is not needed: approving resumes the same reply
        approved = await proc.call(
            "chat:tool:approve", {"sessionId": sid, "toolCallId": "c_write", "decision": "approved"}
        )
        assert approved == {"success": True, "resumed": True}
        final = await wait_final(proc, mid)
        assert final["type"] == "stream_end", final
        assert (ws / "out" / "b.txt").read_text() == "beta"
        events = events_of(proc, mid)
        assert_well_ordered(events)
        assert [e["type"] for e in events].count("stream_start") == 1
        reply = await reply_of(proc, sid)
        assert tool_parts(reply)[:2] == [("use", "c_list"), ("use", "c_write")]
        assert [t[1] for t in tool_parts(reply) if t[0] == "result"] == ["c_list", "c_write"]
        # deciding again is a clear error, never a second run
        with pytest.raises(CallError) as err:
            await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "c_write", "decision": "approved"})
        assert err.value.code == -32003
        audit = await proc.call("tool:audit:list", {"sessionId": sid, "toolCallId": "c_write"})
        assert [(a["decision"], a["actor"]) for a in reversed(audit)] == [("requested", "system"), ("approved", "user")]
        assert audit[0]["arguments"] == pending["toolCall"]["arguments"]
        await proc.close()


@pytest.mark.parametrize("decision", ["denied", "answered"])
async def test_denied_and_answered(tmp_path, decision):
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server, ws)
        await server.script(
            {"tool_calls": [call("c1", "workspace_run_command", {"command": "touch ran.txt"})]},
            {"text": "OK then."},
        )
        mid = await send(proc, sid)
        await wait_event(proc, mid, "tool_approval_required")
        params: dict[str, Any] = {"sessionId": sid, "toolCallId": "c1", "decision": decision}
        if decision == "answered":
            with pytest.raises(CallError) as err:  # an answer needs its text
                await proc.call("chat:tool:approve", params)
            assert err.value.code == -32602
            params["answer"] = "The command printed 42."
        assert (await proc.call("chat:tool:approve", params))["resumed"] is True
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        assert not (ws / "ran.txt").exists()
        result = next(e for e in events_of(proc, mid) if e["type"] == "tool_result")["toolResult"]
        if decision == "denied":
            assert result["isError"] is True and json.loads(result["output"])["error"] == "denied"
        else:
            assert result["output"] == "The command printed 42." and not result.get("isError")
        bodies = [b for b in await server.requests() if b.get("stream")]
        assert bodies[-1]["messages"][-1]["content"] == result["output"]
        await proc.close()


async def test_step_cap_stops_with_a_clear_error(tmp_path):
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server)
        await server.script({"tool_calls": [call("loop_{n}", "get_current_time")], "times": 300})
        mid = await send(proc, sid)
        final = await wait_final(proc, mid, timeout=120)
        assert final["type"] == "error" and "256" in final["error"], final
        bodies = [b for b in await server.requests() if b.get("stream")]
        assert len(bodies) == 256
        reply = await reply_of(proc, sid)
        assert reply["status"] == "error"
        results = [t for t in tool_parts(reply) if t[0] == "result"]
        assert len(results) == 256 and results[-1][3] is True and "limit" in results[-1][2]
        await proc.close()


async def test_abort_while_a_slow_tool_runs_kills_it(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server, ws)
        await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
        await server.script(
            {"tool_calls": [call("slow", "workspace_run_command", {"command": "echo $$ > pid.txt; exec sleep 60"})]}
        )
        mid = await send(proc, sid)
        with anyio.fail_after(10):
            while not (ws / "pid.txt").exists() or not (ws / "pid.txt").read_text().strip():
                await anyio.sleep(0.02)
        pid = int((ws / "pid.txt").read_text())
        assert await proc.call("chat:abort", {"sessionId": sid}) == {"success": True}
        final = await wait_final(proc, mid)
        assert final["type"] == "aborted"
        with anyio.fail_after(5):
            while _alive(pid):
                await anyio.sleep(0.02)
        reply = await reply_of(proc, sid)
        assert reply["status"] == "aborted"
        assert tool_parts(reply)[-1][:2] == ("result", "slow") and "cancelled" in tool_parts(reply)[-1][2]
        await proc.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is Linux's")
async def test_a_descendant_that_leaves_the_commands_group_ends_with_the_sidecar(tmp_path):
    """``setsid`` takes a process out of the command's group, which a timeout kills; the
    sidecar adopts it when its parent is gone, and kills it at exit with every child left."""
    ws = tmp_path / "ws"
    ws.mkdir()
    command = ("setsid sh -c 'echo $$ > escaped.pid; exec sleep 90' >/dev/null 2>&1 </dev/null & "
               "echo $$ > grouped.pid; sleep 30")
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data", subprocess=True) as proc:
        sid = await start(proc, server, ws)
        await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
        await server.script({"tool_calls": [call("c1", "workspace_run_command", {"command": command, "timeout_s": 1})]},
                            {"text": "ok"})
        mid = await send(proc, sid)
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        (result,) = [e["toolResult"] for e in events_of(proc, mid) if e["type"] == "tool_result"]
        assert result["output"].startswith("timed out after 1 s"), result
        escaped, grouped = int((ws / "escaped.pid").read_text()), int((ws / "grouped.pid").read_text())
        assert not _alive(grouped) and _alive(escaped)  # the group is gone; the escaped one waits for the exit
        await proc.close()
    with anyio.fail_after(5):
        while _alive(escaped):
            await anyio.sleep(0.02)


async def test_restart_while_pending_then_approve(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            sid = await start(proc, server, ws)
            await server.script(
                {"tool_calls": [call("w1", "workspace_write_file", {"path": "x.txt", "content": "after restart"})]},
            )
            mid = await send(proc, sid)
            await wait_event(proc, mid, "tool_approval_required")
            with anyio.fail_after(10):
                while (await reply_of(proc, sid))["status"] != "paused":
                    await anyio.sleep(0.02)
            seq_before = max(e["seq"] for e in events_of(proc, mid))
            await proc.close()
        await server.script({"text": "Written."})
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {"protocolVersion": 1})
            reply = await reply_of(proc, sid)
            assert reply["status"] == "paused" and reply["seq"] == seq_before
            pending = await proc.call("tool:pending:list", {})
            assert [p["toolCallId"] for p in pending] == ["w1"]
            assert not (ws / "x.txt").exists()
            res = await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "w1", "decision": "approved"})
            assert res["resumed"] is True
            final = await wait_final(proc, mid)
            assert final["type"] == "stream_end"
            events = events_of(proc, mid)
            assert [e["seq"] for e in events] == list(range(seq_before + 1, seq_before + 1 + len(events)))
            assert (ws / "x.txt").read_text() == "after restart"
            assert (await reply_of(proc, sid))["textContent"] == "Written."
            await proc.close()


async def test_new_send_supersedes_a_paused_reply(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server, ws)
        await server.script(
            {"tool_calls": [call("w1", "workspace_write_file", {"path": "x.txt", "content": "no"})]},
            {"text": "fresh answer"},
        )
        first = await send(proc, sid)
        await wait_event(proc, first, "tool_approval_required")
        second = await send(proc, sid, "never mind")
        assert (await wait_final(proc, first))["type"] == "aborted"
        assert (await wait_final(proc, second))["type"] == "stream_end"
        path = await proc.call("chat:messages:get", {"sessionId": sid})
        old = next(m for m in path if m["id"] == first)
        assert old["status"] == "aborted" and tool_parts(old)[-1][0] == "result"
        assert (await proc.call("tool:pending:list", {"sessionId": sid})) == []
        with pytest.raises(CallError) as err:
            await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "w1", "decision": "approved"})
        assert err.value.code == -32003
        assert not (ws / "x.txt").exists()
        await proc.close()


@pytest.mark.sidecar_subprocess  # a SIGKILL, and the restart after it
async def test_crash_while_a_tool_runs_gets_a_cancelled_result(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            sid = await start(proc, server, ws)
            await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
            await server.script({"tool_calls": [call("r1", "workspace_run_command", {"command": "touch started; sleep 30"})]})
            await send(proc, sid)
            with anyio.fail_after(10):
                while not (ws / "started").exists():
                    await anyio.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            await proc.wait_exit()
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {"protocolVersion": 1})
            reply = await reply_of(proc, sid)
            assert reply["status"] == "aborted"
            last = tool_parts(reply)[-1]
            assert last[:2] == ("result", "r1") and last[3] is True and "sidecar stopped" in last[2]
            await server.script({"text": "again"})
            mid = await send(proc, sid, "retry")
            assert (await wait_final(proc, mid))["type"] == "stream_end"
            await proc.close()


async def test_bad_calls_from_the_model_become_error_results(tmp_path):
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server)
        await server.script(
            {"tool_calls": [
                {"id": "b1", "name": "get_current_time", "arguments": "{not json"},
                {"id": "b2", "name": "get_current_time", "arguments": {"timezone": 5}},
                {"id": "b3", "name": "no_such_tool", "arguments": {}},
                {"id": "b4", "name": "get_current_time", "arguments": {"timezone": "Mars/Olympus"}},
            ]},
            {"text": "Sorry."},
        )
        mid = await send(proc, sid)
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        results = {e["toolResult"]["toolCallId"]: e["toolResult"] for e in events_of(proc, mid) if e["type"] == "tool_result"}
        assert all(r["isError"] for r in results.values())
        assert "not valid JSON" in results["b1"]["output"]
        assert "schema" in results["b2"]["output"]
        assert "unknown tool 'no_such_tool'" in results["b3"]["output"]
        assert "unknown time zone" in results["b4"]["output"]
        bodies = [b for b in await server.requests() if b.get("stream")]
        assert [m["tool_call_id"] for m in bodies[-1]["messages"] if m["role"] == "tool"] == ["b1", "b2", "b3", "b4"]
        await proc.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_call_id_repeated_by_a_later_step_gets_its_own_id(tmp_path):
    # adapters number id-less calls per request (call_0...), so step 2 can repeat step 1's id
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await start(proc, server)
        await server.script(
            {"tool_calls": [call("call_0", "get_current_time")]},
            {"tool_calls": [call("call_0", "get_current_time", {"timezone": "UTC"})]},
            {"text": "twice"},
        )
        mid = await send(proc, sid)
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        events = events_of(proc, mid)
        starts = [e["toolCall"]["id"] for e in events if e["type"] == "tool_call_start"]
        results = [e["toolResult"]["toolCallId"] for e in events if e["type"] == "tool_result"]
        assert starts == results == ["call_0", "call_0_2"]
        reply = await reply_of(proc, sid)
        assert [t[:2] for t in tool_parts(reply)] == [("use", "call_0"), ("result", "call_0"), ("use", "call_0_2"), ("result", "call_0_2")]
        last = [b for b in await server.requests() if b.get("stream")][-1]["messages"]
        assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["call_0", "call_0_2"]
        await proc.close()
