"""Server-forwarded chat (mode "server" sessions) over the subprocess, against the fake server:
text, thinking, tool activity and heart beats stream; a permission request is approved and
the turn goes on; stop mid-turn; a dropped or silent stream re-attaches without repeated text;
a failed turn keeps its partial text; the computer API; a restart mid-turn; chat:suggest and
server:chat:pageResult; a forwarded turn is not pulled again."""

from __future__ import annotations

import signal
from typing import Any

import anyio
import apsw
import pytest

from chat_helpers import assert_well_ordered, events_of, streamed_text, wait_final
from qiming_helpers import QimingServer, all_messages, configure, qiming_server, sync
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio

TURN_TIMEOUT = 60.0


def chunk(text: str, kind: str = "CHAT") -> dict[str, Any]:
    return {"eventType": "MESSAGE", "data": {"type": kind, "text": text}}


def tool(execute_id: str, status: str, *, title: str = "Bash ls", data: Any = None) -> dict[str, Any]:
    result: dict[str, Any] = {"id": -1, "type": "ToolCall", "executeId": execute_id, "input": {"command": "ls"},
                              "kind": "execute"}
    if data is not None:
        result["data"] = data
        result["success"] = status == "FINISHED"
    return {"eventType": "PROCESSING", "data": {"targetId": -1, "name": title, "originalTitle": title,
                                                "type": "ToolCall", "status": status, "result": result}}


async def server_session(proc: Any, server: QimingServer, **configure_extra: Any) -> tuple[dict[str, Any], int]:
    """A configured account and a new server session linked to a new conversation."""
    await proc.call("sidecar:initialize", {})
    await configure(proc, server, agentId=1128, **configure_extra)
    session = await proc.call("server:session:create", {"title": "Forwarded"})
    assert session["mode"] == "server" and session["title"] == "Forwarded"
    convs = [c for c in await server.conversations() if c["topic"] == "Forwarded"]
    assert len(convs) == 1
    return session, convs[0]["id"]


async def send(proc: Any, session_id: str, text: str) -> dict[str, Any]:
    return await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}})


async def requests_to(server: QimingServer, suffix: str) -> list[dict[str, Any]]:
    return [r for r in await server.requests() if r["path"].endswith(suffix)]


