"""chat:messages:delete over a real subprocess: a branch and a single message with the
counters and the active leaf after each, the root, under a streaming reply and under a
paused one (stopped first: ``aborted`` before the answer, no stranded approval), the files
of deleted messages removed, search forgetting their text, a send racing the delete, an
ACP session (an agent session no reply runs on any more is closed), and bad input."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import pytest

from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import configure_provider, events_of, streamed_text, wait_final
from scripted_server import ScriptedServer, scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


async def setup(proc: SidecarProcess, server: ScriptedServer, **session: Any) -> str:
    await configure_provider(proc, server.base_url)
    await proc.call("settings:update", {"generateTitles": False, "generateSuggestions": False})
    return str((await proc.call("chat:session:create", {"title": "t", **session}))["id"])


async def exchange(proc: SidecarProcess, sid: str, text: str, **extra: Any) -> tuple[str, str]:
    """(user id, reply id) of a send whose reply completed."""
    sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": text, **extra}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    return sent["userMessageId"], sent["messageId"]


async def delete(proc: SidecarProcess, sid: str, mid: str, mode: str) -> dict[str, Any]:
    return dict(await proc.call("chat:messages:delete", {"sessionId": sid, "messageId": mid, "mode": mode}))


async def state(proc: SidecarProcess, sid: str) -> tuple[int, str | None, list[str]]:
    """(messageCount, activeLeafId, ids of the active branch)."""
    session = await proc.call("chat:session:get", {"id": sid})
    branch = await proc.call("chat:messages:get", {"sessionId": sid})
    return session["messageCount"], session["activeLeafId"], [m["id"] for m in branch]


async def every_id(proc: SidecarProcess, sid: str) -> set[str]:
    stored = await proc.call("chat:messages:get", {"sessionId": sid, "options": {"allBranches": True}})
    return {m["id"] for m in stored}


async def searched(proc: SidecarProcess, sid: str, word: str) -> set[str]:
    return {r["messageId"] for r in await proc.call("chat:messages:search", {"query": word, "options": {"sessionId": sid}})}


async def last_update(proc: SidecarProcess, sid: str) -> dict[str, Any]:
    """The newest chat:session:updated of the session (sent before the delete's answer)."""
    updates = [u for u in proc.notifications("chat:session:updated") if u["id"] == sid]
    assert updates
    return dict(updates[-1])


def index_of_answer(proc: SidecarProcess, request_id: int) -> int:
    return next(i for i, m in enumerate(proc.messages) if isinstance(m, dict) and "method" not in m and m.get("id") == request_id)


def index_of_final(proc: SidecarProcess, message_id: str) -> int:
    return next(
        i for i, m in enumerate(proc.messages)
        if isinstance(m, dict) and m.get("method") == "chat:stream" and m["params"]["messageId"] == message_id
        and m["params"]["type"] in ("stream_end", "error", "aborted")
    )


async def test_branches_single_messages_and_the_root_with_counters_and_the_active_leaf(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        sid = await setup(proc, server)
        u1, a1 = await exchange(proc, sid, "first zebra")
        u2, a2 = await exchange(proc, sid, "second giraffe",
                                attachments=[{"name": "n.txt", "mimeType": "text/plain",
                                              "data": base64.b64encode(b"private notes").decode()}])
        files = {p.name for p in (data / "attachments").iterdir()}
        assert len(files) == 1
        regen = await proc.call("chat:regenerate", {"sessionId": sid, "messageId": a2})
        a2b = regen["messageId"]
        assert (await wait_final(proc, a2b))["type"] == "stream_end"
        assert await state(proc, sid) == (5, a2b, [u1, a1, u2, a2b])
        assert await searched(proc, sid, "giraffe") >= {u2}

        # the newest sibling's branch: the active leaf goes to the older sibling
        assert await delete(proc, sid, a2b, "branch") == {"success": True, "deleted": 1, "activeLeafId": a2}
        assert await state(proc, sid) == (4, a2, [u1, a1, u2, a2])
        assert (await last_update(proc, sid))["messageCount"] == 4

        # one message in the middle: its reply moves up to a1, the active leaf stays; its
        # attachment is removed before the answer; search forgets it
        assert await delete(proc, sid, u2, "message") == {"success": True, "deleted": 1, "activeLeafId": a2}
        assert await state(proc, sid) == (3, a2, [u1, a1, a2])
        assert not (data / "attachments").exists() or not list((data / "attachments").iterdir())
        assert u2 not in await searched(proc, sid, "giraffe")
        tree = await proc.call("chat:messages:tree", {"sessionId": sid})
        assert [c["message"]["id"] for c in tree[0]["children"][0]["children"]] == [a2]
        assert (await last_update(proc, sid))["messageCount"] == 3

        # the root question, mode message: the replies below it go with it (a1, and a2
        # below a1 now), so no branch starts with a reply; here nothing is left
        assert await delete(proc, sid, u1, "message") == {"success": True, "deleted": 3, "activeLeafId": None}
        assert await state(proc, sid) == (0, None, [])
        assert u1 not in await searched(proc, sid, "zebra")
        session = await proc.call("chat:session:get", {"id": sid})
        assert session["lastMessageAt"] is None and (await last_update(proc, sid))["messageCount"] == 0

        # the session serves the next reply; the root's branch: nothing left
        u, a = await exchange(proc, sid, "again")
        assert await state(proc, sid) == (2, a, [u, a])
        assert await delete(proc, sid, u, "branch") == {"success": True, "deleted": 2, "activeLeafId": None}
        assert await state(proc, sid) == (0, None, [])
        u, a = await exchange(proc, sid, "once more")
        assert await state(proc, sid) == (2, a, [u, a])
        await proc.close()
        assert "Traceback" not in proc.stderr_text()


async def test_deleting_under_a_streaming_reply_stops_it_first(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server)
        u1, a1 = await exchange(proc, sid, "keep this")
        await server.script({"text": "tick", "repeat": 100_000, "delay_ms": 20},
                            {"text": "tock", "repeat": 100_000, "delay_ms": 20})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "stream please"}})
        streaming, user = sent["messageId"], sent["userMessageId"]
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                            and m["params"]["messageId"] == streaming and m["params"]["type"] == "text_delta")
        request = await proc.request("chat:messages:delete", {"sessionId": sid, "messageId": user, "mode": "branch"})
        answer = await proc.response(request, timeout=30)
        assert answer["result"] == {"success": True, "deleted": 2, "activeLeafId": a1}
        assert index_of_final(proc, streaming) < index_of_answer(proc, request)
        assert events_of(proc, streaming)[-1]["type"] == "aborted"
        assert await every_id(proc, sid) == {u1, a1}
        assert await state(proc, sid) == (2, a1, [u1, a1])

        # mode message on the streaming reply itself: it is stopped, then it alone goes
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "again"}})
        streaming, user = sent["messageId"], sent["userMessageId"]
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                            and m["params"]["messageId"] == streaming and m["params"]["type"] == "text_delta")
        request = await proc.request("chat:messages:delete", {"sessionId": sid, "messageId": streaming, "mode": "message"})
        answer = await proc.response(request, timeout=30)
        assert answer["result"] == {"success": True, "deleted": 1, "activeLeafId": user}
        assert index_of_final(proc, streaming) < index_of_answer(proc, request)
        assert await state(proc, sid) == (3, user, [u1, a1, user])
        await proc.close()
        assert "Traceback" not in proc.stderr_text()


