"""Spilled tool outputs, over the subprocess: ``read_tool_output`` reads only the outputs of
its own session. Another session naming the same tool call id (guessed, or simply the
same: providers without ids number calls ``call_0``, ``call_1``...) gets "no saved output",
and its own spill of that id never overwrites the first session's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import configure_provider, events_of, wait_final
from mcp_helpers import FIXTURE, wait_status
from scripted_server import ScriptedServer, scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

A_OUTPUT = "A-PRIVATE-OUTPUT " * 3000  # over the 32 KiB spill limit
B_OUTPUT = "B-OTHER-OUTPUT " * 3000


async def results(proc: SidecarProcess, server: ScriptedServer, session_id: str, *replies: dict[str, Any]) -> dict[str, Any]:
    await server.script(*replies, {"text": "done"})
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "go"}})
    final = await wait_final(proc, sent["messageId"], timeout=60)
    assert final["type"] == "stream_end", final
    return {e["toolResult"]["toolCallId"]: e["toolResult"] for e in events_of(proc, sent["messageId"]) if e["type"] == "tool_result"}


def echo(call_id: str, text: str) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "mcp__fx__echo", "arguments": {"text": text}}]}


def read(call_id: str, via: str = "call_0") -> dict[str, Any]:
    return {"tool_calls": [{"id": via, "name": "read_tool_output", "arguments": {"tool_call_id": call_id}}]}


async def setup(proc: SidecarProcess, server: ScriptedServer) -> tuple[str, str]:
    await configure_provider(proc, server.base_url)
    await proc.call("mcp:server:upsert", {"name": "fx", "command": sys.executable, "args": [FIXTURE]})
    await proc.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
    await wait_status(proc, "fx", {"ready"})
    a = await proc.call("chat:session:create", {"title": "A"})
    b = await proc.call("chat:session:create", {"title": "B"})
    return a["id"], b["id"]


async def test_another_session_cannot_read_a_spilled_output(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        a, b = await setup(proc, server)
        spilled = await results(proc, server, a, echo("call_secret", A_OUTPUT))
        assert "output truncated" in spilled["call_secret"]["output"]
        own = await results(proc, server, a, read("call_secret"))
        assert own["call_0"]["output"].startswith("A-PRIVATE-OUTPUT") and not own["call_0"].get("isError")
        # session B names A's call id: nothing of A's output comes back
        other = await results(proc, server, b, read("call_secret"))
        assert "A-PRIVATE" not in other["call_0"]["output"] and other["call_0"]["isError"], other
        assert "no saved output" in other["call_0"]["output"]
        await proc.close()


async def test_the_same_call_id_in_two_sessions_keeps_two_outputs(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        a, b = await setup(proc, server)
        await results(proc, server, a, echo("call_1", A_OUTPUT))
        await results(proc, server, b, echo("call_1", B_OUTPUT))  # the same id, numbered alike
        in_a = await results(proc, server, a, read("call_1"))
        in_b = await results(proc, server, b, read("call_1"))
        assert in_a["call_0"]["output"].startswith("A-PRIVATE-OUTPUT"), in_a
        assert in_b["call_0"]["output"].startswith("B-OTHER-OUTPUT"), in_b
        # deleting B's session removes B's output only
        await proc.call("chat:session:delete", {"id": b})
        again = await results(proc, server, a, read("call_1"))
        assert again["call_0"]["output"].startswith("A-PRIVATE-OUTPUT"), again
        await proc.close()


async def test_an_untagged_spill_of_an_older_version_is_read_by_its_own_session_only(tmp_path: Path) -> None:
    import apsw

    from sidecar.tools.spill import spill_name

    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            a, b = await setup(proc, server)
            await results(proc, server, a, echo("call_old", A_OUTPUT))
            await proc.close()
        # as an older version named and recorded it: tool_outputs/<call id>.txt
        tagged = f"tool_outputs/{spill_name(a, 'call_old')}"
        (data / tagged).rename(data / "tool_outputs" / "call_old.txt")
        conn = apsw.Connection(str(data / "chat.db"))
        conn.execute("UPDATE owned_files SET path = 'tool_outputs/call_old.txt' WHERE path = ?", (tagged,))
        conn.close()
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            await proc.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
            own = await results(proc, server, a, read("call_old"))
            assert own["call_0"]["output"].startswith("A-PRIVATE-OUTPUT"), own
            other = await results(proc, server, b, read("call_old"))
            assert "A-PRIVATE" not in other["call_0"]["output"] and "no saved output" in other["call_0"]["output"]
            await proc.close()
