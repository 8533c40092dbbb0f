"""The Discord gateway and Slack Socket Mode owned by the sidecar, over a real subprocess
against fake platforms on loopback (tests/platform_fakes.py): a message in and the reply out
(split at Discord's 2,000 characters with fences kept; Slack blocks), heartbeats and their
ACKs, a dropped gateway resumed with the missed message answered once, an invalid session
re-identified, Discord's rate-limit headers and 429, a redelivery answered once, Slack's
envelope acks, a redelivered envelope and a ``disconnect``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider
from platform_fakes import (
    DISCORD_TOKEN,
    SLACK_APP_TOKEN,
    SLACK_BOT_TOKEN,
    FakeDiscord,
    FakeSlack,
    fake_discord,
    fake_slack,
    wait_until,
)
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar
from test_channels_telegram_e2e import connected

pytestmark = [pytest.mark.anyio, pytest.mark.sidecar_subprocess]  # over the subprocess, as the host runs it

CODE = "```js\n" + "\n".join(f"console.log({i}); // line {i}" for i in range(400)) + "\n```"


async def answered(proc: SidecarProcess, channel: str, count: int) -> None:
    """``count`` messages answered, each reply's deliveries all acknowledged."""
    with anyio.fail_after(60):
        while True:
            log = (await proc.call("channel:messages", {"channel": channel, "status": "replied"}))["entries"]
            if len(log) >= count:
                states = []
                for entry in log:
                    path = await proc.call("chat:messages:get", {"sessionId": entry["sessionId"]})
                    states += [(m.get("delivery") or {}).get("status") for m in path if m["role"] == "assistant"]
                if all(s == "delivered" for s in states):
                    return
            await anyio.sleep(0.05)


async def discord_channel(proc: SidecarProcess, fake: FakeDiscord, **fields: Any) -> None:
    await proc.call("channel:config:upsert", {
        "id": "dc", "platform": "discord", "allowEveryone": True,
        "connection": {"kind": "discord_gateway", "apiBaseUrl": fake.api_url}, "credentials": {"botToken": DISCORD_TOKEN},
        **fields,
    })
    await proc.call("channel:connect", {"id": "dc"})
    await connected(proc, "dc")


