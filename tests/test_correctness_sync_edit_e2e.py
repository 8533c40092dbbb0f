"""A local edit of a pulled reply survives the server finishing that reply, over a real
sidecar subprocess against the fake Qiming server: the next ``sync:run`` keeps the edit
(text and ``editedAt``) where it is, adds the server's text as a sibling, and reports a
``branches`` conflict; pulling again changes nothing, and the conversation going on
on the server continues from the sibling, never from the edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from qiming_helpers import all_messages, all_sessions, configure, qiming_server, sync
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio


async def test_an_edited_reply_is_never_overwritten_by_the_server(tmp_path: Path) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        (cid,) = (await server.control("seed", {"count": 1, "messages": 0}))["ids"]
        await server.control("messages", {"conversationId": cid, "messages": [
            {"role": "USER", "text": "how do I reset it?"},
            {"role": "ASSISTANT", "text": "Hold the butt", "finished": False},
        ]})
        await configure(proc, server)
        assert (await sync(proc, "sync:pull"))["pulled"] == 1
        (session,) = await all_sessions(proc)
        sid = session["id"]
        question, reply = await all_messages(proc, sid)
        assert reply["status"] == "aborted"

        edited = await proc.call("chat:messages:update", {
            "sessionId": sid, "messageId": reply["id"], "content": "Hold the button for ten seconds.",
        })
        assert edited["editedAt"] is not None

        served = next(m for m in (await server.conversations())[0]["messages"] if m["role"] == "ASSISTANT")
        await server.control("update_message", {"conversationId": cid, "index": served["index"],
                                                "text": "Hold the button for five seconds.", "finished": True,
                                                "finishReason": "EndTurn"})
        result = await sync(proc, "sync:run")
        assert result["errors"] == []
        (conflict,) = [c for c in result["conflicts"] if c["kind"] == "branches"]
        assert conflict["sessionId"] == sid and conflict["conversationId"] == cid and conflict["winner"] == "both"

        messages = {m["id"]: m for m in await all_messages(proc, sid)}
        kept = messages[reply["id"]]
        assert kept["textContent"] == "Hold the button for ten seconds." and kept["editedAt"] == edited["editedAt"]
        (sibling,) = [m for m in messages.values() if m["id"] not in (question["id"], reply["id"])]
        assert sibling["parentId"] == question["id"] and sibling["role"] == "assistant"
        assert sibling["textContent"] == "Hold the button for five seconds." and sibling["status"] == "completed"
        assert sibling["editedAt"] is None
        active = await proc.call("chat:messages:get", {"sessionId": sid})
        assert [m["id"] for m in active] == [question["id"], reply["id"]]  # the edit stays active
        assert (await proc.call("chat:session:get", {"id": sid}))["messageCount"] == 3

        # again: nothing changes, nothing is reported
        again = await sync(proc, "sync:pull")
        assert again["conflicts"] == [] and again["messagesPulled"] == 0
        assert len(await all_messages(proc, sid)) == 3

        # the server's conversation goes on from its own copy, beside the edit
        await server.control("messages", {"conversationId": cid, "messages": [
            {"role": "USER", "text": "and then?"}, {"role": "ASSISTANT", "text": "Then release it."},
        ]})
        later = await sync(proc, "sync:pull")
        assert later["messagesPulled"] == 2 and [c["kind"] for c in later["conflicts"]] == ["branches"]
        messages = {m["id"]: m for m in await all_messages(proc, sid)}
        follow = next(m for m in messages.values() if m["textContent"] == "and then?")
        assert follow["parentId"] == sibling["id"]
        assert messages[reply["id"]]["textContent"] == "Hold the button for ten seconds."
        assert [m["id"] for m in await proc.call("chat:messages:get", {"sessionId": sid})] == [question["id"], reply["id"]]
        await proc.close()
