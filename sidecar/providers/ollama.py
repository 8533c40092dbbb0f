"""Ollama's native chat API: request body and NDJSON parsing.

Owns: ``OllamaProvider`` — POST ``{base_url}/api/chat`` (``/chat`` when the base URL
already ends in ``/api``); no auth unless an API key is set (then Bearer, for
Ollama behind a proxy or ollama.com).

Request: system messages as ``role: system``; images as base64 in ``images`` (Ollama
takes no URLs: an http(s) image is a ProviderCallError(bad_request)); tool calls as
``tool_calls[{function:{name, arguments:<object>}}]`` on the assistant message, each
result a ``role: tool`` message with ``tool_name``; ``options.temperature/top_p/
num_predict``; ``think`` per ``reasoning.ollama_think``.

Stream: one JSON object per line (``aiter_lines``). ``message.thinking`` ->
ThinkingDelta, ``message.content`` -> TextDelta, ``message.tool_calls`` arrive whole:
each -> ToolCallStart/Delta/End at once, arguments (an object) re-encoded as JSON
text, id taken from the call when the server sends one, else synthesized
(``call_<n>``). ``done: true`` carries ``done_reason`` and ``prompt_eval_count`` /
``eval_count`` -> UsageUpdate then Finish. ``{"error": ...}`` -> ProviderCallError(in_stream);
a stream without ``done: true`` is TRUNCATED.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

import httpx2
import msgspec

from protocol.events import FinishReason
from protocol.types import ImagePart, ToolResultPart, ToolUsePart, Usage
from sidecar.providers.base import HttpProvider
from sidecar.providers.errors import describe_error_object
from sidecar.providers.history import image_data, part_text, split_messages
from sidecar.providers.reasoning import ollama_think
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

__all__ = ["OllamaProvider", "map_done_reason"]

_DONE: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


def map_done_reason(raw: str | None, *, has_tool_calls: bool) -> FinishReason:
    reason = _DONE.get(raw or "stop", "other")
    return "tool_calls" if reason == "stop" and has_tool_calls else reason


class _Fn(msgspec.Struct, gc=False):
    name: str = ""
    arguments: Any = None


class _ToolCall(msgspec.Struct, gc=False):
    id: str | None = None
    function: _Fn | None = None


class _Message(msgspec.Struct, gc=False):
    content: str | None = None
    thinking: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Line(msgspec.Struct, gc=False):
    message: _Message | None = None
    done: bool = False
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    error: Any = None


_line_decoder = msgspec.json.Decoder(_Line)


class OllamaProvider(HttpProvider):
    kind = "ollama"
    accept = "application/x-ndjson"

    def endpoint(self) -> httpx2.URL:
        return self._at("/chat" if self._base.endswith("/api") else "/api/chat")

    def models_endpoint(self) -> httpx2.URL:
        return self._at("/tags" if self._base.endswith("/api") else "/api/tags")

    def auth_headers(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"authorization": f"Bearer {key}"} if key else {}

    # -- request ------------------------------------------------------------------

    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        model = request.model
        params = request.params
        body: dict[str, Any] = {"model": model.id, "messages": self._messages(request), "stream": stream}
        options: dict[str, Any] = {}
        if params.temperature is not None:
            options["temperature"] = params.temperature
        if params.top_p is not None:
            options["top_p"] = params.top_p
        if params.max_tokens is not None:
            options["num_predict"] = params.max_tokens
        if options:
            body["options"] = options
        think = ollama_think(model, params.reasoning)
        if think is not None:
            body["think"] = think
        if request.tools and model.supports_tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
        return body

    def _messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        names = {p.id: p.name for m in request.messages for p in m.parts if type(p) is ToolUsePart}
        out: list[dict[str, Any]] = []
        for segment in split_messages(request.messages):
            if segment.role == "tool":
                for part in segment.parts:
                    if type(part) is ToolResultPart:
                        out.append({"role": "tool", "content": part.content, "tool_name": names.get(part.tool_use_id, "")})
                continue
            text = "\n\n".join(t for t in (part_text(p) for p in segment.parts) if t)
            message: dict[str, Any] = {"role": segment.role, "content": text}
            images = [self._image(p) for p in segment.parts if type(p) is ImagePart]
            if images:
                message["images"] = images
            calls = [
                {"function": {"name": p.name, "arguments": p.input}} for p in segment.parts if type(p) is ToolUsePart
            ]
            if calls:
                message["tool_calls"] = calls
            out.append(message)
        return out

    def _image(self, part: ImagePart) -> str:
        _, data, url = image_data(part)
        if data is None:
            raise self.error(f"Ollama accepts image bytes only, not a URL ({url})", kind="bad_request")
        return data

    # -- streaming response -----------------------------------------------------------

    async def parse_stream(self, response: httpx2.Response) -> AsyncGenerator[StreamPart, None]:
        decode = _line_decoder.decode
        calls = 0
        async with aclosing(cast(AsyncGenerator[str, None], response.aiter_lines())) as lines:
            async for raw in lines:
                if not raw or raw.isspace():
                    continue
                try:
                    line = decode(raw)
                except msgspec.DecodeError as exc:
                    raise self.error(f"malformed line ({exc}): {raw[:200]!r}", kind="malformed") from exc
                if line.error is not None:
                    raise self.error(f"error in stream: {describe_error_object(line.error)}", kind="in_stream")
                message = line.message
                if message is not None:
                    if message.thinking:
                        yield ThinkingDelta(message.thinking)
                    if message.content:
                        yield TextDelta(message.content)
                    if message.tool_calls:
                        for part in self._calls(message.tool_calls, calls):
                            yield part
                        calls += len(message.tool_calls)
                if line.done:
                    yield UsageUpdate(Usage(input_tokens=line.prompt_eval_count or 0, output_tokens=line.eval_count or 0))
                    yield Finish(map_done_reason(line.done_reason, has_tool_calls=calls > 0), line.done_reason)
                    return
        raise self.error("stream ended without done:true (truncated)", kind="truncated", retryable=True)

    def _calls(self, tool_calls: list[_ToolCall], first: int) -> list[StreamPart]:
        out: list[StreamPart] = []
        for offset, call in enumerate(tool_calls):
            fn = call.function
            if fn is None or not fn.name:
                raise self.error("tool call without a name", kind="malformed")
            call_id = call.id or f"call_{first + offset}"
            arguments = fn.arguments
            if isinstance(arguments, str):
                text = arguments or "{}"
            else:
                text = msgspec.json.encode(arguments if arguments is not None else {}).decode()
            out += [ToolCallStart(call_id, fn.name), ToolCallDelta(call_id, text), ToolCallEnd(call_id, fn.name, text)]
        return out

    # -- whole response -----------------------------------------------------------------

    def parse_response(self, raw: bytes) -> list[StreamPart]:
        try:
            line = _line_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise self.error(f"malformed response ({exc})", kind="malformed") from exc
        if line.error is not None:
            raise self.error(f"error in response: {describe_error_object(line.error)}", kind="in_stream")
        parts: list[StreamPart] = []
        message = line.message or _Message()
        if message.thinking:
            parts.append(ThinkingDelta(message.thinking))
        if message.content:
            parts.append(TextDelta(message.content))
        if message.tool_calls:
            parts += self._calls(message.tool_calls, 0)
        parts.append(UsageUpdate(Usage(input_tokens=line.prompt_eval_count or 0, output_tokens=line.eval_count or 0)))
        parts.append(Finish(map_done_reason(line.done_reason, has_tool_calls=bool(message.tool_calls)), line.done_reason))
        return parts
