"""The Qiming server as an untrusted peer, over the subprocess against the fake server.

- Values outside the wire contract (a ``modified`` of 1e308, a message ``index`` of 2**70,
  an id past int64, an answer nested 200,000 deep) are decoded with bounds: the conversation
  holding one is skipped and reported in ``SyncResult.skipped`` (naming the field), the
  rest of the pull goes on, every later pull does the same; nothing is -32603, and nothing
  the server caused comes back as -32602 (that code is for the caller's params).
- A message without a usable index skips its conversation the same way (it was stored
  without that message, which no later pull fetched); a message index the server sent once
  and no longer sends (2**62, then its real one) does not hold back the messages after it.
- Memory is bounded by bytes, not only by counts: a conversation whose messages come to
  more than 64 MiB is skipped whole (``field`` ``$[*]``; what is stored of it stays as it
  was) while the sidecar holds about that much and no more; a message text, a topic or a
  summary past the wire's length is skipped like any value out of bounds; a ``/list`` row's
  ``messageList`` is never decoded; a listing that never ends stops with a ``list`` error
  once it holds 128 MiB, or after 1000 rows out of bounds.
- A server that drips its answer (a byte a second) cannot hold a call past
  ``requestTimeoutMs`` in all, so neither a pull nor the pull queued behind it waits on
  it; a forwarded turn whose stream does not even send its response head in that time
  ends with an error instead of waiting.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest

from chat_helpers import wait_final
from qiming_helpers import QimingServer, all_messages, all_sessions, configure, qiming_server, sync
from sidecar.sync.wire import MAX_MESSAGE_CHARS, MAX_SUMMARY_CHARS, MAX_TOPIC_CHARS
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


async def test_a_conversation_past_its_byte_budget_is_skipped_and_costs_no_more_than_the_budget(tmp_path: Any) -> None:
    """120 messages of 1 MiB each (in pages of 8 MiB, each well under an answer's limit):
    before the budget the sidecar kept all of them (and imported them): RSS grew by
    several hundred MiB; now it stops at 64 MiB, skips the conversation and keeps its copy."""
    async with qiming_server() as server, spawn_sidecar(tmp_path, subprocess=True) as proc:
        await proc.call("sidecar:initialize", {})
        big, small = await seeded(server, 2)
        await configure(proc, server)
        await proc.call("sync:settings:update", {"messagePageSize": 8})
        assert (await sync(proc))["pulled"] == 2
        await server.control("messages", {"conversationId": big["id"], "messages": [
            {"role": "USER", "text": "A", "repeat": 1024 * 1024, "times": 120}]})
        await server.control("messages", {"conversationId": small["id"], "messages": [
            {"role": "USER", "text": "still synced"}]})
        before = proc.vm_hwm_kib()
        assert before is not None
        result = await sync(proc)
        after = proc.vm_hwm_kib()
        assert after is not None
        print(f"peak RSS grew by {(after - before) // 1024} MiB")
        assert [(s["conversationId"], s["field"]) for s in result["skipped"]] == [(big["id"], "$[*]")], result
        assert "more than 64 MiB" in result["skipped"][0]["message"]
        assert result["errors"] == [] and result["messagesPulled"] == 1, result
        assert after - before < 160 * 1024, (before, after)  # KiB: the budget and a page or two
        by_title = {s["title"]: s for s in await all_sessions(proc)}
        kept = [m["textContent"] for m in await all_messages(proc, by_title[big["topic"]]["id"])]
        assert kept == [m["text"] for m in big["messages"]]  # what was stored of it is untouched
        assert (await all_messages(proc, by_title[small["topic"]]["id"]))[-1]["textContent"] == "still synced"
        await proc.close()


async def test_texts_topics_and_summaries_past_the_wire_lengths_skip_their_conversation(tmp_path: Any) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        long_text, long_think, long_topic, long_summary, fine = await seeded(server, 5)
        await server.control("messages", {"conversationId": long_text["id"], "messages": [
            {"role": "USER", "text": "x", "repeat": MAX_MESSAGE_CHARS + 1}]})
        think_index = long_think["messages"][1]["index"]
        await server.control("update_message", {"conversationId": long_think["id"], "index": think_index,
                                                "think": "t" * (MAX_MESSAGE_CHARS // 4 + 1) * 4})
        await server.control("conversation", {"id": long_topic["id"], "topic": "T" * (MAX_TOPIC_CHARS + 1)})
        await server.control("conversation", {"id": long_summary["id"], "summary": "s" * (MAX_SUMMARY_CHARS + 1)})
        await configure(proc, server)
        result = await sync(proc)
        assert result["errors"] == [] and result["complete"] is True, result
        assert {(s["conversationId"], s["field"]) for s in result["skipped"]} == {
            (long_text["id"], "$[4].text"),  # a page is oldest first: the new message is its last
            (long_think["id"], "$[1].think"),
            (long_topic["id"], "$.topic"),
            (long_summary["id"], "$.summary"),
        }, result["skipped"]
        assert [s["title"] for s in await all_sessions(proc)] == [fine["topic"]]
        await proc.close()


async def test_a_list_rows_message_list_is_never_decoded(tmp_path: Any) -> None:
    """/list rows carry no messages on the real server; when one does, it is not read (a
    value in it out of bounds used to skip the row, and all of it was kept while listing)."""
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        (conv,) = await seeded(server, 1)
        await server.control("conversation", {"id": conv["id"], "wire": {
            "messageList": [{"index": 2**70, "text": "never read"}], "icon": "<svg/>"}})
        await configure(proc, server)
        result = await sync(proc)
        assert result["errors"] == [] and result["skipped"] == [] and result["pulled"] == 1, result
        (session,) = await all_sessions(proc)
        assert len(await all_messages(proc, session["id"])) == 4
        await proc.close()


@pytest.mark.parametrize(("row", "stop"), [
    ({"summaryChars": MAX_SUMMARY_CHARS - 100}, "more than 128 MiB of conversations"),
    ({"modified": 1e308}, "more than 1000 conversations listed out of bounds"),
])
async def test_a_listing_that_never_ends_stops_at_its_budget(tmp_path: Any, row: dict[str, Any], stop: str) -> None:
    """Every page full, ids going down: the walk used to go on for 100,000 pages, keeping every
    row (each with a 64 KiB summary: memory without limit) or reporting each refused one."""
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await configure(proc, server)
        await server.fault({"path": LIST, "fault": "endless", "row": row, "times": -1})
        with anyio.fail_after(90):
            result = await sync(proc)
        assert result["complete"] is False, result
        assert [(e["phase"], e["kind"]) for e in result["errors"] if e["phase"] == "list"] == [
            ("list", "malformed")], result["errors"][:3]
        assert stop in next(e["message"] for e in result["errors"] if e["phase"] == "list")
        assert len(result["skipped"]) <= 1000
        pages = sum(1 for r in await server.requests() if r["path"] == LIST)
        assert pages < 40, pages
        await proc.close()


async def test_an_import_batch_is_bounded_in_bytes_not_only_in_messages(tmp_path: Any) -> None:
    """Six conversations of about 6 MiB each (24 messages: far under the 1000 messages of a
    batch) are stored in batches of at most 16 MiB (one conversation alone may pass it), so
    the store's writer is never held by one huge transaction."""
    async with qiming_server() as server, spawn_sidecar(tmp_path, "--log-level", "DEBUG") as proc:
        await proc.call("sidecar:initialize", {})
        convs = await seeded(server, 6)
        for conv in convs:
            await server.control("messages", {"conversationId": conv["id"], "messages": [
                {"role": "USER", "text": "b", "repeat": 256 * 1024, "times": 24}]})
        await configure(proc, server)
        result = await sync(proc)
        assert result["errors"] == [] and result["pulled"] == 6, result
        batches = [tuple(int(n) for n in found) for found in re.findall(
            r"stored a batch of (\d+) conversations, (\d+) messages, (\d+) bytes", proc.stderr_text())]
        assert sum(b[0] for b in batches) == 6, batches
        assert all(b[2] <= 16 * 1024 * 1024 for b in batches if b[0] > 1), batches
        await proc.close()