async def test_text_thinking_tools_and_heartbeats_stream_and_are_stored(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        session, cid = await server_session(proc, server, chatIdleTimeoutMs=1500)
        await server.control("chat", {"events": [
            chunk("Let me think. ", "THINK"),
            chunk("Looking "),
            tool("toolu_1", "EXECUTING"),
            {"wait": 3000, "heartbeatMs": 200},  # longer than the idle timeout: heart beats keep it alive
            tool("toolu_1", "FINISHED", data="a.txt\nb.txt"),
            chunk("at the files: "),
            chunk("two."),
        ]})
        sent = await send(proc, session["id"], "list the files")
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "stream_end", final
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        assert streamed_text(events) == "Looking at the files: two."
        assert "".join(e["thinking"] for e in events if e["type"] == "thinking_delta") == "Let me think. "
        starts = [e for e in events if e["type"] == "tool_call_start"]
        assert [(s["toolCall"]["id"], s["toolCall"]["name"]) for s in starts] == [("toolu_1", "Bash ls")]
        results = [e for e in events if e["type"] == "tool_result"]
        assert [(r["toolResult"]["toolCallId"], r["toolResult"]["output"], r["toolResult"].get("isError", False))
                for r in results] == [("toolu_1", "a.txt\nb.txt", False)]
        usage = [e for e in events if e["type"] == "usage"]
        assert usage and usage[-1]["usage"]["inputTokens"] == 10
        assert await requests_to(server, f"/chat/sub/{cid}") == [], "heart beats kept the stream alive"
        (reply,) = [m for m in await all_messages(proc, session["id"]) if m["role"] == "assistant"]
        assert reply["status"] == "completed" and reply["textContent"] == "Looking at the files: two."
        kinds = [p["type"] for p in reply["parts"]]
        assert kinds.count("thinking") == 1 and "tool_use" in kinds and "tool_result" in kinds
        chat = (await server.get("chat_log"))["chat"]
        assert chat[-1] == {"conversationId": cid, "message": "list the files"}
        await proc.close()


async def test_a_permission_request_is_approved_and_the_turn_goes_on(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        session, cid = await server_session(proc, server, agentMode="ask")
        await server.control("chat", {"events": [
            chunk("Checking. "),
            {"waitPermission": True, "toolId": "toolu_perm", "name": "Bash", "input": {"command": "rm x"}},
            chunk("Done."),
        ]})
        sent = await send(proc, session["id"], "remove x")
        _, message = await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["type"] == "tool_approval_required", timeout=TURN_TIMEOUT,
        )
        asked = message["params"]
        assert asked["toolCall"]["id"] == "toolu_perm" and asked["source"] == "acp"
        assert [o["optionId"] for o in asked["options"]] == ["allow-once", "allow-always", "reject-once"]
        pending = await proc.call("tool:pending:list", {"sessionId": session["id"]})
        assert [(p["toolCallId"], p["toolName"]) for p in pending] == [("toolu_perm", "Bash")]
        assert '"rm x"' in pending[0]["arguments"]
        await proc.call("chat:tool:approve", {"sessionId": session["id"], "toolCallId": "toolu_perm",
                                              "decision": "approved"})
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "stream_end"
        assert streamed_text(events_of(proc, sent["messageId"])) == "Checking. Done."
        log = await server.get("chat_log")
        assert log["permissions"] == [{"conversationId": cid, "toolId": "toolu_perm",
                                       "option": {"optionId": "allow-once", "outcome": "selected"}}]
        assert log["chat"][-1]["agentMode"] == "ask"
        assert await proc.call("tool:pending:list", {"sessionId": session["id"]}) == []
        await proc.close()


async def test_stop_mid_turn_keeps_the_partial_text_and_the_server_saw_it(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        session, cid = await server_session(proc, server)
        await server.control("chat", {"events": [chunk("First part. "), {"wait": 30000, "heartbeatMs": 200},
                                                 chunk("never sent")]})
        sent = await send(proc, session["id"], "go slowly")
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta",
            timeout=TURN_TIMEOUT,
        )
        assert await proc.call("chat:abort", {"sessionId": session["id"]}, timeout=TURN_TIMEOUT) == {"success": True}
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "aborted"
        assert streamed_text(events_of(proc, sent["messageId"])) == "First part. "
        assert len(await requests_to(server, f"/chat/stop/{cid}")) == 1
        (reply,) = [m for m in await all_messages(proc, session["id"]) if m["role"] == "assistant"]
        assert reply["status"] == "aborted" and reply["textContent"] == "First part. "
        await proc.close()


async def test_a_dropped_or_silent_stream_reattaches_without_repeating_text(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        session, cid = await server_session(proc, server, chatIdleTimeoutMs=1000)
        # the connection drops after two events; the turn goes on on the server
        await server.control("chat", {"dropAfter": 2, "delayMs": 100, "events": [
            chunk("one "), chunk("two "), chunk("three "), chunk("four"),
        ]})
        sent = await send(proc, session["id"], "count")
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "stream_end", final
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        assert streamed_text(events) == "one two three four"
        assert len(await requests_to(server, f"/chat/sub/{cid}")) >= 1

        # silence (no heart beat) longer than the idle timeout: dropped and re-attached
        await server.control("chat", {"events": [chunk("alpha "), {"wait": 2500}, chunk("beta")]})
        sent = await send(proc, session["id"], "again")
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "stream_end", final
        assert streamed_text(events_of(proc, sent["messageId"])) == "alpha beta"
        assert len(await requests_to(server, f"/chat/sub/{cid}")) >= 2
        replies = [m for m in await all_messages(proc, session["id"]) if m["role"] == "assistant"]
        assert [r["textContent"] for r in replies] == ["one two three four", "alpha beta"]
        await proc.close()


async def test_a_failed_turn_is_an_error_event_with_the_partial_text_kept(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        session, _ = await server_session(proc, server)
        await server.control("chat", {"events": [chunk("Partial "), chunk("answer")], "fail": "model quota exceeded"})
        sent = await send(proc, session["id"], "hello")
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "error" and "model quota exceeded" in final["error"], final
        assert streamed_text(events_of(proc, sent["messageId"])) == "Partial answer"
        (reply,) = [m for m in await all_messages(proc, session["id"]) if m["role"] == "assistant"]
        assert reply["status"] == "error" and reply["textContent"] == "Partial answer"
        assert "model quota exceeded" in reply["error"]
        await proc.close()


async def test_the_computer_api_drives_a_turn(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await server.control("capabilities", {"computerApi": True})
        await proc.call("sidecar:initialize", {})
        status = await configure(proc, server, chatApi="computer", chatIdleTimeoutMs=1500)
        assert status["chatApi"] == "computer"
        session = await proc.call("chat:session:create", {"mode": "server"})
        await server.control("computer_chat", {"dropAfter": 3, "updates": [
            {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}},
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hello "}},
            {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read file", "kind": "read",
             "status": "pending", "rawInput": {"path": "a.txt"}},
            {"wait": 300},
            {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
             "content": [{"type": "content", "content": {"type": "text", "text": "file body"}}]},
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "world"}},
        ]})
        sent = await send(proc, session["id"], "hi computer")
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "stream_end", final
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        assert streamed_text(events) == "Hello world"
        assert [e["toolResult"]["output"] for e in events if e["type"] == "tool_result"] == ["file body"]
        computer = (await server.get("chat_log"))["computer"]
        (chat,) = [c for c in computer if c["path"] == "/chat"]
        assert chat["body"]["prompt"] == "hi computer" and chat["body"]["user_id"] == "5"
        assert chat["body"]["project_id"] == session["id"] and "session_id" not in chat["body"]
        progress = [r for r in await server.requests() if r["path"].startswith("/api/computer/progress/")]
        assert len(progress) >= 2, "the dropped progress stream was re-attached"

        # the next turn continues the runner's session; stop goes to /api/computer/cancel
        await server.control("computer_chat", {"updates": [
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "slow "}},
            {"wait": 30000},
        ]})
        sent = await send(proc, session["id"], "and again")
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta",
            timeout=TURN_TIMEOUT,
        )
        await proc.call("chat:abort", {"sessionId": session["id"]}, timeout=TURN_TIMEOUT)
        final = await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT)
        assert final["type"] == "aborted"
        computer = (await server.get("chat_log"))["computer"]
        chats = [c for c in computer if c["path"] == "/chat"]
        assert chats[1]["body"]["session_id"] == progress[0]["path"].rsplit("/", 1)[1]
        assert [c["body"]["session_id"] for c in computer if c["path"] == "/cancel"] == [chats[1]["body"]["session_id"]]

        # a permission request of the runner's agent, denied here, goes to /notify-resolved
        await server.control("computer_chat", {"updates": [
            {"permission": {"toolCallId": "perm-1", "title": "Write file", "kind": "edit", "input": {"path": "x"}}},
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "not written"}},
        ]})
        sent = await send(proc, session["id"], "write x")
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "tool_approval_required",
            timeout=TURN_TIMEOUT,
        )
        await proc.call("chat:tool:approve", {"sessionId": session["id"], "toolCallId": "perm-1", "decision": "denied"})
        assert (await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT))["type"] == "stream_end"
        (answer,) = (await server.get("chat_log"))["permissions"]
        assert answer["permission_resolve_request"]["tool_call_id"] == "perm-1"
        assert answer["permission_resolve_request"]["request_permission_response"] == {
            "outcome": {"outcome": "selected", "optionId": "reject-once"}}
        await proc.close()


