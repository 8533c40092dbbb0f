"""Ollama adapter: recorded NDJSON in, parts out; request bodies out."""

from __future__ import annotations

import json
from pathlib import Path
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
    ChatRequest,
    Finish,
    GenerationParams,
    ModelInfo,
    OllamaProvider,
    ProviderCallError,
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
    drain,
    fixture_text,
    json_reply,
    ndjson_reply,
    pieces,
)

pytestmark = pytest.mark.anyio


def settings(**kw: Any) -> ProviderSettings:
    base: dict[str, Any] = {"type": "ollama", "base_url": "http://127.0.0.1:11434"}
    base.update(kw)
    return ProviderSettings(**base)


def request(model: ModelInfo | None = None, **kw: Any) -> ChatRequest:
    kw.setdefault("messages", [user("hi")])
    return ChatRequest(model=model or ModelInfo(id="llama3.2"), **kw)


async def run(reply: Reply, req: ChatRequest | None = None, **kw: Any) -> tuple[list[Any], Any, ScriptedTransport]:
    return await run_scripted(settings(**kw), reply, req or request())


async def test_plain_text_and_done_usage() -> None:
    parts, error, transport = await run(ndjson_reply("ollama/text.ndjson"))
    assert error is None
    assert text_of(parts) == "The sky is blue."
    assert parts[-2:] == [UsageUpdate(Usage(input_tokens=26, output_tokens=6)), Finish("stop", "stop")]
    sent = transport.requests[0]
    assert str(sent.url) == "http://127.0.0.1:11434/api/chat"
    assert "authorization" not in sent.headers


async def test_thinking() -> None:
    parts, error, _ = await run(ndjson_reply("ollama/thinking.ndjson"))
    assert error is None
    assert "".join(p.text for p in parts if isinstance(p, ThinkingDelta)) == "Okay, the user greets me."
    assert text_of(parts) == "Hi!"


async def test_whole_tool_calls_get_ids_and_json_text() -> None:
    parts, error, _ = await run(ndjson_reply("ollama/tool_calls.ndjson"))
    assert error is None
    calls = [p for p in parts if isinstance(p, (ToolCallStart, ToolCallDelta, ToolCallEnd))]
    assert calls == [
        ToolCallStart("call_0", "get_weather"),
        ToolCallDelta("call_0", '{"city":"Paris","unit":"c"}'),
        ToolCallEnd("call_0", "get_weather", '{"city":"Paris","unit":"c"}'),
        ToolCallStart("call_1", "get_weather"),
        ToolCallDelta("call_1", '{"city":"Tokyo"}'),
        ToolCallEnd("call_1", "get_weather", '{"city":"Tokyo"}'),
        ToolCallStart("call_x9", "get_time"),
        ToolCallDelta("call_x9", "{}"),
        ToolCallEnd("call_x9", "get_time", "{}"),
    ]
    assert parts[-1] == Finish("tool_calls", "stop")


async def test_error_line_keeps_partial_text() -> None:
    parts, error, _ = await run(ndjson_reply("ollama/error.ndjson"))
    assert text_of(parts) == "Partial"
    assert error is not None and error.kind == "in_stream" and "unexpected EOF" in error.message


async def test_malformed_line() -> None:
    parts, error, _ = await run(ndjson_reply("ollama/malformed.ndjson"))
    assert text_of(parts) == "Before"
    assert error is not None and error.kind == "malformed"


async def test_missing_done_is_truncated() -> None:
    parts, error, _ = await run(ndjson_reply("ollama/truncated.ndjson"))
    assert text_of(parts) == "This reply was cut"
    assert error is not None and error.kind == "truncated"


@pytest.mark.parametrize("name", ["text", "thinking", "tool_calls"])
async def test_same_parts_whatever_the_network_chunking(name: str) -> None:
    whole, error, _ = await run(ndjson_reply(f"ollama/{name}.ndjson"))
    assert error is None
    for size in (1, 9, 4096):
        cut = Reply(headers={"content-type": "application/x-ndjson"}, chunks=pieces(fixture_text(f"ollama/{name}.ndjson"), size))
        parts, error, _ = await run(cut)
        assert error is None and parts == whole


async def test_model_not_found_is_an_http_error_with_ollama_message() -> None:
    parts, error, _ = await run(json_reply({"error": "model 'nope' not found"}, status=404))
    assert parts == []
    assert error is not None and error.kind == "http" and error.status == 404 and not error.retryable
    assert "model 'nope' not found" in error.message


