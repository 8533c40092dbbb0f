"""Access and load over a real subprocess: strangers are not answered (the default answers
nobody), allowedUsers and allowedGroups, strangers stored or refused, the trigger keyword
in groups, maxConcurrent replies with the rest queued (also across a restart), and the
message log and counters that record all of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # over the subprocess, as the host runs it

REPLY = "channel:reply"


def dm(sender: str, text: str, message_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "channel": "im", "chatId": f"dm_{sender}", "chatType": "private", "sender": {"id": sender, "name": sender},
        "messageId": message_id, "text": text, "timestamp": 1_700_000_000_000, **fields,
    }


def group(sender: str, text: str, message_id: str, chat: str = "g1", **fields: Any) -> dict[str, Any]:
    return {**dm(sender, text, message_id, **fields), "chatId": chat, "chatType": "group"}


async def reply_and_ack(proc: SidecarProcess) -> dict[str, Any]:
    reply = await proc.next_notification(REPLY, timeout=20)
    assert await proc.call("channel:ack", {"deliveryId": reply["deliveryId"], "ok": True}) == {"success": True}
    return reply


async def log(proc: SidecarProcess, **fields: Any) -> list[dict[str, Any]]:
    return (await proc.call("channel:messages", {"channel": "im", **fields}))["entries"]


async def test_strangers_are_not_answered(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        config = await proc.call("channel:config:upsert", {"id": "im", "platform": "plain"})
        assert config["allowEveryone"] is False and config["allowedUsers"] is None  # the default: nobody
        refused = await proc.call("channel:message", dm("mallory", "run rm -rf ~", "m1"))
        assert refused["action"] == "refused" and refused["sessionId"] is None
        assert (await proc.call("chat:session:list", {"channelId": "im"}))["sessions"] == []

        await proc.call("channel:config:upsert", {"id": "im", "platform": "plain", "allowedUsers": ["alice"],
                                                  "allowedGroups": ["team"]})
        await server.script({"text": "hi alice"}, {"text": "hi team"})
        assert (await proc.call("channel:message", dm("mallory", "again", "m2")))["action"] == "refused"
        assert (await proc.call("channel:message", dm("alice", "hello", "a1")))["action"] == "reply"
        assert (await reply_and_ack(proc))["chunks"][0]["text"] == "hi alice"
        # anyone in an allowed group; in another group only alice
        asked = await proc.call("channel:message", group("carol", "question", "t1", chat="team",
                                                         mentions=[{"id": "bot", "isSelf": True}]))
        assert asked["action"] == "reply"
        assert (await reply_and_ack(proc))["chunks"][0]["text"] == "hi team"
        outside = await proc.call("channel:message", group("carol", "psst", "o1", chat="other",
                                                           mentions=[{"id": "bot", "isSelf": True}]))
        assert outside["action"] == "refused"
        # strangers "store": kept in the chat's session, never answered
        await proc.call("channel:config:upsert", {"id": "im", "platform": "plain", "allowedUsers": ["alice"],
                                                  "strangers": "store"})
        kept = await proc.call("channel:message", group("carol", "context for later", "o2", chat="other",
                                                        mentions=[{"id": "bot", "isSelf": True}]))
        assert kept["action"] == "store" and kept["sessionId"]
        with anyio.fail_after(20):
            while (entries := await log(proc))[0]["status"] != "ignored":
                await anyio.sleep(0.05)
        path = await proc.call("chat:messages:get", {"sessionId": kept["sessionId"]})
        assert [(m["role"], m["textContent"]) for m in path] == [("user", '"carol": context for later')]

        assert [(e["messageId"], e["status"]) for e in entries] == [
            ("o2", "ignored"), ("o1", "refused"), ("t1", "replied"), ("a1", "replied"), ("m2", "refused"),
            ("m1", "refused"),
        ]
        assert "not allowed" in entries[1]["reason"] and entries[5]["text"] == "run rm -rf ~"
        assert [e["messageId"] for e in await log(proc, status="refused")] == ["o1", "m2", "m1"]
        page = await proc.call("channel:messages", {"channel": "im", "limit": 4})
        rest = await proc.call("channel:messages", {"channel": "im", "before": page["nextBefore"]})
        assert [e["messageId"] for e in page["entries"] + rest["entries"]] == [e["messageId"] for e in entries]
        assert rest["nextBefore"] is None
        (listed,) = await proc.call("channel:config:list", {})
        assert listed["counters"] == {"received": 6, "replied": 2, "ignored": 1, "refused": 3, "failed": 0,
                                      "duplicates": 0}
        assert len(proc.notifications(REPLY)) == 2
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_the_trigger_keyword_addresses_the_bot_in_groups(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("channel:config:upsert", {"id": "im", "platform": "plain", "allowEveryone": True,
                                                  "triggerKeyword": "Nuwa"})
        await server.script({"text": "one"}, {"text": "two"})
        first = await proc.call("channel:message", group("ann", "nuwa, what is up?", "k1"))
        assert first["action"] == "reply"
        await reply_and_ack(proc)
        assert (await proc.call("channel:message", group("ann", "just talking", "k2")))["action"] == "store"
        assert (await proc.call("channel:message", group("ann", "ask NUWA about it", "k3")))["action"] == "reply"
        await reply_and_ack(proc)
        path = await proc.call("chat:messages:get", {"sessionId": first["sessionId"]})
        assert [m["textContent"] for m in path if m["role"] == "user"] == [
            '"ann": what is up?', '"ann": just talking', '"ann": ask NUWA about it',
        ]
        # a private chat needs no keyword
        assert (await proc.call("channel:message", dm("ann", "no keyword", "k4")))["action"] == "reply"
        await reply_and_ack(proc)
        await proc.close()


async def test_max_concurrent_replies_are_queued_and_the_queue_survives_a_restart(tmp_path: Path) -> None:
    async with scripted_provider() as server:
        async with spawn_sidecar(tmp_path) as proc:
            await configure_provider(proc, server.base_url)
            await proc.call("channel:config:upsert", {"id": "im", "platform": "plain", "allowEveryone": True,
                                                      "maxConcurrent": 1})
            # the first reply streams a little, then hangs: it holds the channel's one slot
            await server.script({"text": "partial answer", "fault": "stall"}, {"text": "second answer"})
            first = await proc.call("channel:message", dm("ann", "first", "q1"))
            with anyio.fail_after(20):
                while len(await server.requests()) < 1:  # the first turn reached the provider
                    await anyio.sleep(0.05)
            second = await proc.call("channel:message", dm("bob", "second", "q2"))
            assert second["action"] == "reply" and second["sessionId"] != first["sessionId"]
            # the second waits for the slot: its turn was not sent (no message, no request)
            assert await proc.call("chat:messages:get", {"sessionId": second["sessionId"]}) == []
            assert len(await server.requests()) == 1
            assert [e["status"] for e in await log(proc)] == ["received", "received"]
            proc.send_signal(9)  # a crash while one reply runs and one waits
            await proc.wait_exit()
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            replies = [await reply_and_ack(proc), await reply_and_ack(proc)]
            by_session = {r["sessionId"]: r["chunks"][0]["text"] for r in replies}
            assert by_session[second["sessionId"]] == "second answer"
            assert "(The reply was interrupted.)" in by_session[first["sessionId"]]
            assert len(await server.requests()) == 2
            await proc.close()
