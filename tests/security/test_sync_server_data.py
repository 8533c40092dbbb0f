"""The Qiming server as an untrusted peer, over the subprocess against the fake server.

- Values outside the wire contract (a ``modified`` of 1e308, a message ``index`` of 2**70,
  an id past int64, an answer nested 200,000 deep) are decoded with bounds: the conversation
  holding one is skipped and reported in ``SyncResult.skipped`` (naming the field), the
  rest of the pull goes on, every later pull does the same; nothing is -32603, and nothing
  the server caused comes back as -32602 (that code is for the caller's params).
- A message without a usable index skips its conversation the same way (it was stored
  without that message, which no later pull fetched); a message index the server sent once
  and no longer sends (2**62, then its real one) does not hold back the messages after it.
- A server that drips its answer (a byte a second) cannot hold a call past
  ``requestTimeoutMs`` in all, so neither a pull nor the pull queued behind it waits on
  it; a forwarded turn whose stream does not even send its response head in that time
  ends with an error instead of waiting.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from chat_helpers import wait_final
from qiming_helpers import QimingServer, all_messages, all_sessions, configure, qiming_server, sync
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio

LIST = "/api/agent/conversation/list"


async def seeded(server: QimingServer, count: int) -> list[dict[str, Any]]:
    ids = (await server.control("seed", {"count": count, "messages": 4}))["ids"]
    by_id = {c["id"]: c for c in await server.conversations()}
    return [by_id[i] for i in ids]


async def test_out_of_bounds_values_skip_their_conversation_and_the_pull_goes_on(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        convs = await seeded(server, 5)
        huge_date, huge_index, huge_id, low_time, fine = convs
        await server.control("conversation", {"id": huge_date["id"], "wire": {"modified": 1e308}})
        index = huge_index["messages"][2]["index"]
        await server.control("update_message", {"conversationId": huge_index["id"], "index": index, "wire": {"index": 2**70}})
        await server.control("conversation", {"id": huge_id["id"], "wire": {"id": 2**70}})
        time_index = low_time["messages"][0]["index"]
        await server.control("update_message", {"conversationId": low_time["id"], "index": time_index,
                                                "wire": {"time": -1e308}})
        await configure(proc, server)

        for _ in range(2):  # a later pull does not fail on the same rows either
            result = await sync(proc)
            assert result["errors"] == [] and result["complete"] is True, result
            skipped = {(s["conversationId"], s["field"]) for s in result["skipped"]}
            assert skipped == {
                (huge_date["id"], "$.modified"),
                (huge_index["id"], "$[2].index"),
                (None, "$.id"),
                (low_time["id"], "$[0].time"),
            }, result["skipped"]
            assert all("the wire contract does not allow" in s["message"] for s in result["skipped"])
        sessions = await all_sessions(proc)
        assert [s["title"] for s in sessions] == [fine["topic"]]
        assert len(await all_messages(proc, sessions[0]["id"])) == 4

        # the same conversation reached another way: the server's fault, never -32602 / -32603
        with pytest.raises(CallError) as err:
            await proc.call("server:session:create", {"conversationId": huge_index["id"]}, timeout=30)
        assert err.value.code == -32004 and err.value.data["kind"] == "malformed", err.value

        # fixed on the server: the next pull imports them
        await server.control("conversation", {"id": huge_date["id"], "wire": {}})
        await server.control("update_message", {"conversationId": huge_index["id"], "index": index, "wire": {}})
        result = await sync(proc)
        assert result["pulled"] == 2 and {s["field"] for s in result["skipped"]} == {"$.id", "$[0].time"}
        proc.assert_all_jsonrpc()
        await proc.close()


async def test_an_answer_nested_past_the_decoder_is_malformed_not_internal(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await seeded(server, 2)
        await configure(proc, server)
        deep = '{"code":"0000","message":"success","data":' + "[" * 200_000 + "]" * 200_000 + "}"
        row = '{"id":1464000,"topic":"Deep","topicUpdated":1,"modified":"2026-03-09T02:24:38.000+00:00","x":'
        deep_row = '{"code":"0000","data":[' + row + "[" * 200_000 + "]" * 200_000 + "}]}"
        for body in (deep, deep_row):  # the envelope cannot be read: the page is malformed
            await server.fault({"path": LIST, "fault": "raw", "body": body, "times": 1})
            result = await sync(proc)
            assert [(e["phase"], e["kind"]) for e in result["errors"]] == [("list", "malformed")], result
            assert "nested too deep" in result["errors"][0]["message"]
        result = await sync(proc)
        assert result["errors"] == [] and result["pulled"] == 2
        await proc.close()


async def test_a_dripping_server_holds_no_call_past_its_deadline(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await seeded(server, 3)
        await configure(proc, server, requestTimeoutMs=2000)
        await server.fault({"path": LIST, "fault": "drip", "delayMs": 1000, "times": 1})
        first = await proc.request("sync:pull", {})
        second = await proc.request("sync:pull", {})  # waits for the first (one run at a time)
        with anyio.fail_after(60):  # a 1 byte/s answer of ~1 KB would take many minutes
            dripped = await proc.response(first, timeout=60)
            queued = await proc.response(second, timeout=60)
        errors = dripped["result"]["errors"]
        assert [(e["phase"], e["kind"]) for e in errors] == [("list", "timeout")], dripped
        assert "within 2 s" in errors[0]["message"]
        assert queued["result"]["errors"] == [] and queued["result"]["pulled"] == 3, queued
        await proc.close()


async def test_a_forwarded_turn_whose_stream_sends_no_head_in_time_ends_with_an_error(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await configure(proc, server, agentId=1128, requestTimeoutMs=1500)
        session = await proc.call("server:session:create", {"title": "Forwarded"})
        await server.fault({"path": "/api/agent/conversation/chat", "fault": "delay", "delayMs": 8000, "times": 1})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hello"}})
        final = await wait_final(proc, sent["messageId"], timeout=30)
        assert final["type"] == "error" and "response head" in final["error"], final
        await proc.close()


async def test_a_login_token_no_http_header_can_carry_is_malformed_and_nothing_is_stored(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        for token in ("tök-" + "t" * 40, "t" * 20 + "\r\nX-Injected: 1", "t" * 20 + " " + "t" * 20):
            body = '{"code":"0000","message":"success","data":{"token":' + json.dumps(token) + ',"expireDate":null}}'
            await server.fault({"path": "/api/user/passwordLogin", "fault": "raw", "body": body, "times": 1})
            with pytest.raises(CallError) as err:
                await configure(proc, server)
            assert err.value.code == -32004 and "a token that an HTTP header cannot carry" in err.value.message
            assert token not in err.value.message
            assert (await proc.call("server:status", {}))["configured"] is False
        assert (await configure(proc, server))["configured"] is True  # the server's own token
        await proc.close()
    assert "Traceback" not in proc.stderr_text()


async def test_a_message_without_an_index_skips_its_conversation_until_the_server_sends_one(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        (conv,) = await seeded(server, 1)
        first = conv["messages"][0]["index"]
        await server.control("update_message", {"conversationId": conv["id"], "index": first, "wire": {"index": None}})
        await configure(proc, server)
        result = await sync(proc)
        assert [(s["conversationId"], s["field"]) for s in result["skipped"]] == [(conv["id"], "$[0].index")], result
        assert await all_sessions(proc) == []  # nothing of it is stored (it was: three of four messages)
        await server.control("update_message", {"conversationId": conv["id"], "index": first, "wire": {}})
        result = await sync(proc)
        assert result["skipped"] == [] and result["pulled"] == 1, result
        (session,) = await all_sessions(proc)
        assert [m["textContent"] for m in await all_messages(proc, session["id"])] == [
            m["text"] for m in conv["messages"]
        ]
        await proc.close()


async def test_an_index_the_server_no_longer_sends_does_not_stop_later_messages(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        (conv,) = await seeded(server, 1)
        await configure(proc, server)
        assert (await sync(proc))["messagesPulled"] == 4
        last = conv["messages"][-1]["index"]
        # once, the newest message came with an index far ahead (in range: nothing to refuse)
        await server.control("update_message", {"conversationId": conv["id"], "index": last, "wire": {"index": 2**62}})
        assert (await sync(proc))["messagesPulled"] == 1
        await server.control("update_message", {"conversationId": conv["id"], "index": last, "wire": {}})
        await server.control("messages", {"conversationId": conv["id"], "messages": [
            {"role": "USER", "text": "a later question"}, {"role": "ASSISTANT", "text": "a later answer"}]})
        result = await sync(proc)
        assert result["errors"] == [] and result["messagesPulled"] == 2, result
        (session,) = await all_sessions(proc)
        texts = [m["textContent"] for m in await all_messages(proc, session["id"])]
        assert texts[-2:] == ["a later question", "a later answer"], texts
        await proc.close()
