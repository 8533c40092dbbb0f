"""Telegram long polling owned by the sidecar, over a real subprocess against a fake Bot API
on loopback (tests/platform_fakes.py): a message in and the reply out split at 4,096 with
fences and tables kept, a redelivery answered once, Telegram's 429 with retry_after, a
dropped poll resumed without loss or duplicates, a restart that keeps the dedup and the
queue, the 409 of a webhook, stream mode's edits, and the credentials sealed and masked."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider
from platform_fakes import TELEGRAM_TOKEN, FakeTelegram, fake_telegram, utf16_len, wait_until
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # over the subprocess, as the host runs it

TABLE = "| city | people |\n|---|---|\n" + "\n".join(f"| city_{i} | {i * 1000} |" for i in range(260))
CODE = "```python\n" + "\n".join(f"print({i})  # line {i} (a.b)" for i in range(220)) + "\n```"
LONG_REPLY = f"Here is the table.\n\n{TABLE}\n\nAnd the code:\n\n{CODE}\n\nDone."


async def telegram_channel(proc: SidecarProcess, fake: FakeTelegram, **fields: Any) -> dict[str, Any]:
    config = await proc.call("channel:config:upsert", {
        "id": "tg", "platform": "telegram", "allowEveryone": True,
        "connection": {"kind": "telegram_polling", "apiBaseUrl": fake.base_url, "pollTimeoutS": 2},
        "credentials": {"botToken": TELEGRAM_TOKEN}, **fields,
    })
    return config


async def connected(proc: SidecarProcess, channel: str = "tg", state: str = "connected") -> dict[str, Any]:
    with anyio.fail_after(30):
        while (status := (await proc.call("channel:config:get", {"id": channel}))["status"])["state"] != state:
            await anyio.sleep(0.05)
    return status


async def replied(proc: SidecarProcess, session_id: str, count: int = 1, channel: str = "tg") -> list[dict[str, Any]]:
    """The session's replies once ``count`` messages were answered (their last deliveries
    stored: the log says replied) and every delivery is acknowledged."""
    with anyio.fail_after(60):
        while True:
            log = (await proc.call("channel:messages", {"channel": channel, "status": "replied"}))["entries"]
            path = await proc.call("chat:messages:get", {"sessionId": session_id})
            replies = [m for m in path if m["role"] == "assistant"]
            if len(log) >= count and all((m.get("delivery") or {}).get("status") == "delivered" for m in replies):
                return replies
            await anyio.sleep(0.05)


async def session_of(proc: SidecarProcess) -> str:
    with anyio.fail_after(30):
        while not (sessions := (await proc.call("chat:session:list", {"channelId": "tg"}))["sessions"]):
            await anyio.sleep(0.05)
    return str(sessions[0]["id"])


async def connected_and_answered(proc: SidecarProcess, server: Any, fake: FakeTelegram, reply: str) -> None:
    """The channel connected, and a first message answered with ``reply``."""
    await configure_provider(proc, server.base_url)
    await telegram_channel(proc, fake)
    await proc.call("channel:connect", {"id": "tg"})
    await connected(proc)
    await server.script({"text": reply})
    fake.post("hello")
    await replied(proc, await session_of(proc))


async def test_a_message_in_a_split_reply_out_a_redelivery_and_a_429(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        config = await telegram_channel(proc, fake)
        assert config["credentials"] == {"botToken": "***", "appToken": None} and config["status"] == {
            "state": "disconnected", "error": None, "retryAt": None, "since": None, "botUserId": None,
        }
        assert (await proc.call("channel:connect", {"id": "tg"}))["state"] in ("connecting", "connected")
        status = await connected(proc)
        assert status["botUserId"] == "4242"
        await server.script({"text": LONG_REPLY, "chunks": 40})
        question = fake.post("give me the table")
        session_id = await session_of(proc)
        await replied(proc, session_id)
        sends = [p for m, p in fake.sent if m == "sendMessage"]
        assert len(sends) >= 3
        assert all(p["parse_mode"] == "MarkdownV2" and utf16_len(p["text"]) <= 4096 for p in sends)
        assert sends[0]["reply_parameters"] == {"message_id": question["message_id"], "allow_sending_without_reply": True}
        assert all("reply_parameters" not in p for p in sends[1:])
        texts = [p["text"] for p in sends]
        table_chunks = [t for t in texts if "city\\_" in t]
        assert len(table_chunks) > 1 and all(t.count("*city* \\| *people*") == 1 for t in table_chunks)
        code_chunks = [t for t in texts if "print(" in t]
        assert len(code_chunks) > 1
        for text in code_chunks:
            fences = [line for line in text.split("\n") if line.startswith("```")]
            assert len(fences) % 2 == 0 and fences[0] == "```python"
        joined = "\n".join(texts)
        assert all(f"city\\_{i} \\| {i * 1000}" in joined for i in range(260))
        assert all(re.search(rf"print\({i}\)  # line {i} \(a\.b\)", joined) for i in range(220))
        assert len(fake.texts()) == len(sends)

        # a redelivery of the same message: nothing more is sent
        before = len(fake.sent)
        fake.redeliver(question)
        await wait_until(lambda: fake.confirmed > fake.updates[-1]["update_id"])
        (listed,) = await proc.call("channel:config:list", {})
        assert listed["counters"]["duplicates"] == 1 and listed["counters"]["received"] == 1
        # Telegram's 429: the sidecar waits retry_after and sends once
        fake.limit_next = 1.0
        await server.script({"text": "short answer"})
        fake.post("and now?")
        await replied(proc, session_id, 2)
        assert fake.limited == 1
        assert [p["text"] for m, p in fake.sent[before:] if m == "sendMessage"] == ["short answer"]
        # the host's path is closed for this channel
        with pytest.raises(CallError) as err:
            await proc.call("channel:message", {"channel": "tg", "chatId": "1", "chatType": "private",
                                                "sender": {"id": "7"}, "text": "x", "timestamp": 1})
        assert err.value.code == -32003
        delivery = (await proc.call("channel:messages", {"channel": "tg"}))["entries"][0]
        assert delivery["status"] == "replied" and delivery["senderName"] == "Alice"
        assert (await proc.call("channel:disconnect", {"id": "tg"}))["state"] == "disconnected"
        assert (await proc.call("channel:config:get", {"id": "tg"}))["status"]["state"] == "disconnected"
        await proc.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("chat.db*"))
    assert TELEGRAM_TOKEN.encode() not in stored
    assert TELEGRAM_TOKEN not in proc.stderr_text()


async def test_a_dropped_poll_and_a_restart_lose_nothing_and_repeat_nothing(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_telegram() as fake:
        async with spawn_sidecar(tmp_path) as proc:
            await configure_provider(proc, server.base_url)
            await telegram_channel(proc, fake, maxConcurrent=1)
            await proc.call("channel:connect", {"id": "tg"})
            await connected(proc)
            # the poll that carries the message drops mid-answer: it comes again
            fake.drop_next_poll = True
            await server.script({"text": "answer one"}, {"text": "answer two"})
            fake.post("one", message_id=1)
            await wait_until(lambda: fake.dropped == 1)
            fake.post("two", message_id=2)  # sent while the connection is down (its backoff)
            session_id = await session_of(proc)
            await replied(proc, session_id, 2)
            assert fake.texts() == ["answer one", "answer two"]

            # one reply hangs (it holds the one slot), the next waits: then a crash
            await server.script({"text": "partial", "fault": "stall"}, {"text": "answer four"})
            three = fake.post("three", message_id=3)
            four = fake.post("four", message_id=4)  # the same chat: it waits behind three
            await wait_until(lambda: fake.confirmed > fake.updates[-1]["update_id"])
            with anyio.fail_after(20):  # three's reply has reached the provider: it holds the slot
                while not any("three" in str(body.get("messages")) for body in await server.requests()):
                    await anyio.sleep(0.02)
            proc.send_signal(9)
            await proc.wait_exit()
        async with spawn_sidecar(tmp_path) as proc:
            await proc.call("sidecar:initialize", {})
            await connected(proc)  # the connection comes back by itself
            await replied(proc, session_id, 4)
            assert fake.texts()[:2] == ["answer one", "answer two"]
            rest = fake.texts()[2:]
            assert len(rest) == 2 and "answer four" in rest
            assert any(t.startswith("partial") or "interrupted" in t for t in rest)
            # the messages it already had come again: nothing is answered twice
            sent = len(fake.sent)
            fake.redeliver(three)
            fake.redeliver(four)
            await wait_until(lambda: fake.confirmed > fake.updates[-1]["update_id"])
            (listed,) = await proc.call("channel:config:list", {})
            assert listed["counters"]["duplicates"] == 2 and len(fake.sent) == sent
            await proc.close()


async def test_a_webhook_conflict_fails_the_connection_until_it_is_gone(tmp_path: Path) -> None:
    async with fake_telegram() as fake, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {})
        fake.webhook = True
        await telegram_channel(proc, fake)
        await proc.call("channel:connect", {"id": "tg"})
        status = await connected(proc, state="failed")
        assert "409" in status["error"] and "webhook" in status["error"] and status["retryAt"] > status["since"]
        fake.webhook = False
        await connected(proc)
        # a wrong token is not retried
        await telegram_channel(proc, fake, credentials={"botToken": "999:WRONG"})
        status = await connected(proc, state="failed")
        assert "refused the bot token" in status["error"] and status["retryAt"] is None
        assert "999:WRONG" not in status["error"]
        await proc.close()


async def test_a_server_that_answers_every_poll_at_once_with_what_was_confirmed_is_not_polled_in_a_loop(
    tmp_path: Path,
) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(tmp_path) as proc:
        await connected_and_answered(proc, server, fake, "once")
        fake.ignore_offset = True  # from now on the same update comes back at once, every time
        polls = fake.polls
        await anyio.sleep(2.5)
        assert fake.polls - polls <= 4, fake.polls - polls  # a poll a second at most (unpaced: 17 in this time)
        assert fake.texts() == ["once"]  # answered once
        assert (await proc.call("channel:config:get", {"id": "tg"}))["status"]["state"] == "connected"
        await proc.close()


async def test_at_debug_the_http_clients_request_lines_show_no_bot_token(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(tmp_path, "--log-level", "DEBUG") as proc:
        await connected_and_answered(proc, server, fake, "hi")
        await proc.close()
    log = proc.stderr_text()
    assert "/bot***/getUpdates" in log and "/bot***/sendMessage" in log  # the lines are there
    assert TELEGRAM_TOKEN not in log and TELEGRAM_TOKEN.split(":")[1] not in log


async def test_stream_mode_edits_the_message_in_place(tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(60))
    async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await telegram_channel(proc, fake, replyMode="stream", rate={"editIntervalMs": 200})
        await proc.call("channel:connect", {"id": "tg"})
        await connected(proc)
        await server.script({"text": words, "chunks": 30, "delay_ms": 40})
        fake.post("stream please")
        await replied(proc, await session_of(proc))
        sends = fake.texts("sendMessage")
        edits = [p for m, p in fake.sent if m == "editMessageText"]
        assert len(sends) == 1 and edits
        assert all(p["message_id"] == edits[0]["message_id"] for p in edits)
        assert fake.messages[("777", edits[0]["message_id"])] == words
        await proc.close()


async def test_a_photo_is_downloaded_into_the_users_turn(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url, models=[{"id": "scripted-1", "supportsImages": True}])
        await telegram_channel(proc, fake)
        await proc.call("channel:connect", {"id": "tg"})
        await connected(proc)
        await server.script({"text": "a fine picture"})
        fake.post("", caption="what is this?", photo=[{"file_id": "small", "width": 90}, {"file_id": "big", "width": 800}])
        session_id = await session_of(proc)
        await replied(proc, session_id)
        (user,) = [m for m in await proc.call("chat:messages:get", {"sessionId": session_id}) if m["role"] == "user"]
        images = [p for p in user["parts"] if p["type"] == "image"]
        assert len(images) == 1 and images[0]["mimeType"] == "image/png"
        assert images[0]["url"].endswith("-big.png")  # the largest size of the photo is the one taken
        stored = [p for p in (tmp_path / "attachments").rglob("*") if p.is_file()]
        assert [p.read_bytes() for p in stored] == [b"\x89PNG fake image bytes"]
        assert user["parts"][0] == {"type": "text", "text": "what is this?"}
        sent_image = base64.b64encode(b"\x89PNG fake image bytes").decode()
        assert any(sent_image in str(body.get("messages")) for body in await server.requests())  # the model saw it
        assert fake.texts() == ["a fine picture"]
        await proc.close()


async def test_an_image_in_the_reply_is_sent_as_a_photo_after_its_text(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await telegram_channel(proc, fake)
        await proc.call("channel:connect", {"id": "tg"})
        await connected(proc)
        await server.script({"text": "Here is the chart:\n\n![sales by month](https://img.example/chart.png)"})
        fake.post("show me the chart")
        await replied(proc, await session_of(proc))
        methods = [m for m, _ in fake.sent]
        assert methods == ["sendMessage", "sendPhoto"]
        photo = fake.sent[1][1]
        assert photo["photo"] == "https://img.example/chart.png" and photo["caption"] == "sales by month"
        assert fake.texts() == ["Here is the chart:\n\nsales by month"]  # the image stands as its alt text
        await proc.close()