async def no_stranded_pause(proc: SidecarProcess, sid: str) -> None:
    """No reply of the session is paused with nothing pending, no call pending outside one."""
    pending = await proc.call("tool:pending:list", {"sessionId": sid})
    stored = await proc.call("chat:messages:get", {"sessionId": sid, "options": {"allBranches": True}})
    paused = {m["id"] for m in stored if m["status"] == "paused"}
    assert {p["messageId"] for p in pending} == paused, (pending, [(m["id"], m["status"]) for m in stored])
    assert not [m for m in stored if m["status"] in ("streaming", "pending")]


def write_call(call_id: str, path: str) -> dict[str, Any]:
    return {"id": call_id, "name": "workspace_write_file", "arguments": {"path": path, "content": "x"}}


async def test_deleting_under_a_paused_reply_ends_it_and_a_paused_reply_elsewhere_stays(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server, workspaceDir=str(ws))
        u1, a1 = await exchange(proc, sid, "hello")
        # a reply that waits for approval on the active branch
        await server.script({"text": "Writing.", "tool_calls": [write_call("w1", "a.txt")]})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "write a"}})
        paused, user = sent["messageId"], sent["userMessageId"]
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                            and m["params"]["messageId"] == paused and m["params"]["type"] == "tool_approval_required")
        assert [p["messageId"] for p in await proc.call("tool:pending:list", {"sessionId": sid})] == [paused]

        # deleting its user message's branch: the pause ends (aborted) before the answer
        request = await proc.request("chat:messages:delete", {"sessionId": sid, "messageId": user, "mode": "branch"})
        answer = await proc.response(request, timeout=30)
        assert answer["result"] == {"success": True, "deleted": 2, "activeLeafId": a1}
        assert index_of_final(proc, paused) < index_of_answer(proc, request)
        assert events_of(proc, paused)[-1]["type"] == "aborted"
        assert await proc.call("tool:pending:list", {"sessionId": sid}) == []
        await no_stranded_pause(proc, sid)
        with pytest.raises(CallError) as err:  # the approval has nothing to approve any more
            await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "w1", "decision": "approved"})
        assert err.value.code in (-32001, -32003)
        assert not (ws / "a.txt").exists()

        # a paused reply on another branch is left alone by a delete elsewhere
        await server.script({"text": "Writing b.", "tool_calls": [write_call("w2", "b.txt")]}, {"text": "wrote b"})
        edited = await proc.call("chat:editResend", {"sessionId": sid, "messageId": u1, "newContent": "hello again"})
        paused = edited["messageId"]
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                            and m["params"]["messageId"] == paused and m["params"]["type"] == "tool_approval_required")
        result = await delete(proc, sid, u1, "branch")  # the old branch u1 - a1
        assert result == {"success": True, "deleted": 2, "activeLeafId": paused}
        assert [p["messageId"] for p in await proc.call("tool:pending:list", {"sessionId": sid})] == [paused]
        await no_stranded_pause(proc, sid)
        approved = await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "w2", "decision": "approved"})
        assert approved["success"] is True
        assert (await wait_final(proc, paused))["type"] == "stream_end"
        assert (ws / "b.txt").read_text() == "x"
        await no_stranded_pause(proc, sid)
        await proc.close()
        assert "Traceback" not in proc.stderr_text()


