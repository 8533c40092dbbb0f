"""ACP against agents we did not write: the examples of the ``agent-client-protocol`` sdist.

``python3 dev.py test`` fetches the sdist pinned in constraints.txt at install time and
keeps its ``examples/`` in the venv (``<venv>/share/acp-sdk-examples``); the tests never
reach the network. ``examples/echo_agent.py`` and ``examples/agent.py`` run as subprocesses
with this venv's Python (the package itself is installed through the test extras). The
tests skip, saying why, only when the examples are not there (an install that did not
go through dev.py, or one without access to PyPI).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from acp_helpers import acp_session, send_and_wait, stored
from chat_helpers import assert_well_ordered, events_of, streamed_text
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

EXAMPLES = Path(sys.prefix) / "share" / "acp-sdk-examples"


@pytest.fixture(scope="session")
def acp_examples() -> Path:
    pytest.importorskip("acp", reason="agent-client-protocol is not installed (pip install -e '.[test]')")
    if not (EXAMPLES / "echo_agent.py").is_file():
        pytest.skip(f"the agent-client-protocol sdist examples are not in {EXAMPLES} (python3 dev.py test fetches them)")
    assert (EXAMPLES / "agent.py").is_file()
    return EXAMPLES


async def _engine(proc, script: Path, name: str) -> dict:
    return await proc.call(
        "provider:upsert",
        {"name": name, "type": "acp-engine", "engine": {"command": sys.executable, "args": [str(script)]}},
    )


async def test_echo_agent_end_to_end(acp_examples: Path, tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await _engine(proc, acp_examples / "echo_agent.py", "Echo")
        session = await acp_session(proc, engine["id"])
        sent, final = await send_and_wait(proc, session["id"], "Hello echo agent", timeout=30)
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        assert final["type"] == "stream_end" and final["finishReason"] == "stop"
        assert streamed_text(events) == "Hello echo agent"
        reply = await stored(proc, session["id"], sent["messageId"])
        assert reply["status"] == "completed" and reply["textContent"] == "Hello echo agent"
        # the agent's _meta is kept verbatim in the raw parts
        assert reply["acpParts"][0]["_meta"] == {"echo": True}
        got = await proc.call("chat:session:get", {"id": session["id"]})
        assert got["acpSessionId"] and len(got["acpSessionId"]) == 32  # the agent's uuid4().hex
        sent, final = await send_and_wait(proc, session["id"], "second", timeout=30)
        assert streamed_text(events_of(proc, sent["messageId"])) == "second"
        assert (await proc.call("chat:session:get", {"id": session["id"]}))["acpSessionId"] == got["acpSessionId"]
        await proc.close()
        proc.assert_all_jsonrpc()


async def test_example_agent_end_to_end(acp_examples: Path, tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await _engine(proc, acp_examples / "agent.py", "Example")
        session = await acp_session(proc, engine["id"])
        sent, final = await send_and_wait(proc, session["id"], "Hi example", timeout=30)
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        assert final["type"] == "stream_end"
        assert streamed_text(events) == "Client sent:Hi example"
        messages = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert [(m["role"], m["status"]) for m in messages] == [("user", "completed"), ("assistant", "completed")]
        assert messages[1]["textContent"] == "Client sent:Hi example"
        got = await proc.call("chat:session:get", {"id": session["id"]})
        assert got["acpSessionId"] == "0"
        # the example agent logs to stderr: it reaches our log
        await proc.close()
    assert "Received prompt request for session 0" in proc.stderr_text()