async def test_generate() -> None:
    answer = {
        "model": "qwen3:8b",
        "message": {"role": "assistant", "content": "Done.", "thinking": "ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 7,
        "eval_count": 3,
    }
    transport = ScriptedTransport(json_reply(answer))
    provider = create_provider(settings(api_key="ollama-key-123456"), transport=transport)
    with anyio.fail_after(5):
        parts = await provider.generate(request(stream=False))
    await provider.aclose()
    assert transport.json()["stream"] is False
    assert transport.requests[0].headers["authorization"] == "Bearer ollama-key-123456"
    assert parts == [
        ThinkingDelta("ok"),
        TextDelta("Done."),
        ToolCallStart("call_0", "f"),
        ToolCallDelta("call_0", '{"a":1}'),
        ToolCallEnd("call_0", "f", '{"a":1}'),
        UsageUpdate(Usage(input_tokens=7, output_tokens=3)),
        Finish("tool_calls", "stop"),
    ]


# -- request bodies ----------------------------------------------------------------------

_BODY_PROVIDER = OllamaProvider(settings(), ScriptedTransport())


def body_of(req: ChatRequest) -> dict[str, Any]:
    return _BODY_PROVIDER.request_body(req, stream=True)


def test_messages_tools_and_options() -> None:
    messages = [
        RequestMessage(role="system", parts=[TextPart(text="Be brief.")]),
        RequestMessage(role="user", parts=[TextPart(text="What is it?"), ImagePart(mime_type="image/png", base64="iVBORw0KGgo=")]),
        RequestMessage(
            role="assistant",
            parts=[
                ThinkingPart(text="dropped"),
                ToolUsePart(id="c1", name="get_weather", input={"city": "Paris"}),
                ToolResultPart(tool_use_id="c1", content="18C"),
                TextPart(text="18C."),
            ],
        ),
    ]
    tools = [ToolSpec(name="get_weather", parameters={"type": "object"})]
    params = GenerationParams(temperature=0.2, top_p=0.8, max_tokens=100)
    body = body_of(request(messages=messages, tools=tools, params=params))
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is it?", "images": ["iVBORw0KGgo="]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C", "tool_name": "get_weather"},
        {"role": "assistant", "content": "18C."},
    ]
    assert body["options"] == {"temperature": 0.2, "top_p": 0.8, "num_predict": 100}
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {"type": "object"}}}]
    assert body["stream"] is True and "think" not in body


@pytest.mark.parametrize(
    ("model", "level", "expected"),
    [
        ("qwen3:8b", "off", False),
        ("qwen3:8b", "low", True),
        ("qwen3:8b", "max", True),
        ("qwen3:8b", "auto", None),
        ("gpt-oss:20b", "low", "low"),
        ("gpt-oss:20b", "medium", "medium"),
        ("gpt-oss:120b", "max", "high"),
        ("gpt-oss:20b", "off", None),
    ],
)
def test_think_per_family(model: str, level: str, expected: bool | str | None) -> None:
    req = request(ModelInfo(id=model, supports_reasoning=True), params=GenerationParams(reasoning=level))  # type: ignore[arg-type]
    assert body_of(req).get("think") == expected


async def test_url_image_is_a_bad_request_and_file_image_is_inlined(tmp_path: Path) -> None:
    remote = request(messages=[RequestMessage(role="user", parts=[ImagePart(mime_type="image/png", url="https://x.example/a.png")])])
    transport = ScriptedTransport()
    provider = create_provider(settings(), transport=transport)
    with anyio.fail_after(5):
        parts, error = await drain(provider.stream(remote))
    assert parts == [] and error is not None and error.kind == "bad_request" and transport.requests == []

    image = tmp_path / "pic.png"
    image.write_bytes(b"\x89PNG\r\n")
    local = request(messages=[RequestMessage(role="user", parts=[ImagePart(mime_type="image/png", url=image.as_uri())])])
    transport.add(ndjson_reply("ollama/text.ndjson"))
    with anyio.fail_after(5):
        parts, error = await drain(provider.stream(local))
    assert error is None
    assert transport.json()["messages"][0]["images"] == ["iVBORw0K"]

    missing = request(messages=[RequestMessage(role="user", parts=[ImagePart(mime_type="image/png", url=(tmp_path / "gone.png").as_uri())])])
    with anyio.fail_after(5), pytest.raises(ProviderCallError) as info:
        await provider.generate(missing)
    assert info.value.kind == "bad_request" and "gone.png" in info.value.message
    await provider.aclose()


def test_base_url_ending_in_api_is_not_doubled() -> None:
    assert OllamaProvider(settings(base_url="http://h:11434/api/"), ScriptedTransport()).endpoint() == "http://h:11434/api/chat"
    assert json.dumps(body_of(request()))  # plain JSON-serialisable


async def test_list_models() -> None:
    tags = {"models": [{"name": "llama3.2:latest", "model": "llama3.2:latest", "size": 1}, {"name": "qwen3:8b"}]}
    transport = ScriptedTransport(json_reply(tags))
    provider = create_provider(settings(), transport=transport)
    with anyio.fail_after(5):
        assert await provider.list_models() == ["llama3.2:latest", "qwen3:8b"]
    await provider.aclose()
    assert transport.requests[0].method == "GET" and str(transport.requests[0].url) == "http://127.0.0.1:11434/api/tags"
