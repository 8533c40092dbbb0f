"""Whatever events the Qiming server streams for a forwarded turn, the turn ends once.

The fake server (a real subprocess on loopback) streams, for each turn of a ``server``
session, realistic AgentOutputDto events (text and thinking chunks, tool activity, heart
beats, a finished message) and a FINAL_RESULT, mutated as tests/test_provider_bytes_property.py
mutates a provider's events (values of any type and size, keys dropped, events dropped,
repeated or swapped). For every turn: exactly one final event (a stream that never ends
properly is re-attached, then given up as an error, never waited on for ever), ``seq``
without gaps; at the end every message is readable, no traceback was logged and every line
sent validates against the generated schema (spawn_sidecar checks it on exit). The draws
are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

from typing import Any

import pytest
from chat_helpers import FINAL_TYPES, assert_well_ordered, events_of, wait_final
from hypothesis import given
from hypothesis import strategies as st
from qiming_helpers import all_messages, configure, qiming_server
from sidecar_proc import spawn_sidecar
from mutation import edited, fixed_draws, mutated_document, sendable

pytestmark = pytest.mark.anyio

TURNS = 4
EXAMPLES = 3
TOOL: dict[str, Any] = {"targetId": -1, "name": "Bash ls", "originalTitle": "Bash ls", "type": "ToolCall",
                        "status": "EXECUTING", "result": {"id": -1, "type": "ToolCall", "executeId": "toolu_1",
                                                          "input": {"command": "ls"}, "kind": "execute"}}
EVENTS: list[dict[str, Any]] = [
    {"requestId": "r", "eventType": "MESSAGE", "error": None, "completed": False,
     "data": {"id": "r", "role": "ASSISTANT", "type": "THINK", "text": "Let me think. ", "finished": False}},
    {"requestId": "r", "eventType": "MESSAGE", "error": None, "completed": False,
     "data": {"id": "r", "role": "ASSISTANT", "type": "CHAT", "text": "Looking ", "finished": False}},
    {"requestId": "r", "eventType": "PROCESSING", "error": None, "completed": False, "data": TOOL},
    {"requestId": "r", "eventType": "HEART_BEAT", "data": None, "error": None, "completed": False},
    {"requestId": "r", "eventType": "PROCESSING", "error": None, "completed": False,
     "data": {**TOOL, "status": "FINISHED", "result": {**TOOL["result"], "data": "a.txt", "success": True}}},
    {"requestId": "r", "eventType": "MESSAGE", "error": None, "completed": False,
     "data": {"id": "r", "role": "ASSISTANT", "type": "CHAT", "text": "two.", "finished": True}},
]
FINAL: dict[str, Any] = {"requestId": "r", "eventType": "FINAL_RESULT", "error": None, "completed": True,
                         "data": {"success": True, "error": None, "startTime": 1, "endTime": 2, "promptTokens": 10,
                                  "completionTokens": 12, "totalTokens": 22, "outputText": "Looking two.",
                                  "componentExecuteResults": []}}


@st.composite
def turn_scripts(draw: st.DrawFn) -> dict[str, Any]:
    events = draw(edited(EVENTS))
    script: dict[str, Any] = {"events": [
        {"raw": sendable(draw(mutated_document(e))) if draw(st.integers(0, 2)) == 0 else e} for e in events]}
    if draw(st.integers(0, 2)) == 0:
        script["final"] = sendable(draw(mutated_document(FINAL)))
    return script


@fixed_draws(EXAMPLES)
@given(scripts=st.lists(turn_scripts(), min_size=TURNS, max_size=TURNS))
async def test_any_forwarded_stream_ends_its_turn_once(
    tmp_path_factory: pytest.TempPathFactory, scripts: list[dict[str, Any]]
) -> None:
    async with qiming_server() as server, spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await proc.call("sidecar:initialize", {})
        await configure(proc, server, agentId=1128, chatIdleTimeoutMs=1500)
        session = await proc.call("server:session:create", {"title": "Forwarded"})
        for script in scripts:
            await server.control("chat", script)
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "go"}})
            final = await wait_final(proc, sent["messageId"], timeout=90)
            assert final["type"] in FINAL_TYPES, script
            assert_well_ordered(events_of(proc, sent["messageId"]))
        messages = await all_messages(proc, session["id"])
        assert sum(m["role"] == "user" for m in messages) == TURNS
        assert all(m["status"] not in ("streaming", "pending") for m in messages), [m["status"] for m in messages]
        await proc.close(timeout=60)
    proc.assert_no_traceback()
