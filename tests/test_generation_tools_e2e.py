"""Per-assistant tools over the real server: ``enabledTools`` decides what a reply
is offered (``[]``: nothing on the wire), a ``deny`` policy hides a tool from the model,
``tool:list {sessionId}`` shows exactly what the model gets, and a send can switch tools off
for one reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat_helpers import wait_final
from generation_helpers import setup
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

SYSTEM_TOOLS = ["read_tool_output", "get_session_capabilities"]


async def reply_tools(proc: SidecarProcess, server: Any, session_id: str, **options: Any) -> tuple[list[str], dict[str, Any]]:
    """The tool names of the request a send made, and that request."""
    before = len(await server.requests())
    params: dict[str, Any] = {"sessionId": session_id, "input": {"content": "hello"}}
    if options:
        params["options"] = options
    sent = await proc.call("chat:send", params)
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    (body,) = (await server.requests())[before:]
    return [t["function"]["name"] for t in body.get("tools") or ()], body


async def listed(proc: SidecarProcess, session_id: str) -> list[str]:
    return [t["name"] for t in await proc.call("tool:list", {"sessionId": session_id})]


async def test_enabled_tools_deny_policies_and_tool_list_match_the_wire(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        sid = session["id"]
        everything, _ = await reply_tools(proc, server, sid)
        assert everything == ["get_current_time", "search_conversations", *SYSTEM_TOOLS]
        assert await listed(proc, sid) == everything

        # an assistant with no tools: none on the wire, and the model is told
        await proc.call("assistant:upsert", {"id": "bare", "name": "Bare", "enabledTools": []})
        await proc.call("chat:context:update", {"sessionId": sid, "assistantId": "bare"})
        names, body = await reply_tools(proc, server, sid)
        assert names == [] and "tools" not in body and "tool_choice" not in body
        assert "cannot call tools" in body["messages"][0]["content"]
        assert await listed(proc, sid) == []
        assert (await proc.call("assistant:get", {"id": "bare"}))["enabledTools"] == []

        # only what it names (the helpers of the others come with them)
        await proc.call("assistant:upsert", {"id": "clock", "name": "Clock", "enabledTools": ["get_current_time"]})
        await proc.call("chat:context:update", {"sessionId": sid, "assistantId": "clock"})
        names, _ = await reply_tools(proc, server, sid)
        assert names == ["get_current_time", *SYSTEM_TOOLS]
        assert await listed(proc, sid) == names

        # a tool whose policy is deny is not offered at all
        await proc.call("chat:context:update", {"sessionId": sid, "assistantId": ""})
        await proc.call("tool:policy:set", {"key": "search_conversations", "policy": "deny"})
        names, _ = await reply_tools(proc, server, sid)
        assert names == ["get_current_time", *SYSTEM_TOOLS]
        assert await listed(proc, sid) == names
        await proc.call("tool:policy:set", {"key": "search_conversations", "policy": None})
        names, _ = await reply_tools(proc, server, sid)
        assert "search_conversations" in names

        # one send without tools
        names, body = await reply_tools(proc, server, sid, tools=False)
        assert names == [] and "cannot call tools" in body["messages"][0]["content"]
        # the default assistant's profile says "every tool" (null), as before
        assert (await proc.call("assistant:get", {"id": "default"}))["enabledTools"] is None
        await proc.close()


async def test_a_model_without_tool_support_lists_none(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, models=[{"id": "plain", "supportsTools": False}])
        session = await proc.call("chat:session:create", {})
        assert await listed(proc, session["id"]) == []
        names, _ = await reply_tools(proc, server, session["id"])
        assert names == []
        with pytest.raises(CallError) as err:
            await proc.call("assistant:upsert", {"name": "x", "enabledTools": [""]})
        assert err.value.code == -32602
        await proc.close()
