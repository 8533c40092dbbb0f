"""OpenAI Chat Completions (and every server that speaks it): request body and SSE parsing.

Owns: ``OpenAICompatProvider`` — POST ``{base_url}/chat/completions``.

Stream decisions (documented here because servers differ):
- ``data: [DONE]`` ends the stream. A stream that ends without ``[DONE]`` but after a
  ``finish_reason`` is complete (several servers omit ``[DONE]``); one that ends with
  neither is TRUNCATED.
- Tool-call fragments are accumulated by ``index``; id and name come with the first
  fragment. A fragment that carries a different id at an index already in use starts
  a new call (servers that send whole calls all at index 0). ToolCallEnd is emitted
  for every open call when the finish_reason arrives, and at ``[DONE]`` for a server
  that never sent one. A missing id is synthesized as ``call_<index>``.
- ``reasoning_content`` (DeepSeek, vLLM) or ``reasoning`` (OpenRouter, Ollama) ->
  ThinkingDelta. ``refusal`` text -> TextDelta, and a ``stop`` finish becomes ``refusal``.
- ``finish_reason: stop`` with tool calls in the step is reported as ``tool_calls``
  (raw_reason keeps ``stop``): some servers say stop after calling tools.
- ``[DONE]`` without a finish_reason ends as ``stop`` (``tool_calls`` if calls were made).
- The usage-only final chunk (``choices: []``, from ``stream_options.include_usage``) and
  any chunk with ``usage`` -> UsageUpdate (cached and reasoning tokens included).
- ``{"error": ...}`` in a chunk (or an ``event: error``) -> ProviderCallError(in_stream).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import httpx2
import msgspec

from protocol.events import FinishReason
from protocol.types import ImagePart, ToolResultPart, ToolUsePart, Usage
from sidecar.providers.base import HttpProvider
from sidecar.providers.errors import ProviderCallError, describe_error_object
from sidecar.providers.history import image_data, part_text, split_messages, tool_input_json
from sidecar.providers.reasoning import openai_effort, openai_family
from sidecar.providers.types import (
    ChatRequest,
    Finish,
    StreamPart,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)

__all__ = ["OpenAICompatProvider", "map_finish_reason"]


# -- wire shapes (unknown fields are ignored by msgspec) ---------------------------


class _Fn(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None
    """A JSON text; a few servers send the object itself."""

    def text(self) -> str:
        args = self.arguments
        if args is None or isinstance(args, str):
            return args or ""
        return msgspec.json.encode(args).decode()


class _ToolCallChunk(msgspec.Struct, gc=False):
    index: int | None = None
    id: str | None = None
    function: _Fn | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCallChunk] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class _CompletionDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


class _FullToolCall(msgspec.Struct):
    id: str | None = None
    function: _Fn | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[_FullToolCall] | None = None


class _FullChoice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None
    finish_reason: str | None = None


class _Completion(msgspec.Struct):
    choices: list[_FullChoice] | None = None
    usage: _Usage | None = None
    error: Any = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)
_completion_decoder = msgspec.json.Decoder(_Completion)

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


def map_finish_reason(raw: str | None, *, has_tool_calls: bool, refused: bool) -> FinishReason:
    reason = _FINISH.get(raw or "stop", "other")
    if reason == "stop":
        if has_tool_calls:
            return "tool_calls"
        if refused:
            return "refusal"
    return reason


def _usage(u: _Usage) -> Usage:
    prompt = u.prompt_tokens_details
    completion = u.completion_tokens_details
    return Usage(
        input_tokens=u.prompt_tokens or 0,
        output_tokens=u.completion_tokens or 0,
        cache_read_tokens=prompt.cached_tokens if prompt is not None else None,
        cache_write_tokens=prompt.cache_write_tokens if prompt is not None else None,
        reasoning_tokens=completion.reasoning_tokens if completion is not None else None,
    )


class _Call:
    __slots__ = ("id", "name", "args", "started", "closed")

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.name = ""
        self.args: list[str] = []
        self.started = False
        self.closed = False


class _ToolCalls:
    """Accumulates tool-call fragments by index (see the module docstring)."""

    def __init__(self, provider: OpenAICompatProvider) -> None:
        self._provider = provider
        self._by_index: dict[int, _Call] = {}
        self.calls: list[_Call] = []

    def feed(self, fragments: list[_ToolCallChunk]) -> list[StreamPart]:
        out: list[StreamPart] = []
        for position, fragment in enumerate(fragments):
            index = fragment.index if fragment.index is not None else position
            call = self._by_index.get(index)
            if call is None or (fragment.id and fragment.id != call.id):
                call = _Call(fragment.id or f"call_{len(self.calls)}")
                self._by_index[index] = call
                self.calls.append(call)
            fn = fragment.function
            if fn is None:
                continue
            if fn.name and not call.started:
                call.name = fn.name
                call.started = True
                out.append(ToolCallStart(call.id, call.name))
                if call.args:
                    out.append(ToolCallDelta(call.id, "".join(call.args)))
            arguments = fn.text()
            if arguments:
                call.args.append(arguments)
                if call.started:
                    out.append(ToolCallDelta(call.id, arguments))
        return out

    def close(self) -> list[StreamPart]:
        out: list[StreamPart] = []
        for call in self.calls:
            if call.closed:
                continue
            if not call.started:
                raise self._provider.error(f"tool call {call.id!r} arrived without a name", kind="malformed")
            call.closed = True
            out.append(ToolCallEnd(call.id, call.name, "".join(call.args) or "{}"))
        return out


class OpenAICompatProvider(HttpProvider):
    kind = "openai-compat"
    accept = "text/event-stream"

    def endpoint(self) -> httpx2.URL:
        return self._at("/chat/completions")

    def models_endpoint(self) -> httpx2.URL:
        return self._at("/models")

    def auth_headers(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"authorization": f"Bearer {key}"} if key else {}

    # -- request ------------------------------------------------------------------

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        model = request.model
        family = openai_family(model.id)
        body: dict[str, Any] = {"model": model.id, "messages": self._messages(request), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        params = request.params
        if not family.reasoning_model:
            if params.temperature is not None:
                body["temperature"] = params.temperature
            if params.top_p is not None:
                body["top_p"] = params.top_p
        if params.max_tokens is not None:
            body["max_completion_tokens" if family.reasoning_model else "max_tokens"] = params.max_tokens
        effort = openai_effort(model, params.reasoning)
        if effort is not None:
            body["reasoning_effort"] = effort
        if request.tools and model.supports_tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        return body

    def _messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for segment in split_messages(request.messages):
            if segment.role == "system":
                out.append({"role": "system", "content": _joined_text(segment.parts)})
            elif segment.role == "user":
                out.append({"role": "user", "content": _user_content(segment.parts)})
            elif segment.role == "assistant":
                message: dict[str, Any] = {"role": "assistant", "content": _joined_text(segment.parts) or None}
                calls = [
                    {"id": p.id, "type": "function", "function": {"name": p.name, "arguments": tool_input_json(p)}}
                    for p in segment.parts
                    if type(p) is ToolUsePart
                ]
                if calls:
                    message["tool_calls"] = calls
                if message["content"] is not None or calls:
                    out.append(message)
            else:
                out.extend(
                    {"role": "tool", "tool_call_id": p.tool_use_id, "content": p.content}
                    for p in segment.parts
                    if type(p) is ToolResultPart
                )
        return out

    # -- streaming response -----------------------------------------------------------

    async def parse_stream(self, response: httpx2.Response) -> AsyncGenerator[StreamPart, None]:
        decode = _chunk_decoder.decode
        tools = _ToolCalls(self)
        finish: str | None = None
        finished = False
        refused = False
        done = False
        async with aclosing(self.sse_events(response)) as events:
            async for event in events:
                data = event.data
                if data == "[DONE]":
                    done = True
                    break
                if not data:
                    continue
                if event.event == "error":
                    raise self._in_stream(data)
                try:
                    chunk = decode(data)
                except msgspec.DecodeError as exc:
                    raise self.error(f"malformed chunk ({exc}): {data[:200]!r}", kind="malformed") from exc
                if chunk.error is not None:
                    raise self.error(f"error in stream: {describe_error_object(chunk.error)}", kind="in_stream")
                for choice in chunk.choices or ():
                    if choice.index != 0:
                        continue
                    delta = choice.delta
                    if delta is not None:
                        thinking = delta.reasoning_content or delta.reasoning
                        if thinking:
                            yield ThinkingDelta(thinking)
                        if delta.content:
                            yield TextDelta(delta.content)
                        if delta.refusal:
                            refused = True
                            yield TextDelta(delta.refusal)
                        if delta.tool_calls:
                            for part in tools.feed(delta.tool_calls):
                                yield part
                    if choice.finish_reason and not finished:
                        finished = True
                        finish = choice.finish_reason
                        for part in tools.close():
                            yield part
                if chunk.usage is not None:
                    yield UsageUpdate(_usage(chunk.usage))
        if not done and not finished:
            raise self.error("stream ended without finish_reason or [DONE] (truncated)", kind="truncated", retryable=True)
        for part in tools.close():
            yield part
        yield Finish(map_finish_reason(finish, has_tool_calls=bool(tools.calls), refused=refused), finish)

    def _in_stream(self, data: str) -> ProviderCallError:
        try:
            value: Any = msgspec.json.decode(data)
        except msgspec.DecodeError:
            value = data
        if isinstance(value, dict) and "error" in value:
            value = value["error"]
        return self.error(f"error in stream: {describe_error_object(value)}", kind="in_stream")

    # -- whole response -----------------------------------------------------------------

    def parse_response(self, raw: bytes) -> list[StreamPart]:
        try:
            completion = _completion_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise self.error(f"malformed response ({exc})", kind="malformed") from exc
        if completion.error is not None:
            raise self.error(f"error in response: {describe_error_object(completion.error)}", kind="in_stream")
        choice = next((c for c in completion.choices or () if c.index == 0), None)
        if choice is None:
            raise self.error("response has no choices", kind="malformed")
        parts: list[StreamPart] = []
        message = choice.message or _Message()
        thinking = message.reasoning_content or message.reasoning
        if thinking:
            parts.append(ThinkingDelta(thinking))
        if message.content:
            parts.append(TextDelta(message.content))
        if message.refusal:
            parts.append(TextDelta(message.refusal))
        for position, call in enumerate(message.tool_calls or ()):
            fn = call.function
            if fn is None or not fn.name:
                raise self.error("tool call without a name in response", kind="malformed")
            call_id = call.id or f"call_{position}"
            arguments = fn.text() or "{}"
            parts += [ToolCallStart(call_id, fn.name), ToolCallDelta(call_id, arguments), ToolCallEnd(call_id, fn.name, arguments)]
        if completion.usage is not None:
            parts.append(UsageUpdate(_usage(completion.usage)))
        reason = map_finish_reason(
            choice.finish_reason, has_tool_calls=bool(message.tool_calls), refused=bool(message.refusal)
        )
        parts.append(Finish(reason, choice.finish_reason))
        return parts


def _joined_text(parts: list[Any]) -> str:
    return "\n\n".join(t for t in (part_text(p) for p in parts) if t)


def _user_content(parts: list[Any]) -> str | list[dict[str, Any]]:
    if not any(type(p) is ImagePart for p in parts):
        return _joined_text(parts)
    content: list[dict[str, Any]] = []
    for part in parts:
        if type(part) is ImagePart:
            mime, data, url = image_data(part)
            content.append({"type": "image_url", "image_url": {"url": url if data is None else f"data:{mime};base64,{data}"}})
        else:
            text = part_text(part)
            if text:
                content.append({"type": "text", "text": text})
    return content

