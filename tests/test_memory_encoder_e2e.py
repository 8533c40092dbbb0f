"""The MemoryEncoder over the real server and the scripted provider: in auto mode a
memory appears after a completed reply (bounded wait), the same fact twice stays one memory,
a contradicting fact supersedes with history, an exchange that only repeats injected memory
creates none, propose mode sends memory_proposed (accept edited / reject), and a failing side
call (HTTP 500, invalid JSON) changes nothing and is logged. The side call's tokens go to the
session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider, wait_final
from memory_helpers import active, assistant, session_of
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


def encoded(*memories: dict[str, Any], remember: bool = True) -> dict[str, Any]:
    return {"text": json.dumps({"remember": remember, "reason": "the user told it", "memories": list(memories)}),
            "usage": {"prompt_tokens": 300, "completion_tokens": 40}}


async def exchange(proc: SidecarProcess, sid: str, text: str) -> str:
    sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": text}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    return str(sent["messageId"])


async def wait_log(proc: SidecarProcess, needle: str, count: int = 1, timeout: float = 20) -> None:
    await proc.wait_stderr(needle, count=count, timeout=timeout)


async def wait_memories(proc: SidecarProcess, scope: str, count: int, timeout: float = 20) -> list[dict[str, Any]]:
    with anyio.fail_after(timeout):
        while len(found := await active(proc, scope)) < count:
            await anyio.sleep(0.05)
    return found


async def test_auto_mode_remembers_dedups_and_supersedes(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook", encoder="auto")
        sid = await session_of(proc, "cook")
        city = {"kind": "fact", "text": "The user lives in Lyon.", "subject": "user", "key": "user.city"}
        await chat.script({"text": "Lovely city."}, encoded(city))
        before = (await proc.call("chat:session:get", {"id": sid}))["totalTokens"]
        mid = await exchange(proc, sid, "I live in Lyon, by the way.")
        [memory] = await wait_memories(proc, "cook", 1)
        assert memory["text"] == "The user lives in Lyon." and memory["source"] == {
            "kind": "encoder", "sessionId": sid, "messageId": mid, "toolCallId": None}
        with anyio.fail_after(20):  # the encoder's side call counts for the session, by kind
            while "side:memory-encoder" not in (got := await proc.call("chat:session:get", {"id": sid}))["usageByKind"]:
                await anyio.sleep(0.05)
        encoder = got["usageByKind"]["side:memory-encoder"]
        assert encoder["inputTokens"] + encoder["outputTokens"] == 340 and encoder["calls"] == 1
        assert got["totalTokens"] >= before + 340  # the reply's tokens and the encoder's
        side = [b for b in await chat.requests() if not b.get("stream")]
        assert len(side) == 1 and "I live in Lyon" in side[0]["messages"][1]["content"]
        # the same fact again (other words, same normalized text): still one memory
        await chat.script({"text": "Yes, Lyon."}, encoded(dict(city, text="the user lives in lyon")))
        await exchange(proc, sid, "As I said, I live in Lyon.")
        await wait_log(proc, "duplicate memory")
        assert [m["id"] for m in await active(proc, "cook")] == [memory["id"]]
        # a near duplicate (similar words, no key) is skipped too
        await chat.script({"text": "Right."}, encoded({"kind": "fact", "text": "The user lives in Lyon, France.",
                                                       "subject": "user"}))
        await exchange(proc, sid, "Lyon in France, that is where I live.")
        await wait_log(proc, "duplicate memory", 2)
        assert [m["id"] for m in await active(proc, "cook")] == [memory["id"]]
        # the encoder was shown the memory it already had, as data with its id
        side = [b for b in await chat.requests() if not b.get("stream")]
        assert f'id="{memory["id"]}"' in side[-1]["messages"][1]["content"]
        # a contradicting fact supersedes, with history
        await chat.script({"text": "Paris then."}, encoded(dict(city, text="The user lives in Paris.",
                                                                  supersedes=memory["id"])))
        await exchange(proc, sid, "I moved to Paris last week.")
        await wait_log(proc, "superseded memory")
        [now] = await active(proc, "cook")
        assert now["text"] == "The user lives in Paris." and now["supersedes"] == memory["id"]
        versions = (await proc.call("memory:get", {"id": now["id"]}))["versions"]
        assert [v["text"] for v in versions] == ["The user lives in Lyon.", "The user lives in Paris."]
        # an exchange that only repeats injected memory: stripped, skipped, no side call
        calls = len([b for b in await chat.requests() if not b.get("stream")])
        await chat.script({"text": "Indeed."})
        await exchange(proc, sid, '<memories><memory scope="cook">The user lives in Paris.</memory></memories> ok')
        await wait_log(proc, "skipped")
        assert len([b for b in await chat.requests() if not b.get("stream")]) == calls
        # asking about someone is not a fact about the user
        await chat.script({"text": "Bob is a name."},
                          encoded({"kind": "fact", "text": "The user is Bob.", "subject": "Bob"}))
        await exchange(proc, sid, "What do you know about someone called Bob?")
        await wait_log(proc, "does not name it")
        assert [m["id"] for m in await active(proc, "cook")] == [now["id"]]
        await proc.close()


async def test_propose_mode_sends_memory_proposed(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "coach", encoder="propose")
        sid = await session_of(proc, "coach")
        await chat.script({"text": "Great."}, encoded(
            {"kind": "preference", "text": "The user runs on Sundays.", "subject": "user"},
            {"kind": "task-outcome", "text": "Planned a 10 km training.", "subject": "user",
             "task": "training plan", "outcome": "a 6-week plan", "context": "first race"}))
        mid = await exchange(proc, sid, "I run every Sunday; help me plan a 10 km race.")
        _, first = await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "memory_proposed", timeout=20)
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "memory_proposed"
                            and m["params"]["id"] != first["params"]["id"], timeout=20)
        proposals = await proc.call("memory:proposal:list", {"sessionId": sid})
        assert [p["text"] for p in proposals] == ["The user runs on Sundays.", "Planned a 10 km training."]
        assert all(p["messageId"] == mid and p["action"] == "create" and p["status"] == "pending" for p in proposals)
        assert await active(proc, "coach") == []  # nothing stored before an answer
        accepted = await proc.call("memory:accept", {"id": proposals[0]["id"], "text": "The user runs on Sunday mornings."})
        assert accepted["action"] == "created" and accepted["memory"]["source"]["kind"] == "manual"
        await proc.call("memory:reject", {"id": proposals[1]["id"]})
        left = await proc.call("memory:proposal:list", {"sessionId": sid})
        assert left == [], (left, proposals, accepted)
        assert [m["text"] for m in await active(proc, "coach")] == ["The user runs on Sunday mornings."]
        with pytest.raises(Exception):
            await proc.call("memory:accept", {"id": proposals[1]["id"]})
        await proc.close()


@pytest.mark.parametrize("failure", ["status", "invalid"])
async def test_a_failing_side_call_changes_nothing_and_is_logged(tmp_path: Path, failure: str) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook", encoder="auto")
        kept = await proc.call("memory:create", {"text": "The user likes tea.", "scope": "cook"})
        sid = await session_of(proc, "cook")
        bad = {"status": 500, "times": 3} if failure == "status" else {"text": '{"remember": true, "memories": [{"kind": 7}]'}
        await chat.script({"text": "Fine."}, bad)
        await exchange(proc, sid, "I would like to remember that I drink coffee now.")
        await wait_log(proc, "nothing remembered")
        assert "memory encoder" in proc.stderr_text()
        assert [m["id"] for m in await active(proc, "cook")] == [kept["id"]]
        # the process keeps serving: the next exchange still works
        await chat.script({"text": "Sure."}, encoded({"kind": "fact", "text": "The user drinks coffee.", "subject": "user"}))
        await exchange(proc, sid, "I drink coffee now, remember it.")
        assert len(await wait_memories(proc, "cook", 2)) == 2
        await proc.close()


async def test_a_slow_encoder_delays_neither_the_next_send_nor_shutdown(tmp_path: Path) -> None:
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await assistant(proc, "cook", encoder="auto")
        sid = await session_of(proc, "cook")
        stalled = dict(encoded({"kind": "fact", "text": "The user owns a wok.", "subject": "user"}), hold_ms=45_000)
        await chat.script({"text": "A wok, nice."}, stalled, {"text": "Second reply."})
        await exchange(proc, sid, "I just bought a big wok for stir fries.")
        with anyio.fail_after(20):  # the encoder's call is in flight
            while not [b for b in await chat.requests() if not b.get("stream")]:
                await anyio.sleep(0.05)
        # the next send streams while the encoder waits for its model
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "Another question now?"}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end"
        assert await active(proc, "cook") == []  # the stalled encoder has written nothing
        await proc.close(timeout=10)  # shutdown cancels it (the stall is 45 s)
