"""OpenAI-compatible adapter: recorded streams in, parts out; request bodies out."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from provider_helpers import run_scripted, text_of, user

from protocol.types import (
    FilePart,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    Usage,
)
from sidecar.providers import (
    ChatRequest,
    Finish,
    GenerationParams,
    ModelInfo,
    OpenAICompatProvider,
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
from sidecar.providers.history import MISSING_RESULT
from sidecar.providers.replay import (
    Reply,
    ScriptedTransport,
    drain,
    fixture_text,
    json_reply,
    pieces,
    sse_reply,
)

pytestmark = pytest.mark.anyio


def settings(**kw: Any) -> ProviderSettings:
    base: dict[str, Any] = {"type": "openai-compat", "base_url": "https://api.example.test/v1", "api_key": "sk-test-0123456789"}
    base.update(kw)
    return ProviderSettings(**base)


def request(model: str = "gpt-4o-mini", **kw: Any) -> ChatRequest:
    model_info = kw.pop("model_info", None) or ModelInfo(id=model)
    kw.setdefault("messages", [user("hi")])
    return ChatRequest(model=model_info, **kw)


async def run(reply: Reply, req: ChatRequest | None = None, **kw: Any) -> tuple[list[Any], Any, ScriptedTransport]:
    return await run_scripted(settings(**kw), reply, req or request())


# -- streams --------------------------------------------------------------------------


async def test_plain_text_with_usage_only_final_chunk() -> None:
    parts, error, _ = await run(sse_reply("openai/text.sse"))
    assert error is None
    assert text_of(parts) == "Hello! How can I help you today?"
    assert parts[-2:] == [
        UsageUpdate(Usage(input_tokens=19, output_tokens=10, cache_read_tokens=8, reasoning_tokens=0)),
        Finish("stop", "stop"),
    ]


async def test_reasoning_content_becomes_thinking() -> None:
    parts, error, _ = await run(sse_reply("openai/thinking.sse"))
    assert error is None
    thinking = "".join(p.text for p in parts if isinstance(p, ThinkingDelta))
    assert thinking == "The user asks 2+2. That is 4."
    assert text_of(parts) == "2 + 2 = 4."
    # thinking first, then the answer
    first_text = next(i for i, p in enumerate(parts) if isinstance(p, TextDelta))
    assert all(not isinstance(p, ThinkingDelta) for p in parts[first_text:])
    usage = [p for p in parts if isinstance(p, UsageUpdate)][-1].usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (12, 40, 28)
    assert parts[-1] == Finish("stop", "stop")


async def test_reasoning_field_and_keepalive_comments() -> None:
    parts, error, _ = await run(sse_reply("openai/reasoning_field.sse"))
    assert error is None
    assert "".join(p.text for p in parts if isinstance(p, ThinkingDelta)) == "Let me think. Paris."
    assert text_of(parts) == "Paris"
    assert UsageUpdate(Usage(input_tokens=9, output_tokens=7)) in parts


async def test_one_tool_call_with_fragmented_arguments() -> None:
    parts, error, _ = await run(sse_reply("openai/tool_call.sse"))
    assert error is None
    calls = [p for p in parts if isinstance(p, (ToolCallStart, ToolCallDelta, ToolCallEnd))]
    assert calls[0] == ToolCallStart("call_Zq1mFh3pL8", "get_weather")
    end = calls[-1]
    assert isinstance(end, ToolCallEnd)
    assert json.loads(end.arguments) == {"location": "Paris, FR", "unit": "c"}
    deltas = [p.arguments for p in calls if isinstance(p, ToolCallDelta)]
    assert len(deltas) == 11 and "".join(deltas) == end.arguments
    assert parts[-1] == Finish("tool_calls", "tool_calls")


async def test_parallel_tool_calls_accumulate_by_index() -> None:
    parts, error, _ = await run(sse_reply("openai/parallel_tool_calls.sse"))
    assert error is None
    ends = [p for p in parts if isinstance(p, ToolCallEnd)]
    assert [(e.id, e.name, json.loads(e.arguments)) for e in ends] == [
        ("call_A1", "get_weather", {"location": "Tokyo"}),
        ("call_B2", "get_time", {"tz": "Asia/Tokyo"}),
    ]
    for end in ends:
        fragments = [p.arguments for p in parts if isinstance(p, ToolCallDelta) and p.id == end.id]
        assert "".join(fragments) == end.arguments
    starts = [p.id for p in parts if isinstance(p, ToolCallStart)]
    assert starts == ["call_A1", "call_B2"]
    assert text_of(parts) == "Checking both."
    # every end comes before usage and finish
    assert isinstance(parts[-2], UsageUpdate) and parts[-2].usage.cache_read_tokens == 64


async def test_stream_without_done_but_with_finish_reason_is_complete() -> None:
    parts, error, _ = await run(sse_reply("openai/no_done.sse"))
    assert error is None
    assert text_of(parts) == "Hi there"
    assert parts[-1] == Finish("stop", "stop")


async def test_refusal_is_text_and_finish_refusal() -> None:
    parts, error, _ = await run(sse_reply("openai/refusal.sse"))
    assert error is None
    assert text_of(parts) == "I'm sorry, I can't help with that."
    assert parts[-1] == Finish("refusal", "stop")


async def test_in_stream_error_keeps_partial_text() -> None:
    parts, error, _ = await run(sse_reply("openai/in_stream_error.sse"))
    assert text_of(parts) == "Partial answer"
    assert error is not None and error.kind == "in_stream"
    assert "The server had an error while processing your request" in error.message
    assert "server_error" in error.message


async def test_malformed_chunk_ends_step_after_partial_text() -> None:
    parts, error, _ = await run(sse_reply("openai/malformed.sse"))
    assert text_of(parts) == "Before the"
    assert error is not None and error.kind == "malformed"
    assert not any(isinstance(p, Finish) for p in parts)


async def test_truncated_stream_is_an_error() -> None:
    parts, error, _ = await run(sse_reply("openai/truncated.sse"))
    assert text_of(parts) == "This reply was cut short"
    assert error is not None and error.kind == "truncated"


async def test_unknown_fields_of_wrong_type_are_malformed_not_a_crash() -> None:
    body = 'data: {"choices":[{"index":0,"delta":{"content":5}}]}\n\n'
    parts, error, _ = await run(sse_reply(body))
    assert parts == []
    assert error is not None and error.kind == "malformed" and "content" in error.message


async def test_whole_calls_repeating_index_zero_are_separate_calls() -> None:
    # Some servers send each complete call at index 0 with its own id (and some send
    # the arguments as an object rather than JSON text).
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": {"x": 1}}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    parts, error, _ = await run(sse_reply(body))
    assert error is None
    assert [(p.id, p.name, p.arguments) for p in parts if isinstance(p, ToolCallEnd)] == [("a", "f", "{}"), ("b", "g", '{"x":1}')]
    # "stop" with tool calls is reported as tool_calls, raw reason kept
    assert parts[-1] == Finish("tool_calls", "stop")


@pytest.mark.parametrize("name", ["text", "thinking", "tool_call", "parallel_tool_calls", "reasoning_field", "no_done"])
async def test_same_parts_whatever_the_network_chunking(name: str) -> None:
    whole, error, _ = await run(sse_reply(f"openai/{name}.sse"))
    assert error is None
    for size in (1, 7, 4096):
        cut = Reply(headers={"content-type": "text/event-stream"}, chunks=pieces(fixture_text(f"openai/{name}.sse"), size))
        parts, error, _ = await run(cut)
        assert error is None and parts == whole


async def test_json_answer_to_a_stream_request_is_reported() -> None:
    reply = json_reply({"error": {"message": "stream not supported here"}})
    parts, error, _ = await run(reply)
    assert parts == [] and error is not None and error.kind == "malformed"
    assert "stream not supported here" in error.message


# -- non-streaming ---------------------------------------------------------------------


async def test_generate_maps_whole_answer_onto_parts() -> None:
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me look.",
                    "reasoning_content": "need weather",
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70, "prompt_tokens_details": {"cached_tokens": 10}},
    }
    transport = ScriptedTransport(json_reply(answer))
    provider = create_provider(settings(), transport=transport)
    with anyio.fail_after(5):
        parts = await provider.generate(request(stream=False))
    await provider.aclose()
    assert transport.json()["stream"] is False and "stream_options" not in transport.json()
    assert parts == [
        ThinkingDelta("need weather"),
        TextDelta("Let me look."),
        ToolCallStart("call_1", "get_weather"),
        ToolCallDelta("call_1", '{"city":"Oslo"}'),
        ToolCallEnd("call_1", "get_weather", '{"city":"Oslo"}'),
        UsageUpdate(Usage(input_tokens=50, output_tokens=20, cache_read_tokens=10)),
        Finish("tool_calls", "tool_calls"),
    ]


# -- request bodies ----------------------------------------------------------------------


# Building a body needs no connection: one unused provider serves every body test.
_BODY_PROVIDER = OpenAICompatProvider(settings(), ScriptedTransport())


def body_of(req: ChatRequest) -> dict[str, Any]:
    return _BODY_PROVIDER.request_body(req, stream=True)


def test_system_user_images_and_skipped_parts() -> None:
    req = request(
        messages=[
            RequestMessage(role="system", parts=[TextPart(text="Be brief.")]),
            RequestMessage(
                role="user",
                parts=[
                    TextPart(text="What is this?"),
                    ImagePart(mime_type="image/png", base64="iVBORw0KGgo="),
                    ImagePart(mime_type="image/jpeg", url="https://img.example/cat.jpg"),
                    FilePart(uri="file:///tmp/notes.txt", name="notes.txt"),
                ],
            ),
        ]
    )
    body = body_of(req)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://img.example/cat.jpg"}},
            ],
        },
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_tool_history_is_split_into_assistant_and_tool_messages() -> None:
    req = request(
        messages=[
            user("Weather in Paris and Tokyo?"),
            RequestMessage(
                role="assistant",
                parts=[
                    ThinkingPart(text="two calls"),
                    TextPart(text="Checking."),
                    ToolUsePart(id="c1", name="get_weather", input={"city": "Paris"}),
                    ToolUsePart(id="c2", name="get_weather", input={"city": "Tokyo"}),
                    ToolResultPart(tool_use_id="c1", content="18C"),
                    ToolResultPart(tool_use_id="c2", content="25C"),
                    ToolUsePart(id="c3", name="convert", input={"c": 25}),
                    ToolResultPart(tool_use_id="c3", content="77F", is_error=False),
                    TextPart(text="Paris 18C, Tokyo 25C (77F)."),
                ],
            ),
            user("thanks"),
        ]
    )
    messages = body_of(req)["messages"]
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Tokyo"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": "25C"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "convert", "arguments": '{"c":25}'}}],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "77F"},
        {"role": "assistant", "content": "Paris 18C, Tokyo 25C (77F)."},
        {"role": "user", "content": "thanks"},
    ]


def test_unanswered_call_gets_a_synthesized_result_and_orphans_are_dropped() -> None:
    req = request(
        messages=[
            user("go"),
            RequestMessage(
                role="assistant",
                parts=[ToolResultPart(tool_use_id="ghost", content="?"), ToolUsePart(id="c1", name="f", input={})],
            ),
            user("still there?"),
        ]
    )
    messages = body_of(req)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": MISSING_RESULT}


def test_params_tools_and_max_tokens_by_family() -> None:
    tools = [ToolSpec(name="get_weather", description="Weather", parameters={"type": "object", "properties": {}})]
    params = GenerationParams(temperature=0.3, top_p=0.9, max_tokens=256)
    body = body_of(request("gpt-4o", tools=tools, params=params))
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.3, 0.9, 256)
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {}}}}
    ]
    body = body_of(request("o3-mini", params=params))
    assert body["max_completion_tokens"] == 256
    assert not {"max_tokens", "temperature", "top_p"} & body.keys()
    body = body_of(request("openai/gpt-5-mini", params=params))
    assert body["max_completion_tokens"] == 256 and "temperature" not in body
    no_tools = request("m", tools=tools, model_info=ModelInfo(id="m", supports_tools=False))
    assert "tools" not in body_of(no_tools)


@pytest.mark.parametrize(
    ("model", "level", "expected"),
    [
        ("deepseek-r1", "low", "low"),
        ("deepseek-r1", "medium", "medium"),
        ("deepseek-r1", "high", "high"),
        ("deepseek-r1", "max", "high"),
        ("deepseek-r1", "off", None),
        ("deepseek-r1", "auto", None),
        ("o3", "max", "high"),
        ("o4-mini", "off", None),
        ("gpt-5", "off", "minimal"),
        ("gpt-5", "max", "high"),
        ("gpt-5-nano", "low", "low"),
        ("gpt-5.1", "off", "none"),
        ("gpt-5.1", "max", "high"),
        ("gpt-5.2", "max", "xhigh"),
        ("gpt-5.2", "high", "high"),
        ("gpt-5.1-codex-max", "max", "xhigh"),
    ],
)
def test_reasoning_effort_per_family(model: str, level: str, expected: str | None) -> None:
    req = request(model_info=ModelInfo(id=model, supports_reasoning=True), params=GenerationParams(reasoning=level))  # type: ignore[arg-type]
    assert body_of(req).get("reasoning_effort") == expected


def test_reasoning_not_sent_to_models_without_reasoning() -> None:
    req = request(model_info=ModelInfo(id="o3"), params=GenerationParams(reasoning="max"))
    assert "reasoning_effort" not in body_of(req)


async def test_custom_headers_and_deep_merged_body_are_sent() -> None:
    transport = ScriptedTransport(sse_reply("openai/text.sse"))
    provider = create_provider(
        settings(
            headers={"X-Title": "chat-sidecar", "HTTP-Referer": "https://app.example"},
            body={"stream_options": {"include_usage": False, "extra": 1}, "temperature": 1.2, "provider": {"order": ["a"]}, "top_p": None},
        ),
        transport=transport,
    )
    with anyio.fail_after(5):
        await drain(provider.stream(request(params=GenerationParams(temperature=0.1, top_p=0.5))))
    await provider.aclose()
    sent = transport.requests[0]
    assert sent.headers["x-title"] == "chat-sidecar" and sent.headers["http-referer"] == "https://app.example"
    assert sent.headers["authorization"] == "Bearer sk-test-0123456789"
    assert str(sent.url) == "https://api.example.test/v1/chat/completions"
    body = transport.json()
    assert body["stream_options"] == {"include_usage": False, "extra": 1}
    assert body["temperature"] == 1.2 and body["provider"] == {"order": ["a"]}
    assert "top_p" not in body