@pytest.mark.sidecar_subprocess  # a SIGKILL, and the restart after it
async def test_restart_during_a_forwarded_turn_leaves_it_aborted_with_its_text(tmp_path):
    async with qiming_server() as server:
        async with spawn_sidecar(tmp_path) as proc:
            session, _ = await server_session(proc, server)
            await proc.call("settings:update", {"persistIntervalMs": 50})
            await server.control("chat", {"events": [chunk("kept text"), {"wait": 60000, "heartbeatMs": 200}]})
            sent = await send(proc, session["id"], "long task")
            await proc.wait_for(
                lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta",
                timeout=TURN_TIMEOUT,
            )
            await until_persisted(tmp_path, session["id"], "kept text")
            proc.send_signal(signal.SIGKILL)
            await proc.wait_exit()
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            (reply,) = [m for m in await all_messages(proc, session["id"]) if m["role"] == "assistant"]
            assert reply["status"] == "aborted" and reply["textContent"] == "kept text"
            await proc.close()


async def until_persisted(data_dir: Any, session_id: str, text: str) -> None:
    """Wait (bounded) until the streaming reply's text is in the database file
    (chat:messages:get overlays the live content, so the file is read directly)."""
    db_path = str(data_dir / "chat.db")
    with anyio.fail_after(TURN_TIMEOUT):
        while True:
            conn = apsw.Connection(db_path, flags=apsw.SQLITE_OPEN_READONLY)
            try:
                rows = conn.execute(
                    "SELECT text_content FROM messages_v2 WHERE session_id = ? AND role = 'assistant'", (session_id,)
                ).fetchall()
            finally:
                conn.close()
            if rows and rows[0][0] == text:
                return
            await anyio.sleep(0.05)


