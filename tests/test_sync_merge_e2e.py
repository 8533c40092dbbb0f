"""Merges, conflicts, push and deletions over a real sidecar against the fake Qiming server."""

from __future__ import annotations

import time

import pytest

from chat_helpers import configure_provider, wait_final
from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio


def by_title(sessions, title):
    return next(s for s in sessions if s["title"] == title)


async def send(proc, session_id: str, text: str) -> dict:
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}})
    final = await wait_final(proc, sent["messageId"])
    assert final["type"] == "stream_end", final
    return sent


async def test_local_and_server_edits_both_survive_as_branches_and_title_conflicts_are_reported(tmp_path):
    async with qiming_server() as server, scripted_provider() as provider, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, provider.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        ids = (await server.control("seed", {"count": 2, "messages": 4}))["ids"]
        await configure(proc, server)
        assert (await sync(proc, "sync:pull"))["pulled"] == 2
        sessions = await all_sessions(proc)
        first, second = by_title(sessions, "Topic 0"), by_title(sessions, "Topic 1")
        pulled = await all_messages(proc, first["id"])
        fork_point = pulled[-1]

        # here: a new exchange; there: another device added an exchange too
        sent = await send(proc, first["id"], "local follow-up")
        await server.control("messages", {"conversationId": ids[0], "messages": [
            {"role": "USER", "text": "server follow-up"},
            {"role": "ASSISTANT", "text": "server answer", "finishReason": "EndTurn"},
        ]})
        # titles: changed on both sides; the local change is newer for Topic 0's session, the
        # server's is newer for Topic 1's
        await proc.call("chat:session:update", {"id": first["id"], "updates": {"title": "Local title"}})
        await server.control("conversation", {"id": ids[0], "topic": "Server title A",
                                              "modified": int(time.time() * 1000) - 3_600_000})
        await proc.call("chat:session:update", {"id": second["id"], "updates": {"title": "Local title B"}})
        await server.control("conversation", {"id": ids[1], "topic": "Server title B",
                                              "modified": int(time.time() * 1000) + 3_600_000})

        result = await sync(proc, "sync:run")
        assert result["errors"] == [], result["errors"]
        kinds = {(c["kind"], c["sessionId"]) for c in result["conflicts"]}
        assert ("branches", first["id"]) in kinds
        meta = {c["sessionId"]: c for c in result["conflicts"] if c["kind"] == "metadata"}
        assert meta[first["id"]]["winner"] == "local" and meta[first["id"]]["field"] == "title"
        assert meta[first["id"]]["localValue"] == "Local title"
        assert meta[first["id"]]["serverValue"] == "Server title A"
        assert meta[second["id"]]["winner"] == "server" and meta[second["id"]]["localValue"] == "Local title B"

        # both branches hang below the last message both sides had; the local one stays active
        tree = await proc.call("chat:messages:tree", {"sessionId": first["id"]})
        node = tree[0]
        while node["message"]["id"] != fork_point["id"]:
            (node,) = node["children"]
        texts = sorted(child["message"]["textContent"] for child in node["children"])
        assert texts == ["local follow-up", "server follow-up"]
        messages = await all_messages(proc, first["id"])
        assert len(messages) == 8 and sent["messageId"] in {m["id"] for m in messages}
        session = await proc.call("chat:session:get", {"id": first["id"]})
        assert session["activeLeafId"] == sent["messageId"] and session["title"] == "Local title"
        # the local winner went to the server (push of the same run), the server winner came here
        convs = {c["id"]: c for c in await server.conversations()}
        assert convs[ids[0]]["topic"] == "Local title"
        assert (await proc.call("chat:session:get", {"id": second["id"]}))["title"] == "Server title B"
        # the local exchange cannot go to the server: said so, per session
        assert [n["sessionId"] for n in result["notPushed"]] == [first["id"]]
        assert result["notPushed"][0]["messages"] == 2

        # everything agrees now: another run finds nothing to do
        quiet = await sync(proc, "sync:run")
        assert quiet["conflicts"] == [] and quiet["pulled"] == 0 and quiet["pushed"] == 0
        assert quiet["notPushed"] == [] and quiet["errors"] == []
        await proc.close()


