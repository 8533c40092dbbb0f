"""Whatever a platform sends, the channel's connection keeps serving.

The fakes of tests/platform_fakes.py (on loopback) hand the sidecar (in process)
realistic events mutated as tests/test_provider_bytes_property.py mutates a provider's
events (values of any type and size, keys dropped): Telegram's getUpdates (messages with
entities, a reply, a photo, a document, a caption, an edit, a callback query) and
Discord's gateway (MESSAGE_CREATE and other dispatches, their sequence numbers, frames of
other opcodes) and Slack's Socket Mode envelopes (messages, mentions, thread replies,
edits, files). Then one well-formed message from another chat. What must hold: that
message is answered, the connection is ``connected``, every session is readable, nothing
is logged as a traceback, and every line sent validates against the generated schema
(spawn_sidecar checks it on exit). The draws are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from chat_helpers import configure_provider
from hypothesis import given
from hypothesis import strategies as st
from platform_fakes import (
    DISCORD_TOKEN,
    SLACK_APP_TOKEN,
    SLACK_BOT_TOKEN,
    TELEGRAM_TOKEN,
    fake_discord,
    fake_slack,
    fake_telegram,
    wait_until,
)
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar
from mutation import fixed_draws, mutated_document, sendable

pytestmark = pytest.mark.anyio

UPDATES = 10
EXAMPLES = 3
LAST_CHAT = 999_999
PEOPLE = {"id": 7, "is_bot": False, "first_name": "Alice", "username": "alice"}
CHAT = {"id": -100, "type": "supergroup", "title": "Team"}
MESSAGES: list[dict[str, Any]] = [
    {"message_id": 11, "date": 1_700_000_000, "chat": CHAT, "from": PEOPLE, "text": "@MyBot hi /new@MyBot",
     "entities": [{"type": "mention", "offset": 0, "length": 6}, {"type": "bot_command", "offset": 10, "length": 10}]},
    {"message_id": 12, "date": 1_700_000_001, "chat": {"id": 7, "type": "private"}, "from": PEOPLE, "text": "and this?",
     "reply_to_message": {"message_id": 3, "from": {"id": 4242, "is_bot": True, "first_name": "Helper"},
                          "text": "an earlier answer"}},
    {"message_id": 13, "date": 1_700_000_002, "chat": {"id": 7, "type": "private"}, "from": PEOPLE,
     "caption": "look", "photo": [{"file_id": "p1", "file_unique_id": "u1", "width": 90, "height": 90, "file_size": 10}]},
    {"message_id": 14, "date": 1_700_000_003, "chat": {"id": 7, "type": "private"}, "from": PEOPLE,
     "document": {"file_id": "d1", "file_unique_id": "u2", "file_name": "a.txt", "mime_type": "text/plain", "file_size": 3}},
    {"message_id": 15, "date": 1_700_000_004, "chat": CHAT, "from": PEOPLE, "text": "in a topic",
     "message_thread_id": 5, "is_topic_message": True},
]


async def open_channel(proc: SidecarProcess, provider_url: str, channel: str, platform: str,
                       connection: dict[str, Any], credentials: dict[str, str]) -> None:
    """The scripted provider as the default model, and a channel open to everyone, connecting."""
    await configure_provider(proc, provider_url)
    await proc.call("channel:config:upsert", {"id": channel, "platform": platform, "allowEveryone": True,
                                              "connection": connection, "credentials": credentials})
    await proc.call("channel:connect", {"id": channel})


async def still_serving(proc: SidecarProcess, channel: str, answered: Callable[[], bool], sent: Any) -> None:
    """The last good message is answered, the connection is up, every session reads; then a
    clean stop (``sent``: what the platform sent, shown when the connection is not up)."""
    await wait_until(answered, timeout=60)
    status = (await proc.call("channel:config:get", {"id": channel}))["status"]
    assert status["state"] == "connected", (status, json.dumps(sent)[:3000])
    for session in (await proc.call("chat:session:list", {"limit": 500}))["sessions"]:
        await proc.call("chat:messages:get", {"sessionId": session["id"]})
    with anyio.fail_after(30):
        await proc.call("channel:disconnect", {"id": channel})
    await proc.close(timeout=60)


@st.composite
def updates(draw: st.DrawFn) -> dict[str, Any]:
    """One update (without its ``update_id``, which the fake numbers)."""
    message = draw(st.sampled_from(MESSAGES))
    kind = draw(st.sampled_from(["message", "message", "edited_message", "callback_query"]))
    body: dict[str, Any] = {kind: message} if kind != "callback_query" else {
        kind: {"id": "cb1", "from": PEOPLE, "data": "x", "message": message}}
    if not draw(st.integers(0, 4)):
        return body
    mutated = sendable(draw(mutated_document(body)))
    return mutated if isinstance(mutated, dict) else {kind: mutated}


@fixed_draws(EXAMPLES)
@given(batch=st.lists(updates(), min_size=UPDATES, max_size=UPDATES))
async def test_no_update_stops_the_polling_connection(
    tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]]
) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, \
            spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await open_channel(proc, server.base_url, "tg", "telegram",
                           {"kind": "telegram_polling", "apiBaseUrl": fake.base_url, "pollTimeoutS": 2},
                           {"botToken": TELEGRAM_TOKEN})
        for update in batch:
            fake.updates.append({"update_id": next(fake._update_ids), **update})
        fake.post("still there?", chat_id=LAST_CHAT)  # wakes the long poll

        def answered() -> bool:
            return any(m == "sendMessage" and p.get("chat_id") in (LAST_CHAT, str(LAST_CHAT)) for m, p in fake.sent)

        await still_serving(proc, "tg", answered, batch)
    proc.assert_no_traceback()


DISCORD_MESSAGE: dict[str, Any] = {
    "id": "7001", "channel_id": "3001", "guild_id": "2001", "author": {"id": "1001", "username": "alice"},
    "content": "<@9001> hello", "timestamp": "2026-01-01T00:00:00+00:00", "type": 0,
    "mentions": [{"id": "9001", "username": "sidecar", "bot": True}], "mention_everyone": False,
    "attachments": [{"id": "a1", "filename": "a.txt", "size": 3, "url": "http://127.0.0.1:9/a.txt",
                     "content_type": "text/plain"}],
    "message_reference": {"message_id": "6999", "channel_id": "3001"},
}
DISPATCHES = ["MESSAGE_CREATE", "MESSAGE_CREATE", "MESSAGE_UPDATE", "INTERACTION_CREATE", "GUILD_CREATE", "TYPING_START"]


@st.composite
def gateway_frames(draw: st.DrawFn) -> tuple[str, Any]:
    """("dispatch", (t, d)) or ("frame", a whole frame of any opcode but reconnect/invalid session)."""
    if draw(st.integers(0, 5)):
        data = sendable(draw(mutated_document(DISCORD_MESSAGE))) if draw(st.integers(0, 4)) else DISCORD_MESSAGE
        return "dispatch", (draw(st.sampled_from(DISPATCHES)), data)
    frame = {"op": draw(st.sampled_from([0, 1, 11, 3, 99])), "t": draw(st.sampled_from(DISPATCHES)), "s": 1,
             "d": DISCORD_MESSAGE}
    return "frame", sendable(draw(mutated_document(frame)))


@fixed_draws(EXAMPLES)
@given(frames=st.lists(gateway_frames(), min_size=UPDATES, max_size=UPDATES))
async def test_no_gateway_event_stops_the_discord_connection(
    tmp_path_factory: pytest.TempPathFactory, frames: list[tuple[str, Any]]
) -> None:
    async with scripted_provider() as server, fake_discord() as fake, \
            spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await open_channel(proc, server.base_url, "dc", "discord", {"kind": "discord_gateway", "apiBaseUrl": fake.api_url},
                           {"botToken": DISCORD_TOKEN})
        with anyio.fail_after(30):
            await fake.connected.wait()
        for kind, body in frames:
            if fake._socket is None:
                with anyio.fail_after(30):
                    await fake.connected.wait()
            if kind == "dispatch":
                await fake.dispatch(*body)
            else:
                await fake._socket.send_text(json.dumps(body))  # type: ignore[union-attr]
        with anyio.fail_after(30):
            await fake.connected.wait()
        await fake.post(fake.message("<@9001> still there?", channel_id="9999"))

        def answered() -> bool:
            return any(m == "POST" and path.endswith("/channels/9999/messages") for m, path, _ in fake.sent)

        await still_serving(proc, "dc", answered, frames)
    proc.assert_no_traceback()


SLACK_EVENTS: list[dict[str, Any]] = [
    {"type": "app_mention", "channel": "C1", "user": "U1", "text": "<@UBOT> hi", "ts": "1700000000.000001",
     "channel_type": "channel"},
    {"type": "message", "channel": "D1", "user": "U1", "text": "in a thread", "ts": "1700000000.000002",
     "thread_ts": "1700000000.000001", "channel_type": "im"},
    {"type": "message", "subtype": "message_changed", "channel": "D1", "channel_type": "im",
     "message": {"user": "U1", "text": "edited", "ts": "1700000000.000002"}, "ts": "1700000000.000003"},
    {"type": "message", "channel": "D1", "user": "U1", "text": "a file", "ts": "1700000000.000004", "channel_type": "im",
     "files": [{"id": "F1", "name": "a.txt", "mimetype": "text/plain", "size": 3,
                "url_private": "http://127.0.0.1:9/files-pri/T1-F1/a.txt"}]},
    {"type": "message", "subtype": "bot_message", "channel": "D1", "bot_id": "B2", "text": "a bot", "ts": "1700000000.000005",
     "channel_type": "im"},
]


@st.composite
def socket_envelopes(draw: st.DrawFn) -> dict[str, Any]:
    event = draw(st.sampled_from(SLACK_EVENTS))
    envelope = {"envelope_id": f"fz-{draw(st.integers(0, 10**6))}", "type": "events_api", "accepts_response_payload": False,
                "retry_attempt": 0, "retry_reason": "",
                "payload": {"type": "event_callback", "event": event, "event_id": "Ev1"}}
    return sendable(draw(mutated_document(envelope))) if draw(st.integers(0, 4)) else envelope


@fixed_draws(EXAMPLES)
@given(envelopes=st.lists(socket_envelopes(), min_size=UPDATES, max_size=UPDATES))
async def test_no_envelope_stops_the_slack_connection(
    tmp_path_factory: pytest.TempPathFactory, envelopes: list[Any]
) -> None:
    async with scripted_provider() as server, fake_slack() as fake, \
            spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await open_channel(proc, server.base_url, "sl", "slack", {"kind": "slack_socket", "apiBaseUrl": fake.api_url},
                           {"botToken": SLACK_BOT_TOKEN, "appToken": SLACK_APP_TOKEN})
        for envelope in envelopes:
            with anyio.fail_after(30):
                await fake.connected.wait()
            if fake._socket is not None:
                await fake._socket.send_text(json.dumps(envelope))
        with anyio.fail_after(30):
            await fake.connected.wait()
        await fake.post(fake.event("still there?", channel="D9", channel_type="im"))

        def answered() -> bool:
            return any(p.get("channel") == "D9" for p in fake.posts())

        await still_serving(proc, "sl", answered, envelopes)
    proc.assert_no_traceback()
