"""Side calls over the real server: follow-up suggestions (stored, announced with
``chat:suggestions``, cancelled by a new send, their cost on the session), the AI session
summary (automatic every N exchanges, never over the user's own, found by the session-list
search; ``chat:session:summarize`` on demand) and ``chat:session:title``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat_helpers import wait_final
from generation_helpers import eventually, setup
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


def whole(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in bodies if not b.get("stream")]


async def exchange(proc: SidecarProcess, session_id: str, text: str) -> str:
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}})
    final = await wait_final(proc, sent["messageId"])
    assert final["type"] == "stream_end", final
    return str(sent["messageId"])


async def test_suggestions_are_stored_announced_paid_for_and_cancelled_by_a_new_send(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, settings={"generateSuggestions": True},
                    models=[{"id": "scripted-1", "inputPrice": 1.0, "outputPrice": 2.0}])
        await server.script(
            {"text": "Paris is the capital of France.", "usage": {"prompt_tokens": 10, "completion_tokens": 8}},
            {"text": "Follow-up questions:\n1. How many people live in Paris?\n2. Which river flows through it?\n"
                     "3. What should I visit first?\n4. One too many?",
             "usage": {"prompt_tokens": 40, "completion_tokens": 20}},
        )
        session = await proc.call("chat:session:create", {})
        first = await exchange(proc, session["id"], "What is the capital of France?")
        announced = await proc.next_notification("chat:suggestions", timeout=20)
        expected = ["How many people live in Paris?", "Which river flows through it?", "What should I visit first?"]
        assert announced == {"sessionId": session["id"], "messageId": first, "suggestions": expected}
        (_, reply) = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert reply["suggestions"] == expected
        ask = whole(await server.requests())[0]
        assert ask["max_tokens"] == 256 and "follow-up" in ask["messages"][0]["content"]
        assert "Paris is the capital of France." in ask["messages"][1]["content"]
        # the side call's tokens and cost are the session's too
        stored = await eventually(
            lambda: proc.call("chat:session:get", {"id": session["id"]}), lambda s: s["totalTokens"] == 78
        )
        assert stored["totalCost"] == pytest.approx((10 + 40) * 1e-6 + (8 + 20) * 2e-6)

        # a pending suggestions call is cancelled by the next send
        await server.script(
            {"text": "It is the Seine."},
            {"text": "Never stored?", "delay_ms": 60_000},
            {"text": "Yes, it is long."},
            {"text": "How long is it?"},
        )
        second = await exchange(proc, session["id"], "Which river?")
        await eventually(server.requests, lambda bodies: len(bodies) == 4)  # its suggestions call is out
        third = await exchange(proc, session["id"], "Is it long?")
        assert await eventually(server.cancelled, lambda numbers: numbers == [4]) == [4]
        later = await proc.next_notification("chat:suggestions", timeout=20)
        assert later["messageId"] == third and later["suggestions"] == ["How long is it?"]
        messages = {m["id"]: m for m in await proc.call("chat:messages:get", {"sessionId": session["id"]})}
        assert messages[second]["suggestions"] is None
        assert messages[third]["suggestions"] == ["How long is it?"]
        assert [n["messageId"] for n in proc.notifications("chat:suggestions")] == [first, third]
        await proc.close()


async def test_the_summary_is_written_every_n_exchanges_found_by_search_and_never_over_the_users(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, settings={"summaryEvery": 2})
        session = await proc.call("chat:session:create", {"title": "Untitled talk"})
        sid = session["id"]
        await server.script({"text": "Borrowing is checked at compile time."},
                            {"text": "Lifetimes name how long a reference is valid."},
                            {"text": "A chat about Rust lifetimes and the borrow checker."})
        await exchange(proc, sid, "How does Rust check borrows?")
        assert not whole(await server.requests())  # one exchange: no summary yet
        await exchange(proc, sid, "And lifetimes?")
        updated = await eventually(
            lambda: proc.call("chat:session:get", {"id": sid}), lambda s: s["summary"] is not None
        )
        assert updated["summary"] == "A chat about Rust lifetimes and the borrow checker."
        assert updated["summarySource"] == "ai"
        assert any(n["id"] == sid and n["summary"] == updated["summary"] for n in proc.notifications("chat:session:updated"))
        (ask,) = whole(await server.requests())
        assert ask["max_tokens"] == 300
        assert "How does Rust check borrows?" in ask["messages"][1]["content"]
        found = await proc.call("chat:session:list", {"search": "borrow checker"})
        assert [s["id"] for s in found["sessions"]] == [sid]

        # the user's own summary is never replaced automatically
        mine = await proc.call("chat:session:update", {"id": sid, "updates": {"summary": "My notes on Rust"}})
        assert mine["summarySource"] == "user"
        await server.script({"text": "Yes."}, {"text": "Indeed."})
        await exchange(proc, sid, "Is that all?")
        await exchange(proc, sid, "Really?")  # the 4th exchange: the automatic summary's turn
        assert len(whole(await server.requests())) == 1
        assert (await proc.call("chat:session:get", {"id": sid}))["summary"] == "My notes on Rust"

        # on demand it is written whatever was there
        await server.script({"text": "  Rust borrowing,\n lifetimes and more.  "})
        summarized = await proc.call("chat:session:summarize", {"id": sid}, timeout=30)
        assert summarized["summary"] == "Rust borrowing, lifetimes and more." and summarized["summarySource"] == "ai"
        found = await proc.call("chat:session:list", {"search": "lifetimes and more"})
        assert [s["id"] for s in found["sessions"]] == [sid]
        # clearing it clears who wrote it
        cleared = await proc.call("chat:session:update", {"id": sid, "updates": {"summary": ""}})
        assert cleared["summary"] is None and cleared["summarySource"] is None
        await proc.close()


async def test_title_on_demand_and_errors(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        empty = await proc.call("chat:session:create", {})
        with pytest.raises(Exception) as err:
            await proc.call("chat:session:title", {"id": empty["id"]})
        assert getattr(err.value, "code", None) == -32003
        with pytest.raises(Exception) as err:
            await proc.call("chat:session:summarize", {"id": "no-such-session"})
        assert getattr(err.value, "code", None) == -32001
        session = await proc.call("chat:session:create", {"title": "Mine"})
        await server.script({"text": "Ownership moves values."}, {"text": "\"Rust Ownership Basics.\""})
        await exchange(proc, session["id"], "Explain ownership")
        titled = await proc.call("chat:session:title", {"id": session["id"]}, timeout=30)
        assert titled["title"] == "Rust Ownership Basics"
        assert proc.notifications("chat:session:updated")[-1]["title"] == "Rust Ownership Basics"
        (ask,) = whole(await server.requests())
        assert "Explain ownership" in ask["messages"][1]["content"]
        await proc.close()
