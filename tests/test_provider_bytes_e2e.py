"""Whatever a provider sends, a turn ends once, its events keep the wire contract, and the
conversation stays readable.

The sidecar (in process) talks to the scripted provider on loopback, which answers each
turn with the bytes of one mutated recording (tests/test_provider_bytes_property.py
draws them: any family, stream or whole, values of any type and size, cut anywhere). For
every turn: exactly one final event, ``seq`` without gaps, no traceback in the log; at the
end every session's messages and totals are readable and every line sent validates
against the generated schema (spawn_sidecar checks it on exit). The draws are fixed
(``derandomize``): a failure replays.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import FINAL_TYPES, assert_well_ordered, events_of, wait_final
from hypothesis import given
from hypothesis import strategies as st
from mutation import fixed_draws
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar
from test_provider_bytes_property import provider_answers

from protocol.limits import INT64_MAX
from sidecar.providers.replay import Reply

pytestmark = pytest.mark.anyio

TURNS = 12
"""Turns of one example (one sidecar): drawn before it starts, within what one example may draw."""
EXAMPLES = 5


def raw_reply(reply: Reply) -> dict[str, Any]:
    """The scripted provider's ``raw`` reply serving what ``reply`` holds."""
    return {"raw": {"status": reply.status, "content_type": reply.headers.get("content-type", ""),
                    "body_b64": base64.b64encode(b"".join(reply.chunks)).decode()}}


@fixed_draws(EXAMPLES)
@given(answers=st.lists(provider_answers(), min_size=TURNS, max_size=TURNS))
async def test_any_provider_answer_ends_the_turn_once_and_keeps_the_store(
    tmp_path_factory: pytest.TempPathFactory, answers: list[tuple[str, bool, Reply]]
) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        sessions: dict[str, str] = {}
        for family, base_url in (("openai-compat", server.base_url), ("anthropic", server.root), ("ollama", server.root)):
            provider = await proc.call("provider:upsert", {
                "name": family, "type": family, "baseUrl": base_url, "apiKey": "sk-test-0123456789",
                "models": [{"id": "m-1", "contextWindow": 32000, "inputPrice": 1.0, "outputPrice": 2.0,
                            "stream": True}, {"id": "m-whole", "contextWindow": 32000, "stream": False}],
            })
            for model in ("m-1", "m-whole"):
                session = await proc.call("chat:session:create", {"providerId": provider["id"], "modelId": model, "title": "fuzz"})
                sessions[f"{family}/{model}"] = session["id"]
        sent_by_session: dict[str, int] = {}
        for family, stream, reply in answers:
            session_id = sessions[f"{family}/{'m-1' if stream else 'm-whole'}"]
            script = raw_reply(reply)
            await server.script(script)
            sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "hi"}})
            final = await wait_final(proc, sent["messageId"], timeout=30)
            assert final["type"] in FINAL_TYPES, script
            events = events_of(proc, sent["messageId"])
            assert_well_ordered(events)
            sent_by_session[session_id] = sent_by_session.get(session_id, 0) + 1
        for session_id, turns in sent_by_session.items():
            messages = await proc.call("chat:messages:get", {"sessionId": session_id})
            assert sum(m["role"] == "user" for m in messages) == turns
            assert all(m["status"] not in ("streaming", "pending") for m in messages), [m["status"] for m in messages]
            session = await proc.call("chat:session:get", {"id": session_id})
            assert 0 <= session["totalTokens"] <= INT64_MAX and session["totalCost"] >= 0, session
        await proc.close(timeout=60)
    proc.assert_no_traceback()


@pytest.mark.parametrize("reported", [10**30, -813, 2**63])
async def test_a_count_that_is_no_count_is_not_reported_and_the_rest_is_kept(tmp_path: Path, reported: int) -> None:
    body = "".join(f"data: {json.dumps(event)}\n\n" for event in [
        {"choices": [{"index": 0, "delta": {"content": "hello"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": reported, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": reported}}},
    ]) + "data: [DONE]\n\n"
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=[body.encode()])
    async with scripted_provider() as server, spawn_sidecar(tmp_path) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        provider = await proc.call("provider:upsert", {"name": "p", "type": "openai-compat", "baseUrl": server.base_url,
                                                       "models": [{"id": "m", "inputPrice": 1.0, "outputPrice": 2.0}]})
        session = await proc.call("chat:session:create", {"providerId": provider["id"], "modelId": "m", "title": "usage"})
        for _ in range(2):
            await server.script(raw_reply(reply))
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hi"}})
            final = await wait_final(proc, sent["messageId"])
            assert final["type"] == "stream_end"
            assert final["usage"]["inputTokens"] == 0 and final["usage"]["outputTokens"] == 3
            assert final["usage"]["cacheReadTokens"] is None
        stored = (await proc.call("chat:messages:get", {"sessionId": session["id"]}))[-1]
        assert stored["textContent"] == "hello" and stored["usage"]["outputTokens"] == 3
        session = await proc.call("chat:session:get", {"id": session["id"]})
        assert session["totalTokens"] == 6
        assert session["usageByKind"]["reply"]["calls"] == 2
        assert session["totalCost"] == pytest.approx(2 * 3 * 2.0 / 1e6)
        await proc.close(timeout=60)
    assert "Traceback" not in proc.stderr_text()
