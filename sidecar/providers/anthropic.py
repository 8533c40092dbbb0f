"""Anthropic Messages: request body and SSE event parsing.

Owns: ``AnthropicProvider`` — POST ``{base_url}/v1/messages`` (``/messages`` when the
base URL already ends in ``/v1``), headers ``x-api-key`` and ``anthropic-version``.

Request decisions:
- System messages are joined into the top-level ``system``.
- Tool calls become ``tool_use`` blocks of the assistant message; their results a
  following user message of ``tool_result`` blocks; consecutive same-role messages
  are merged (the API wants alternation, tool results first in their message).
- Thinking parts go back (as ``thinking`` blocks, unchanged) only when they carry a
  signature and thinking is enabled for this request; the API requires them when a
  tool-use turn continues. ``redacted_thinking`` blocks are not kept (a known gap).
- ``max_tokens`` is always sent (see ``reasoning`` for the thinking budget rules).

Stream decisions: ``ping`` and unknown event types are ignored; text, thinking and
signature deltas map to Text/ThinkingDelta; ``input_json_delta`` fragments accumulate
per content block index into ToolCallDelta and a ToolCallEnd at ``content_block_stop``
(or at the end of the message for a block cut by ``max_tokens``); usage from
``message_start`` is merged with the cumulative ``message_delta`` usage; ``event: error``
-> ProviderCallError(in_stream); a stream without ``message_stop`` is TRUNCATED.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import httpx2
import msgspec

from protocol.events import FinishReason
from protocol.types import ImagePart, ThinkingPart, ToolResultPart, ToolUsePart, Usage
from sidecar.providers.base import HttpProvider
from sidecar.providers.errors import describe_error_object
from sidecar.providers.history import image_data, part_text, split_messages
from sidecar.providers.reasoning import anthropic_thinking
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

__all__ = ["AnthropicProvider", "ANTHROPIC_VERSION", "map_stop_reason"]

ANTHROPIC_VERSION = "2023-06-01"

_STOP: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "refusal",
}
# Error types after which a fresh request may well succeed.
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


def map_stop_reason(raw: str | None, *, has_tool_calls: bool) -> FinishReason:
    if raw is None:
        return "tool_calls" if has_tool_calls else "stop"
    return _STOP.get(raw, "other")


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Block(msgspec.Struct, gc=False):
    type: str = ""
    id: str | None = None
    name: str | None = None
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    input: Any = None


class _Delta(msgspec.Struct, gc=False):
    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None
    stop_reason: str | None = None


class _Message(msgspec.Struct, gc=False):
    content: list[_Block] = []
    stop_reason: str | None = None
    usage: _Usage | None = None


class _Event(msgspec.Struct, gc=False):
    type: str = ""
    index: int | None = None
    message: _Message | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: Any = None


class _Response(msgspec.Struct):
    type: str = ""
    content: list[_Block] = []
    stop_reason: str | None = None
    usage: _Usage | None = None
    error: Any = None


_event_decoder = msgspec.json.Decoder(_Event)
_response_decoder = msgspec.json.Decoder(_Response)


class _UsageTotals:
    """message_start usage, overridden field by field by cumulative message_delta usage."""

    __slots__ = ("input", "output", "cache_read", "cache_write")

    def __init__(self) -> None:
        self.input = 0
        self.output = 0
        self.cache_read: int | None = None
        self.cache_write: int | None = None

    def merge(self, u: _Usage) -> Usage:
        if u.input_tokens is not None:
            self.input = u.input_tokens
        if u.output_tokens is not None:
            self.output = u.output_tokens
        if u.cache_read_input_tokens is not None:
            self.cache_read = u.cache_read_input_tokens
        if u.cache_creation_input_tokens is not None:
            self.cache_write = u.cache_creation_input_tokens
        return Usage(
            input_tokens=self.input + (self.cache_read or 0) + (self.cache_write or 0),
            output_tokens=self.output,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
        )


class _ToolBlock:
    __slots__ = ("id", "name", "args")

    def __init__(self, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self.args: list[str] = []

    def end(self) -> ToolCallEnd:
        return ToolCallEnd(self.id, self.name, "".join(self.args) or "{}")


class AnthropicProvider(HttpProvider):
    kind = "anthropic"
    accept = "text/event-stream"

    def endpoint(self) -> httpx2.URL:
        return self._at("/messages" if self._base.endswith("/v1") else "/v1/messages")

    def models_endpoint(self) -> httpx2.URL:
        url = self._at("/models" if self._base.endswith("/v1") else "/v1/models")
        return url.copy_merge_params({"limit": "1000"})

    def auth_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self.settings.api_key:
            headers["x-api-key"] = self.settings.api_key
        return headers

    # -- request ------------------------------------------------------------------

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        model = request.model
        params = request.params
        plan = anthropic_thinking(model, params.reasoning, params.max_tokens)
        thinking = plan.budget_tokens is not None
        system, messages = self._messages(request, keep_thinking=thinking)
        body: dict[str, Any] = {"model": model.id, "max_tokens": plan.max_tokens, "messages": messages}
        if system:
            body["system"] = system
        if stream:
            body["stream"] = True
        if thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": plan.budget_tokens}
        else:
            if params.temperature is not None:
                body["temperature"] = params.temperature
            if params.top_p is not None:
                body["top_p"] = params.top_p
        if request.tools and model.supports_tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters or {"type": "object"}}
                for t in request.tools
            ]
        return body

    def _messages(self, request: ChatRequest, *, keep_thinking: bool) -> tuple[str, list[dict[str, Any]]]:
        system: list[str] = []
        messages: list[dict[str, Any]] = []
        for segment in split_messages(request.messages):
            if segment.role == "system":
                system.extend(t for t in (part_text(p) for p in segment.parts) if t)
                continue
            blocks: list[dict[str, Any]] = []
            role = "assistant" if segment.role == "assistant" else "user"
            for part in segment.parts:
                if type(part) is ToolResultPart:
                    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": part.tool_use_id, "content": part.content}
                    if part.is_error:
                        block["is_error"] = True
                    blocks.append(block)
                elif type(part) is ToolUsePart:
                    blocks.append({"type": "tool_use", "id": part.id, "name": part.name, "input": part.input})
                elif type(part) is ThinkingPart:
                    if keep_thinking and part.signature:
                        blocks.append({"type": "thinking", "thinking": part.text, "signature": part.signature})
                elif type(part) is ImagePart:
                    mime, data, url = image_data(part)
                    source = (
                        {"type": "base64", "media_type": mime, "data": data}
                        if data is not None
                        else {"type": "url", "url": url}
                    )
                    blocks.append({"type": "image", "source": source})
                else:
                    text = part_text(part)
                    # The API rejects empty text blocks.
                    if text and text.strip():
                        blocks.append({"type": "text", "text": text})
            if not blocks:
                continue
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})
        return "\n\n".join(system), messages

    # -- streaming response -----------------------------------------------------------

    async def parse_stream(self, response: httpx2.Response) -> AsyncGenerator[StreamPart, None]:
        decode = _event_decoder.decode
        usage = _UsageTotals()
        tools: dict[int, _ToolBlock] = {}
        any_tool = False
        stop_reason: str | None = None
        done = False
        async with aclosing(self.sse_events(response)) as events:
            async for event in events:
                name = event.event
                if name == "ping":
                    continue
                try:
                    ev = decode(event.data)
                except msgspec.DecodeError as exc:
                    raise self.error(f"malformed event ({exc}): {event.data[:200]!r}", kind="malformed") from exc
                if name == "message":
                    name = ev.type
                if name == "content_block_delta":
                    delta = ev.delta
                    if delta is None:
                        continue
                    kind = delta.type
                    if kind == "text_delta":
                        if delta.text:
                            yield TextDelta(delta.text)
                    elif kind == "input_json_delta":
                        block = tools.get(ev.index if ev.index is not None else -1)
                        if block is not None and delta.partial_json:
                            block.args.append(delta.partial_json)
                            yield ToolCallDelta(block.id, delta.partial_json)
                    elif kind == "thinking_delta":
                        if delta.thinking:
                            yield ThinkingDelta(delta.thinking)
                    elif kind == "signature_delta":
                        if delta.signature:
                            yield ThinkingDelta("", delta.signature)
                elif name == "content_block_start":
                    block_start = ev.content_block
                    if block_start is None:
                        continue
                    if block_start.type == "text":
                        if block_start.text:
                            yield TextDelta(block_start.text)
                    elif block_start.type == "thinking":
                        if block_start.thinking:
                            yield ThinkingDelta(block_start.thinking, block_start.signature or None)
                    elif block_start.type == "tool_use":
                        if not block_start.id or not block_start.name:
                            raise self.error("tool_use block without id or name", kind="malformed")
                        tool = _ToolBlock(block_start.id, block_start.name)
                        tools[ev.index if ev.index is not None else -1] = tool
                        any_tool = True
                        yield ToolCallStart(tool.id, tool.name)
                        if isinstance(block_start.input, dict) and block_start.input:
                            whole = msgspec.json.encode(block_start.input).decode()
                            tool.args.append(whole)
                            yield ToolCallDelta(tool.id, whole)
                elif name == "content_block_stop":
                    tool_done = tools.pop(ev.index if ev.index is not None else -1, None)
                    if tool_done is not None:
                        yield tool_done.end()
                elif name == "message_start":
                    if ev.message is not None and ev.message.usage is not None:
                        yield UsageUpdate(usage.merge(ev.message.usage))
                elif name == "message_delta":
                    if ev.delta is not None and ev.delta.stop_reason is not None:
                        stop_reason = ev.delta.stop_reason
                    if ev.usage is not None:
                        yield UsageUpdate(usage.merge(ev.usage))
                elif name == "message_stop":
                    done = True
                    break
                elif name == "error":
                    error = ev.error if ev.error is not None else event.data
                    retryable = isinstance(error, dict) and error.get("type") in _RETRYABLE_ERRORS
                    raise self.error(
                        f"error in stream: {describe_error_object(error)}", kind="in_stream", retryable=retryable
                    )
                # Anything else (future event types) is tolerated and ignored.
        if not done:
            raise self.error("stream ended without message_stop (truncated)", kind="truncated", retryable=True)
        for tool in tools.values():
            yield tool.end()
        yield Finish(map_stop_reason(stop_reason, has_tool_calls=any_tool), stop_reason)

    # -- whole response -----------------------------------------------------------------

    def parse_response(self, raw: bytes) -> list[StreamPart]:
        try:
            message = _response_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise self.error(f"malformed response ({exc})", kind="malformed") from exc
        if message.type == "error" or message.error is not None:
            raise self.error(f"error in response: {describe_error_object(message.error)}", kind="in_stream")
        parts: list[StreamPart] = []
        any_tool = False
        for block in message.content:
            if block.type == "text" and block.text:
                parts.append(TextDelta(block.text))
            elif block.type == "thinking":
                parts.append(ThinkingDelta(block.thinking or "", block.signature or None))
            elif block.type == "tool_use":
                if not block.id or not block.name:
                    raise self.error("tool_use block without id or name", kind="malformed")
                any_tool = True
                arguments = msgspec.json.encode(block.input if block.input is not None else {}).decode()
                parts += [
                    ToolCallStart(block.id, block.name),
                    ToolCallDelta(block.id, arguments),
                    ToolCallEnd(block.id, block.name, arguments),
                ]
        if message.usage is not None:
            parts.append(UsageUpdate(_UsageTotals().merge(message.usage)))
        parts.append(Finish(map_stop_reason(message.stop_reason, has_tool_calls=any_tool), message.stop_reason))
        return parts
