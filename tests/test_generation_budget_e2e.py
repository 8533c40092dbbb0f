"""The context budget over the real server: a model with a 4,096-token window and
a 40,000-token branch gets requests that fit, counted with the real tokenizer over the exact
bodies the provider received (system prompt and tools included), the summary calls too; a
window that cannot hold the recent messages loses its oldest ones with a notice; a message
that cannot fit at all is refused before anything is sent; chat:context:get reports the
budget's parts."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import pytest

from chat_helpers import assert_well_ordered, wait_final
from generation_helpers import events_for, setup
from scripted_server import scripted_provider
from sidecar import tokens as tk
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

WINDOW = 4096
MODEL = "gpt-4o-mini"  # o200k_base: the sidecar's counts are exact for it
ENCODING = "o200k_base"
WORDS = (
    "context window budget tokens summary request provider message assistant user branch history "
    "the a of to and in is that for it with as was on be by this 上下文 窗口 摘要 消息 模型"
).split()
SYSTEM_PROMPT = "You are a careful assistant. " * 40


def n(text: str) -> int:
    return tk.count_text(text, ENCODING)


def text_of(tokens: int, rng: random.Random, tag: str) -> str:
    words = [tag]
    while n(" ".join(words)) < tokens:
        words.extend(rng.choice(WORDS) for _ in range(max(1, (tokens - n(" ".join(words))) // 2)))
    return " ".join(words)


def body_tokens(body: dict[str, Any]) -> int:
    """What the provider received, counted as the budget counts it: every message's framing
    and content, tool calls and results, and each tool definition's JSON."""
    total = 0
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        total += tk.MESSAGE_OVERHEAD + n(content or "")
        for call in message.get("tool_calls") or ():
            total += n(call["function"]["name"]) + n(call["function"]["arguments"]) + 8
    for tool in body.get("tools") or ():
        total += n(json.dumps(tool, separators=(",", ":"), ensure_ascii=False)) + 8
    return total


def assert_fits(body: dict[str, Any], reserve: int = 1024) -> int:
    used = body_tokens(body) + (body.get("max_tokens") or reserve)
    assert used <= WINDOW, (used, [m["role"] for m in body["messages"]])
    return used


