"""Whatever an MCP server answers to ``initialize``, ``tools/list`` and ``tools/call``, the
connection ends in a status, a turn that calls its tools ends once, and the sidecar serves on.

fixtures/mcp_raw_server.py (a real stdio subprocess) answers with results mutated as
tests/test_provider_bytes_property.py mutates a provider's events (values of any type and
size, keys dropped) from valid ones: an initialize result, a tools/list with two tools,
and call results with text, image, resource and structured content. For each example:
the server reaches ``ready`` or ``failed``; a turn whose model calls its tools three times
ends with exactly one final event and a tool result for every call; no traceback is
logged; every line sent validates against the generated schema (spawn_sidecar checks it
on exit). The draws are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_helpers import CALLS, INITIALIZE, ROOT, TOOLS, a_turn_through_its_tools
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar
from mutation import fixed_draws, mutated_document, sendable

pytestmark = pytest.mark.anyio

RAW_SERVER = str(ROOT / "fixtures" / "mcp_raw_server.py")
EXAMPLES = 4
@st.composite
def server_scripts(draw: st.DrawFn) -> dict[str, Any]:
    def maybe(value: Any) -> Any:
        return sendable(draw(mutated_document(value))) if draw(st.integers(0, 2)) == 0 else value

    return {"initialize": maybe(INITIALIZE), "tools": maybe(TOOLS), "calls": [maybe(c) for c in CALLS]}


@fixed_draws(EXAMPLES)
@given(script=server_scripts())
async def test_any_server_answer_ends_in_a_status_and_a_turn_ends_once(
    tmp_path_factory: pytest.TempPathFactory, script: dict[str, Any]
) -> None:
    data = tmp_path_factory.mktemp("data")
    script_file = Path(data).parent / f"{Path(data).name}-mcp.json"
    script_file.write_text(json.dumps(script))
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        upsert = {"name": "rx", "command": sys.executable, "args": [RAW_SERVER, str(script_file)], "toolTimeoutS": 5}
        await a_turn_through_its_tools(proc, server, upsert, script)
        await proc.close(timeout=60)
    proc.assert_no_traceback()
