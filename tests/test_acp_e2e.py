"""ACP mode end to end: the sidecar subprocess drives the scripted agent (fixtures/acp).

Each test checks, besides its own behaviour, what must hold after every case: the
sidecar still serves, the database holds the (partial) turn, and no agent process is left
running (the agent writes its pid to a file; we check /proc after the case).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from acp_helpers import (
    acp_session,
    add_engine,
    alive,
    assert_gone,
    pids,
    send_and_wait,
    stored,
)
from chat_helpers import assert_well_ordered, events_of, streamed_text, wait_final
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio


async def test_turns_stream_store_and_continue_the_agent_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, pid_file=pid_file, env={"AGENT_TOKEN": "tok-SECRET-1"})
        assert engine["type"] == "acp-engine" and engine["engine"]["env"] == {"AGENT_TOKEN": "***"}
        session = await acp_session(proc, engine["id"])

        sent, final = await send_and_wait(proc, session["id"], "hello there")
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        assert final["type"] == "stream_end" and final["finishReason"] == "stop"
        assert streamed_text(events) == "echo: hello there [turn 1 of sess-1]"

        sent2, _ = await send_and_wait(proc, session["id"], "again")
        assert streamed_text(events_of(proc, sent2["messageId"])) == "echo: again [turn 2 of sess-1]"

        reply = await stored(proc, session["id"], sent2["messageId"])
        assert reply["status"] == "completed" and reply["textContent"] == "echo: again [turn 2 of sess-1]"
        assert [u["sessionUpdate"] for u in reply["acpParts"]] == ["agent_message_chunk"] * 3
        user = await stored(proc, session["id"], sent2["userMessageId"])
        assert user["role"] == "user" and user["textContent"] == "again"
        got = await proc.call("chat:session:get", {"id": session["id"]})
        assert got["acpSessionId"] == "sess-1" and got["messageCount"] == 4
        # the session's default working directory was created under the data dir
        assert (tmp_path / "data" / "acp" / session["id"]).is_dir()
        assert "tok-SECRET-1" not in proc.stderr_text()
        [pid] = pids(pid_file)
        assert alive(pid)
        await proc.close()
        proc.assert_all_jsonrpc()
    await assert_gone([pid])


async def test_tool_calls_diffs_plan_usage_and_unknown_updates(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"])

        sent, final = await send_and_wait(proc, session["id"], "tools")
        assert final["type"] == "stream_end"
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        kinds = [e["type"] for e in events]
        assert kinds == [
            "stream_start", "tool_call_start", "tool_result", "tool_call_start", "tool_result",
            "text_delta", "stream_end",
        ]
        assert events[1]["toolCall"] == {"id": "call-read", "name": "Read config", "arguments": '{"path":"/w/config.json"}'}
        assert events[2]["toolResult"] == {"toolCallId": "call-read", "output": "debug=false", "isError": False}
        reply = await stored(proc, session["id"], sent["messageId"])
        parts = reply["parts"]
        assert [p["type"] for p in parts] == ["tool_use", "tool_result", "tool_use", "diff", "tool_result", "text"]
        assert parts[3] == {
            "type": "diff",
            "filePath": "/w/config.json",
            "hunks": [{"oldStart": 1, "oldLines": 3, "newStart": 1, "newLines": 3,
                       "lines": [" a", "-debug=false", "+debug=true", " c"]}],
        }
        assert reply["textContent"] == "I enabled debug."

        sent, final = await send_and_wait(proc, session["id"], "unknown")
        assert final["type"] == "stream_end"
        assert final["usage"] == {"inputTokens": 11, "outputTokens": 7, "contextUsed": 1234, "contextSize": 200000,
                                  "cacheReadTokens": None, "cacheWriteTokens": None, "reasoningTokens": None}
        reply = await stored(proc, session["id"], sent["messageId"])
        raw_kinds = [u.get("sessionUpdate") for u in reply["acpParts"]]
        assert raw_kinds == [
            "available_commands_update", "current_mode_update", "brand_new_kind", "notice",
            "tool_call_update", "plan", "usage_update", "agent_message_chunk",
        ]
        assert reply["acpParts"][2] == {"sessionUpdate": "brand_new_kind", "payload": {"deep": [1, 2, 3]}, "_meta": {"x": 1}}
        assert [p["type"] for p in reply["parts"]] == ["step_start", "step_finish", "step_start", "text"]
        assert reply["parts"][0] == {"type": "step_start", "stepId": "plan-1", "title": "Look around"}
        assert reply["textContent"] == "still fine"
        assert reply["usage"]["contextUsed"] == 1234

        sent, final = await send_and_wait(proc, session["id"], "thought")
        events = events_of(proc, sent["messageId"])
        assert [e["type"] for e in events][1:3] == ["thinking_delta", "text_delta"]
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["parts"] == [{"type": "thinking", "text": "thinking hard", "signature": None}, {"type": "text", "text": "answer"}]

        for reason, finish in (("max_tokens", "length"), ("refusal", "refusal"), ("max_turn_requests", "max_turn_requests")):
            _, final = await send_and_wait(proc, session["id"], f"stop {reason}")
            assert final["type"] == "stream_end" and final["finishReason"] == finish
        await proc.close()


async def test_permission_approved_rejected_remembered_and_audited(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"])

        async def ask(kind: str) -> tuple[dict, dict]:
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": f"permission {kind}"}})
            _, message = await proc.wait_for(
                lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "tool_approval_required"
            )
            return sent, message["params"]

        # approved once
        sent, event = await ask("edit")
        assert event["source"] == "acp" and event["toolCall"]["name"] == "Do edit"
        assert [o["kind"] for o in event["options"]] == ["allow_once", "allow_always", "reject_once", "reject_always"]
        pending = await proc.call("tool:pending:list", {"sessionId": session["id"]})
        assert [p["toolCallId"] for p in pending] == ["call-p"]
        result = await proc.call("chat:tool:approve", {"sessionId": session["id"], "toolCallId": "call-p", "decision": "approved"})
        assert result["success"] is True
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end"
        assert streamed_text(events_of(proc, sent["messageId"])) == "allowed:yes"
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["parts"][1] == {"type": "tool_result", "toolUseId": "call-p", "content": "done", "isError": False}

        # rejected once
        sent, _ = await ask("delete")
        await proc.call("chat:tool:approve", {"sessionId": session["id"], "toolCallId": "call-p", "decision": "denied"})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end"
        assert streamed_text(events_of(proc, sent["messageId"])) == "rejected:no"
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["parts"][1] == {"type": "tool_result", "toolUseId": "call-p", "content": "", "isError": True}

        # "always allow" for execute: answered with allow_always, then remembered for the engine
        sent, _ = await ask("execute")
        await proc.call(
            "chat:tool:approve",
            {"sessionId": session["id"], "toolCallId": "call-p", "decision": "approved", "remember": True},
        )
        await wait_final(proc, sent["messageId"])
        assert streamed_text(events_of(proc, sent["messageId"])) == "allowed:yes-always"
        sent, final = await send_and_wait(proc, session["id"], "permission execute")
        kinds = [e["type"] for e in events_of(proc, sent["messageId"])]
        assert "tool_approval_required" not in kinds, kinds
        assert streamed_text(events_of(proc, sent["messageId"])) == "allowed:yes"
        policies = await proc.call("tool:policy:get", {})
        assert {"key": f"acp:{engine['id']}:execute", "policy": "auto"} in [
            {"key": p["key"], "policy": p["policy"]} for p in policies
        ]
        # choosing the reject_always option by id remembers a deny
        sent, _ = await ask("move")
        await proc.call(
            "chat:tool:approve",
            {"sessionId": session["id"], "toolCallId": "call-p", "decision": "denied", "optionId": "no-always"},
        )
        await wait_final(proc, sent["messageId"])
        sent, _ = await send_and_wait(proc, session["id"], "permission move")
        assert streamed_text(events_of(proc, sent["messageId"])) == "rejected:no"

        audit = await proc.call("tool:audit:list", {"sessionId": session["id"]})
        decisions = [(a["decision"], a["actor"], a["source"]) for a in reversed(audit)]
        assert ("approved", "user", "acp") in decisions and ("denied", "user", "acp") in decisions
        assert ("policy:auto", "policy", "acp") in decisions and ("policy:deny", "policy", "acp") in decisions
        assert all(a["toolCallId"] == "call-p" for a in audit)
        await proc.close()


async def test_engine_auto_allow_kinds_skip_the_question(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, autoAllow=["read"])
        session = await acp_session(proc, engine["id"])
        sent, final = await send_and_wait(proc, session["id"], "permission read")
        assert final["type"] == "stream_end"
        assert "tool_approval_required" not in [e["type"] for e in events_of(proc, sent["messageId"])]
        assert streamed_text(events_of(proc, sent["messageId"])) == "allowed:yes"
        await proc.close()


async def test_abort_mid_turn_and_during_a_pending_permission(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, pid_file=pid_file)
        session = await acp_session(proc, engine["id"])

        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "wait"}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta"
        )
        assert (await proc.call("chat:abort", {"sessionId": session["id"]}))["success"] is True
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "aborted" and final["reason"] == "aborted by the user"
        # the agent's last update after session/cancel is kept
        assert streamed_text(events_of(proc, sent["messageId"])) == "working stopped"
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["status"] == "aborted" and reply["textContent"] == "working stopped"

        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "permission edit"}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "tool_approval_required"
        )
        await proc.call("chat:abort", {"sessionId": session["id"]})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "aborted"
        # the agent was answered "cancelled" and said so before ending the prompt
        assert streamed_text(events_of(proc, sent["messageId"])) == "permission cancelled"
        assert await proc.call("tool:pending:list", {"sessionId": session["id"]}) == []
        audit = await proc.call("tool:audit:list", {"sessionId": session["id"]})
        assert audit[0]["decision"] == "cancelled"

        # a newer send supersedes a running turn the same way
        first = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "wait"}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == first["messageId"] and m["params"]["type"] == "text_delta"
        )
        second, final2 = await send_and_wait(proc, session["id"], "after")
        assert (await wait_final(proc, first["messageId"]))["type"] == "aborted"
        assert final2["type"] == "stream_end"
        await proc.close()
    await assert_gone(pids(pid_file))


async def test_agent_that_hangs_after_cancel_is_ended_by_us(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, pid_file=pid_file, cancelTimeoutMs=400, shutdownTimeoutMs=300)
        session = await acp_session(proc, engine["id"])
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hang"}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta"
        )
        await proc.call("chat:abort", {"sessionId": session["id"]})
        final = await wait_final(proc, sent["messageId"], timeout=10)
        assert final["type"] == "aborted" and "did not stop within 0.4 s" in final["reason"]
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["status"] == "aborted" and reply["textContent"] == "working"
        # prompts on one agent session are serialised: the next one waits (bounded) for it
        _, final = await send_and_wait(proc, session["id"], "next")
        assert final["type"] == "error" and "has not finished the previous prompt" in final["error"]
        # other sessions of the same engine are served meanwhile
        other = await acp_session(proc, engine["id"])
        _, final = await send_and_wait(proc, other["id"], "hi")
        assert final["type"] == "stream_end"
        await proc.close()
    await assert_gone(pids(pid_file))


async def test_crash_mid_turn_keeps_the_partial_turn_and_the_next_send_respawns(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, pid_file=pid_file)
        session = await acp_session(proc, engine["id"])
        await send_and_wait(proc, session["id"], "first")
        sent, final = await send_and_wait(proc, session["id"], "crash")
        assert final["type"] == "error" and final["code"] == -32004
        assert "exited with code 3" in final["error"] and "crashing mid-turn" in final["error"]
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["status"] == "error" and reply["textContent"] == "partial one partial two"
        [first_pid] = pids(pid_file)
        await assert_gone([first_pid])  # reaped by the sidecar (no zombie)

        sent, final = await send_and_wait(proc, session["id"], "back")
        assert final["type"] == "stream_end"
        events = events_of(proc, sent["messageId"])
        notices = [e for e in events if e["type"] == "notice"]
        assert [n["code"] for n in notices] == ["acp_session_replaced"]
        assert streamed_text(events) == "echo: back [turn 1 of sess-1]"
        assert len(pids(pid_file)) == 2
        await proc.close()
    await assert_gone(pids(pid_file))


async def test_stderr_flood_junk_on_stdout_and_a_failed_start(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        noisy = await add_engine(proc, "--stderr-mb", "6", "--junk", pid_file=pid_file, name="Noisy")
        session = await acp_session(proc, noisy["id"])
        _, final = await send_and_wait(proc, session["id"], "hello")
        assert final["type"] == "stream_end"
        sent, final = await send_and_wait(proc, session["id"], "stderr 6")
        assert final["type"] == "stream_end"
        assert streamed_text(events_of(proc, sent["messageId"])) == "stderr done"
        sent, final = await send_and_wait(proc, session["id"], "tools")
        assert [e["type"] for e in events_of(proc, sent["messageId"])].count("tool_result") == 2
        assert "skipped a stdout line that is not JSON-RPC" in proc.stderr_text()

        broken = await add_engine(proc, "--crash-on-start", pid_file=pid_file, name="Broken")
        other = await acp_session(proc, broken["id"])
        sent, final = await send_and_wait(proc, other["id"], "hi")
        assert final["type"] == "error" and "exited with code 2" in final["error"]
        missing = await proc.call(
            "provider:upsert",
            {"name": "Missing", "type": "acp-engine", "engine": {"command": str(tmp_path / "no-such-agent")}},
        )
        third = await acp_session(proc, missing["id"])
        _, final = await send_and_wait(proc, third["id"], "hi")
        assert final["type"] == "error" and "cannot start the agent engine 'Missing'" in final["error"]
        # the sidecar serves on, and the noisy engine still works
        _, final = await send_and_wait(proc, session["id"], "still there")
        assert final["type"] == "stream_end"
        await proc.close()
        proc.assert_all_jsonrpc()
    await assert_gone(pids(pid_file))


async def test_shutdown_ends_an_agent_that_ignores_stdin_eof_and_sigterm(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, "--ignore-eof", "--ignore-term", pid_file=pid_file, shutdownTimeoutMs=300)
        session = await acp_session(proc, engine["id"])
        _, final = await send_and_wait(proc, session["id"], "hello")
        assert final["type"] == "stream_end"
        [pid] = pids(pid_file)
        await proc.close(timeout=10)
    assert "sending SIGTERM" in proc.stderr_text() and "sending SIGKILL" in proc.stderr_text()
    await assert_gone([pid])


async def test_fs_requests_are_confined_to_the_session_directory(tmp_path: Path) -> None:
    workspace = tmp_path / "work"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "notes.txt").write_text("inside text")
    outside = tmp_path / "secret.txt"
    outside.write_text("outside text")
    os.symlink(outside, workspace / "link-out")
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"], workspaceDir=str(workspace))

        async def reply_text(prompt: str) -> str:
            sent, final = await send_and_wait(proc, session["id"], prompt)
            assert final["type"] == "stream_end"
            return streamed_text(events_of(proc, sent["messageId"]))

        assert await reply_text(f"fs-read {workspace / 'notes.txt'}") == "fs ok: inside text"
        for path in (str(outside), f"{workspace}/../secret.txt", str(workspace / "link-out"), "/etc/hostname"):
            text = await reply_text(f"fs-read {path}")
            assert text.startswith("fs error -32602:") and "outside the session's working directory" in text, text
        assert (await reply_text("fs-read notes.txt")).startswith("fs error -32602: invalid params: path must be absolute")
        long_path = str(workspace) + "/" + "a" * 5000
        assert "longer than 4096" in await reply_text(f"fs-read {long_path}")
        assert (await reply_text(f"fs-read {workspace / 'missing.txt'}")).startswith("fs error -32002")

        assert await reply_text(f"fs-write {workspace / 'sub' / 'new.txt'}") == "fs ok: "
        assert (workspace / "sub" / "new.txt").read_text() == "written by agent"
        text = await reply_text(f"fs-write {tmp_path / 'escaped.txt'}")
        assert "outside the session's working directory" in text
        assert not (tmp_path / "escaped.txt").exists()
        assert outside.read_text() == "outside text"
        await proc.close()


async def test_restart_reloads_the_agent_session_when_supported(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for flags, expect_notice in ((("--load",), False), ((), True)):
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            engine = await add_engine(proc, *flags)
            session = await acp_session(proc, engine["id"])
            await send_and_wait(proc, session["id"], "one")
            await proc.close()
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            sent, final = await send_and_wait(proc, session["id"], "two")
            assert final["type"] == "stream_end"
            events = events_of(proc, sent["messageId"])
            notices = [e["code"] for e in events if e["type"] == "notice"]
            got = await proc.call("chat:session:get", {"id": session["id"]})
            if expect_notice:
                assert notices == ["acp_session_replaced"]
                # a new agent process numbers its sessions from 1 again: a new agent session
                assert streamed_text(events) == "echo: two [turn 1 of sess-1]"
            else:
                assert notices == []
                assert got["acpSessionId"] == "sess-1"
                assert "loaded sess-1" in proc.stderr_text()
            await proc.close()


async def test_regenerate_and_edit_use_session_fork_or_fail_clearly(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        forking = await add_engine(proc, "--fork", "--close", name="Forking")
        session = await acp_session(proc, forking["id"])
        first, _ = await send_and_wait(proc, session["id"], "a")
        second, _ = await send_and_wait(proc, session["id"], "b")
        # a plain next turn continues the same agent session (no fork)
        assert streamed_text(events_of(proc, second["messageId"])) == "echo: b [turn 2 of sess-1]"
        # regenerate b: the agent session went on past "a", so a fork of it (which keeps
        # "b" in the agent's context, and a notice says so); the first branch keeps sess-1
        regen = await proc.call("chat:regenerate", {"sessionId": session["id"], "messageId": second["messageId"]})
        final = await wait_final(proc, regen["messageId"])
        assert final["type"] == "stream_end"
        assert streamed_text(events_of(proc, regen["messageId"])) == "echo: b [turn 3 of sess-2]"
        notices = [e for e in events_of(proc, regen["messageId"]) if e["type"] == "notice"]
        assert [n["code"] for n in notices] == ["acp_history_kept"]
        # edit "a": a fresh agent session (nothing came before it)
        edit = await proc.call(
            "chat:editResend", {"sessionId": session["id"], "messageId": first["userMessageId"], "newContent": "A"}
        )
        await wait_final(proc, edit["messageId"])
        assert streamed_text(events_of(proc, edit["messageId"])) == "echo: A [turn 1 of sess-3]"
        # continuing the first branch continues its own agent session, which ends at "b"
        await proc.call("chat:messages:select", {"sessionId": session["id"], "leafId": second["messageId"]})
        cont, _ = await send_and_wait(proc, session["id"], "c")
        assert streamed_text(events_of(proc, cont["messageId"])) == "echo: c [turn 3 of sess-1]"
        assert not [e for e in events_of(proc, cont["messageId"]) if e["type"] == "notice"]
        # deleting the session closes its agent sessions (the engine advertises close)
        await proc.call("chat:session:delete", {"id": session["id"]})
        with anyio.fail_after(10):
            for n in (1, 2, 3):
                await proc.wait_stderr(f"closed sess-{n}")

        plain = await add_engine(proc, name="Plain")
        session = await acp_session(proc, plain["id"])
        sent, _ = await send_and_wait(proc, session["id"], "a")
        with pytest.raises(CallError) as err:
            await proc.call("chat:regenerate", {"sessionId": session["id"]})
        assert err.value.code == -32005 and "does not offer session/fork" in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call(
                "chat:editResend", {"sessionId": session["id"], "messageId": sent["userMessageId"], "newContent": "x"}
            )
        assert err.value.code == -32005
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert len(messages) == 2  # nothing was stored by the refused requests
        await proc.close()


async def test_images_and_files_follow_the_prompt_capabilities(tmp_path: Path) -> None:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    text_b64 = "aGVsbG8gZmlsZQ=="  # "hello file"
    user_input = {
        "content": "images",
        "attachments": [
            {"name": "dot.png", "data": png, "mimeType": "image/png"},
            {"name": "notes.txt", "data": text_b64, "mimeType": "text/plain"},
        ],
    }
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        capable = await add_engine(proc, "--image", name="Capable")
        session = await acp_session(proc, capable["id"])
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": user_input})
        await wait_final(proc, sent["messageId"])
        assert streamed_text(events_of(proc, sent["messageId"])) == "blocks=3 text,image:image/png,resource"

        plain = await add_engine(proc, name="Plain")
        session = await acp_session(proc, plain["id"])
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": user_input})
        await wait_final(proc, sent["messageId"])
        events = events_of(proc, sent["messageId"])
        assert streamed_text(events) == "blocks=2 text,resource_link:text/plain"
        notices = [e for e in events if e["type"] == "notice"]
        assert notices and notices[0]["code"] == "acp_content_not_sent" and "image" in notices[0]["notice"]
        await proc.close()


async def test_bad_engine_configs_are_invalid_params(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        for engine, field in (
            (None, "$.engine"),
            ({"command": " "}, "$.engine.command"),
            ({"command": "x", "autoAllow": ["everything"]}, "$.engine.autoAllow"),
            ({"command": "x", "cancelTimeoutMs": 0}, "$.engine"),
        ):
            params = {"name": "E", "type": "acp-engine", **({"engine": engine} if engine is not None else {})}
            with pytest.raises(CallError) as err:
                await proc.call("provider:upsert", params)
            assert err.value.code == -32602 and field in err.value.message, err.value.message
        with pytest.raises(CallError) as err:
            await proc.call(
                "provider:upsert",
                {"name": "H", "type": "openai-compat", "baseUrl": "http://x", "engine": {"command": "x"}},
            )
        assert err.value.code == -32602
        # a direct session cannot use an engine, an ACP session cannot use an HTTP provider:
        # refused where they are chosen (and at the send, for a session whose default it is)
        engine = await add_engine(proc)
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:create", {"providerId": engine["id"], "modelId": "m"})
        assert err.value.code == -32602 and "is an ACP agent engine" in err.value.message
        await proc.call("provider:setDefault", {"providerId": engine["id"], "modelId": "m"})
        direct = await proc.call("chat:session:create", {})
        _, final = await send_and_wait(proc, direct["id"], "hi")
        assert final["type"] == "error" and "is an ACP agent engine" in final["error"]
        http = await proc.call("provider:upsert", {"name": "H", "type": "openai-compat", "baseUrl": "http://127.0.0.1:9"})
        with pytest.raises(CallError) as err:
            await acp_session(proc, http["id"])
        assert err.value.code == -32602 and "needs an acp-engine provider" in err.value.message
        await proc.call("provider:setDefault", {"providerId": http["id"], "modelId": "m"})
        acp = await proc.call("chat:session:create", {"mode": "acp"})
        _, final = await send_and_wait(proc, acp["id"], "hi")
        assert final["type"] == "error" and "is not an ACP agent engine" in final["error"]
        await proc.close()


async def test_engine_env_is_explicit_masked_and_kept(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data", env={"SIDECAR_ONLY_VAR": "leak"}) as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, env={"API_KEY": "k-SECRET-1", "MODE": "fast"})
        assert engine["engine"]["env"] == {"API_KEY": "***", "MODE": "***"}
        session = await acp_session(proc, engine["id"])

        async def env(name: str) -> str:
            sent, _ = await send_and_wait(proc, session["id"], f"env {name}")
            return streamed_text(events_of(proc, sent["messageId"]))

        assert await env("API_KEY") == "API_KEY=k-SECRET-1"
        assert await env("SIDECAR_ONLY_VAR") == "SIDECAR_ONLY_VAR=<unset>"  # not inherited
        assert (await env("PATH")).startswith("PATH=/")
        # the renderer sends the masked value back with another change: the key is kept
        changed = dict(engine["engine"], env={"API_KEY": "***", "MODE": "slow"})
        await proc.call(
            "provider:upsert", {"id": engine["id"], "name": "Scripted agent", "type": "acp-engine", "engine": changed}
        )
        assert await env("API_KEY") == "API_KEY=k-SECRET-1"  # a restarted engine, same secret
        assert await env("MODE") == "MODE=slow"
        assert "k-SECRET-1" not in proc.stderr_text()
        await proc.close()


async def test_configured_mcp_servers_are_passed_to_session_new_unless_denied(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        await proc.call("mcp:server:upsert", {"name": "files", "command": "files-server", "env": {"K": "v"}})
        await proc.call("mcp:server:upsert", {"name": "web", "transport": "http", "url": "http://127.0.0.1:9/mcp"})
        await proc.call("mcp:server:upsert", {"name": "off", "command": "x", "enabled": False})
        # denied: the agent would run it itself, with its secret: it is not passed
        await proc.call("mcp:server:upsert", {"name": "private", "command": "mail-server", "env": {"TOKEN": "t-SECRET"}})
        await proc.call("tool:policy:set", {"key": "mcp:private", "policy": "deny"})
        stdio_only = await add_engine(proc, name="StdioOnly")
        with_http = await add_engine(proc, "--mcp-http", name="WithHttp")
        for engine, expected in ((stdio_only, "mcp=1 [stdio:files]"), (with_http, "mcp=2 [stdio:files,http:web]")):
            session = await acp_session(proc, engine["id"])
            _, final = await send_and_wait(proc, session["id"], "hi")
            assert final["type"] == "stream_end"
            assert expected in proc.stderr_text()
        await proc.close()
