"""Property over the real server: random JSON nested up to 2,000 levels in every
free-form field of every method never poisons the process or its data dir.

Each example sends a few such requests (every one gets an answer with its own id; nothing
deeper than the limit is accepted; no -32603/-32007), then the reads that a deep stored value
used to kill (``chat:session:list``, ``provider:list``, ``chat:messages:get``,
``chat:session:export``) must answer, and again after a restart on the same data dir.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import METHODS
from protocol.limits import MAX_JSON_DEPTH
from sidecar_proc import SidecarProcess, spawn_sidecar
from wire_edges import MARK, document, field_kind, free_form_cases, shaped

pytestmark = pytest.mark.anyio

CASES = free_form_cases(METHODS)
ANSWERS = {-32602, -32700, -32001, -32003, -32004, -32005}
"""Acceptable errors: input refused, not found, bad state, provider, not implemented."""


def with_ids(value: Any, session_id: str) -> Any:
    """The minimal document, addressed to a real session where it names one."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("id", "sessionId") and item == "x":
                out[key] = session_id
            else:
                out[key] = with_ids(item, session_id)
        return out
    if isinstance(value, list):
        return [with_ids(v, session_id) for v in value]
    return value


injection = st.tuples(
    st.integers(0, len(CASES) - 1),
    st.one_of(st.integers(0, 70), st.integers(60, 1_100), st.integers(900, 2_000)),
    st.sampled_from(["object", "array", "mixed"]),
    st.sampled_from(["1", '"leaf"', "null", "[]", "{}", "-9223372036854775808"]),
)


async def reads_answer(proc: SidecarProcess, session_id: str) -> None:
    assert isinstance((await proc.call("chat:session:list", {"limit": 500}))["sessions"], list)
    assert isinstance(await proc.call("provider:list"), list)
    assert isinstance(await proc.call("chat:messages:get", {"sessionId": session_id}), list)
    assert (await proc.call("chat:session:export", {"id": session_id}))["session"]["id"] == session_id


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(injection, min_size=1, max_size=8))
async def test_random_deep_json_in_every_free_form_field_never_poisons_anything(
    injections: list[tuple[int, int, str, str]],
) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        async with spawn_sidecar(data_dir) as proc:
            await proc.call("sidecar:initialize", {})
            session_id = (await proc.call("chat:session:create", {"title": "target"}))["id"]
            for index, depth, pattern, leaf in injections:
                method, steps, field = CASES[index]
                text = json.dumps(with_ids(document(steps), session_id), separators=(",", ":"))
                deep = shaped(depth, pattern, field_kind(field), leaf)
                request_id = proc.new_id()
                await proc.send_line(
                    f'{{"jsonrpc":"2.0","id":{request_id},"method":"{method}","params":'
                    + text.replace(f'"{MARK}"', deep) + "}"
                )
                reply = await proc.response(request_id, timeout=30)
                if "error" in reply:
                    assert reply["error"]["code"] in ANSWERS, (method, depth, reply["error"])
                else:
                    assert depth <= MAX_JSON_DEPTH, (method, depth, "accepted")
            await reads_answer(proc, session_id)
            await proc.close(timeout=30)
        proc.assert_all_jsonrpc()
        async with spawn_sidecar(data_dir) as proc:
            await reads_answer(proc, session_id)
            await proc.close(timeout=30)
        assert "RecursionError" not in proc.stderr_text()
