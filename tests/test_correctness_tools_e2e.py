"""``enabledTools`` and the feature tools, over the real server: an assistant with
memory on (and Soul.md evolving) keeps ``memory_*`` and ``soul_update`` whatever its
``enabledTools`` names, ``[]`` included; ``tool:list`` says why each tool is offered
(``offeredBy``) and matches the wire; ``assistant:upsert`` refuses an unknown name (listing
the valid ones), a feature tool's name (naming its switch) and an MCP name of a server that
is not configured or a tool a ready server does not have; nothing is stored then."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat_helpers import wait_final
from generation_helpers import setup
from mcp_helpers import stdio_server, wait_status
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

MEMORY_TOOLS = ["memory_search", "memory_save", "memory_update", "memory_forget"]
HELPERS = ["read_tool_output", "get_session_capabilities"]


async def wire_tools(proc: SidecarProcess, server: Any, session_id: str) -> list[str]:
    before = len(await server.requests())
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "hello"}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    bodies = [b for b in (await server.requests())[before:] if b.get("stream")]
    return [t["function"]["name"] for t in bodies[0].get("tools") or ()]


async def listed(proc: SidecarProcess, session_id: str) -> list[tuple[str, str]]:
    return [(t["name"], t["offeredBy"]) for t in await proc.call("tool:list", {"sessionId": session_id})]


async def refused(proc: SidecarProcess, profile: dict[str, Any]) -> str:
    with pytest.raises(CallError) as err:
        await proc.call("assistant:upsert", profile)
    assert err.value.code == -32602, err.value.message
    return str(err.value.message)


async def test_feature_tools_follow_their_switch_and_unknown_names_are_refused(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        sid = session["id"]

        await proc.call("assistant:upsert", {
            "id": "clock", "name": "Clock", "enabledTools": ["get_current_time"],
            "memory": {"enabled": True}, "context": {"useSoul": True, "evolveSoul": True},
        })
        await proc.call("chat:context:update", {"sessionId": sid, "assistantId": "clock"})
        expected = [*((n, "memory") for n in MEMORY_TOOLS), ("soul_update", "soul"),
                    ("get_current_time", "enabledTools"), *((n, "helper") for n in HELPERS)]
        assert await wire_tools(proc, server, sid) == [name for name, _ in expected]
        assert await listed(proc, sid) == expected

        # [] is none of the others: the feature tools still come, with their helpers
        await proc.call("assistant:upsert", {"id": "bare", "name": "Bare", "enabledTools": [], "memory": {"enabled": True}})
        await proc.call("chat:context:update", {"sessionId": sid, "assistantId": "bare"})
        expected = [*((n, "memory") for n in MEMORY_TOOLS), *((n, "helper") for n in HELPERS)]
        assert await wire_tools(proc, server, sid) == [name for name, _ in expected]
        assert await listed(proc, sid) == expected

        # null: every tool the settings enable, said so
        await proc.call("chat:context:update", {"sessionId": sid, "assistantId": ""})
        assert await listed(proc, sid) == [
            ("get_current_time", "settings"), ("search_conversations", "settings"), *((n, "helper") for n in HELPERS),
        ]

        # names that are not tools, and the feature tools' own names, are refused
        message = await refused(proc, {"id": "typo", "name": "Typo", "enabledTools": ["get_current_time", "get_curent_time"]})
        assert "enabledTools[1]" in message and "'get_curent_time'" in message
        assert "get_current_time" in message.split("valid:", 1)[1] and "workspace_read_file" in message
        message = await refused(proc, {"id": "typo", "name": "Typo", "enabledTools": ["memory_save"]})
        assert "enabledTools[0]" in message and "memory.enabled" in message
        message = await refused(proc, {"id": "typo", "name": "Typo", "enabledTools": ["knowledge_search"]})
        assert "knowledgeBaseIds" in message
        message = await refused(proc, {"id": "typo", "name": "Typo", "enabledTools": ["soul_update"]})
        assert "context.evolveSoul" in message
        await refused(proc, {"id": "typo", "name": "Typo", "enabledTools": ["mcp:files"]})
        await refused(proc, {"id": "typo", "name": "Typo", "enabledTools": ["mcp__files__echo"]})
        with pytest.raises(CallError) as err:
            await proc.call("assistant:get", {"id": "typo"})
        assert err.value.code == -32001

        # MCP names: a configured server's, its tools checked once it is ready
        await proc.call("mcp:server:upsert", stdio_server("off", enabled=False))
        await proc.call("assistant:upsert", {"id": "mcp", "name": "MCP", "enabledTools": ["mcp:off", "mcp__off__whatever"]})
        await proc.call("mcp:server:upsert", stdio_server("files"))
        await wait_status(proc, "files", {"ready"})
        await proc.call("assistant:upsert", {"id": "mcp", "name": "MCP", "enabledTools": ["mcp:files", "mcp__files__echo"]})
        message = await refused(proc, {"id": "mcp", "name": "MCP", "enabledTools": ["mcp__files__ech"]})
        assert "'mcp__files__ech'" in message and "mcp__files__echo" in message
        assert (await proc.call("assistant:get", {"id": "mcp"}))["enabledTools"] == ["mcp:files", "mcp__files__echo"]
        await proc.close()
