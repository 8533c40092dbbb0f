"""ACP against agents we did not write: the examples of the ``agent-client-protocol`` sdist.

The sdist (0.12.1) is fetched with ``pip download`` once per test session into a temporary
directory; its ``examples/echo_agent.py`` and ``examples/agent.py`` run as subprocesses
with this venv's Python (the package itself is installed through the test extras). The
tests skip, saying why, only when the download fails (no access to PyPI).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from acp_helpers import acp_session, send_and_wait, stored
from chat_helpers import assert_well_ordered, events_of, streamed_text
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

SDIST = "agent-client-protocol==0.12.1"


@pytest.fixture(scope="session")
def acp_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("acp", reason="agent-client-protocol is not installed (pip install -e '.[test]')")
    where = tmp_path_factory.mktemp("acp-sdist")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--disable-pip-version-check", "-q", "-d", str(where), SDIST],
        capture_output=True,
        text=True,
        timeout=180,
    )
    archives = list(where.glob("agent_client_protocol-*.tar.gz"))
    if result.returncode != 0 or not archives:
        pytest.skip(f"could not download the {SDIST} sdist: {result.stderr.strip()[-500:]}")
    with tarfile.open(archives[0]) as tar:
        members = [m for m in tar.getmembers() if "/examples/" in m.name and m.name.endswith(".py")]
        tar.extractall(where, members=members, filter="data")
    examples = next(where.glob("agent_client_protocol-*/examples"))
    assert (examples / "echo_agent.py").is_file() and (examples / "agent.py").is_file()
    return examples


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
