"""Whatever session updates and prompt result an agent sends, the ACP turn ends once, its
events keep the wire contract, and the conversation stays readable.

The scripted agent (a real subprocess) sends, for each turn, a realistic set of updates
(text and thought chunks, tool calls with a diff and their updates, a plan, usage, kinds
it does not know) and a prompt result, each mutated as tests/test_provider_bytes_property.py
mutates a provider's events: values of any type and size, keys dropped, updates dropped,
repeated or swapped. For every turn: exactly one final event, ``seq`` without gaps; at the
end every message is readable, no traceback was logged, and every line sent validates
against the generated schema (spawn_sidecar checks it on exit). The draws are fixed
(``derandomize``): a failure replays.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import FINAL_TYPES, assert_well_ordered, events_of
from hypothesis import given
from hypothesis import strategies as st
from sidecar_proc import spawn_sidecar
from mutation import edited, fixed_draws, mutated_document

pytestmark = pytest.mark.anyio

TURNS = 12
"""Turns of one example (one sidecar and agent): drawn before they start."""
EXAMPLES = 3
UPDATES: list[dict[str, Any]] = [
    {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}},
    {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hello "}, "messageId": "m-1"},
    {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Edit config", "kind": "edit", "status": "pending",
     "rawInput": {"path": "/w/a.txt"}, "locations": [{"path": "/w/a.txt", "line": 1}],
     "content": [{"type": "diff", "path": "/w/a.txt", "oldText": "a\nb\n", "newText": "a\nc\n"}]},
    {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "in_progress",
     "content": [{"type": "content", "content": {"type": "text", "text": "working"}}]},
    {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed", "rawOutput": {"ok": 1}},
    {"sessionUpdate": "plan", "entries": [{"content": "Look", "priority": "high", "status": "completed"},
                                          {"content": "Write", "priority": "medium", "status": "pending"}]},
    {"sessionUpdate": "usage_update", "used": 1234, "size": 200000, "cost": {"amount": 0.01, "currency": "USD"}},
    {"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="}},
    {"sessionUpdate": "brand_new_kind", "payload": {"deep": [1, 2, 3]}},
    {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "world"}},
]
RESULT: dict[str, Any] = {"stopReason": "end_turn", "usage": {"inputTokens": 11, "outputTokens": 7, "totalTokens": 18}}


@st.composite
def agent_turns(draw: st.DrawFn) -> str:
    """The prompt that makes the scripted agent send one mutated turn."""
    updates = draw(edited(UPDATES))
    updates = [draw(mutated_document(u)) if draw(st.integers(0, 2)) == 0 else u for u in updates]
    result = draw(mutated_document(RESULT)) if draw(st.booleans()) else RESULT
    # JSON has no Infinity: an agent that sent it would send a line that is no message at all
    # (its answer lost, as if it never answered: the user stops such a turn)
    script = json.loads(json.dumps({"updates": updates, "result": result}), parse_constant=lambda _: None)
    return "raw " + base64.b64encode(json.dumps(script, allow_nan=False).encode()).decode()


@fixed_draws(EXAMPLES)
@given(prompts=st.lists(agent_turns(), min_size=TURNS, max_size=TURNS))
async def test_any_agent_turn_ends_once_and_keeps_the_store(
    tmp_path_factory: pytest.TempPathFactory, prompts: list[str]
) -> None:
    async with spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"], title="fuzz")
        for prompt in prompts:
            sent, final = await send_and_wait(proc, session["id"], prompt, timeout=30)
            assert final["type"] in FINAL_TYPES, prompt
            assert_well_ordered(events_of(proc, sent["messageId"]))
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"],
                                                         "options": {"allBranches": True, "includeAcpParts": True}})
        assert sum(m["role"] == "user" for m in messages) == TURNS
        assert all(m["status"] not in ("streaming", "pending") for m in messages), [m["status"] for m in messages]
        await proc.call("chat:session:get", {"id": session["id"]})
        await proc.close(timeout=60)
    proc.assert_no_traceback()
