"""IM channels over a real subprocess and the scripted loopback provider.

The test plays the host: it configures a channel, hands in platform messages with
``channel:message``, receives ``channel:reply`` notifications and answers ``channel:ack``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from markdown_it import MarkdownIt

from chat_helpers import configure_provider, wait_final
from protocol.channels import ChannelConfig
from scripted_server import scripted_provider
from sidecar.channels.compose import compose
from sidecar.store.attachments import AttachmentStore
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

REPLY = "channel:reply"
_md = MarkdownIt("commonmark").enable(["table"])


async def channel(proc: SidecarProcess, **fields: Any) -> dict[str, Any]:
    return await proc.call(
        "channel:config:upsert",
        {"id": "im", "platform": "feishu", "botUserIds": ["ou_bot"], "allowEveryone": True, **fields},
    )


def message(text: str = "hello", *, message_id: str | None = "om_1", group: bool = False, **fields: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "channel": "im",
        "chatId": "oc_group" if group else "oc_private",
        "chatType": "group" if group else "private",
        "sender": {"id": "ou_alice", "name": "Alice"},
        "text": text,
        "timestamp": 1_700_000_000_000,
        **fields,
    }
    if message_id is not None:
        params["messageId"] = message_id
    return params


def mention(text: str) -> dict[str, Any]:
    return {"text": "@_user_1 " + text, "mentions": [{"id": "ou_bot", "key": "@_user_1", "name": "Helper"}]}


async def next_reply(proc: SidecarProcess, timeout: float = 20) -> dict[str, Any]:
    return await proc.next_notification(REPLY, timeout=timeout)


async def ack(proc: SidecarProcess, reply: dict[str, Any], ok: bool = True, **extra: Any) -> None:
    assert await proc.call("channel:ack", {"deliveryId": reply["deliveryId"], "ok": ok, **extra}) == {"success": True}


async def reply_message(proc: SidecarProcess, session_id: str) -> dict[str, Any]:
    return (await proc.call("chat:messages:get", {"sessionId": session_id}))[-1]


async def wait_delivery(proc: SidecarProcess, session_id: str, status: str, timeout: float = 20) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            reply = await reply_message(proc, session_id)
            if reply["role"] == "assistant" and (reply.get("delivery") or {}).get("status") == status:
                return reply
            await anyio.sleep(0.05)


def balanced(text: str) -> bool:
    lines = text.split("\n")
    for token in _md.parse(text):
        if token.type == "fence" and token.map is not None:
            end = token.map[1]
            if end - 1 <= token.map[0] or not re.match(r"^\s*`{3,}\s*$", lines[end - 1]):
                return False
    return True


LONG_REPLY = (
    "Here is the table you asked for.\n\n| city | people |\n|---|---|\n"
    + "\n".join(f"| city{i} | {i * 1000} |" for i in range(30))
    + "\n\nAnd the code:\n\n```python\n"
    + "\n".join(f"print({i})  # 打印第{i}行" for i in range(40))
    + "\n```\n\n"
    + "结尾的中文句子，说明分割不会切断词语。" * 10
)


async def test_a_message_gets_a_reply_split_for_the_platform(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        # the platform's own rate (20 a minute) would make the test wait ~12 s between bursts
        config = await channel(
            proc, platform="dingtalk", limits={"maxMessageSize": 400}, rate={"burst": 2, "messagesPerMinute": 600}
        )
        assert config["dialect"] == "dingtalk_md" and config["limits"]["sizeUnit"] == "utf8_bytes"
        await server.script({"text": LONG_REPLY, "chunks": 50})
        result = await proc.call("channel:message", message(**mention("give me the table"), group=True, chatName="Ops"))
        assert result["action"] == "reply"
        session_id = result["sessionId"]

        replies = []
        while True:
            reply = await next_reply(proc)
            replies.append(reply)
            await ack(proc, reply, platformMessageId=f"dt_{reply['seq']}")
            if reply["final"]:
                break
        assert [r["seq"] for r in replies] == list(range(1, len(replies) + 1))
        assert all(r["channel"] == "im" and r["chatId"] == "oc_group" and r["replyTo"] == "om_1" for r in replies)
        assert all(r["kind"] == "send" and r["attempt"] == 1 and 1 <= len(r["chunks"]) <= 2 for r in replies)
        chunks = [c for r in replies for c in r["chunks"]]
        assert len(chunks) > 4
        for chunk in chunks:
            assert chunk["type"] == "text" and chunk["format"] == "dingtalk_md"
            assert len(chunk["text"].encode()) <= 400
            assert balanced(chunk["text"])
        table_chunks = [c["text"] for c in chunks if "| city" in c["text"]]
        assert len(table_chunks) > 1 and all("| city | people |\n| --- | --- |" in t for t in table_chunks)

        stored = await wait_delivery(proc, session_id, "delivered")
        expected = compose(
            stored["textContent"], None, msgspec.convert(config, ChannelConfig), AttachmentStore(tmp_path)
        )
        assert chunks == [msgspec.json.decode(msgspec.json.encode(c)) for c in expected]
        assert stored["delivery"] == {
            "channel": "im", "chatId": "oc_group", "status": "delivered", "deliveries": len(replies),
            "delivered": len(replies), "failed": 0, "error": None, "updatedAt": stored["delivery"]["updatedAt"],
        }
        # the user turn says who spoke; the session is linked to the chat
        path = await proc.call("chat:messages:get", {"sessionId": session_id})
        assert path[0]["role"] == "user" and path[0]["textContent"] == '"Alice": give me the table'
        session = await proc.call("chat:session:get", {"id": session_id})
        assert session["channelId"] == "im" and session["title"] == "dingtalk - group - Ops"
        assert session["channelMeta"] == {
            "platform": "dingtalk", "chatId": "oc_group", "chatType": "group", "scope": "chat",
            "scopeKey": '["chat","oc_group"]', "route": "local", "chatName": "Ops",
        }
        listed = await proc.call("chat:session:list", {"channelId": "im"})
        assert [s["id"] for s in listed["sessions"]] == [session_id]
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_a_redelivered_message_gets_one_reply_even_after_a_restart(tmp_path: Path) -> None:
    async with scripted_provider() as server:
        async with spawn_sidecar(tmp_path) as proc:
            await configure_provider(proc, server.base_url)
            await channel(proc)
            await server.script({"text": "first answer", "delay_ms": 30, "chunks": 4})
            first = await proc.call("channel:message", message("question one"))
            again = await proc.call("channel:message", message("question one"))  # while it is answered
            assert first["action"] == "reply" and again == {**first, "action": "duplicate"}
            reply = await next_reply(proc)
            await ack(proc, reply)
            assert (await proc.call("channel:message", message("question one")))["action"] == "duplicate"
            # without a platform id the content hash decides (same sender, time and text)
            no_id = message("no id here", message_id=None, timestamp=5)
            assert (await proc.call("channel:message", no_id))["action"] == "reply"
            assert (await proc.call("channel:message", no_id))["action"] == "duplicate"
            await ack(proc, await next_reply(proc))
            await proc.close()
        assert len(proc.notifications(REPLY)) == 2
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            dup = await proc.call("channel:message", message("question one"))
            assert dup == {**first, "action": "duplicate"}
            assert (await proc.call("channel:message", message("no id here", message_id=None, timestamp=5)))["action"] == "duplicate"
            await server.script({"text": "second answer"})
            fresh = await proc.call("channel:message", message("question two", message_id="om_2"))
            assert fresh["action"] == "reply" and fresh["sessionId"] == first["sessionId"]
            reply = await next_reply(proc)
            await ack(proc, reply)
            assert proc.notifications(REPLY) == [reply]  # nothing for the duplicates
            assert reply["chunks"] == [{"type": "text", "text": "second answer", "format": "feishu_card"}]
            path = await proc.call("chat:messages:get", {"sessionId": first["sessionId"]})
            assert [m["textContent"] for m in path if m["role"] == "user"] == ["question one", "no id here", "question two"]
            await proc.close()


async def test_an_unacknowledged_reply_is_retried_then_failed(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc, delivery={"ackTimeoutMs": 200, "maxAttempts": 3, "retryBackoffMs": 0})
        await server.script({"text": "nobody hears this"})
        result = await proc.call("channel:message", message())
        attempts = [await next_reply(proc) for _ in range(3)]
        assert len({r["deliveryId"] for r in attempts}) == 1
        assert [r["attempt"] for r in attempts] == [1, 2, 3]
        failed = await wait_delivery(proc, result["sessionId"], "failed")
        assert failed["delivery"]["failed"] == 1 and "no acknowledgement" in failed["delivery"]["error"]
        # a late acknowledgement still counts: it was delivered after all
        await ack(proc, attempts[0])
        await wait_delivery(proc, result["sessionId"], "delivered")
        # a refusal that must not be retried fails at once
        await server.script({"text": "second"})
        await proc.call("channel:message", message("again", message_id="om_2"))
        refused = await next_reply(proc)
        await ack(proc, refused, ok=False, error="bot removed from chat", retryable=False)
        failed = await wait_delivery(proc, result["sessionId"], "failed")
        assert "bot removed from chat" in failed["delivery"]["error"]
        await proc.close()
    sent = proc.notifications(REPLY)
    assert [r["deliveryId"] for r in sent[:3]] == [attempts[0]["deliveryId"]] * 3
    assert {r["deliveryId"] for r in sent[3:]} == {refused["deliveryId"]}  # never retried once refused


async def test_an_unacknowledged_delivery_is_resent_after_a_restart(tmp_path: Path) -> None:
    async with scripted_provider() as server:
        async with spawn_sidecar(tmp_path) as proc:
            await configure_provider(proc, server.base_url)
            await channel(proc, delivery={"ackTimeoutMs": 600_000, "maxAttempts": 3})
            await server.script({"text": "survives"})
            result = await proc.call("channel:message", message())
            first = await next_reply(proc)
            await proc.close()
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            again = await next_reply(proc)
            assert again["deliveryId"] == first["deliveryId"] and again["attempt"] == 2
            assert again["chunks"] == first["chunks"]
            await ack(proc, again)
            await wait_delivery(proc, result["sessionId"], "delivered")
            await proc.close()


async def test_a_group_message_without_a_mention_is_stored_without_a_reply(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc)
        quiet = await proc.call("channel:message", message("just chatting", group=True, message_id="g1"))
        assert quiet["action"] == "store"
        await server.script({"text": "answer to bob"})
        asked = await proc.call(
            "channel:message",
            message(**mention("what did she say?"), group=True, message_id="g2", sender={"id": "ou_bob", "name": "Bob"}),
        )
        assert asked["action"] == "reply" and asked["sessionId"] == quiet["sessionId"]
        reply = await next_reply(proc)
        await ack(proc, reply, platformMessageId="pm_answer")
        assert reply["replyTo"] == "g2" and proc.notifications(REPLY) == [reply]
        path = await proc.call("chat:messages:get", {"sessionId": quiet["sessionId"]})
        assert [(m["role"], m["textContent"]) for m in path] == [
            ("user", '"Alice": just chatting'), ("user", '"Bob": what did she say?'), ("assistant", "answer to bob"),
        ]
        bodies = await server.requests()
        assert any('"Alice": just chatting' in str(b["messages"]) for b in bodies)
        # a quoted reply without its text: the sidecar knows the messages of this chat
        await ack(proc, reply)  # a repeated ack is harmless and keeps the platform id
        quoted_bot = await proc.call(
            "channel:message", message(group=True, message_id="g4", text="ok", replyTo={"messageId": "pm_answer"})
        )
        quoted_user = await proc.call(
            "channel:message", message(group=True, message_id="g5", text="same", replyTo={"messageId": "g1"})
        )
        assert quoted_bot["action"] == quoted_user["action"] == "store"
        with anyio.fail_after(20):
            while len(path := await proc.call("chat:messages:get", {"sessionId": quiet["sessionId"]})) < 5:
                await anyio.sleep(0.05)
        assert [m["textContent"] for m in path[3:]] == [
            '> answer to bob\n\n"Alice": ok', '> &quot;Alice&quot;: just chatting\n\n"Alice": same',
        ]
        # with groupTrigger "always" every group message is answered
        await channel(proc, groupTrigger="always")
        await server.script({"text": "always"})
        assert (await proc.call("channel:message", message("no mention", group=True, message_id="g3")))["action"] == "reply"
        await ack(proc, await next_reply(proc))
        await proc.close()


async def test_new_starts_a_new_session_for_the_chat(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc, scope="chat_sender")
        await server.script({"text": "one"}, {"text": "two"})
        first = await proc.call("channel:message", message(**mention("hi"), group=True, message_id="n1"))
        await ack(proc, await next_reply(proc))
        new = await proc.call("channel:message", message(**mention("/new"), group=True, message_id="n2"))
        assert new["action"] == "new_session" and new["sessionId"] != first["sessionId"]
        confirmation = await next_reply(proc)
        assert confirmation["sessionId"] == new["sessionId"] and confirmation["messageId"] is None
        assert confirmation["chunks"] == [{"type": "text", "text": "New conversation started.", "format": "feishu_card"}]
        await ack(proc, confirmation)
        after = await proc.call("channel:message", message(**mention("hello again"), group=True, message_id="n3"))
        assert after["sessionId"] == new["sessionId"]
        await ack(proc, await next_reply(proc))
        # another sender in the same group has a session of their own (scope chat_sender)
        await server.script({"text": "three"})
        other = await proc.call(
            "channel:message", message(**mention("me too"), group=True, message_id="n4", sender={"id": "ou_c", "name": "Carol"})
        )
        assert other["sessionId"] not in (first["sessionId"], new["sessionId"])
        await ack(proc, await next_reply(proc))
        listed = await proc.call("chat:session:list", {"channelId": "im"})
        assert len(listed["sessions"]) == 3
        old = await proc.call("chat:messages:get", {"sessionId": first["sessionId"]})
        assert [m["textContent"] for m in old] == ['"Alice": hi', "one"]
        await proc.close()


async def test_stream_mode_edits_one_message_in_place(tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(80))
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc, platform="slack", replyMode="stream", rate={"editIntervalMs": 200, "messagesPerMinute": 0})
        await server.script({"text": words, "delay_ms": 25})
        result = await proc.call("channel:message", message())
        replies = []
        while True:
            reply = await next_reply(proc)
            replies.append(reply)
            await ack(proc, reply)
            if reply["final"]:
                break
        first = replies[0]
        assert first["kind"] == "send" and first["chunks"][0]["type"] == "blocks"
        assert len(replies) >= 2
        assert all(r["kind"] == "edit" and r["editOf"] == first["deliveryId"] for r in replies[1:])
        assert [r["seq"] for r in replies] == list(range(1, len(replies) + 1))
        last_text = replies[-1]["chunks"][0]["text"]
        assert last_text == words
        texts = [r["chunks"][0]["text"] for r in replies]
        assert all(words.startswith(t) for t in texts)  # each edit shows the reply so far
        stored = await wait_delivery(proc, result["sessionId"], "delivered")
        assert stored["textContent"] == words
        await proc.close()


async def test_a_reply_paused_for_approval_is_delivered_once_it_finishes_even_after_a_restart(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with scripted_provider() as server:
        async with spawn_sidecar(tmp_path / "data") as proc:
            await configure_provider(proc, server.base_url)
            await channel(proc)
            await server.script({"text": "hello"})
            first = await proc.call("channel:message", message("hi", message_id="p1"))
            await ack(proc, await next_reply(proc))
            session_id = first["sessionId"]
            await proc.call("chat:session:update", {"id": session_id, "updates": {"workspaceDir": str(workspace)}})
            await server.script(
                {"tool_calls": [{"id": "w1", "name": "workspace_write_file", "arguments": {"path": "a.txt", "content": "x"}}]},
                {"text": "Written."},
            )
            await proc.call("channel:message", message("write it", message_id="p2"))
            with anyio.fail_after(20):
                while (await reply_message(proc, session_id))["status"] != "paused":
                    await anyio.sleep(0.05)
            paused = await reply_message(proc, session_id)
            assert paused["delivery"]["status"] == "pending"
            assert len(proc.notifications(REPLY)) == 1  # nothing for the paused reply
            await proc.close()
        async with spawn_sidecar(tmp_path / "data") as proc:
            await proc.call("sidecar:initialize", {})
            assert await proc.call(
                "chat:tool:approve", {"sessionId": session_id, "toolCallId": "w1", "decision": "approved"}
            ) == {"success": True, "resumed": True}
            reply = await next_reply(proc)
            assert reply["messageId"] == paused["id"] and reply["replyTo"] == "p2"
            assert reply["chunks"][0]["text"] == "Written."
            await ack(proc, reply)
            await wait_delivery(proc, session_id, "delivered")
            assert (workspace / "a.txt").read_text() == "x"
            await proc.close()


async def test_the_loop_guard_stops_ping_pong(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc, rate={"loopMaxEvents": 2, "loopWindowMs": 60_000, "loopCooldownMs": 60_000})
        await server.script({"text": "a"}, {"text": "b"})
        bot = {"id": "ou_otherbot", "name": "OtherBot", "isBot": True}
        actions = [
            (await proc.call("channel:message", message(f"ping {i}", message_id=f"l{i}", sender=bot)))["action"]
            for i in range(4)
        ]
        assert actions == ["reply", "reply", "throttled", "throttled"]
        for _ in range(2):
            await ack(proc, await next_reply(proc))
        # the throttled messages are kept in the session, unanswered
        session = (await proc.call("chat:session:list", {"channelId": "im"}))["sessions"][0]
        with anyio.fail_after(20):
            while True:
                path = await proc.call("chat:messages:get", {"sessionId": session["id"]})
                if [m["textContent"] for m in path if m["role"] == "user"] == [f"ping {i}" for i in range(4)]:
                    break
                await anyio.sleep(0.05)
        # the bot's own messages are ignored
        own = await proc.call("channel:message", message("echo", message_id="own", sender={"id": "ou_bot"}))
        assert own["action"] == "ignored" and own["sessionId"] is None
        await proc.close()


async def test_an_unanswerable_message_is_kept_and_the_chat_told(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        await channel(proc)  # no provider configured at all
        result = await proc.call("channel:message", message("anyone?"))
        reply = await next_reply(proc)
        text = reply["chunks"][0]["text"]
        assert text.startswith("(The reply failed:") and "provider" in text, text
        await ack(proc, reply)
        path = await proc.call("chat:messages:get", {"sessionId": result["sessionId"]})
        assert [(m["role"], m["status"]) for m in path] == [("user", "completed"), ("assistant", "error")]
        assert path[0]["textContent"] == "anyone?" and path[1]["delivery"]["status"] == "delivered"
        await proc.close()


async def test_a_failed_reply_is_delivered_with_a_notice(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc, platform="plain")
        await server.script({"status": 400, "text": "bad request from provider"})
        result = await proc.call("channel:message", message())
        reply = await next_reply(proc)
        assert reply["chunks"][0]["text"].startswith("(The reply failed:")
        await ack(proc, reply)
        stored = await wait_delivery(proc, result["sessionId"], "delivered")
        assert stored["status"] == "error"
        await proc.close()


async def call_error(proc: SidecarProcess, method: str, params: Any) -> CallError:
    with pytest.raises(CallError) as err:
        await proc.call(method, params)
    return err.value


async def test_bad_input_on_every_method(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await channel(proc, limits={"maxInboundChars": 1000})
        # channel:message
        assert (await call_error(proc, "channel:message", {**message(), "channel": "nope"})).code == -32001
        huge = await call_error(proc, "channel:message", message("x" * 1001))
        assert huge.code == -32602 and "text" in huge.message
        unknown = await call_error(proc, "channel:message", {**message(), "colour": "red"})
        assert unknown.code == -32602 and "colour" in unknown.message
        bad_mention = await call_error(proc, "channel:message", {**message(), "mentions": [{"name": "no id"}]})
        assert bad_mention.code == -32602 and "mentions" in bad_mention.message
        assert (await call_error(proc, "channel:message", {**message(), "chatType": "channel"})).code == -32602
        assert (await call_error(proc, "channel:message", {**message(), "sender": {"id": ""}})).code == -32602
        deep: Any = {}
        for _ in range(40):
            deep = {"a": deep}
        assert "raw" in (await call_error(proc, "channel:message", {**message(), "raw": deep})).message
        big_raw = {"blob": "y" * 300_000}
        assert "raw" in (await call_error(proc, "channel:message", {**message(), "raw": big_raw})).message
        assert (await call_error(proc, "channel:message", {**message(), "attachments": [{"kind": "image"}]})).code == -32602
        # malformed mention markup is not an error: it stays text
        await server.script({"text": "fine"})
        odd = await proc.call("channel:message", message('<at user_id="x">broken @_user_7 <@U1', message_id="odd"))
        assert odd["action"] == "reply"
        await ack(proc, await next_reply(proc))
        # channel:ack
        assert (await call_error(proc, "channel:ack", {"deliveryId": "nope", "ok": True})).code == -32001
        assert (await call_error(proc, "channel:ack", {"deliveryId": "x", "ok": True, "extra": 1})).code == -32602
        assert (await call_error(proc, "channel:ack", {"ok": True})).code == -32602
        # channel:config:*
        for bad in (
            {"id": "x", "platform": "matrix"},
            {"id": "bad id!", "platform": "plain"},
            {"id": "x", "platform": "plain", "maxConcurrent": 0},
            {"id": "x", "platform": "plain", "triggerKeyword": "  "},
            {"id": "x", "platform": "plain", "allowedUsers": [""]},
            {"id": "x", "platform": "plain", "strangers": "answer"},
            {"id": "x", "platform": "plain", "rate": {"chatBurst": 0}},
            {"id": "x", "platform": "plain", "route": {"type": "assistant", "assistantId": "no-such"}},
            {"id": "x", "platform": "plain", "route": {"type": "acp", "providerId": "no-such"}},
            {"id": "x", "platform": "plain", "route": {"type": "acp", "providerId": "p", "workspaceDir": "rel/dir"}},
            {"id": "x", "platform": "plain", "route": {"type": "teleport"}},
            {"id": "x", "platform": "plain", "route": {"type": "remote-agent", "serviceUrl": "ftp://x"}},
            {"id": "x", "platform": "plain", "route": {"type": "remote-agent", "serviceUrl": "http://u:p@x"}},
            {"id": "x", "platform": "plain", "route": {"type": "remote-agent", "serviceUrl": "http://x",
                                                       "progressEndpoint": "/progress"}},
            {"id": "x", "platform": "plain", "route": {"type": "remote-agent", "serviceUrl": "http://x",
                                                       "auth": {"type": "custom-header", "token": "t",
                                                                "headerName": "Host"}}},
            {"id": "x", "platform": "plain", "route": {"type": "remote-agent", "serviceUrl": "http://x",
                                                       "auth": {"type": "bearer", "token": "a\nb"}}},
            {"id": "x", "platform": "plain", "route": {"type": "remote-agent", "serviceUrl": "http://x",
                                                       "auth": {"type": "bearer", "token": "***"}}},
            {"id": "x", "platform": "feishu", "connection": {"kind": "telegram_polling"}},
            {"id": "x", "platform": "telegram", "connection": {"kind": "telegram_polling", "apiBaseUrl": "ftp://x"}},
            {"id": "x", "platform": "telegram", "connection": {"kind": "telegram_polling", "pollTimeoutS": 0}},
            {"id": "x", "platform": "telegram", "connection": {"kind": "telegram_polling", "intents": 1}},
            {"id": "x", "platform": "discord", "connection": {"kind": "discord_gateway", "gatewayUrl": "http://x"}},
            {"id": "x", "platform": "plain", "connection": {"apiBaseUrl": "https://x"}},
            {"id": "x", "platform": "plain", "credentials": {"botToken": "t"}},
            {"id": "x", "platform": "telegram", "connection": {"kind": "telegram_polling"},
             "credentials": {"appToken": "xapp-1"}},
            {"id": "x", "platform": "telegram", "connection": {"kind": "telegram_polling"},
             "credentials": {"botToken": "has space"}},
            {"id": "x", "platform": "telegram", "connection": {"kind": "telegram_polling"},
             "credentials": {"botToken": "***"}},
            {"id": "x", "platform": "wecom", "replyMode": "stream"},
            {"id": "x", "platform": "plain", "limits": {"maxMessageSize": 10}},
            {"id": "x", "platform": "plain", "limits": {"maxBlocks": 5}},
            {"id": "x", "platform": "slack", "limits": {"maxBlocks": 51}},
            {"id": "x", "platform": "plain", "rate": {"burst": 0}},
            {"id": "x", "platform": "plain", "delivery": {"maxAttempts": 0}},
            {"id": "x", "platform": "plain", "limits": {"dedupWindowMs": 1000}},
            {"id": "x", "platform": "plain", "unknownSetting": True},
        ):
            assert (await call_error(proc, "channel:config:upsert", bad)).code == -32602, bad
        assert (await call_error(proc, "channel:config:get", {"id": "x"})).code == -32001
        assert (await call_error(proc, "channel:config:delete", {"id": "x"})).code == -32001
        assert (await call_error(proc, "channel:config:get", {})).code == -32602
        # channel:connect / channel:disconnect
        assert (await call_error(proc, "channel:connect", {"id": "x"})).code == -32001
        assert (await call_error(proc, "channel:disconnect", {"id": "x"})).code == -32001
        assert (await call_error(proc, "channel:connect", {"id": "im"})).code == -32003  # host-driven
        await proc.call("channel:config:upsert", {"id": "tg", "platform": "telegram",
                                                  "connection": {"kind": "telegram_polling"}})
        no_token = await call_error(proc, "channel:connect", {"id": "tg"})
        assert no_token.code == -32003 and "credentials.botToken" in no_token.message
        assert await proc.call("channel:config:delete", {"id": "tg"}) == {"success": True}
        # channel:messages
        assert (await call_error(proc, "channel:messages", {"channel": "x"})).code == -32001
        assert (await call_error(proc, "channel:messages", {"channel": "im", "limit": 0})).code == -32602
        assert (await call_error(proc, "channel:messages", {"channel": "im", "status": "odd"})).code == -32602
        assert (await call_error(proc, "channel:messages", {"channel": "im", "before": ""})).code == -32602
        # a disabled channel refuses messages; a deleted one is unknown
        await channel(proc, enabled=False)
        assert (await call_error(proc, "channel:message", message(message_id="d1"))).code == -32003
        assert await proc.call("channel:config:delete", {"id": "im"}) == {"success": True}
        assert (await call_error(proc, "channel:message", message(message_id="d2"))).code == -32001
        assert await proc.call("channel:config:list", {}) == []
        await proc.close()
    proc.assert_all_jsonrpc()