async def test_bad_input_is_refused_and_nothing_is_deleted(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server)
        u1, a1 = await exchange(proc, sid, "hello")
        other = (await proc.call("chat:session:create", {"title": "other"}))["id"]
        huge = "x" * 5000
        cases: list[tuple[dict[str, Any], int]] = [
            ({"sessionId": "missing", "messageId": u1, "mode": "branch"}, -32001),
            ({"sessionId": sid, "messageId": "missing", "mode": "message"}, -32001),
            ({"sessionId": other, "messageId": u1, "mode": "branch"}, -32001),  # another session's
            ({"sessionId": sid, "messageId": u1, "mode": "leaf"}, -32602),
            ({"sessionId": sid, "messageId": u1}, -32602),
            ({"sessionId": sid, "messageId": u1, "mode": None}, -32602),
            ({"sessionId": sid, "messageId": huge, "mode": "branch"}, -32602),
            ({"sessionId": huge, "messageId": u1, "mode": "branch"}, -32602),
            ({"sessionId": sid, "messageId": 7, "mode": "branch"}, -32602),
        ]
        for params, code in cases:
            with pytest.raises(CallError) as err:
                await proc.call("chat:messages:delete", params)
            assert err.value.code == code, (params, err.value.message)
            assert len(err.value.message) < 2_100 and huge not in err.value.message
        assert await state(proc, sid) == (2, a1, [u1, a1])

        # a server-mode session refuses (its conversation on the server is linear): one
        # imported with messages (an export of this one, under new ids, mode server)
        doc = await proc.call("chat:session:export", {"id": sid})
        copy = f"{sid}-server"
        renamed = {m["id"]: f"{m['id']}-s" for m in doc["messages"]}
        server_session = await proc.call("chat:session:import", {
            "session": {**doc["session"], "id": copy, "mode": "server", "activeLeafId": renamed[a1]},
            "messages": [{**m, "id": renamed[m["id"]], "sessionId": copy,
                          "parentId": renamed.get(m["parentId"]) if m["parentId"] else None} for m in doc["messages"]],
        })
        assert server_session["mode"] == "server" and server_session["messageCount"] == 2
        for mode in ("message", "branch"):
            with pytest.raises(CallError) as err:
                await proc.call("chat:messages:delete", {"sessionId": copy, "messageId": renamed[u1], "mode": mode})
            assert err.value.code == -32003 and "server" in err.value.message
        assert (await proc.call("chat:session:get", {"id": copy}))["messageCount"] == 2
        await proc.close()
        assert "Traceback" not in proc.stderr_text()


