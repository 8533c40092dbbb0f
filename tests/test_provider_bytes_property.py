"""Whatever a provider sends, an adapter yields well-formed parts or one ProviderCallError.

The recorded streams of every family (OpenAI-compatible SSE, Anthropic SSE, Ollama NDJSON)
are mutated: a value anywhere in an event replaced by any JSON value (huge and negative
numbers, wrong types, long text), keys dropped, events dropped, repeated or swapped, a
line of garbage put in, the body cut anywhere, served in pieces of any size. Whole answers
(``stream: false``) are mutated the same way. What must hold for every such answer:
- the call ends (within seconds) with its parts, or with ProviderCallError, never any
  other exception;
- every part is one of the stream's part types with fields of their declared types (token
  counts are ints as the provider reported them: what is not a count is dropped by the one
  rule of sidecar/usage_counts.py where usage is kept, tests/test_provider_bytes_e2e.py);
- a tool call's end carries the name its start gave (a repeated id is allowed here: the
  engine's CallIds renames it, and the end-to-end test drives that);
- a stream that ends without an error ends with exactly one Finish, its last part.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation import edited, mutated_document
from provider_helpers import user

from sidecar.providers import (
    ChatRequest,
    Finish,
    ModelInfo,
    ProviderSettings,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
    create_provider,
)
from sidecar.providers.errors import ProviderCallError
from sidecar.providers.replay import FIXTURES, Reply, ScriptedTransport, drain, pieces

FAMILIES: dict[str, tuple[str, str, str]] = {
    # type: (fixture folder, base URL, content type of a stream)
    "openai-compat": ("openai", "https://api.example.test/v1", "text/event-stream"),
    "anthropic": ("anthropic", "https://api.anthropic.test", "text/event-stream"),
    "ollama": ("ollama", "http://ollama.test:11434", "application/x-ndjson"),
}
WHOLE: dict[str, Any] = {
    "openai-compat": {
        "id": "c1", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi", "reasoning_content": "think",
                                              "tool_calls": [{"id": "call_1", "type": "function",
                                                              "function": {"name": "get_weather",
                                                                           "arguments": "{\"city\":\"Paris\"}"}}]},
                     "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2},
                  "completion_tokens_details": {"reasoning_tokens": 1}},
    },
    "anthropic": {
        "id": "m1", "type": "message", "role": "assistant", "stop_reason": "tool_use",
        "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "Hi"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3,
                  "cache_creation_input_tokens": 1},
    },
    "ollama": {
        "model": "qwen3:8b", "done": True, "done_reason": "stop", "prompt_eval_count": 10, "eval_count": 5,
        "message": {"role": "assistant", "content": "Hi", "thinking": "hmm",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    },
}
TOOLS = [ToolSpec(name="get_weather", parameters={"type": "object"}), ToolSpec(name="get_time")]
PART_FIELDS: dict[type, dict[str, tuple[type, ...]]] = {
    TextDelta: {"text": (str,)},
    ThinkingDelta: {"text": (str,), "signature": (str, type(None))},
    ToolCallStart: {"id": (str,), "name": (str,)},
    ToolCallDelta: {"id": (str,), "arguments": (str,)},
    ToolCallEnd: {"id": (str,), "name": (str,), "arguments": (str,)},
    Finish: {"reason": (str,), "raw_reason": (str, type(None))},
}


def _recorded(folder: str) -> list[list[str]]:
    """Each recorded stream of a family as its events (SSE) or lines (NDJSON), as text."""
    out = []
    for path in sorted((FIXTURES / folder).iterdir()):
        text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
        if path.suffix == ".sse":
            out.append([e.strip("\n") for e in text.split("\n\n") if e.strip()])
        else:
            out.append([line for line in text.split("\n") if line])
    return out


RECORDED = {family: _recorded(folder) for family, (folder, _, _) in FAMILIES.items()}

@st.composite
def mutated_event(draw: st.DrawFn, event: str, sse: bool) -> str:
    lines = event.split("\n")
    out = []
    for line in lines:
        prefix, text = ("data: ", line[6:]) if sse and line.startswith("data: ") else ("", line)
        if (prefix or not sse) and draw(st.integers(0, 3)) == 0:
            try:
                document = json.loads(text)
            except ValueError:
                document = None
            if document is not None:
                text = json.dumps(draw(mutated_document(document)), ensure_ascii=draw(st.booleans()))
        elif sse and not prefix and draw(st.integers(0, 9)) == 0:
            text = draw(st.sampled_from(["event: error", "event: message", "event: ", "id: 7", ": keep-alive", "retry: x"]))
        out.append(prefix + text)
    return "\n".join(out)


@st.composite
def provider_answers(draw: st.DrawFn) -> tuple[str, bool, Reply]:
    """(provider type, stream or whole, what the provider answers)."""
    family = draw(st.sampled_from(sorted(FAMILIES)))
    _, _, stream_type = FAMILIES[family]
    stream = draw(st.booleans())
    if stream:
        sse = stream_type == "text/event-stream"
        events = [draw(mutated_event(e, sse)) for e in draw(edited(draw(st.sampled_from(RECORDED[family]))))]
        if draw(st.integers(0, 7)) == 0:
            events.insert(draw(st.integers(0, len(events))), draw(st.sampled_from(["{", "data: {", "\x00\xff", "data: [DONE]x"])))
        body = ("\n\n" if sse else "\n").join(events).encode() + (b"\n\n" if sse else b"\n")
        content_type = stream_type
    else:
        body = json.dumps(draw(mutated_document(WHOLE[family]))).encode()
        content_type = "application/json"
    if draw(st.integers(0, 5)) == 0:
        body = body[: draw(st.integers(0, len(body)))]
    if draw(st.integers(0, 9)) == 0:
        content_type = draw(st.sampled_from(["", "text/html", "application/json", "text/event-stream; charset=latin-1"]))
    status = 200 if draw(st.integers(0, 7)) else draw(st.sampled_from([201, 204, 301, 400, 401, 404, 429, 500, 503]))
    chunks = pieces(body, draw(st.sampled_from([1, 3, 17, 256, 1 << 20]))) if body else []
    return family, stream, Reply(status=status, headers={"content-type": content_type} if content_type else {}, chunks=chunks)


def check_parts(parts: list[Any], error: ProviderCallError | None) -> None:
    started: dict[str, set[str]] = {}
    for position, part in enumerate(parts):
        if type(part) is UsageUpdate:
            for field in msgspec.structs.fields(part.usage):
                count = getattr(part.usage, field.name)
                assert count is None or type(count) is int, (field.name, count)
            continue
        assert type(part) in PART_FIELDS, part
        for name, types in PART_FIELDS[type(part)].items():
            assert isinstance(getattr(part, name), types), (part, name)
        if type(part) is ToolCallStart:
            started.setdefault(part.id, set()).add(part.name)
        elif type(part) is ToolCallEnd and part.id in started:
            assert part.name in started[part.id], (part, started[part.id])
        elif type(part) is Finish:
            assert position == len(parts) - 1, "a Finish that is not the last part"
    if error is None:
        assert parts and type(parts[-1]) is Finish, "an answer that ended without an error and without a Finish"


async def answer(family: str, stream: bool, reply: Reply) -> tuple[list[Any], ProviderCallError | None]:
    _, base_url, _ = FAMILIES[family]
    provider = create_provider(
        ProviderSettings(type=family, base_url=base_url, api_key="sk-test-0123456789", max_retries=0, idle_timeout=2),
        transport=ScriptedTransport(reply),
    )
    request = ChatRequest(model=ModelInfo(id="m-1", supports_reasoning=True), messages=[user("hi")], tools=TOOLS)
    try:
        with anyio.fail_after(10):
            if stream:
                return await drain(provider.stream(request))
            try:
                return await provider.generate(request), None
            except ProviderCallError as exc:
                return [], exc
    finally:
        await provider.aclose()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(provider_answers())
def test_any_answer_gives_well_formed_parts_or_one_typed_error(case: tuple[str, bool, Reply]) -> None:
    family, stream, reply = case
    parts, error = anyio.run(answer, family, stream, reply)
    check_parts(parts, error)



@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_recorded_streams_themselves_pass(family: str) -> None:
    """The property's checks against the unmutated recordings (a check too strict fails here)."""
    _, _, stream_type = FAMILIES[family]
    sse = stream_type == "text/event-stream"
    for events in RECORDED[family]:
        body = (("\n\n" if sse else "\n").join(events) + ("\n\n" if sse else "\n")).encode()
        parts, error = anyio.run(answer, family, True, Reply(headers={"content-type": stream_type}, chunks=[body]))
        check_parts(parts, error)
    parts, error = anyio.run(answer, family, False,
                             Reply(headers={"content-type": "application/json"}, chunks=[json.dumps(WHOLE[family]).encode()]))
    assert error is None, error
    check_parts(parts, error)
    assert any(type(p) is ToolCallEnd for p in parts)
