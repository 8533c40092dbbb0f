"""sync:pull over the real server against the fake Qiming server on loopback."""

from __future__ import annotations

from datetime import datetime

import pytest

from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio


def iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


async def snapshot(proc) -> dict[str, object]:
    sessions = sorted(await all_sessions(proc), key=lambda s: s["id"])
    return {s["id"]: (s, await all_messages(proc, s["id"])) for s in sessions}


async def test_pull_250_conversations_over_3_pages_then_again_nothing_then_an_update(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        seeded = await server.control("seed", {
            "count": 250, "messages": 30, "thinkEvery": 3, "attachmentEvery": 4, "systemEvery": 7,
        })
        ids = seeded["ids"]
        # three old conversations modified last: /list (ORDER BY modified, cursor on id) returns
        # them again on every page
        await server.control("seed", {"count": 0, "bumped": [ids[10], ids[20], ids[30]]})
        await configure(proc, server)
        settings = await proc.call("sync:settings:update", {"messagePageSize": 20})
        assert settings["listPageSize"] == 100 and settings["messagePageSize"] == 20

        result = await sync(proc, "sync:pull", {"progressToken": "pull-1"})
        assert result["errors"] == [] and result["complete"] is True
        assert result["pulled"] == 250 and result["messagesPulled"] == 250 * 30
        log = await server.requests()
        lists = [r["body"] for r in log if r["path"].endswith("/conversation/list")]
        walk = [b for b in lists if b["limit"] == 100]
        assert len(walk) == 3 and "lastId" not in walk[0] and walk[1]["lastId"] > walk[2]["lastId"]
        # the pages overlapped (the bumped three came back on every page); the sweep that follows
        # a walk of full pages (nothing imported yet: no mark to stop at) doubles the limit
        assert [b["limit"] for b in lists[3:]] == [200, 400] and all("lastId" not in b for b in lists[3:])
        per_conversation: dict[int, int] = {}
        for r in log:
            if r["path"].endswith("/message/list"):
                per_conversation[r["body"]["conversationId"]] = per_conversation.get(r["body"]["conversationId"], 0) + 1
                assert r["body"]["size"] == 20
        # 30 messages (+ hidden SYSTEM rows) take two pages of 20, then an empty page ends the walk
        assert len(per_conversation) == 250 and all(n >= 3 for n in per_conversation.values())
        assert all(r["clientType"] == "desktop" and r["authorization"] for r in log if "/conversation/" in r["path"])

        progress = proc.notifications("sidecar:progress")
        assert [p["kind"] for p in progress][0] == "begin" and progress[-1]["kind"] == "end"
        assert all(p["token"] == "pull-1" for p in progress)
        assert max(p["done"] for p in progress) == 250

        sessions = await all_sessions(proc)
        assert len(sessions) == 250 and len({s["title"] for s in sessions}) == 250
        server_convs = {c["topic"]: c for c in await server.conversations()}
        for session in sessions[:40]:
            conv = server_convs[session["title"]]
            messages = await all_messages(proc, session["id"])
            expected = [m for m in conv["messages"] if m["role"] in ("USER", "ASSISTANT")]
            assert len(messages) == len(expected) == 30 == session["messageCount"]
            assert session["createdAt"] == iso_ms(conv["created"])
            for mine, theirs in zip(messages, expected, strict=True):
                assert mine["role"] == theirs["role"].lower()
                assert mine["createdAt"] == iso_ms(theirs["time"])
                assert mine["textContent"] == theirs["text"] and "<attachment>" not in mine["textContent"]
                assert mine["status"] == "completed"
                parts = mine["parts"] or []
                if theirs["think"]:
                    assert parts[0] == {"type": "thinking", "text": theirs["think"], "signature": None}
                for attachment in theirs["attachments"]:
                    assert {"type": "file", "uri": attachment["fileUrl"], "mimeType": attachment["mimeType"],
                            "name": attachment["fileName"]} in parts
            # one linear branch, root first, the newest message active
            assert [m["parentId"] for m in messages[1:]] == [m["id"] for m in messages[:-1]]
            assert session["activeLeafId"] == messages[-1]["id"]
        hits = await proc.call("chat:messages:search", {"query": "世界"})
        assert hits, "imported messages are searchable (Chinese)"

        before = await snapshot(proc)
        marker = len(await server.requests())
        again = await sync(proc, "sync:pull")
        assert again["pulled"] == 0 and again["messagesPulled"] == 0 and again["errors"] == []
        assert await snapshot(proc) == before, "pulling twice changes nothing"
        second = [r["body"]["limit"] for r in (await server.requests())[marker:] if r["path"].endswith("/conversation/list")]
        assert second == [100, 100, 100], "the first page reaches the last pull's mark: no sweep"

        # the conversation is updated on the server (another device chatted): only it is re-pulled
        target = server_convs["Topic 100"]
        await server.control("messages", {"conversationId": target["id"], "messages": [
            {"role": "USER", "text": "one more question"},
            {"role": "ASSISTANT", "text": "one more answer", "think": "hmm", "finishReason": "EndTurn"},
        ]})
        marker = len(await server.requests())
        updated = await sync(proc, "sync:pull")
        assert updated["pulled"] == 1 and updated["messagesPulled"] == 2 and updated["conflicts"] == []
        fetched = {r["body"]["conversationId"] for r in (await server.requests())[marker:]
                   if r["path"].endswith("/message/list")}
        assert fetched == {target["id"]}
        session = next(s for s in await all_sessions(proc) if s["title"] == "Topic 100")
        messages = await all_messages(proc, session["id"])
        assert len(messages) == 32 == session["messageCount"]
        assert [m["textContent"] for m in messages[-2:]] == ["one more question", "one more answer"]
        assert messages[-2]["parentId"] == messages[-3]["id"]
        assert session["activeLeafId"] == messages[-1]["id"]
        after = await snapshot(proc)
        assert {k: v for k, v in after.items() if k != session["id"]} == {
            k: v for k, v in before.items() if k != session["id"]
        }
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_rows_the_lastid_walk_skips_are_found(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        # two batches with the same modified times: ORDER BY modified interleaves their ids,
        # and the walk's cursor (the last row, from the older batch) jumps over half the newer
        # batch, which no page of the walk ever shows
        first = (await server.control("seed", {"count": 100, "messages": 1, "baseTime": 1_700_000_000_000}))["ids"]
        second = (await server.control("seed", {"count": 100, "messages": 1, "baseTime": 1_700_000_000_000,
                                                "topicPrefix": "Later"}))["ids"]
        await configure(proc, server)
        result = await sync(proc, "sync:pull")
        assert result["pulled"] == 200 and result["errors"] == []
        log = [r["body"] for r in await server.requests() if r["path"].endswith("/conversation/list")]
        walked = [b for b in log if b["limit"] == 100]
        assert len(walked) == 2, "the walk alone saw 150: two pages"
        assert {s["title"] for s in await all_sessions(proc)} == {f"Topic {n}" for n in range(100)} | {
            f"Later {n}" for n in range(100)}
        assert len(first) == len(second) == 100
        # a later pull with new conversations: the sweep stops at the mark of the first pull
        await server.control("seed", {"count": 3, "messages": 1, "topicPrefix": "New"})
        marker = len(await server.requests())
        later = await sync(proc, "sync:pull")
        assert later["pulled"] == 3 and later["errors"] == []
        limits = [r["body"]["limit"] for r in (await server.requests())[marker:] if r["path"].endswith("/conversation/list")]
        assert set(limits) == {100}, "the newest page reaches the first pull's mark: no sweep"
        await proc.close()


async def test_statuses_agent_filter_unfinished_replies_and_probes(tmp_path):
    async with qiming_server() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        a = (await server.control("seed", {"count": 2, "messages": 2, "agentId": 1128}))["ids"]
        b = (await server.control("seed", {"count": 1, "messages": 0, "agentId": 2001, "topicPrefix": "Task"}))["ids"]
        await server.control("messages", {"conversationId": b[0], "messages": [
            {"role": "USER", "text": "go"},
            {"role": "ASSISTANT", "text": "boom", "finishReason": "ERROR"},
            {"role": "USER", "text": "again"},
            {"role": "ASSISTANT", "text": "half an ans", "finished": False},
            {"role": "USER", "text": "<attachment>not json</attachment> raw"},
        ]})
        await configure(proc, server)
        only_b = await sync(proc, "sync:pull", {"agentId": 2001})
        assert only_b["pulled"] == 1
        lists = [r for r in await server.requests() if r["path"].endswith("/conversation/list")]
        assert lists[-1]["body"]["agentId"] == 2001
        (session,) = await all_sessions(proc)
        messages = await all_messages(proc, session["id"])
        assert [(m["role"], m["status"]) for m in messages] == [
            ("user", "completed"), ("assistant", "error"), ("user", "completed"), ("assistant", "aborted"),
            ("user", "completed"),
        ]
        assert messages[1]["error"] == "boom"
        assert messages[4]["textContent"] == "<attachment>not json</attachment> raw"  # not JSON: left as is

        # the unfinished reply finishes on the server: the next pull rewrites it in place
        convs = {c["id"]: c for c in await server.conversations()}
        half = next(m for m in convs[b[0]]["messages"] if m["text"] == "half an ans")
        await server.control("update_message", {"conversationId": b[0], "index": half["index"],
                                                "text": "half an answer, finished", "finished": True,
                                                "finishReason": "EndTurn"})
        again = await sync(proc, "sync:pull", {"agentId": 2001})
        assert again["pulled"] == 1 and again["messagesPulled"] == 0 and again["errors"] == []
        messages = await all_messages(proc, session["id"])
        assert len(messages) == 5
        assert messages[3]["textContent"] == "half an answer, finished" and messages[3]["status"] == "completed"
        hits = await proc.call("chat:messages:search", {"query": "finished"})
        assert [h["messageId"] for h in hits] == [messages[3]["id"]]

        # everything else comes with an unfiltered pull
        full = await sync(proc, "sync:pull")
        assert full["pulled"] == 2 and len(await all_sessions(proc)) == 3

        # a linked conversation the list no longer shows is probed: still there -> kept in sync
        await server.control("conversation", {"id": a[0], "topicUpdated": 0})
        await server.control("messages", {"conversationId": a[0], "messages": [{"role": "USER", "text": "hidden"}]})
        probed = await sync(proc, "sync:pull")
        assert probed["pulled"] == 1 and probed["messagesPulled"] == 1 and probed["errors"] == []
        assert any(r["path"].endswith(f"/conversation/{a[0]}") for r in await server.requests())
        await proc.close()
