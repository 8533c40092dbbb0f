"""Property over the real server: any body a caller with the key sends to a V1 route is
answered in the V1 envelope, never with a 500 or a traceback, and the process keeps serving.

The bodies are shaped like ComputerChatRequest and ProjectRequest (their field names,
nested ``agent_config.agent_server`` and ``model_provider``) with values of any JSON type,
edge numbers and path-like strings, plus raw bytes that are not JSON or not UTF-8. A body
the endpoint accepts may start a turn: its provider is a closed loopback port, and the host
allows no agent command (``agentCommands`` empty), so nothing runs. The checks run in a worker thread
(hypothesis drives a plain client) while the test's event loop keeps reading the sidecar.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest
from compat_helpers import v1_sidecar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

ROUTES = ["/computer/chat", "/computer/agent/status", "/computer/agent/stop", "/computer/agent/session/cancel"]
STATUSES = {200, 400, 404, 409, 413, 429}
"""What a V1 route may answer (an engine failure is 200 with code 5000, as V1 did)."""

CLOSED_PORT_URL = "http://127.0.0.1:9/v1"
"""A provider no turn can reach (the discard port: nothing listens on it here)."""

edge_text = st.sampled_from([
    "", " ", "..", "../../etc", "/", "/etc/passwd", "C:\\Windows", "~", "p1", "a" * 65, "漢字", "\x00", "\u202e",
    "file:///etc/passwd", CLOSED_PORT_URL, "yolo", "deny", "allow", "scripted-agent", "-c",
])
leaf = st.one_of(
    st.none(), st.booleans(), edge_text, st.text(max_size=12),
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**64, -(2**70), 10**40]),
    st.floats(allow_nan=False, allow_infinity=False),
)
any_json = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(edge_text, inner, max_size=3),
                        max_leaves=8)


def fields(names: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of ``names``, each a plausible value or any JSON value."""
    return st.fixed_dictionaries({}, optional={name: strategy | any_json for name, strategy in names.items()})


ids = st.one_of(edge_text, st.integers(-5, 10**6))
rule = fields({"patterns": st.lists(edge_text, max_size=3), "action": edge_text, "tool_kind": edge_text})
agent_server = fields({
    "agent_id": edge_text, "command": st.sampled_from(["bash", "/bin/sh", "node", "python3", ""]) | edge_text,
    "args": st.lists(edge_text, max_size=3), "env": st.dictionaries(edge_text, edge_text, max_size=2),
    "agent_mode": edge_text, "tool_approval_rules": st.lists(rule, max_size=2),
})
model_provider = fields({
    "id": ids, "name": edge_text, "provider": edge_text, "base_url": edge_text, "api_key": edge_text,
    "model": edge_text, "default_model": edge_text, "api_protocol": st.sampled_from(["openai", "anthropic", "ollama"]),
    "requires_openai_auth": st.booleans(),
})
chat_request = fields({
    "user_id": ids, "project_id": ids, "session_id": ids, "prompt": st.text(max_size=20) | edge_text,
    "request_id": ids, "system_prompt": edge_text, "model_provider": model_provider,
    "agent_config": fields({"agent_server": agent_server}), "agent_work_dir": edge_text,
    "attachments": st.lists(any_json, max_size=2), "data_source_attachments": st.lists(any_json, max_size=2),
})
closed_provider = st.fixed_dictionaries(
    {"base_url": st.just(CLOSED_PORT_URL), "default_model": st.sampled_from(["m", "gpt-x"])},
    optional={"id": ids, "name": edge_text, "api_key": edge_text, "api_protocol": st.sampled_from(["openai", "anthropic", "ollama"] + ["x"])},
)
near_valid_chat = st.fixed_dictionaries(
    {"user_id": st.sampled_from(["1", "u-2", 7]), "project_id": st.sampled_from(["p1", "p_2", 3]),
     "prompt": st.sampled_from(["hi", "你好"])},
    optional={"session_id": ids, "request_id": ids, "system_prompt": edge_text, "agent_work_dir": edge_text,
              "model_provider": closed_provider | model_provider, "agent_config": fields({"agent_server": agent_server}),
              "attachments": st.lists(any_json, max_size=2)},
)
bodies = st.one_of(
    chat_request.map(lambda body: json.dumps(body).encode()),
    any_json.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=40),
    st.sampled_from([b"", b"{", b'{"user_id": "1", "prompt": "x"', b"\xff\xfe{}", b"[" * 2000 + b"]" * 2000]),
)
project_request = fields({"user_id": ids, "project_id": ids, "session_id": ids})
cases = st.one_of(
    st.tuples(st.just("/computer/chat"), near_valid_chat.map(lambda body: json.dumps(body).encode())),
    st.tuples(st.just("/computer/chat"), bodies),
    st.tuples(st.sampled_from(ROUTES[1:]), project_request.map(lambda body: json.dumps(body).encode()) | bodies),
)
queries = st.sampled_from(["", "?user_id=1&project_id=p1", "?session_id=../x", "?project_id=%00", "?a=%ff"])


async def test_any_body_on_any_route_gets_the_envelope(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, provider=False, agentCommands={}) as v1:
        headers = {"x-api-key": v1.token, "Content-Type": "application/json"}
        answered: list[int] = []

        def check_all() -> None:
            with httpx2.Client(timeout=30) as client:

                @settings(max_examples=120, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
                @given(case=cases, query=queries)
                def check(case: tuple[str, bytes], query: str) -> None:
                    route, body = case
                    response = client.post(v1.url + route + query, content=body, headers=headers)
                    assert response.status_code in STATUSES, (route, body[:200], response.status_code, response.text[:300])
                    envelope = response.json()
                    assert list(envelope) == ["code", "message", "data", "tid", "success"], envelope
                    assert envelope["success"] == (envelope["code"] == "0000"), envelope
                    answered.append(response.status_code)

                check()

        await anyio.to_thread.run_sync(check_all)
        assert len(answered) >= 100 and 400 in answered and 200 in answered
        # still serving, both ways
        async with httpx2.AsyncClient() as client:
            assert (await client.get(v1.url.removesuffix("/") + "/health")).status_code == 200
        assert isinstance((await v1.proc.call("chat:session:list", {}))["sessions"], list)
        await v1.wait_idle(timeout=60)
        await v1.proc.close()
    stderr = v1.proc.stderr_text()
    assert "Traceback" not in stderr and not re.search(r"V1 \S+ \S+ failed", stderr), stderr[-3000:]
