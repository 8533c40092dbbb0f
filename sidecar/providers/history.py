"""Turning the request's messages into wire-neutral segments every adapter renders.

Owns: ``split_messages`` (system / user / assistant / tool segments, with the tool
calls and results that live inside assistant messages pulled apart in order),
``resolve_images`` (``file://`` images read into base64 before a request is built)
and small part helpers.

Rules (seed 000 §8: tool calls and their results stay IN the assistant message):
- An assistant message ``[text, tool_use A, tool_use B, result A, result B, text]``
  becomes ``assistant(text, A, B)``, ``tool(A, B)``, ``assistant(text)``: results
  close the segment, anything after them starts a new assistant segment.
- Every tool call gets a result in the segment that follows it; a call without one
  (an aborted or interrupted step) gets a synthesized error result, because every
  API rejects a call left unanswered. A result that answers no call of the
  preceding segment is dropped for the same reason.
- Thinking parts are kept only when they carry a signature (Anthropic sends them
  back); file parts, steps and diffs never reach a provider (the engine turns files
  into text first).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from typing import Literal
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import anyio
import msgspec

from protocol.types import (
    CodePart,
    ContentPart,
    ImagePart,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.providers.errors import ProviderCallError
from sidecar.providers.types import ChatRequest, RequestMessage

__all__ = [
    "Segment",
    "split_messages",
    "resolve_images",
    "part_text",
    "image_data",
    "tool_input_json",
    "MISSING_RESULT",
]

log = logging.getLogger("sidecar.providers")

MISSING_RESULT = "The tool call was not completed; no result is available."

SegmentRole = Literal["system", "user", "assistant", "tool"]


class Segment(msgspec.Struct):
    role: SegmentRole
    parts: list[ContentPart]


def part_text(part: ContentPart) -> str | None:
    """The text a part contributes to a message's text, or None."""
    if type(part) is TextPart:
        return part.text
    if type(part) is CodePart:
        return f"```{part.language}\n{part.code}\n```"
    return None


def tool_input_json(part: ToolUsePart) -> str:
    return msgspec.json.encode(part.input).decode()


def image_data(part: ImagePart) -> tuple[str, str | None, str | None]:
    """``(mime_type, base64 or None, url or None)``; a ``data:`` URL is unpacked."""
    if part.base64:
        return part.mime_type, part.base64, None
    url = part.url or ""
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        mime = header[5:].split(";", 1)[0] or part.mime_type
        if ";base64" in header:
            return mime, payload, None
        return mime, base64.b64encode(unquote(payload).encode()).decode(), None
    return part.mime_type, None, url or None


def split_messages(messages: list[RequestMessage]) -> list[Segment]:
    segments: list[Segment] = []
    for message in messages:
        if message.role == "system":
            _append(segments, "system", [p for p in message.parts if part_text(p) is not None])
        elif message.role == "user":
            results: list[ContentPart] = [p for p in message.parts if type(p) is ToolResultPart]
            if results:
                _append(segments, "tool", results)
            _append(segments, "user", [p for p in message.parts if _user_part(p)])
        else:
            _split_assistant(segments, message.parts)
    return _pair_results(segments)


def _user_part(part: ContentPart) -> bool:
    return type(part) is ImagePart or part_text(part) is not None


def _assistant_part(part: ContentPart) -> bool:
    if type(part) is ThinkingPart:
        return part.signature is not None
    return type(part) is ToolUsePart or part_text(part) is not None


def _split_assistant(segments: list[Segment], parts: list[ContentPart]) -> None:
    current: list[ContentPart] = []
    results: list[ContentPart] = []
    for part in parts:
        if type(part) is ToolResultPart:
            results.append(part)
        elif _assistant_part(part):
            if results:
                _append(segments, "assistant", current)
                _append(segments, "tool", results)
                current, results = [], []
            current.append(part)
    _append(segments, "assistant", current)
    _append(segments, "tool", results)


def _append(segments: list[Segment], role: SegmentRole, parts: list[ContentPart]) -> None:
    if not parts:
        return
    if segments and segments[-1].role == role and role != "assistant":
        # Two user (or tool) runs in a row read as one turn on every API.
        segments[-1].parts.extend(parts)
    else:
        segments.append(Segment(role, list(parts)))


def _pair_results(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    pending: list[ToolUsePart] = []
    for segment in segments:
        if segment.role == "tool":
            wanted = {call.id for call in pending}
            kept: list[ContentPart] = [
                p for p in segment.parts if type(p) is ToolResultPart and p.tool_use_id in wanted
            ]
            if len(kept) != len(segment.parts):
                log.debug("dropped %d tool results that answer no call", len(segment.parts) - len(kept))
            answered = {p.tool_use_id for p in kept if type(p) is ToolResultPart}
            kept.extend(_missing(pending, answered))
            pending = []
            if kept:
                out.append(Segment("tool", kept))
            continue
        if pending:
            out.append(Segment("tool", _missing(pending, set())))
            pending = []
        if segment.role == "assistant":
            pending = [p for p in segment.parts if type(p) is ToolUsePart]
        out.append(segment)
    if pending:
        out.append(Segment("tool", _missing(pending, set())))
    return out


def _missing(calls: list[ToolUsePart], answered: set[str]) -> list[ContentPart]:
    return [
        ToolResultPart(tool_use_id=call.id, content=MISSING_RESULT, is_error=True)
        for call in calls
        if call.id not in answered
    ]


async def resolve_images(request: ChatRequest, describe: Callable[[str], str]) -> ChatRequest:
    """``request`` with every ``file://`` image replaced by its bytes in base64.

    Returns ``request`` itself when it has none (the common case costs one scan).
    """
    if not any(_is_local(p) for m in request.messages for p in m.parts):
        return request
    messages: list[RequestMessage] = []
    for message in request.messages:
        parts: list[ContentPart] = []
        for part in message.parts:
            if _is_local(part):
                assert type(part) is ImagePart and part.url is not None
                parts.append(await _load(part, part.url, describe))
            else:
                parts.append(part)
        messages.append(RequestMessage(role=message.role, parts=parts))
    return msgspec.structs.replace(request, messages=messages)


def _is_local(part: ContentPart) -> bool:
    return type(part) is ImagePart and not part.base64 and (part.url or "").startswith("file:")


async def _load(part: ImagePart, url: str, describe: Callable[[str], str]) -> ImagePart:
    path = anyio.Path(url2pathname(unquote(urlsplit(url).path)))
    try:
        data = await path.read_bytes()
    except OSError as exc:
        raise ProviderCallError(
            describe(f"cannot read the image {path.name!r} for the request: {exc.strerror}"),
            kind="bad_request",
        ) from exc
    return ImagePart(mime_type=part.mime_type, base64=base64.b64encode(data).decode())
