"""Replies over a real subprocess: tool-call ids unique within a reply, pausing and resuming
as one decision, every token counted (aborted and failed replies too, cached tokens at
their prices, side calls apart), update methods where null clears and absent keeps, and
titles that were due when the process died.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import assert_well_ordered, configure_provider, events_of, wait_final
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


def call(call_id: str, name: str, arguments: Any = None) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": {} if arguments is None else arguments}


async def send(proc: SidecarProcess, session_id: str, text: str = "go") -> str:
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}})
    return str(sent["messageId"])


async def wait_event(proc: SidecarProcess, message_id: str, kind: str, timeout: float = 20) -> dict[str, Any]:
    _, message = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == message_id and m["params"]["type"] == kind,
        timeout=timeout,
    )
    return message["params"]


async def reply_of(proc: SidecarProcess, session_id: str) -> dict[str, Any]:
    return (await proc.call("chat:messages:get", {"sessionId": session_id}))[-1]


async def setup(proc: SidecarProcess, server: Any, **session: Any) -> str:
    await configure_provider(proc, server.base_url)
    await proc.call("settings:update", {"generateTitles": False})
    created = await proc.call("chat:session:create", {"title": "t", **session})
    return str(created["id"])


# ---- tool-call ids ----------------------------------------------------------------------


async def test_two_calls_with_one_id_in_a_step_both_run_under_unique_ids(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server)
        await server.script(
            {"tool_calls": [call("c1", "get_current_time", {"timezone": "UTC"}),
                            call("c1", "get_current_time", {"timezone": "Asia/Shanghai"})]},
            # a later step repeats the id again
            {"tool_calls": [call("c1", "get_current_time", {"timezone": "Europe/Paris"})]},
            {"text": "three times"},
        )
        mid = await send(proc, sid)
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        events = events_of(proc, mid)
        assert_well_ordered(events)
        starts = [e["toolCall"]["id"] for e in events if e["type"] == "tool_call_start"]
        results = [e["toolResult"]["toolCallId"] for e in events if e["type"] == "tool_result"]
        assert starts == ["c1", "c1_2", "c1_3"] and results == starts
        # every event of one call names the same id (its fragments included)
        deltas = [(e["toolCall"]["id"], e["toolCall"]["arguments"]) for e in events if e["type"] == "tool_call_delta"]
        assert "".join(a for i, a in deltas if i == "c1_2") == json.dumps({"timezone": "Asia/Shanghai"})
        reply = await reply_of(proc, sid)
        uses = [(p["id"], p["input"]["timezone"]) for p in reply["parts"] if p["type"] == "tool_use"]
        assert uses == [("c1", "UTC"), ("c1_2", "Asia/Shanghai"), ("c1_3", "Europe/Paris")]
        assert [p["toolUseId"] for p in reply["parts"] if p["type"] == "tool_result"] == ["c1", "c1_2", "c1_3"]
        # what the provider got back: unique ids, each call with its own result
        second = [b for b in await server.requests() if b.get("stream")][1]["messages"]
        assert [c["id"] for c in second[-3]["tool_calls"]] == ["c1", "c1_2"]
        assert [(m["role"], m["tool_call_id"]) for m in second[-2:]] == [("tool", "c1"), ("tool", "c1_2")]
        assert "+08:00" in second[-1]["content"] and "+00:00" in second[-2]["content"]
        await proc.close()


# ---- pausing and resuming are one decision -------------------------------------------------


async def test_an_approval_during_the_steps_auto_tools_is_applied_when_the_step_ends(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server, workspaceDir=str(ws))
        await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
        gate = ws / "release"
        await server.script(
            {"tool_calls": [
                # runs by itself and holds the step until the test lets it go
                call("c_wait", "workspace_run_command",
                     {"command": f"while [ ! -e {gate.name} ]; do sleep 0.05; done; echo waited"}),
                call("c_write", "workspace_write_file", {"path": "out.txt", "content": "written"}),
            ]},
            {"text": "All done."},
        )
        mid = await send(proc, sid)
        with anyio.fail_after(20):  # the pending call is listed while the auto tool still runs
            while not (pending := await proc.call("tool:pending:list", {"sessionId": sid})):
                await anyio.sleep(0.02)
        assert [p["toolCallId"] for p in pending] == ["c_write"]
        answer = await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "c_write", "decision": "approved"})
        assert answer == {"success": True, "resumed": True}
        gate.write_text("")
        final = await wait_final(proc, mid)
        assert final["type"] == "stream_end", final
        assert (ws / "out.txt").read_text() == "written"
        events = events_of(proc, mid)
        assert_well_ordered(events)
        # one job from start to end: never paused, the decided call never announced as pending
        assert not [e for e in events if e["type"] == "tool_approval_required"]
        assert [e["type"] for e in events].count("stream_start") == 1
        assert await proc.call("tool:pending:list", {"sessionId": sid}) == []
        reply = await reply_of(proc, sid)
        assert reply["status"] == "completed"
        results = {p["toolUseId"]: p["content"] for p in reply["parts"] if p["type"] == "tool_result"}
        assert "waited" in results["c_wait"] and "out.txt" in results["c_write"]
        await proc.close()


async def _no_stranded_pause(proc: SidecarProcess, sid: str) -> None:
    """No reply of the session is paused with nothing pending, no call pending outside one."""
    pending = await proc.call("tool:pending:list", {"sessionId": sid})
    stored = await proc.call("chat:messages:get", {"sessionId": sid, "options": {"allBranches": True}})
    paused = {m["id"] for m in stored if m["status"] == "paused"}
    assert {p["messageId"] for p in pending} == paused, (pending, [(m["id"], m["status"]) for m in stored])
    assert not [m for m in stored if m["status"] in ("streaming", "pending")]


@pytest.mark.parametrize(
    "interleaving",
    ["denied", "answered", "abort", "second send", pytest.param("restart", marks=pytest.mark.sidecar_subprocess)],
)
async def test_decisions_during_the_steps_auto_tools_never_strand_the_reply(tmp_path: Path, interleaving: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    data = tmp_path / "data"
    gate = ws / "release"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            sid = await setup(proc, server, workspaceDir=str(ws))
            await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
            await server.script(
                {"tool_calls": [
                    call("c_wait", "workspace_run_command",
                         {"command": f"while [ ! -e {gate.name} ]; do sleep 0.05; done; echo waited"}),
                    call("c_write", "workspace_write_file", {"path": "out.txt", "content": "written"}),
                ]},
                {"text": "All done."} if interleaving in ("denied", "answered") else {"text": "second reply"},
            )
            mid = await send(proc, sid)
            with anyio.fail_after(20):  # the pending call is listed while the auto tool still runs
                while not await proc.call("tool:pending:list", {"sessionId": sid}):
                    await anyio.sleep(0.02)
            decision: dict[str, Any] = {"sessionId": sid, "toolCallId": "c_write", "decision": "approved"}
            if interleaving == "denied":
                decision["decision"] = "denied"
            elif interleaving == "answered":
                decision.update(decision="answered", answer="the user wrote it by hand")
            assert await proc.call("chat:tool:approve", decision) == {"success": True, "resumed": True}

            if interleaving in ("denied", "answered"):
                gate.write_text("")
                assert (await wait_final(proc, mid))["type"] == "stream_end"
                reply = await reply_of(proc, sid)
                assert reply["status"] == "completed" and reply["textContent"].endswith("All done.")
                result = next(p for p in reply["parts"] if p["type"] == "tool_result" and p["toolUseId"] == "c_write")
                if interleaving == "answered":
                    assert "the user wrote it by hand" in json.dumps(result["content"])
                else:
                    assert result.get("isError") is True
                assert not (ws / "out.txt").exists()
                assert not [e for e in events_of(proc, mid) if e["type"] == "tool_approval_required"]
            elif interleaving == "abort":
                assert (await proc.call("chat:abort", {"sessionId": sid}))["success"] is True
                assert (await wait_final(proc, mid))["type"] == "aborted"
                assert (await reply_of(proc, sid))["status"] == "aborted"
            elif interleaving == "second send":
                second = await send(proc, sid, "never mind")
                assert (await wait_final(proc, mid))["type"] == "aborted"
                assert (await wait_final(proc, second))["type"] == "stream_end"
                assert (await reply_of(proc, sid))["textContent"] == "second reply"
            else:  # the process dies while the step still runs, with the decision queued
                os.kill(proc.process.pid, signal.SIGKILL)
                await proc.process.wait()
            if interleaving != "restart":
                await _no_stranded_pause(proc, sid)
                await proc.close()
                assert "Traceback" not in proc.stderr_text()
        if interleaving == "restart":
            gate.write_text("")
            async with spawn_sidecar(data) as proc:
                await proc.call("sidecar:initialize", {})
                with anyio.fail_after(20):  # the start-up pass settles what the dead process left
                    while (await reply_of(proc, sid))["status"] in ("streaming", "pending"):
                        await anyio.sleep(0.05)
                await _no_stranded_pause(proc, sid)
                # the session serves the next reply
                final = await wait_final(proc, await send(proc, sid, "again"))
                assert final["type"] == "stream_end"
                await _no_stranded_pause(proc, sid)
                await proc.close()
            assert "Traceback" not in proc.stderr_text()


async def test_a_paused_reply_always_reads_back_paused_with_its_content(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server, workspaceDir=str(ws))
        for n in range(3):  # the first tool call after start too
            await server.script(
                {"text": f"Writing {n}.", "tool_calls": [call(f"w{n}", "workspace_write_file",
                                                                {"path": f"{n}.txt", "content": "x"})]},
                {"text": "ok"},
            )
            mid = await send(proc, sid, f"write {n}")
            event = await wait_event(proc, mid, "tool_approval_required")
            got = await reply_of(proc, sid)  # right after the event: never "streaming, seq 1, ''"
            assert got["id"] == mid and got["status"] == "paused", got
            assert got["seq"] >= event["seq"] and got["textContent"] == f"Writing {n}."
            assert [p["type"] for p in got["parts"]] == ["text", "tool_use"]
            await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": f"w{n}", "decision": "approved"})
            assert (await wait_final(proc, mid))["type"] == "stream_end"
        await proc.close()


# ---- usage and cost on every ending ---------------------------------------------------------


async def test_aborted_and_failed_replies_add_their_usage_and_cached_tokens_have_their_price(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url, models=[{
            "id": "scripted-1", "inputPrice": 1.0, "outputPrice": 2.0, "cacheReadPrice": 0.1, "cacheWritePrice": 1.25,
        }])
        await proc.call("settings:update", {"generateTitles": False})
        session = await proc.call("chat:session:create", {"workspaceDir": str(ws)})
        sid = session["id"]
        # aborted while it waits for an approval: its first step was billed
        await server.script({"tool_calls": [call("w1", "workspace_write_file", {"path": "a", "content": "b"})],
                             "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 800}})
        paused = await send(proc, sid)
        await wait_event(proc, paused, "tool_approval_required")
        assert (await proc.call("chat:abort", {"sessionId": sid}))["success"] is True
        assert (await wait_final(proc, paused))["type"] == "aborted"
        got = await proc.call("chat:session:get", {"id": sid})
        cost = (200 * 1.0 + 800 * 0.1 + 100 * 2.0) / 1e6
        assert got["totalTokens"] == 1100 and got["totalCost"] == pytest.approx(cost)
        assert got["usageByKind"]["reply"] == {
            "inputTokens": 1000, "outputTokens": 100, "cacheReadTokens": 800, "cacheWriteTokens": 0,
            "reasoningTokens": 0, "cost": pytest.approx(cost), "calls": 1,
        }
        # failed in its second step: the first step's usage still counts
        await server.script(
            {"tool_calls": [call("t1", "get_current_time")], "usage": {"prompt_tokens": 50, "completion_tokens": 5}},
            {"status": 400, "text": "the model refused the request"},
        )
        failed = await send(proc, sid)
        assert (await wait_final(proc, failed))["type"] == "error"
        got = await proc.call("chat:session:get", {"id": sid})
        assert got["totalTokens"] == 1100 + 55
        assert got["usageByKind"]["reply"]["calls"] == 2
        assert got["totalCost"] == pytest.approx(cost + (50 * 1.0 + 5 * 2.0) / 1e6)
        await proc.close()


def _history(n: int, session_id: str) -> list[dict[str, Any]]:
    messages, parent = [], None
    for i in range(n):
        mid = f"0190a000-0000-7000-8000-{i:012d}"
        messages.append({
            "id": mid, "sessionId": session_id, "parentId": parent, "role": "user" if i % 2 == 0 else "assistant",
            "textContent": f"msg{i} " + "lorem " * 60, "status": "completed",
            "createdAt": 1_700_000_000_000 + i, "updatedAt": 1_700_000_000_000 + i,
        })
        parent = mid
    return messages


async def test_summaries_are_side_calls_of_their_session(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url, models=[{"id": "scripted-1", "inputPrice": 1.0, "outputPrice": 2.0}])
        await proc.call("settings:update", {"generateTitles": False})
        await proc.call("assistant:upsert", {"id": "default", "name": "Default", "context": {"compressThreshold": 400}})
        session = await proc.call("chat:session:create", {"title": "long"})
        sid = session["id"]
        history = _history(12, sid)
        exported = await proc.call("chat:session:export", {"id": sid})
        exported["session"]["activeLeafId"] = history[-1]["id"]
        await proc.call("chat:session:import", {"session": exported["session"], "messages": history, "replace": True})
        # the rolling summary of this send, then the reply
        await server.script(
            {"text": "SUMMARY", "usage": {"prompt_tokens": 700, "completion_tokens": 30}},
            {"text": "fine", "usage": {"prompt_tokens": 300, "completion_tokens": 10}},
        )
        mid = await send(proc, sid, "next question")
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        assert [b.get("stream") for b in await server.requests()] == [False, True]
        got = await proc.call("chat:session:get", {"id": sid})
        by_kind = got["usageByKind"]
        assert set(by_kind) == {"reply", "side:summary"}
        assert (by_kind["reply"]["inputTokens"], by_kind["reply"]["outputTokens"], by_kind["reply"]["calls"]) == (300, 10, 1)
        assert (by_kind["side:summary"]["inputTokens"], by_kind["side:summary"]["outputTokens"]) == (700, 30)
        assert by_kind["side:summary"]["calls"] == 1
        assert by_kind["side:summary"]["cost"] == pytest.approx((700 * 1.0 + 30 * 2.0) / 1e6)
        # totals hold both kinds
        assert got["totalTokens"] == 1040
        assert got["totalCost"] == pytest.approx((1000 * 1.0 + 40 * 2.0) / 1e6)
        # a compaction the renderer asks for is a side call of the session too
        await server.script({"text": "SUMMARY AGAIN", "usage": {"prompt_tokens": 50, "completion_tokens": 5}})
        await proc.call("chat:context:compact", {"sessionId": sid, "targetTokens": 300})
        after = (await proc.call("chat:session:get", {"id": sid}))["usageByKind"]
        assert after["side:summary"]["calls"] == 2 and after["side:summary"]["inputTokens"] == 750
        assert after["reply"] == by_kind["reply"]
        await proc.close()


# ---- update semantics ---------------------------------------------------------------------


async def test_null_clears_and_absent_keeps_in_every_update(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await configure_provider(proc, server.base_url)
        changed = await proc.call("settings:update", {
            "temperature": 0.3, "maxTokens": 900, "topP": 0.5, "reasoning": "high", "deltaCoalesceMs": 10,
            "titleModel": {"providerId": provider["id"], "modelId": "scripted-1"},
        })
        assert (changed["temperature"], changed["maxTokens"], changed["topP"], changed["reasoning"]) == (0.3, 900, 0.5, "high")
        kept = await proc.call("settings:update", {"generateTitles": False})
        assert kept["temperature"] == 0.3 and kept["maxTokens"] == 900 and kept["deltaCoalesceMs"] == 10
        cleared = await proc.call("settings:update", {
            "temperature": None, "maxTokens": None, "topP": None, "reasoning": None, "titleModel": None,
            "deltaCoalesceMs": None,
        })
        assert (cleared["temperature"], cleared["maxTokens"], cleared["topP"], cleared["reasoning"]) == (None,) * 4
        assert cleared["titleModel"] is None and cleared["deltaCoalesceMs"] == 40 and cleared["generateTitles"] is False
        # the next request carries no temperature any more, and the budget's own reserve
        # (a quarter of the 32,000-token window, at most 4,096) instead of the 900
        session = await proc.call("chat:session:create", {})
        await wait_final(proc, await send(proc, session["id"], "hi"))
        body = [b for b in await server.requests() if b.get("stream")][-1]
        assert "temperature" not in body and body["max_tokens"] == 4096 and "max_completion_tokens" not in body

        sid = session["id"]
        await proc.call("chat:session:update", {"id": sid, "updates": {
            "summary": "a summary", "systemPrompt": "be brief", "folder": "f", "tags": ["x"], "isPinned": True,
        }})
        kept_s = await proc.call("chat:session:update", {"id": sid, "updates": {"title": "named"}})
        assert (kept_s["summary"], kept_s["systemPrompt"], kept_s["folder"], kept_s["tags"], kept_s["isPinned"]) == (
            "a summary", "be brief", "f", ["x"], True)
        cleared_s = await proc.call("chat:session:update", {"id": sid, "updates": {
            "summary": None, "systemPrompt": None, "folder": None, "tags": None, "isPinned": None, "title": None,
        }})
        assert (cleared_s["summary"], cleared_s["systemPrompt"], cleared_s["folder"], cleared_s["tags"],
                cleared_s["isPinned"], cleared_s["title"]) == (None, None, None, [], False, "New Chat")

        await proc.call("tool:settings:update", {"webSearch": {"url": "http://127.0.0.1:9/search"}, "toolTimeoutS": 9})
        assert (await proc.call("tool:settings:update", {"enabled": True}))["webSearch"] is not None
        tools = await proc.call("tool:settings:update", {"webSearch": None, "toolTimeoutS": None})
        assert tools["webSearch"] is None and tools["toolTimeoutS"] == 60.0
        await proc.call("tool:settings:update", {"webSearch": {"url": "http://127.0.0.1:9/search"}})
        assert (await proc.call("tool:settings:update", {"clearWebSearch": True}))["webSearch"] is None

        await proc.call("chat:context:update", {"sessionId": sid, "truncationStrategy": "sliding-window"})
        assert (await proc.call("chat:context:update", {"sessionId": sid}))["truncationStrategy"] == "sliding-window"
        ctx = await proc.call("chat:context:update", {"sessionId": sid, "truncationStrategy": None})
        assert ctx["sessionTruncationStrategy"] is None

        upsert = {"id": provider["id"], "name": "Scripted", "type": "openai-compat", "baseUrl": server.base_url,
                  "models": [{"id": "scripted-1"}]}
        assert (await proc.call("provider:upsert", upsert))["hasApiKey"] is True  # absent: kept
        assert (await proc.call("provider:upsert", {**upsert, "apiKey": None}))["hasApiKey"] is False
        await proc.close()


# ---- titles that were due ---------------------------------------------------------------


@pytest.mark.sidecar_subprocess  # a SIGKILL, and the restart after it
async def test_a_session_killed_after_its_first_reply_gets_its_title_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            await configure_provider(proc, server.base_url)
            session = await proc.call("chat:session:create", {})
            # the title request is still in flight when the process is killed
            await server.script({"text": "first answer"}, {"text": "Owls", "hold_ms": 60_000})
            await wait_final(proc, await send(proc, session["id"], "tell me about owls"))
            with anyio.fail_after(20):
                while not [b for b in await server.requests() if not b.get("stream")]:
                    await anyio.sleep(0.05)
            os.kill(proc.process.pid, signal.SIGKILL)
            await proc.process.wait()
        await server.reset()
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            with anyio.fail_after(20):
                while True:
                    updated = await proc.next_notification("chat:session:updated")
                    if updated["id"] == session["id"] and updated["title"] != "New Chat":
                        break
            assert updated["title"].startswith("A chat about")
            assert updated["usageByKind"]["side:title"]["calls"] == 1
            await proc.close()
        async with spawn_sidecar(data) as proc:  # asked once: not again
            await proc.call("sidecar:initialize", {})
            await proc.call("chat:session:list", {})
            await proc.close()
        assert not [n for n in proc.notifications("chat:session:updated") if n["id"] == session["id"]]