def branch(session: dict[str, Any], sizes: list[int], seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    parent = None
    for i, size in enumerate(sizes):
        mid = f"m{i:05d}-{session['id']}"
        messages.append({
            "id": mid, "sessionId": session["id"], "parentId": parent,
            "role": "user" if i % 2 == 0 else "assistant", "contentType": "text",
            "textContent": text_of(size, rng, f"[{i}]"), "status": "completed",
            "createdAt": 1_700_000_000_000 + i, "updatedAt": 1_700_000_000_000 + i,
        })
        parent = mid
    return messages


async def import_branch(proc: SidecarProcess, provider: dict[str, Any], sizes: list[int]) -> tuple[str, int]:
    created = await proc.call("chat:session:create", {"title": "long"})
    stub = {**created, "id": created["id"] + "-long", "providerId": provider["id"], "modelId": MODEL}
    messages = branch(stub, sizes)
    await proc.call("chat:session:import", {"session": stub, "messages": messages}, timeout=60)
    return stub["id"], sum(n(m["textContent"]) for m in messages)


async def configure(proc: SidecarProcess, base_url: str) -> dict[str, Any]:
    provider = await setup(proc, base_url, models=[{"id": MODEL, "contextWindow": WINDOW}])
    await proc.call("assistant:upsert", {"id": "default", "name": "Default", "systemPrompt": SYSTEM_PROMPT})
    return provider


async def test_a_4096_window_and_a_40000_token_branch_get_requests_that_fit(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await configure(proc, server.base_url)
        session_id, branch_tokens = await import_branch(proc, provider, [200] * 200)
        assert branch_tokens >= 40_000
        sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "What did we decide?"}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        bodies = await server.requests()
        summaries = [b for b in bodies if not b["stream"]]
        (reply,) = [b for b in bodies if b["stream"]]
        assert summaries, "the old part of the branch is summarized"
        for body in summaries:
            assert_fits(body)
        used = assert_fits(reply)
        assert used > WINDOW // 2  # it is filled, not starved
        assert reply["messages"][0]["role"] == "system" and SYSTEM_PROMPT.strip() in reply["messages"][0]["content"]
        assert "<conversation_summary>" in reply["messages"][0]["content"]
        assert reply["tools"], "tools are offered (and counted)"
        assert reply["messages"][-1] == {"role": "user", "content": "What did we decide?"}
        assert len(reply["messages"]) < 40  # never the full history

        info = await proc.call("chat:context:get", {"sessionId": session_id})
        budget, last = info["budget"], info["lastRequest"]
        assert budget is not None and last is not None
        for parts in (budget, last):
            assert parts["contextWindow"] == WINDOW and parts["reservedOutput"] == 1024
            assert parts["systemPrompt"] > n(SYSTEM_PROMPT) // 2 and parts["tools"] > 0 and parts["messages"] > 0
            assert parts["summary"] > 0 and parts["exact"] is True and parts["modelId"] == MODEL
            assert parts["total"] == parts["systemPrompt"] + parts["tools"] + parts["messages"] + parts["reservedOutput"]
            assert parts["total"] <= WINDOW and parts["available"] == WINDOW - parts["total"]
            assert parts["threshold"] < WINDOW
        # the meter of the request that was sent is the sent request
        assert last["systemPrompt"] + last["tools"] + last["messages"] == body_tokens(reply)
        await proc.close()


async def test_recent_messages_too_big_for_the_window_are_left_out_with_a_notice(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await configure(proc, server.base_url)
        # the planner keeps at least four recent messages: here they cannot all fit
        session_id, _ = await import_branch(proc, provider, [300] * 6 + [900] * 4)
        await proc.call("chat:context:update", {"sessionId": session_id, "truncationStrategy": "sliding-window"})
        sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": "Go on."}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        events = events_for(proc, sent["messageId"])
        assert_well_ordered(events)
        (notice,) = [e for e in events if e["type"] == "notice"]
        assert notice["code"] == "context_trimmed" and f"({WINDOW:,} tokens)" in notice["notice"]
        (reply,) = await server.requests()
        assert_fits(reply)
        assert reply["messages"][-1]["content"] == "Go on."
        assert reply["messages"][1]["role"] == "user"  # the history still starts with the user
        dropped = int(notice["notice"].split()[0])
        info = await proc.call("chat:context:get", {"sessionId": session_id})
        assert info["lastRequest"]["dropped"] == dropped > 0
        await proc.close()


async def test_a_message_that_cannot_fit_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        huge = text_of(5000, random.Random(1), "[huge]")
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": huge}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "error" and "does not fit the context window" in final["error"], final
        assert await server.requests() == []
        (_, stored) = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert stored["status"] == "error"
        await proc.close()


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


async def test_an_image_is_counted_by_its_estimate_and_the_request_still_fits(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await setup(proc, server.base_url, models=[{"id": MODEL, "contextWindow": WINDOW, "supportsImages": True}])
        await proc.call("assistant:upsert", {"id": "default", "name": "Default", "systemPrompt": SYSTEM_PROMPT})
        # a history that fills the window once the image's estimate is counted too
        session_id, _ = await import_branch(proc, provider, [300] * 8)
        question = [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image", "mimeType": "image/png", "base64": base64.b64encode(PNG).decode()},
        ]
        sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": question}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        (reply,) = [b for b in await server.requests() if b["stream"]]
        last = reply["messages"][-1]
        assert last["role"] == "user" and any(p.get("type") == "image_url" for p in last["content"])
        # the text of the body counted with the real tokenizer, plus the image's estimate,
        # plus the reserved answer: within the window
        sent_tokens = body_tokens(reply) + tk.IMAGE_TOKENS
        assert sent_tokens + 1024 <= WINDOW, sent_tokens
        info = await proc.call("chat:context:get", {"sessionId": session_id})
        last_request, planned = info["lastRequest"], info["budget"]
        assert last_request["attachments"] == tk.IMAGE_TOKENS
        assert last_request["systemPrompt"] + last_request["tools"] + last_request["messages"] == sent_tokens
        # the whole history would not fit beside the image: its older part is summarized or left out
        assert len(reply["messages"]) < 1 + 8 + 1
        # the meter of the next request counts the stored image too
        assert planned["attachments"] == tk.IMAGE_TOKENS and planned["total"] <= WINDOW
        await proc.close()