async def test_push_a_local_session_then_it_is_not_pushed_or_pulled_twice(tmp_path):
    async with qiming_server() as server, scripted_provider() as provider, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, provider.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        local = await proc.call("chat:session:create", {"title": "Written offline"})
        await send(proc, local["id"], "hello from this device")
        open_one = await proc.call("chat:session:create", {"title": "Empty"})
        await configure(proc, server)

        no_agent = await sync(proc, "sync:push")
        assert no_agent["pushed"] == 0 and [e["kind"] for e in no_agent["errors"]] == ["no_agent"]

        await configure(proc, server, agentId=1128)
        result = await sync(proc, "sync:push", {"progressToken": 7})
        assert result["pushed"] == 1 and result["errors"] == []
        assert result["notPushed"] == [{
            "sessionId": local["id"], "conversationId": result["notPushed"][0]["conversationId"], "messages": 2,
            "reason": result["notPushed"][0]["reason"],
        }]
        assert "no messages" in result["notPushed"][0]["reason"]
        cid = result["notPushed"][0]["conversationId"]
        log = await server.requests()
        create = next(r for r in log if r["path"].endswith("/conversation/create"))
        assert create["body"] == {"agentId": 1128, "variables": None, "devMode": False}
        update = next(r for r in log if r["path"].endswith("/conversation/update"))
        assert update["body"] == {"id": cid, "firstMessage": "hello from this device", "topic": "Written offline"}
        conv = next(c for c in await server.conversations() if c["id"] == cid)
        assert conv["topic"] == "Written offline" and conv["topicUpdated"] == 1 and conv["messageCount"] == 0
        assert open_one["id"] not in {n["sessionId"] for n in result["notPushed"]}  # empty: nothing to push

        again = await sync(proc, "sync:run")
        assert again["pushed"] == 0 and again["pulled"] == 0 and again["notPushed"] == []
        assert len(await all_sessions(proc)) == 2, "the pushed conversation is not pulled back as a copy"
        # the server gets messages in it later (chat from another device): they join the session
        await server.control("messages", {"conversationId": cid, "messages": [{"role": "USER", "text": "from web"}]})
        later = await sync(proc, "sync:pull")
        assert later["messagesPulled"] == 1
        assert len(await all_messages(proc, local["id"])) == 3
        await proc.close()


async def test_push_with_messages_on_create_for_servers_that_accept_them(tmp_path):
    async with qiming_server() as server, scripted_provider() as provider, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, provider.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        await server.control("capabilities", {"messagesOnCreate": True})
        local = await proc.call("chat:session:create", {"title": "Seed shape"})
        first = await send(proc, local["id"], "question one")
        await send(proc, local["id"], "question two")
        await configure(proc, server, agentId=1128, messagesOnCreate=True)
        result = await sync(proc, "sync:push")
        assert result["pushed"] == 1 and result["messagesPushed"] == 4 and result["notPushed"] == []
        create = next(r for r in await server.requests() if r["path"].endswith("/conversation/create"))
        assert create["body"]["title"] == "Seed shape"
        assert [m["role"] for m in create["body"]["messages"]] == ["user", "assistant", "user", "assistant"]
        assert create["body"]["messages"][0]["content"] == "question one"
        pulled = await sync(proc, "sync:pull")
        assert pulled["messagesPulled"] == 0 and len(await all_messages(proc, local["id"])) == 4
        assert first["userMessageId"] in {m["id"] for m in await all_messages(proc, local["id"])}

        # a server that says it accepts messages but drops them: reported, nothing pretended
        await server.control("capabilities", {"messagesOnCreate": False})
        other = await proc.call("chat:session:create", {"title": "Dropped"})
        await send(proc, other["id"], "lost on the server?")
        dropped = await sync(proc, "sync:push")
        assert dropped["pushed"] == 1 and dropped["messagesPushed"] == 0
        assert [(n["sessionId"], n["messages"]) for n in dropped["notPushed"]] == [(other["id"], 2)]
        await proc.close()