async def test_suggest_page_result_and_mode_rules(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        session, cid = await server_session(proc, server)
        assert await proc.call("chat:suggest", {"sessionId": session["id"]}) == [
            "Tell me more about Forwarded", "What else can you do?", "Summarize this chat",
        ]
        await server.control("capabilities", {"suggestFails": True})
        assert await proc.call("chat:suggest", {"sessionId": session["id"]}) == []
        await server.fault({"path": "/api/agent/conversation/chat/suggest", "fault": "status", "status": 503,
                            "times": 5})
        assert await proc.call("chat:suggest", {"sessionId": session["id"]}) == []
        local = await proc.call("chat:session:create", {})
        with pytest.raises(CallError) as err:
            await proc.call("chat:suggest", {"sessionId": local["id"]})
        assert err.value.code == -32003 and "not linked" in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("chat:suggest", {"sessionId": "no-such-session"})
        assert err.value.code == -32001

        assert await proc.call("server:chat:pageResult", {"requestId": "req-1", "html": "<p>hi</p>"}) == {"success": True}
        assert (await server.get("chat_log"))["pageResults"] == [{"requestId": "req-1", "html": "<p>hi</p>"}]
        with pytest.raises(CallError) as err:
            await proc.call("server:chat:pageResult", {"requestId": "", "html": "x"})
        assert err.value.code == -32004 and err.value.data["code"] == "4000"

        # a server conversation is linear
        await server.control("chat", {"events": [chunk("ok")]})
        sent = await send(proc, session["id"], "first")
        assert (await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT))["type"] == "stream_end"
        with pytest.raises(CallError) as err:
            await proc.call("chat:regenerate", {"sessionId": session["id"]})
        assert err.value.code == -32005
        # a server session without a link nor an agent to create one is refused before anything is stored
        await configure(proc, server)
        lonely = await proc.call("chat:session:create", {"mode": "server"})
        with pytest.raises(CallError) as err:
            await send(proc, lonely["id"], "hello?")
        assert err.value.code == -32003 and "not linked" in err.value.message
        assert await all_messages(proc, lonely["id"]) == []
        await proc.close()


async def test_a_pulled_conversation_continues_on_the_server_and_is_not_pulled_twice(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        ids = (await server.control("seed", {"count": 1, "messages": 2}))["ids"]
        await proc.call("sidecar:initialize", {})
        await configure(proc, server)
        await sync(proc, "sync:pull")
        session = await proc.call("server:session:create", {"conversationId": ids[0]})
        assert session["mode"] == "server" and session["title"] == "Topic 0"
        await server.control("chat", {"events": [chunk("continued")]})
        sent = await send(proc, session["id"], "go on")
        assert (await wait_final(proc, sent["messageId"], timeout=TURN_TIMEOUT))["type"] == "stream_end"
        before = await all_messages(proc, session["id"])
        assert [m["textContent"] for m in before][-2:] == ["go on", "continued"]

        # the turn's messages were mapped to the server's before its end: a pull adds nothing
        result = await sync(proc, "sync:pull")
        assert result["messagesPulled"] == 0 and result["errors"] == [], result
        after = await all_messages(proc, session["id"])
        assert len(after) == len(before) == 4, [m["textContent"] for m in after]
        assert len((await server.conversations())[0]["messages"]) == 4

        # a conversation not linked yet: imported as a server session
        more = (await server.control("seed", {"count": 1, "messages": 2, "topicPrefix": "Fresh"}))["ids"]
        fresh = await proc.call("server:session:create", {"conversationId": more[0]})
        assert fresh["mode"] == "server" and fresh["title"] == "Fresh 0" and fresh["messageCount"] == 2
        with pytest.raises(CallError) as err:
            await proc.call("server:session:create", {"conversationId": 999})
        assert err.value.code == -32004 and err.value.data["kind"] == "not_found"
        await proc.close()


async def test_shutdown_during_a_forwarded_turn_ends_it_aborted_in_time(tmp_path):
    # the server's agent does not stop: the turn waits only its share of the shutdown
    # deadline, then ends aborted (row and final event) before sidecar:shutdown is answered
    async with qiming_server() as server:
        async with spawn_sidecar(tmp_path) as proc:
            session, cid = await server_session(proc, server)
            await server.control("chat", {"ignoreStop": True, "events": [
                chunk("working "), {"wait": 60000, "heartbeatMs": 200}]})
            sent = await send(proc, session["id"], "a long job")
            await proc.wait_for(
                lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta",
                timeout=TURN_TIMEOUT,
            )
            shutdown_id = await proc.request("sidecar:shutdown", {})
            answer = await proc.response(shutdown_id, timeout=30)
            assert answer["result"] == {"success": True}
            final = await wait_final(proc, sent["messageId"], timeout=1)  # already received
            assert final["type"] == "aborted", final
            final_at = next(i for i, m in enumerate(proc.messages)
                            if isinstance(m, dict) and m.get("method") == "chat:stream" and m["params"] is final)
            assert final_at < proc.messages.index(answer)
            assert len(await requests_to(server, f"/chat/stop/{cid}")) == 1
            await proc.close_stdin()
            assert await proc.wait_exit() == 0
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            (reply,) = [m for m in await all_messages(proc, session["id"]) if m["role"] == "assistant"]
            assert reply["status"] == "aborted" and reply["textContent"] == "working "
            await proc.close()
