"""Soul.md over the real server and the scripted provider: versions set, listed and
reverted (none overwritten), the size limit, inheritance of the global one, the request's
system prompt, and the soul_update tool: it asks by default, the approval carries the diff,
the new version is written only after approval, and an edit against a changed Soul.md fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_helpers import configure_provider, wait_final
from memory_helpers import call, session_of, system_text
from scripted_server import scripted_provider
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio


async def wait_event(proc, message_id: str, kind: str, timeout: float = 20):  # type: ignore[no-untyped-def]
    _, message = await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == message_id and m["params"]["type"] == kind, timeout=timeout)
    return message["params"]


async def test_versions_history_revert_and_inheritance(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        await proc.call("assistant:upsert", {"id": "muse", "name": "Muse"})
        empty = await proc.call("assistant:soul:get", {"id": "muse"})
        assert empty["content"] == "" and empty["version"] == 0 and empty["maxBytes"] == 16384
        await proc.call("assistant:soul:set", {"id": "global", "content": "# Shared soul\nBe kind."})
        inherited = await proc.call("assistant:soul:get", {"id": "muse"})
        assert inherited["inherited"] and inherited["content"].startswith("# Shared soul") and inherited["version"] == 0
        one = await proc.call("assistant:soul:set", {"id": "muse", "content": "I write poems.", "reason": "start"})
        two = await proc.call("assistant:soul:set", {"id": "muse", "content": "I write short poems."})
        assert (one["version"], two["version"]) == (1, 2) and not two["inherited"] and two["tokens"] > 0
        back = await proc.call("assistant:soul:revert", {"id": "muse", "version": 1})
        assert back["version"] == 3 and back["content"] == "I write poems." and back["source"] == "revert"
        history = await proc.call("assistant:soul:history", {"id": "muse"})
        assert [(v["version"], v["content"], v["source"]) for v in history] == [
            (3, "I write poems.", "revert"), (2, "I write short poems.", "user"), (1, "I write poems.", "user")]
        assert history[0]["revertedFrom"] == 1 and history[2]["reason"] == "start"
        with pytest.raises(CallError) as err:
            await proc.call("assistant:soul:set", {"id": "muse", "content": "é" * 9000})  # 18,000 bytes
        assert err.value.code == -32602 and "16384" in err.value.message
        cleared = await proc.call("assistant:soul:set", {"id": "muse", "content": ""})
        assert cleared["inherited"] and cleared["version"] == 4
        await proc.close()


async def test_soul_update_tool_asks_with_a_diff_and_writes_after_approval(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await proc.call("assistant:upsert", {"id": "muse", "name": "Muse", "context": {"useSoul": True, "evolveSoul": True}})
        await proc.call("assistant:soul:set", {"id": "muse", "content": "I write poems.\nI like rhyme.\n"})
        sid = await session_of(proc, "muse")
        tools = await proc.call("tool:list", {"sessionId": sid})
        soul_tool = next(t for t in tools if t["name"] == "soul_update")
        assert soul_tool["defaultPolicy"] == "ask" and soul_tool["source"] == "memory"
        assert "baseVersion 1" in soul_tool["description"]
        new = "I write poems.\nI prefer free verse.\n"
        await chat.script(
            {"tool_calls": [call("t1", "soul_update", {"content": new, "reason": "the user dislikes rhyme", "baseVersion": 1})]},
            {"text": "Updated my soul."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "Stop rhyming, please."}})
        mid = sent["messageId"]
        pending = await wait_event(proc, mid, "tool_approval_required")
        assert pending["toolCall"]["name"] == "soul_update"
        assert "-I like rhyme.\n" in pending["preview"] and "+I prefer free verse.\n" in pending["preview"]
        first = [b for b in await chat.requests() if b.get("stream")][0]
        assert "I like rhyme." in system_text(first)  # the request carried the current Soul.md
        assert (await proc.call("assistant:soul:get", {"id": "muse"}))["version"] == 1  # not before approval
        await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "t1", "decision": "approved"})
        assert (await wait_final(proc, mid))["type"] == "stream_end"
        soul = await proc.call("assistant:soul:get", {"id": "muse"})
        assert soul["version"] == 2 and soul["content"] == new and soul["source"] == "tool"
        history = await proc.call("assistant:soul:history", {"id": "muse"})
        assert history[0]["sessionId"] == sid and history[0]["messageId"] == mid
        assert history[0]["reason"] == "the user dislikes rhyme"
        # an edit proposed against a Soul.md that changed before approval writes nothing
        await chat.script(
            {"tool_calls": [call("t2", "soul_update", {"content": "Something else.", "reason": "x", "baseVersion": 2})]},
            {"text": "Could not."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "Change again."}})
        await wait_event(proc, sent["messageId"], "tool_approval_required")
        await proc.call("assistant:soul:set", {"id": "muse", "content": "Changed by the user meanwhile."})
        await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "t2", "decision": "approved"})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        soul = await proc.call("assistant:soul:get", {"id": "muse"})
        assert soul["content"] == "Changed by the user meanwhile." and soul["version"] == 3
        reply = (await proc.call("chat:messages:get", {"sessionId": sid}))
        messages = reply if isinstance(reply, list) else reply["messages"]
        results = [p for m in messages for p in (m.get("parts") or []) if p.get("type") == "tool_result"]
        assert any("changed meanwhile" in str(p) for p in results), results
        await proc.close()
