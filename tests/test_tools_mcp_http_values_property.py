"""Whatever an MCP server on streamable HTTP answers, and however it frames it, the connection
ends in a status, a turn that calls its tools ends once, and the sidecar serves on.

fixtures/mcp_raw_http_server.py (a real server on loopback) answers every exchange as the
drawn script says: results mutated as in the stdio property
(tests/test_tools_mcp_values_property.py), and the HTTP around them too: any status (202,
a redirect, 404 with or without a session, 500 with a JSON-RPC error or without), a JSON
body or an SSE stream (server requests and notifications before the response, junk
events, a ``retry``, a stream cut before its response), another content type, a raw body
that is no JSON, a session id of any text; the notifications' answers and the server's
own GET stream likewise. For each example: the server reaches ``ready`` or ``failed``; a
turn whose model calls its tools three times ends with exactly one final event; no
traceback is logged; every line sent validates against the generated schema
(spawn_sidecar checks it on exit). The draws are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_helpers import CALLS, INITIALIZE, RAW_HTTP, TOOLS, a_turn_through_its_tools, http_fixture
from mutation import fixed_draws, json_values, mutated_document, sendable
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

EXAMPLES = 4
SERVER_MESSAGES = [
    {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"},
    {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}},
    {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 0.5}},
    {"jsonrpc": "2.0", "id": "s1", "method": "ping"},
    {"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 9}},
    {"jsonrpc": "2.0", "id": "s2", "method": "roots/list"},
]
SESSIONS = st.sampled_from([None, "S1", "a-session-0123", "ü-session", "two words", "x" * 2000, "\t", ""])


@st.composite
def answers(draw: st.DrawFn, result: Any, *, request: bool = True) -> dict[str, Any]:
    """How the server answers one exchange: usually well, otherwise anything HTTP allows."""
    answer: dict[str, Any] = {"result": result} if request else {}
    if draw(st.integers(0, 2)) != 0:
        return answer  # two in three exchanges go well: the server gets far enough to be tested further
    if request and draw(st.booleans()):
        answer["result"] = sendable(draw(mutated_document(result)))
    if draw(st.integers(0, 2)) == 0:
        answer["status"] = draw(st.sampled_from([200, 201, 202, 204, 301, 307, 400, 401, 404, 405, 500, 503]))
    if draw(st.integers(0, 2)) == 0:
        answer["type"] = draw(st.sampled_from(["json", "sse", "text/html", "", "application/json; charset=utf-8",
                                               "TEXT/EVENT-STREAM", "application/octet-stream"]))
    if draw(st.integers(0, 3)) == 0:
        answer["session"] = draw(SESSIONS)
    if draw(st.integers(0, 3)) == 0:
        before = draw(st.lists(st.sampled_from(SERVER_MESSAGES) | json_values, max_size=4))
        answer["before"] = [sendable(draw(mutated_document(m))) if draw(st.booleans()) else m for m in before]
    if draw(st.integers(0, 5)) == 0:
        answer["cut"] = True
    if draw(st.integers(0, 5)) == 0:
        answer["retry"] = draw(st.sampled_from([0, -5, 10, 2**40]))
    if draw(st.integers(0, 5)) == 0:
        answer["body"] = draw(st.sampled_from(["", "{", "not json", "data: {}\n\n", "event: message\ndata: [1,2\n\n",
                                               '{"jsonrpc": "2.0", "id": 99, "result": {}}', "\x00" * 10]))
    if draw(st.integers(0, 6)) == 0:
        answer["error"] = sendable(draw(mutated_document({"code": -32000, "message": "scripted failure"})))
    return answer


@st.composite
def server_scripts(draw: st.DrawFn) -> dict[str, Any]:
    script = {
        "initialize": draw(answers(INITIALIZE)),
        "tools/list": draw(answers(TOOLS)),
        "tools/call": [draw(answers(c)) for c in CALLS],
        "notification": draw(answers(None, request=False)),
    }
    get = draw(st.sampled_from(["none", "sse", "other"]))
    if get == "sse":
        script["get"] = {"status": 200, "type": "sse", **draw(answers(None, request=False))}
    elif get == "other":
        script["get"] = draw(answers(None, request=False))
    return script


@fixed_draws(EXAMPLES)
@given(script=server_scripts())
async def test_any_http_answer_ends_in_a_status_and_a_turn_ends_once(
    tmp_path_factory: pytest.TempPathFactory, script: dict[str, Any]
) -> None:
    data = tmp_path_factory.mktemp("data")
    script_file = Path(data).parent / f"{Path(data).name}-mcp-http.json"
    script_file.write_text(json.dumps(script))
    async with scripted_provider() as server, http_fixture(RAW_HTTP, script_file) as (url, _), spawn_sidecar(data) as proc:
        upsert = {"name": "rh", "transport": "http", "url": url, "toolTimeoutS": 5, "connectTimeoutS": 5}
        await a_turn_through_its_tools(proc, server, upsert, script)
        await proc.close(timeout=60)
    proc.assert_no_traceback()