async def test_deletions_travel_and_tombstones_keep_them_from_coming_back(tmp_path):
    async with qiming_server() as server, scripted_provider() as provider, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, provider.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        ids = (await server.control("seed", {"count": 4, "messages": 2}))["ids"]
        await configure(proc, server, agentId=1128)
        assert (await sync(proc, "sync:pull"))["pulled"] == 4
        sessions = await all_sessions(proc)
        s0, s1, s2, s3 = (by_title(sessions, f"Topic {n}") for n in range(4))

        # deleted on the server: unchanged here -> deleted here; changed here -> kept and reported
        await send(proc, s1["id"], "I still need this")
        await server.control("conversation", {"id": ids[0], "delete": True})
        await server.control("conversation", {"id": ids[1], "delete": True})
        result = await sync(proc, "sync:run")
        assert result["deleted"] == 1 and result["errors"] == []
        assert [(c["kind"], c["sessionId"], c["winner"]) for c in result["conflicts"]] == [
            ("deleted_on_server", s1["id"], "local")
        ]
        left = {s["id"] for s in await all_sessions(proc)}
        assert s0["id"] not in left and s1["id"] in left
        assert len(await all_messages(proc, s1["id"])) == 4
        # the kept copy is not pushed back as a new conversation
        assert all(not r["path"].endswith("/create") for r in await server.requests())

        # deleted here: the push deletes it there, and it does not come back
        await proc.call("chat:session:delete", {"id": s2["id"]})
        gone = await sync(proc, "sync:run")
        assert gone["deleted"] == 1 and gone["errors"] == []
        assert ids[2] not in {c["id"] for c in await server.conversations()}
        # deleted here, but the server's copy changed since: kept there, restored here
        await proc.call("chat:session:delete", {"id": s3["id"]})
        await server.control("messages", {"conversationId": ids[3], "messages": [{"role": "USER", "text": "new"}]})
        restored = await sync(proc, "sync:run")
        assert [(c["kind"], c["winner"]) for c in restored["conflicts"]] == [("deleted_locally", "server")]
        assert ids[3] in {c["id"] for c in await server.conversations()}
        back = await proc.call("chat:session:get", {"id": s3["id"]})
        assert back["messageCount"] == 3
        quiet = await sync(proc, "sync:run")
        assert quiet["deleted"] == 0 and quiet["conflicts"] == [] and quiet["pulled"] == 0
        assert {s["id"] for s in await all_sessions(proc)} == {s1["id"], s3["id"]}
        await proc.close()


async def test_chat_goes_on_while_a_sync_runs(tmp_path):
    async with qiming_server() as server, scripted_provider() as provider, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, provider.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        await server.control("seed", {"count": 80, "messages": 4})
        await configure(proc, server)
        await server.fault({"path": "/api/agent/conversation/message/list", "fault": "delay", "delayMs": 100,
                            "times": -1})
        pull = await proc.request("sync:pull", {"progressToken": "bg"})
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "sidecar:progress"
                            and m["params"]["done"] >= 1, timeout=60)
        session = await proc.call("chat:session:create", {"title": "meanwhile"})
        await provider.script({"text": "an answer while the sync runs", "delay_ms": 5})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hi"}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end"
        running = [p for p in proc.notifications("sidecar:progress") if p["kind"] == "end"]
        assert running == [], "the reply finished while the sync was still running"
        result = (await proc.response(pull, timeout=120))["result"]
        assert result["pulled"] == 80 and result["errors"] == []
        await proc.close()
