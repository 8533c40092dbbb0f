"""Whatever updates Telegram's getUpdates returns, the polling connection keeps serving.

The fake Telegram (tests/platform_fakes.py, on loopback) hands the sidecar (in process)
realistic updates (messages with entities, a reply, a photo, a document, a caption, an
edit, a callback query) mutated as tests/test_provider_bytes_property.py mutates a
provider's events: values of any type and size, keys dropped. Then one well-formed
message from another chat. What must hold: that message is answered, the connection is
still ``connected``, every session is readable, nothing is logged as a traceback, and
every line sent validates against the generated schema (spawn_sidecar checks it on exit).
The draws are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from chat_helpers import configure_provider
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from platform_fakes import TELEGRAM_TOKEN, fake_telegram, wait_until
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar
from test_provider_bytes_property import mutated_document

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


def _clean(value: Any) -> Any:
    """What the fake can send as JSON: no Infinity, no lone surrogate (its encoder refuses both)."""
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    return value


@st.composite
def updates(draw: st.DrawFn) -> dict[str, Any]:
    """One update (without its ``update_id``, which the fake numbers)."""
    message = draw(st.sampled_from(MESSAGES))
    kind = draw(st.sampled_from(["message", "message", "edited_message", "callback_query"]))
    body: dict[str, Any] = {kind: message} if kind != "callback_query" else {
        kind: {"id": "cb1", "from": PEOPLE, "data": "x", "message": message}}
    if not draw(st.integers(0, 4)):
        return body
    mutated = _clean(draw(mutated_document(body)))
    return mutated if isinstance(mutated, dict) else {kind: mutated}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(updates(), min_size=UPDATES, max_size=UPDATES))
async def test_no_update_stops_the_polling_connection(
    tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]]
) -> None:
    async with scripted_provider() as server, fake_telegram() as fake, \
            spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("channel:config:upsert", {
            "id": "tg", "platform": "telegram", "allowEveryone": True,
            "connection": {"kind": "telegram_polling", "apiBaseUrl": fake.base_url, "pollTimeoutS": 2},
            "credentials": {"botToken": TELEGRAM_TOKEN},
        })
        await proc.call("channel:connect", {"id": "tg"})
        for update in batch:
            fake.updates.append({"update_id": next(fake._update_ids), **update})
        fake.post("still there?", chat_id=LAST_CHAT)  # wakes the long poll

        def answered() -> bool:
            return any(m == "sendMessage" and p.get("chat_id") in (LAST_CHAT, str(LAST_CHAT)) for m, p in fake.sent)

        await wait_until(answered, timeout=60)
        status = (await proc.call("channel:config:get", {"id": "tg"}))["status"]
        assert status["state"] == "connected", (status, json.dumps(batch)[:3000])
        for session in (await proc.call("chat:session:list", {"limit": 500}))["sessions"]:
            await proc.call("chat:messages:get", {"sessionId": session["id"]})
        with anyio.fail_after(30):
            await proc.call("channel:disconnect", {"id": "tg"})
        await proc.close(timeout=60)
    stderr = proc.stderr_text()
    start = stderr.find("Traceback")
    assert start < 0, stderr[max(0, start - 800): start + 4000]
