"""The memory tools over the real server and the scripted provider: registered first
when memory is on, saves run at once, an update waits for the user's approval, and the next
session's request carries what was saved (basic text with RAG off, at most six with RAG on)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from chat_helpers import configure_provider, events_of, wait_final
from memory_helpers import active, assistant, call, session_of, system_text
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

MEMORY_TOOLS = ["memory_search", "memory_save", "memory_update", "memory_forget"]


async def wait_event(proc, message_id: str, kind: str, timeout: float = 20):  # type: ignore[no-untyped-def]
    _, message = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == message_id and m["params"]["type"] == kind, timeout=timeout)
    return message["params"]


async def test_tools_write_memories_the_next_session_gets(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook")
        await assistant(proc, "plain")
        await proc.call("assistant:upsert", {"id": "plain", "name": "Plain"})  # memory off
        old = await proc.call("memory:create", {"text": "The user lives in Lyon.", "scope": "cook"})
        sid = await session_of(proc, "cook")
        tools = await proc.call("tool:list", {"sessionId": sid})
        assert [t["name"] for t in tools[:4]] == MEMORY_TOOLS
        assert {t["name"]: t["defaultPolicy"] for t in tools[:4]} == {
            "memory_search": "auto", "memory_save": "auto", "memory_update": "ask", "memory_forget": "ask"}
        plain = await proc.call("tool:list", {"sessionId": await session_of(proc, "plain")})
        assert not any(t["name"].startswith("memory_") for t in plain)
        await chat.script(
            {"tool_calls": [call("s1", "memory_save", {"text": "The user is vegetarian.", "kind": "preference"}),
                            call("s2", "memory_save", {"text": "The user's name is Ada.", "scope": "global"}),
                            call("q1", "memory_search", {"query": "where does the user live"})]},
            {"tool_calls": [call("u1", "memory_update", {"id": old["id"], "text": "The user lives in Paris."})]},
            {"text": "Noted."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "I moved to Paris; I'm Ada, vegetarian."}})
        mid = sent["messageId"]
        pending = await wait_event(proc, mid, "tool_approval_required")
        assert pending["toolCall"]["name"] == "memory_update"
        # the saves ran; the update waits
        texts = sorted(m["text"] for m in await active(proc, "cook"))
        assert texts == ["The user is vegetarian.", "The user lives in Lyon."]
        assert [m["text"] for m in await active(proc, "global")] == ["The user's name is Ada."]
        saved = next(m for m in await active(proc, "cook") if "vegetarian" in m["text"])
        assert saved["source"] == {"kind": "tool", "sessionId": sid, "messageId": mid, "toolCallId": "s1"}
        search = next(e for e in events_of(proc, mid) if e["type"] == "tool_result" and e["toolResult"]["toolCallId"] == "q1")
        assert f'id="{old["id"]}"' in search["toolResult"]["output"] and "Lyon" in search["toolResult"]["output"]
        with anyio.fail_after(10):
            while True:
                approved = await proc.call("tool:pending:list", {"sessionId": sid})
                if approved:
                    break
                await anyio.sleep(0.02)
        await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "u1", "decision": "approved"})
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        history = await proc.call("memory:get", {"id": old["id"]})
        assert [v["text"] for v in history["versions"]] == ["The user lives in Lyon.", "The user lives in Paris."]
        assert history["versions"][1]["source"]["kind"] == "tool"
        # the next session (RAG off): the basic memory text
        sid2 = await session_of(proc, "cook")
        sent = await proc.call("chat:send", {"sessionId": sid2, "input": {"content": "Suggest a dinner."}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        body = [b for b in await chat.requests() if b.get("stream")][-1]
        system = system_text(body)
        for fact in ("vegetarian", "Ada", "Paris"):
            assert fact in system
        assert "Lyon" not in system  # superseded
        assert [t["function"]["name"] for t in body["tools"][:4]] == MEMORY_TOOLS
        # RAG on: at most six, the relevant one first among them
        await assistant(proc, "cook", rag=True)
        sid3 = await session_of(proc, "cook")
        sent = await proc.call("chat:send", {"sessionId": sid3, "input": {"content": "Which city does the user live in? Paris?"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        system = system_text([b for b in await chat.requests() if b.get("stream")][-1])
        block = system[system.index("<memories>"):]
        elements = [line for line in block.splitlines() if line.startswith("<memory ")]
        assert 1 <= len(elements) <= 6 and "Paris" in elements[0]
        await proc.close()


async def test_the_tools_cannot_reach_another_assistants_memories(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook")
        await assistant(proc, "coach")
        await proc.call("tool:policy:set", {"key": "memory_forget", "policy": "auto"})
        theirs = await proc.call("memory:create", {"text": "The coach's private note about the user.", "scope": "coach"})
        sid = await session_of(proc, "cook")
        await chat.script(
            {"tool_calls": [call("f1", "memory_forget", {"id": theirs["id"]}),
                            call("q1", "memory_search", {"query": "private note about the user"})]},
            {"text": "Done."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "Forget the coach's note."}})
        mid = sent["messageId"]
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        results = {e["toolResult"]["toolCallId"]: e["toolResult"] for e in events_of(proc, mid) if e["type"] == "tool_result"}
        assert results["f1"]["isError"] and "no memory" in results["f1"]["output"]
        assert "private note" not in results["q1"]["output"]
        assert [m["id"] for m in await active(proc, "coach")] == [theirs["id"]]  # untouched
        await proc.close()


async def test_a_denied_forget_leaves_the_memory(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook")
        kept = await proc.call("memory:create", {"text": "The user is allergic to nuts.", "scope": "cook"})
        sid = await session_of(proc, "cook")
        await chat.script({"tool_calls": [call("f1", "memory_forget", {"id": kept["id"]})]}, {"text": "Kept it."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "Forget my allergy."}})
        mid = sent["messageId"]
        await wait_event(proc, mid, "tool_approval_required")
        with anyio.fail_after(10):
            while not await proc.call("tool:pending:list", {"sessionId": sid}):
                await anyio.sleep(0.02)
        await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "f1", "decision": "denied"})
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        assert [m["id"] for m in await active(proc, "cook")] == [kept["id"]]
        await proc.close()