async def test_a_send_racing_the_delete_is_refused_or_stored_whole_or_deleted_whole(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        sid = await setup(proc, server)
        u1, a1 = await exchange(proc, sid, "hello")
        await server.script({"text": "tick", "repeat": 100_000, "delay_ms": 20})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "stream please"}})
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
                            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta")
        deleting = await proc.request("chat:messages:delete",
                                      {"sessionId": sid, "messageId": sent["userMessageId"], "mode": "branch"})
        racing = await proc.request("chat:send", {"sessionId": sid, "input": {"content": "meanwhile"}})
        deleted = (await proc.response(deleting, timeout=30))["result"]["deleted"]
        raced = await proc.response(racing, timeout=30)
        ids = await every_id(proc, sid)
        if "error" in raced:  # it came while the delete ran: refused, nothing of it stored
            assert raced["error"]["code"] == -32002
            assert (deleted, ids) == (2, {u1, a1})
        else:
            turn = {raced["result"]["userMessageId"], raced["result"]["messageId"]}
            with anyio.fail_after(30):
                final = await wait_final(proc, raced["result"]["messageId"])
            if deleted == 4:  # it came first: stored under the streaming reply, deleted with it
                assert final["type"] == "aborted" and ids == {u1, a1}
            else:  # it came after: a turn of its own on what is left
                assert deleted == 2 and ids == {u1, a1} | turn
        await no_stranded_pause(proc, sid)
        await proc.close()
        assert "Traceback" not in proc.stderr_text()


async def test_an_acp_sessions_messages_are_deleted_and_an_unused_agent_session_is_closed(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        await proc.call("settings:update", {"generateTitles": False})
        engine = await add_engine(proc, "--fork", "--close")
        sid = (await acp_session(proc, engine["id"]))["id"]
        await send_and_wait(proc, sid, "a")
        second, _ = await send_and_wait(proc, sid, "b")
        regen = await proc.call("chat:regenerate", {"sessionId": sid, "messageId": second["messageId"]})
        assert (await wait_final(proc, regen["messageId"]))["type"] == "stream_end"  # on a fork: sess-2
        result = await delete(proc, sid, regen["messageId"], "branch")
        assert result == {"success": True, "deleted": 1, "activeLeafId": second["messageId"]}
        # no reply runs on the fork any more: it is closed
        await proc.wait_stderr("closed sess-2", timeout=15)
        assert "closed sess-1" not in proc.stderr_text()
        # the next turn continues the agent session of the reply it follows
        sent, final = await send_and_wait(proc, sid, "c")
        assert final["type"] == "stream_end"
        assert streamed_text(events_of(proc, sent["messageId"])) == "echo: c [turn 3 of sess-1]"
        assert (await proc.call("chat:session:get", {"id": sid}))["messageCount"] == 6
        await proc.close()
        assert "Traceback" not in proc.stderr_text()


async def test_messages_pulled_from_the_qiming_server_stay_and_local_ones_of_the_session_go(tmp_path: Path) -> None:
    from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync

    async with qiming_server() as server, scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        await server.control("seed", {"count": 1, "messages": 4})
        await configure(proc, server)
        assert (await sync(proc, "sync:pull"))["pulled"] == 1
        [session] = await all_sessions(proc)
        pulled = await all_messages(proc, session["id"])
        assert len(pulled) == 4
        for mode, target in (("message", pulled[-1]), ("branch", pulled[0])):
            with pytest.raises(CallError) as err:  # the next pull would bring them back
                await proc.call("chat:messages:delete", {"sessionId": session["id"], "messageId": target["id"], "mode": mode})
            assert err.value.code == -32003 and "Qiming server" in err.value.message
        assert len(await all_messages(proc, session["id"])) == 4
        # a reply made here, in the synced session, is the user's own: it can go
        await configure_provider(proc, chat.base_url)
        await chat.script({"text": "a local answer"})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "a local question"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        local_user = (await proc.call("chat:messages:get", {"sessionId": session["id"]}))[-2]
        assert local_user["textContent"] == "a local question"
        done = await proc.call("chat:messages:delete", {"sessionId": session["id"], "messageId": local_user["id"], "mode": "branch"})
        assert done["deleted"] == 2
        assert [m["id"] for m in await proc.call("chat:messages:get", {"sessionId": session["id"]})] == [m["id"] for m in pulled]
        await proc.close()
