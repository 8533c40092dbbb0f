"""Anthropic adapter: recorded SSE events in, parts out; request bodies out."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from provider_helpers import run_scripted, text_of, user

from protocol.types import (
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    Usage,
)
from sidecar.providers import (
    AnthropicProvider,
    ChatRequest,
    Finish,
    GenerationParams,
    ModelInfo,
    ProviderSettings,
    RequestMessage,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
    create_provider,
)
from sidecar.providers.replay import (
    Reply,
    ScriptedTransport,
    fixture_text,
    json_reply,
    pieces,
    sse_reply,
)

pytestmark = pytest.mark.anyio

SONNET = ModelInfo(id="claude-sonnet-4-5", max_output_tokens=64000, supports_reasoning=True)


def settings(**kw: Any) -> ProviderSettings:
    base: dict[str, Any] = {"type": "anthropic", "base_url": "https://api.anthropic.test", "api_key": "sk-ant-test-0123456789"}
    base.update(kw)
    return ProviderSettings(**base)


def request(model: ModelInfo | None = None, **kw: Any) -> ChatRequest:
    kw.setdefault("messages", [user("hi")])
    return ChatRequest(model=model or ModelInfo(id="claude-3-5-haiku-latest"), **kw)


async def run(reply: Reply, req: ChatRequest | None = None) -> tuple[list[Any], Any, ScriptedTransport]:
    return await run_scripted(settings(), reply, req or request())


# -- streams ------------------------------------------------------------------------------


async def test_plain_text_pings_ignored() -> None:
    parts, error, transport = await run(sse_reply("anthropic/text.sse"))
    assert error is None
    assert text_of(parts) == "Hello! How can I help you today?"
    assert parts[-1] == Finish("stop", "end_turn")
    assert parts[-2] == UsageUpdate(Usage(input_tokens=25, output_tokens=12, cache_read_tokens=0, cache_write_tokens=0))
    sent = transport.requests[0]
    assert str(sent.url) == "https://api.anthropic.test/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test-0123456789"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers


async def test_thinking_and_signature() -> None:
    parts, error, _ = await run(sse_reply("anthropic/thinking.sse"))
    assert error is None
    thinking = [p for p in parts if isinstance(p, ThinkingDelta)]
    assert "".join(p.text for p in thinking) == "The user wants 27 * 453.\n27*453 = 12231."
    assert thinking[-1] == ThinkingDelta("", "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds8Ct4B7A5cFQ9u4fNg==")
    assert text_of(parts) == "27 × 453 = 12,231"
    assert parts[-1] == Finish("stop", "end_turn")


async def test_tool_use_fragments_and_cache_usage() -> None:
    parts, error, _ = await run(sse_reply("anthropic/tool_use.sse"))
    assert error is None
    start = parts.index(ToolCallStart("toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather"))
    end = next(p for p in parts if isinstance(p, ToolCallEnd))
    assert json.loads(end.arguments) == {"location": "Paris", "unit": "c"}
    deltas = [p.arguments for p in parts[start:] if isinstance(p, ToolCallDelta)]
    assert "".join(deltas) == end.arguments and "" not in deltas
    # input counts cache reads and writes; output is cumulative from message_delta
    assert parts[-2] == UsageUpdate(
        Usage(input_tokens=377 + 100 + 2048, output_tokens=65, cache_read_tokens=2048, cache_write_tokens=100)
    )
    assert parts[-1] == Finish("tool_calls", "tool_use")


async def test_parallel_tool_use_blocks_accumulate_per_index() -> None:
    parts, error, _ = await run(sse_reply("anthropic/parallel_tool_use.sse"))
    assert error is None
    ends = [(p.id, p.name, json.loads(p.arguments)) for p in parts if isinstance(p, ToolCallEnd)]
    assert ends == [
        ("toolu_A", "get_weather", {"location": "Tokyo"}),
        ("toolu_B", "get_time", {"tz": "Asia/Tokyo"}),
        ("toolu_C", "list_files", {}),
    ]
    assert parts[-1] == Finish("tool_calls", "tool_use")


async def test_unknown_events_and_deltas_are_tolerated() -> None:
    parts, error, _ = await run(sse_reply("anthropic/unknown_events.sse"))
    assert error is None
    assert text_of(parts) == "Hello there!"
    assert not any(isinstance(p, ToolCallStart) for p in parts)  # server tools are not ours
    assert parts[-2] == UsageUpdate(Usage(input_tokens=11, output_tokens=6))
    assert parts[-1] == Finish("stop", "end_turn")


async def test_error_event_keeps_partial_text() -> None:
    parts, error, _ = await run(sse_reply("anthropic/error.sse"))
    assert text_of(parts) == "Partial answer"
    assert error is not None and error.kind == "in_stream" and error.retryable
    assert "Overloaded" in error.message and "overloaded_error" in error.message


async def test_malformed_event() -> None:
    parts, error, _ = await run(sse_reply("anthropic/malformed.sse"))
    assert text_of(parts) == "Before"
    assert error is not None and error.kind == "malformed"


async def test_missing_message_stop_is_truncated() -> None:
    parts, error, _ = await run(sse_reply("anthropic/truncated.sse"))
    assert text_of(parts) == "This reply was cut"
    assert error is not None and error.kind == "truncated"
    assert not any(isinstance(p, Finish) for p in parts)


async def test_tool_block_cut_by_max_tokens_is_closed_with_its_partial_json() -> None:
    parts, error, _ = await run(sse_reply("anthropic/max_tokens_partial_json.sse"))
    assert error is None
    end = next(p for p in parts if isinstance(p, ToolCallEnd))
    assert end.arguments == '{"filename": "taxes.txt", "lines": ["# GUIDE",'
    assert parts[-1] == Finish("length", "max_tokens")


@pytest.mark.parametrize("name", ["text", "thinking", "tool_use", "parallel_tool_use", "unknown_events"])
async def test_same_parts_whatever_the_network_chunking(name: str) -> None:
    whole, error, _ = await run(sse_reply(f"anthropic/{name}.sse"))
    assert error is None
    for size in (1, 13, 4096):
        cut = Reply(headers={"content-type": "text/event-stream"}, chunks=pieces(fixture_text(f"anthropic/{name}.sse"), size))
        parts, error, _ = await run(cut)
        assert error is None and parts == whole


async def test_generate_maps_whole_message() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3},
    }
    transport = ScriptedTransport(json_reply(message))
    provider = create_provider(settings(), transport=transport)
    with anyio.fail_after(5):
        parts = await provider.generate(request(stream=False))
    await provider.aclose()
    assert "stream" not in transport.json()
    assert parts == [
        ThinkingDelta("hmm", "sig=="),
        TextDelta("Calling."),
        ToolCallStart("toolu_1", "lookup"),
        ToolCallDelta("toolu_1", '{"q":"x"}'),
        ToolCallEnd("toolu_1", "lookup", '{"q":"x"}'),
        UsageUpdate(Usage(input_tokens=13, output_tokens=5, cache_read_tokens=3)),
        Finish("tool_calls", "tool_use"),
    ]


# -- request bodies --------------------------------------------------------------------------

_BODY_PROVIDER = AnthropicProvider(settings(), ScriptedTransport())


def body_of(req: ChatRequest) -> dict[str, Any]:
    return _BODY_PROVIDER.request_body(req, stream=True)


def tool_turn() -> list[RequestMessage]:
    return [
        RequestMessage(role="system", parts=[TextPart(text="You are terse.")]),
        RequestMessage(role="system", parts=[TextPart(text="Use metric units.")]),
        user("Weather in Paris and Tokyo?"),
        RequestMessage(
            role="assistant",
            parts=[
                ThinkingPart(text="two calls", signature="sig-1"),
                ThinkingPart(text="unsigned, never sent"),
                TextPart(text="Checking."),
                ToolUsePart(id="t1", name="get_weather", input={"city": "Paris"}),
                ToolUsePart(id="t2", name="get_weather", input={"city": "Tokyo"}),
                ToolResultPart(tool_use_id="t1", content="18C"),
                ToolResultPart(tool_use_id="t2", content="boom", is_error=True),
                TextPart(text="Paris is 18C; Tokyo failed."),
            ],
        ),
        user("Try Tokyo again"),
    ]


def test_system_on_top_tool_history_split_and_alternation() -> None:
    body = body_of(request(messages=tool_turn()))
    assert body["system"] == "You are terse.\n\nUse metric units."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Tokyo?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Tokyo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Paris is 18C; Tokyo failed."}]},
        {"role": "user", "content": [{"type": "text", "text": "Try Tokyo again"}]},
    ]
    assert body["max_tokens"] == 4096 and body["stream"] is True


def test_tool_results_merge_with_the_next_user_message() -> None:
    messages = [
        user("go"),
        RequestMessage(role="assistant", parts=[ToolUsePart(id="t1", name="f", input={}), ToolResultPart(tool_use_id="t1", content="ok")]),
        user("and now?"),
    ]
    body = body_of(request(messages=messages))
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
        {"type": "text", "text": "and now?"},
    ]


def test_signed_thinking_goes_back_only_with_thinking_enabled() -> None:
    thinking_on = body_of(request(SONNET, messages=tool_turn(), params=GenerationParams(reasoning="medium")))
    assistant = thinking_on["messages"][1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "two calls", "signature": "sig-1"}
    assert sum(1 for b in assistant if b["type"] == "thinking") == 1
    thinking_off = body_of(request(SONNET, messages=tool_turn()))
    assert all(b["type"] != "thinking" for m in thinking_off["messages"] for b in m["content"])


def test_images_and_tools() -> None:
    messages = [
        RequestMessage(
            role="user",
            parts=[
                ImagePart(mime_type="image/png", base64="iVBORw0KGgo="),
                ImagePart(mime_type="image/jpeg", url="data:image/jpeg;base64,/9j/4AAQ"),
                ImagePart(mime_type="image/gif", url="https://img.example/a.gif"),
                TextPart(text="  "),
                TextPart(text="Describe"),
            ],
        )
    ]
    tools = [ToolSpec(name="lookup", description="Find", parameters={"type": "object", "properties": {"q": {"type": "string"}}})]
    body = body_of(request(messages=messages, tools=tools))
    assert body["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
        {"type": "image", "source": {"type": "url", "url": "https://img.example/a.gif"}},
        {"type": "text", "text": "Describe"},
    ]
    assert body["tools"] == [
        {"name": "lookup", "description": "Find", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
    ]


@pytest.mark.parametrize(
    ("model", "level", "max_tokens", "expected_max", "expected_budget"),
    [
        (SONNET, "low", None, 64000, 2048),
        (SONNET, "medium", None, 64000, 8192),
        (SONNET, "high", 1000, 16384 + 4096, 16384),
        (SONNET, "high", 30000, 30000, 16384),
        (SONNET, "max", None, 64000, 64000 - 4096),
        (ModelInfo(id="claude-opus-4", supports_reasoning=True), "max", None, 32000, 32000 - 4096),
        (ModelInfo(id="claude-x", supports_reasoning=True), "low", None, 2048 + 4096, 2048),
        (ModelInfo(id="claude-x", max_output_tokens=8192, supports_reasoning=True), "high", None, 8192, 8192 - 2048),
        (ModelInfo(id="claude-x", max_output_tokens=8192, supports_reasoning=True), "max", None, 8192, 8192 - 2048),
        (ModelInfo(id="claude-tiny", max_output_tokens=1200, supports_reasoning=True), "max", None, 1200, None),
        (SONNET, "off", None, 64000, None),
        (SONNET, "auto", None, 64000, None),
        (ModelInfo(id="claude-3-5-haiku"), "max", 1000, 1000, None),
    ],
)
def test_thinking_budget_per_level(
    model: ModelInfo, level: str, max_tokens: int | None, expected_max: int, expected_budget: int | None
) -> None:
    params = GenerationParams(reasoning=level, max_tokens=max_tokens, temperature=0.5, top_p=0.9)  # type: ignore[arg-type]
    body = body_of(request(model, params=params))
    assert body["max_tokens"] == expected_max
    if expected_budget is None:
        assert "thinking" not in body
        assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    else:
        assert body["thinking"] == {"type": "enabled", "budget_tokens": expected_budget}
        assert 1024 <= expected_budget < body["max_tokens"]
        assert "temperature" not in body and "top_p" not in body


def test_base_url_ending_in_v1_is_not_doubled() -> None:
    provider = AnthropicProvider(settings(base_url="https://proxy.example/anthropic/v1/"), ScriptedTransport())
    assert provider.endpoint() == "https://proxy.example/anthropic/v1/messages"
