"""The V1 /computer/chat endpoint end to end: a sidecar subprocess, real HTTP on loopback, and
a client that behaves as the Qiming server's SandboxAgentClient (fixtures/v1_client.py).

Every test also holds what the issue asks after each case: the turn is stored like any
other and the renderer saw it on chat:stream.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from acp_helpers import AGENT, alive, assert_gone, pids
from chat_helpers import streamed_text, wait_final
from compat_helpers import AGENT_COMMAND, V1, v1_sidecar

from fixtures.v1_client import ChatFailed, SandboxClient, Turn

pytestmark = pytest.mark.anyio


async def stored_reply(v1: V1, session_id: str) -> dict[str, Any]:
    messages = await v1.proc.call("chat:messages:get", {"sessionId": session_id})
    return messages[-1]


def frames(turn: Turn) -> list[dict[str, Any]]:
    return [e.json() for e in turn.events]


async def test_a_whole_turn_as_the_server_drives_it_then_a_second_prompt(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        await v1.server.script({"text": "Hello from the scripted model.", "delay_ms": 5})  # type: ignore[union-attr]
        turn = await v1.client.run_turn(v1.direct("write a script", project_id="1464425"))
        assert turn.completed and turn.finish_reason == "END_TURN" and turn.error is None
        assert turn.text == "Hello from the scripted model."
        assert turn.chat["project_id"] == "1464425" and turn.chat["request_id"] == "req-1464425"
        assert turn.chat["is_new_session"] is True and turn.chat["error"] is None
        kinds = [e.type for e in turn.events]
        assert kinds[0] == "prompt_start" and kinds[-1] == "end_turn" and "agent_message_chunk" in kinds
        first = frames(turn)[0]
        assert first == {
            "sessionId": turn.session_id, "acpSessionId": turn.session_id, "messageType": "sessionPromptStart",
            "subType": "prompt_start", "data": {"request_id": "req-1464425"}, "timestamp": first["timestamp"],
        }
        # the turn is stored like any other, the renderer saw it, the session says where it came from
        reply = await stored_reply(v1, turn.session_id)
        assert reply["status"] == "completed" and reply["textContent"] == turn.text
        final = await wait_final(v1.proc, reply["id"])
        assert final["type"] == "stream_end"
        renderer = [e for e in v1.proc.notifications("chat:stream") if e["messageId"] == reply["id"]]
        assert streamed_text(renderer) == turn.text
        listed = await v1.proc.call("chat:session:list", {"channelId": "v1-computer"})
        [session] = listed["sessions"]
        assert session["id"] == turn.session_id and session["systemPrompt"] == "You are a helpful agent."
        assert session["channelMeta"] == {"origin": "v1 /computer/chat", "userId": "5", "projectId": "1464425"}
        assert session["workspaceDir"] == str(tmp_path / "data" / "compat" / "computer-project-workspace" / "5" / "1464425")
        providers = await v1.proc.call("provider:list", {})
        assert any(p["id"].startswith("v1-model-") and p["hasApiKey"] for p in providers)

        # the session's title (a side call to the same scripted provider) is in before the
        # second answer is scripted, so the title call cannot take it
        await v1.proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:session:updated"
                               and m["params"]["id"] == turn.session_id
                               and m["params"]["title"].startswith("A chat about"))

        # the second prompt of the conversation: the server sends the session id back
        await v1.server.script({"text": "Second answer."})  # type: ignore[union-attr]
        body = v1.direct("and now?", project_id="1464425", session_id=turn.session_id, system_prompt="ignored now")
        second = await v1.client.run_turn(body)
        assert second.session_id == turn.session_id and second.chat["is_new_session"] is False
        assert second.text == "Second answer." and second.finish_reason == "END_TURN"
        messages = await v1.proc.call("chat:messages:get", {"sessionId": turn.session_id})
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        assert messages[2]["textContent"] == "and now?"
        requests = await v1.server.requests()  # type: ignore[union-attr]
        history = [m["content"] for m in requests[-1]["messages"] if m["role"] == "assistant"]
        assert history == ["Hello from the scripted model."]  # the model got the conversation so far
        got = await v1.proc.call("chat:session:get", {"id": turn.session_id})
        assert got["systemPrompt"] == "You are a helpful agent."  # system_prompt applies to new sessions only
        assert "sk-v1-SECRET-9" not in v1.proc.stderr_text()
        await v1.proc.close()
        v1.proc.assert_all_jsonrpc()


async def test_an_acp_engine_behind_it_tools_plan_cancel_status_and_stop(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with v1_sidecar(tmp_path, provider=False) as v1:
        c = v1.client
        turn = await c.run_turn(v1.agent("tools", "--pid-file", str(pid_file)))
        assert turn.completed and turn.text == "I enabled debug."
        assert [p["type"] for p in turn.processing] == ["tool_call", "tool_call_update", "tool_call", "tool_call_update"]
        read = turn.processing[0]
        assert read["toolCallId"] == "call-read" and read["title"] == "Read config" and read["rawInput"] == {"path": "/w/config.json"}
        assert turn.processing[1]["status"] == "completed"
        assert turn.processing[1]["content"] == [{"type": "content", "content": {"type": "text", "text": "debug=false"}}]
        session_id = turn.session_id
        [pid] = pids(pid_file)

        plan = await c.run_turn(v1.agent("unknown", "--pid-file", str(pid_file), session_id=session_id))
        assert plan.session_id == session_id and plan.text == "still fine"
        [step] = [p for p in plan.processing if p["type"] == "plan"]
        assert step["entries"] == [
            {"content": "Look around", "priority": "high", "status": "completed"},
            {"content": "Write code", "priority": "medium", "status": "pending"},
        ]
        assert "usage_update" in [e.type for e in plan.events]
        assert pids(pid_file) == [pid]  # one engine per command/args/env, reused

        # cancel mid-turn; status Busy, then Idle
        data = await c.chat(v1.agent("wait", "--pid-file", str(pid_file)))
        waiting = Turn(session_id=data["session_id"], chat=data)
        async with c.progress(data["session_id"]) as (_, events), anyio.create_task_group() as tg:
            tg.start_soon(c.follow, waiting, events)
            with anyio.fail_after(20):
                while not waiting.text:
                    await anyio.sleep(0.02)
            status = (await c.status("p1", "5", with_key=True)).json()["data"]
            assert status["status"] == "Busy" and status["is_alive"] is True and status["session_id"] == session_id
            cancelled = await c.cancel("p1", data["session_id"], "5")
            assert cancelled.json() == {"code": "0000", "message": "success", "data": {"success": True, "session_id": session_id}, "tid": None, "success": True}
        assert waiting.interrupted and waiting.error is None
        last = frames(waiting)[-1]
        assert last["subType"] == "cancelled" and last["data"] == {"reason": "cancelled", "description": "Prompt completed: cancelled"}
        assert (await c.status("p1", "5", with_key=True)).json()["data"]["status"] == "Idle"
        reply = await stored_reply(v1, session_id)
        assert reply["status"] == "aborted" and reply["textContent"].startswith("working")
        # a second cancel is idempotent
        assert (await c.cancel("p1", session_id, "5")).json()["success"] is True

        # stop: the engine goes away, the conversation stays, the next prompt starts it again
        stopped = await c.stop("p1", session_id, "5")
        assert stopped.json()["data"] == {"success": True, "message": "Agent stopped successfully", "user_id": "5", "project_id": "p1"}
        await assert_gone([pid])
        status = (await c.status("p1", "5", with_key=True)).json()["data"]
        assert status["is_alive"] is False and status["status"] == "Idle"
        again = await c.run_turn(v1.agent("hello", "--pid-file", str(pid_file)))
        assert again.session_id == session_id and again.text.startswith("echo: hello")
        assert len(pids(pid_file)) == 2 and alive(pids(pid_file)[1])
        await v1.proc.close()
    await assert_gone(pids(pid_file))


async def test_permissions_follow_the_tool_policy_and_the_request_rules(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, provider=False, trustApprovalRules=True) as v1:
        c = v1.client
        # a rule allows it (the host trusts the requests' rules): decided at once, audited
        # as the rule's decision with the reason, never as the user's
        turn = await c.run_turn(v1.agent("permission edit", tool_approval_rules=[
            {"action": "ask", "patterns": []}, {"action": "allow", "patterns": ["Do *"]}]))
        assert turn.text == "allowed:yes"
        audit = await v1.proc.call("tool:audit:list", {"limit": 10})
        assert [(a["decision"], a["actor"]) for a in audit[:2]] == [("rule:allow", "compat"), ("requested", "system")]
        assert audit[0]["note"] == "decided by the V1 request's tool_approval_rules (allow)"
        # a rule denies by kind (its target: the title's first word, as the agent sent no tool name)
        turn = await c.run_turn(v1.agent("permission delete", tool_approval_rules=[
            {"action": "allow", "patterns": ["*"], "tool_kind": "edit"},
            {"action": "deny", "patterns": ["do"], "tool_kind": "Delete"}]))
        assert turn.text == "rejected:no"
        # no rule (and yolo not trusted): the call waits for the user, visible to the renderer
        seen = len(v1.proc.messages)
        data = await c.chat(v1.agent("permission edit", agent_mode="yolo"))
        pending: Turn = Turn(session_id=data["session_id"], chat=data)
        async with c.progress(data["session_id"]) as (_, events), anyio.create_task_group() as tg:
            tg.start_soon(c.follow, pending, events)
            _, message = await v1.proc.wait_for(
                lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                and m["params"]["type"] == "tool_approval_required", timeout=20, start=seen,
            )
            [call] = await v1.proc.call("tool:pending:list", {"sessionId": data["session_id"]})
            assert call["toolCallId"] == "call-p" and call["source"] == "acp"
            assert (await c.status("p1", "5", with_key=True)).json()["data"]["status"] == "Busy"
            await v1.proc.call("chat:tool:approve", {"sessionId": data["session_id"], "toolCallId": "call-p", "decision": "approved"})
        assert pending.text == "allowed:yes" and pending.finish_reason == "END_TURN"
        await v1.proc.close()


async def test_trusting_agent_mode_approves_yolo_requests(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, provider=False, trustAgentMode=True) as v1:
        turn = await v1.client.run_turn(v1.agent("permission edit", agent_mode="yolo"))
        assert turn.text == "allowed:yes"
        audit = await v1.proc.call("tool:audit:list", {"limit": 1})
        assert audit[0]["note"] == "decided by the V1 request's agent_mode yolo (trustAgentMode)"
        await v1.proc.close()


async def test_progress_clients_before_the_chat_late_and_when_idle(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        c = v1.client
        # no side calls: a title request that comes late would take the reply scripted for
        # the next turn
        await v1.proc.call("settings:update", {"generateTitles": False, "generateSuggestions": False})
        first = await c.run_turn(v1.direct("one"))
        session_id = first.session_id

        # before the chat: the stream waits for the session's next turn (electron)
        async with c.progress(session_id) as (response, events):
            assert response.status_code == 200
            await v1.wait_clients(1)
            await v1.server.script({"text": "two is here"})  # type: ignore[union-attr]
            data = await c.chat(v1.direct("two", session_id=session_id))
            early = await c.follow(Turn(session_id=data["session_id"], chat=data), events)
        assert early.completed and early.text == "two is here"
        assert [e.type for e in early.events][0] == "prompt_start"

        # late: the whole turn ended before anyone connected; the buffer replays it
        await v1.server.script({"text": "three, buffered", "chunks": 3})  # type: ignore[union-attr]
        data = await c.chat(v1.direct("three", session_id=session_id))
        reply = await stored_reply(v1, session_id)
        await wait_final(v1.proc, reply["id"])
        late = Turn(session_id=session_id, chat=data)
        async with c.progress(session_id) as (_, events):
            await c.follow(late, events)
        assert late.completed and late.text == "three, buffered" and late.events[0].type == "prompt_start"

        # idle: after stop nothing runs for the session: one end_turn, then the stream closes
        await c.stop("d1", session_id, "5")
        async with c.progress(session_id) as (_, events):
            idle = [e async for e in events]
        assert [e.type for e in idle] == ["end_turn"]
        message = idle[0].json()
        assert message["data"] == {"reason": "EndTurn", "description": "Agent 当前无在执行任务"}
        assert message["messageType"] == "sessionPromptEnd" and message["sessionId"] == session_id
        await v1.proc.close()


async def test_the_rcoder_flavor(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, flavor="rcoder", pingIntervalMs=60000) as v1:
        c = v1.client
        await v1.server.script({"text": "rust says hi"})  # type: ignore[union-attr]
        body = v1.direct("hi")
        del body["request_id"]
        data = await c.chat(body)
        assert "is_new_session" not in data and data["request_id"]  # rcoder makes a request id
        async with c.progress(data["session_id"]) as (_, events):
            got = [e async for e in events]  # rcoder closes the stream after the end of the turn
        kinds = [e.type for e in got if e.type != "ping"]
        assert kinds[0] == "prompt_start" and kinds[-1] == "end_turn"
        messages = [e.json() for e in got if e.type != "ping"]
        assert all("acpSessionId" not in m for m in messages)
        chunk = next(m for m in messages if m["subType"] == "agent_message_chunk")
        assert chunk["data"] == {"content": chunk["data"]["content"], "request_id": data["request_id"]}
        assert messages[-1]["data"] == {"reason": "EndTurn", "description": "Normal end", "request_id": data["request_id"]}
        # idle now (rcoder checks the session's agent): one end_turn and close
        async with c.progress(data["session_id"]) as (_, events):
            assert [e.type for e in [e async for e in events]] == ["end_turn"]
        await v1.proc.close()


async def test_pings_and_the_electron_cancel_form(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, provider=False, pingIntervalMs=1000, cancelAsError=True) as v1:
        c = v1.client
        data = await c.chat(v1.agent("wait"))
        turn = Turn(session_id=data["session_id"], chat=data)
        async with c.progress(data["session_id"]) as (_, events):
            async for event in events:
                turn.events.append(event)
                if event.type == "ping":
                    break
            ping = turn.events[-1].json()
            assert list(ping) == ["sessionId", "messageType", "subType", "data", "timestamp"]
            assert ping["data"]["type"] == "heartbeat" and ping["data"]["message"] == "keep-alive"
            await c.cancel("p1", data["session_id"], "5")
            await c.follow(turn, events)
        assert turn.error == "Session cancelled" and turn.finish_reason == "ERROR"
        assert frames(turn)[-1]["data"] == {"reason": "error", "description": "Session cancelled"}
        await v1.proc.close()


async def test_engine_failures_end_with_an_error_frame_and_are_stored(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        c = v1.client
        turn = await c.run_turn(v1.agent("hello", "--crash-on-start", project_id="crash"))
        assert turn.finish_reason == "ERROR" and turn.error and "crashing at start on purpose" in turn.error
        reply = await stored_reply(v1, turn.session_id)
        assert reply["status"] == "error" and reply["error"] == turn.error

        await v1.server.script({"status": 400, "times": 10})  # type: ignore[union-attr]
        failed = await c.run_turn(v1.direct("boom", project_id="fail"))
        assert failed.finish_reason == "ERROR" and failed.error
        assert (await stored_reply(v1, failed.session_id))["status"] == "error"

        # an agent that is not allowed never starts: an error answer, as V1 answered engine failures
        with pytest.raises(ChatFailed) as err:
            await c.chat({**v1.agent("x"), "agent_config": {"agent_server": {"command": "/bin/sh", "args": ["-c", "id"]}}})
        assert err.value.status == 200 and "not allowed" in str(err.value)
        assert json.loads(err.value.body)["code"] == "5000"
        await v1.proc.close()


async def test_shutdown_is_prompt_with_streams_open_and_a_turn_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    async with v1_sidecar(tmp_path, provider=False) as v1:
        c = v1.client
        data = await c.chat(v1.agent("wait", "--pid-file", str(pid_file)))
        async with c.progress(data["session_id"]) as (_, events):
            async for event in events:
                if event.type == "agent_message_chunk":
                    break
            other = SandboxClient(v1.url, v1.token)
            async with other.progress(data["session_id"]) as (_, waiting):
                await v1.wait_clients(2)
                with anyio.fail_after(15):
                    await v1.proc.close()  # sidecar:shutdown answers, the process exits 0
                rest: list[Any] = []
                with contextlib.suppress(httpx2.HTTPError):
                    rest = [e async for e in waiting]  # the stream ended with the endpoint
                assert all(e.type != "end_turn" for e in rest)
            await other.aclose()
    await assert_gone(pids(pid_file))


async def test_only_commands_it_allows_run_and_placeholders_are_filled(tmp_path: Path) -> None:
    async with v1_sidecar(
        tmp_path, provider=False,
        agentCommands={AGENT_COMMAND: {"command": sys.executable, "requestArgs": True, "requestEnv": ["KEY_SEEN", "LOGS"]},
                       "pinned": {"command": sys.executable, "args": [str(AGENT)]}},
    ) as v1:
        body = v1.agent("env KEY_SEEN", project_id="env1", env={"KEY_SEEN": "{MODEL_PROVIDER_API_KEY}", "LOGS": "{PREFIX_WORKSPACE_DIR}/env1/logs"})
        body["model_provider"] = {"id": "1", "base_url": "http://127.0.0.1:9/m", "api_key": "sk-placeholder-1", "default_model": "m", "api_protocol": "anthropic"}
        turn = await v1.client.run_turn(body)
        assert turn.text == "KEY_SEEN=sk-placeholder-1"
        logs = await v1.client.run_turn({**body, "prompt": "env LOGS"})
        assert logs.text == f"LOGS={tmp_path / 'data' / 'compat' / 'computer-project-workspace' / '5'}/env1/logs"
        # a mapping may replace the arguments too: "pinned" always runs the scripted agent,
        # whatever the request asks to run
        pinned = await v1.client.run_turn({
            **v1.agent("hi", project_id="pin"),
            "agent_config": {"agent_server": {"command": "pinned", "args": ["-c", "print('not the agent')"]}},
        })
        assert pinned.text.startswith("echo: hi")
        await v1.proc.close()