async def test_discord_gateway_reply_split_resume_and_rate_limits(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_discord() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await discord_channel(proc, fake)
        assert fake.identifies == 1
        assert (await proc.call("channel:config:get", {"id": "dc"}))["status"]["botUserId"] == "9001"
        await wait_until(lambda: fake.heartbeats >= 2)  # heartbeats go on, each ACKed

        # a mention in a guild channel: the reply, split at 2,000, fences closed and reopened;
        # more than the channel's bucket of 5: the rate-limit headers are waited out
        await server.script({"text": f"Here:\n\n{CODE}\n\ndone", "chunks": 20})
        fake.limit_next = 0.5  # and the first send gets a 429 with retry_after
        asked = fake.message("<@9001> show me the code")
        await fake.post(asked)
        await answered(proc, "dc", 1)
        posts = [b for m, _, b in fake.sent if m == "POST"]
        # one 429 (the one asked for): the bucket's headers were waited out, never overrun
        assert len(posts) > 5 and fake.limited == 1
        assert all(len(b["content"]) <= 2000 and b["allowed_mentions"] == {"parse": [], "replied_user": False} for b in posts)
        assert posts[0]["message_reference"] == {"message_id": asked["id"], "fail_if_not_exists": False}
        for body in posts[1:]:
            assert "message_reference" not in body
        for body in posts:
            if "console.log" in body["content"]:
                fences = [line for line in body["content"].split("\n") if line.startswith("```")]
                assert len(fences) % 2 == 0 and fences[0] == "```js"
        joined = "\n".join(b["content"] for b in posts)
        assert all(f"console.log({i}); // line {i}" in joined for i in range(400))
        assert [b["content"] for b in posts] == fake.contents()

        # the gateway drops; a message comes while it is down; the client resumes and the
        # missed message is replayed and answered once
        await server.script({"text": "missed but answered"})
        await fake.drop()
        await fake.post(fake.message("<@9001> are you there?"))
        with anyio.fail_after(30):
            await fake.connected.wait()
        await answered(proc, "dc", 2)
        assert fake.resumes == 1 and fake.identifies == 1
        assert fake.contents().count("missed but answered") == 1

        # the same MESSAGE_CREATE again (a repeated dispatch): no second reply
        before = len(fake.sent)
        await fake.post(asked)
        with anyio.fail_after(20):
            while (await proc.call("channel:config:get", {"id": "dc"}))["counters"]["duplicates"] < 1:
                await anyio.sleep(0.05)
        assert len(fake.sent) == before

        # an invalid session: a new IDENTIFY (after Discord's 1-5 s)
        await fake.send_op(9, False)
        await wait_until(lambda: fake.identifies == 2)
        with anyio.fail_after(30):
            await fake.connected.wait()
        # a reconnect request: resumed at once
        await fake.send_op(7)
        await wait_until(lambda: fake.resumes == 2)
        await server.script({"text": "still here"})
        await fake.post(fake.message("<@9001> once more"))
        await answered(proc, "dc", 3)
        assert fake.contents()[-1] == "still here"
        await proc.close()
    assert DISCORD_TOKEN not in proc.stderr_text()


async def test_discord_zombie_connections_and_stream_edits(tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(50))
    async with scripted_provider() as server, fake_discord() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await discord_channel(proc, fake, replyMode="stream", rate={"editIntervalMs": 200})
        # no heartbeat ACK: the client closes the zombie connection and resumes
        fake.acks = False
        await wait_until(lambda: fake.resumes >= 1)
        fake.acks = True
        await server.script({"text": words, "chunks": 25, "delay_ms": 40})
        await fake.post(fake.message("hello in a DM", guild_id=None, channel_id="4001"))
        await answered(proc, "dc", 1)
        posts = [(p, b) for m, p, b in fake.sent if m == "POST"]
        patches = [(p, b) for m, p, b in fake.sent if m == "PATCH"]
        assert len(posts) == 1 and patches and patches[-1][1]["content"] == words
        assert all(p.startswith("/api/v10/channels/4001/messages/") for p, _ in patches)
        await proc.close()


async def slack_channel(proc: SidecarProcess, fake: FakeSlack, **fields: Any) -> None:
    await proc.call("channel:config:upsert", {
        "id": "sl", "platform": "slack", "allowEveryone": True,
        "connection": {"kind": "slack_socket", "apiBaseUrl": fake.api_url},
        "credentials": {"botToken": SLACK_BOT_TOKEN, "appToken": SLACK_APP_TOKEN}, **fields,
    })
    await proc.call("channel:connect", {"id": "sl"})
    await connected(proc, "sl")


async def test_slack_socket_mode_acks_redeliveries_and_disconnects(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_slack() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await slack_channel(proc, fake)
        assert (await proc.call("channel:config:get", {"id": "sl"}))["credentials"] == {"botToken": "***", "appToken": "***"}
        await server.script({"text": "**hello** from the bot"})
        event = fake.event("<@UBOT> hi there", kind="app_mention", thread_ts="1699999999.000001")
        envelope = await fake.post(event)
        # the same message as a message event: one turn
        duplicate = await fake.post({**event, "type": "message"})
        await answered(proc, "sl", 1)
        await wait_until(lambda: {envelope, duplicate} <= set(fake.acked))
        (post,) = fake.posts()
        assert post["channel"] == "C1" and post["thread_ts"] == "1699999999.000001"
        assert post["blocks"] == [{"type": "section", "text": {"type": "mrkdwn", "text": "*hello* from the bot"}}]
        assert post["link_names"] is False

        # an envelope Slack sends again (its ack was late): acknowledged, not answered again
        again = await fake.post(event)
        await wait_until(lambda: again in fake.acked)
        # Slack asks for a new socket: the client opens one; a 429 on the reply is waited out
        await fake.disconnect("refresh_requested")
        await wait_until(lambda: fake.sockets == 2)
        with anyio.fail_after(30):
            await fake.connected.wait()
        fake.limit_next = 1.0
        await server.script({"text": "after the refresh"})
        await fake.post(fake.event("<@UBOT> still there?", kind="app_mention"))
        await answered(proc, "sl", 2)
        assert fake.limited == 1 and [p["text"] for p in fake.posts()] == ["*hello* from the bot", "after the refresh"]
        # a dropped socket: the unacknowledged envelope comes again on the next one
        await fake.drop()
        await server.script({"text": "answered once"})
        late = await fake.post(fake.event("<@UBOT> while you were away", kind="app_mention"))
        await wait_until(lambda: late in fake.acked)
        await answered(proc, "sl", 3)
        assert [p["text"] for p in fake.posts()].count("answered once") == 1
        (listed,) = await proc.call("channel:config:list", {})
        assert listed["counters"]["duplicates"] == 2 and listed["counters"]["replied"] == 3
        await proc.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("chat.db*"))
    assert SLACK_BOT_TOKEN.encode() not in stored and SLACK_APP_TOKEN.encode() not in stored


async def test_a_platform_that_asks_for_a_new_socket_again_and_again_is_answered_after_a_backoff(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_slack() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url)
        await slack_channel(proc, fake)
        fake.disconnect_at_hello = True
        await fake.disconnect("refresh_requested")  # the first request is answered at once
        await wait_until(lambda: fake.sockets == 2)
        await anyio.sleep(3.5)  # then 1 s, 2 s: sockets 3 and 4 (unpaced: one after another)
        assert 3 <= fake.sockets <= 5, fake.sockets
        fake.disconnect_at_hello = False  # Slack is right again: the next socket stays, and serves
        await server.script({"text": "back"})
        envelope = await fake.post(fake.event("<@UBOT> are you back?", kind="app_mention"))
        await wait_until(lambda: envelope in fake.acked, timeout=70)
        await answered(proc, "sl", 1)
        assert [p["text"] for p in fake.posts()] == ["back"]
        await proc.close()


async def test_slack_files_shared_in_a_message_reach_the_users_turn(tmp_path: Path) -> None:
    async with scripted_provider() as server, fake_slack() as fake, spawn_sidecar(tmp_path) as proc:
        await configure_provider(proc, server.base_url, models=[{"id": "scripted-1", "supportsImages": True}])
        await slack_channel(proc, fake)
        fake.files["chart.png"] = (b"\x89PNG slack chart", "image/png")
        await server.script({"text": "a chart of sales"})
        await fake.post(fake.event("<@UBOT> what is this?", kind="app_mention", files=[
            {"id": "F1", "name": "chart.png", "mimetype": "image/png", "url_private_download": fake.file_url("chart.png")},
            {"id": "F2", "name": "gone.txt", "mimetype": "text/plain", "url_private_download": fake.file_url("gone.txt")},
        ]))
        await answered(proc, "sl", 1)
        (entry,) = (await proc.call("channel:messages", {"channel": "sl"}))["entries"]
        (user,) = [m for m in await proc.call("chat:messages:get", {"sessionId": entry["sessionId"]}) if m["role"] == "user"]
        images = [p for p in user["parts"] if p["type"] == "image"]
        assert len(images) == 1 and images[0]["mimeType"] == "image/png"  # the missing file is left out
        stored = [p.read_bytes() for p in (tmp_path / "attachments").rglob("*") if p.is_file()]
        assert stored == [b"\x89PNG slack chart"]  # fetched with the bot token (the fake serves no one else)
        assert [p["text"] for p in fake.posts()] == ["a chart of sales"]
        await proc.close()
