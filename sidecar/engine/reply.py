"""ReplyBuilder: the content of an assistant message as it streams in.

Accumulates provider stream parts into the parts a MessageV2 stores: text and thinking
runs merged, tool calls completed from their fragments, usage replaced by the latest
cumulative total, citations replaced by the latest full list. ``snapshot()`` gives the
columns to persist at any moment, so a partial reply can be flushed at a bounded interval
and on every state change (the citations are stored by the reply's driver, not here).
"""

from __future__ import annotations

import msgspec

from protocol.limits import MAX_JSON_DEPTH
from protocol.types import (
    Citation,
    ContentPart,
    MessageV2,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultPart,
    ToolUsePart,
    Usage,
)
from sidecar.jsondepth import json_too_deep


class ReplySnapshot(msgspec.Struct, frozen=True):
    content_type: str
    text_content: str
    parts: list[ContentPart] | None
    tool_calls: list[ToolCall] | None
    citations: list[Citation] | None = None


class ReplyBuilder:
    def __init__(self) -> None:
        self.parts: list[ContentPart] = []
        self.tool_calls: list[ToolCall] = []
        self.usage: Usage | None = None
        self.citations: list[Citation] = []
        self.finish_reason: str | None = None
        self._text: list[str] = []  # text runs, joined on demand
        self.dirty = False

    def add_delta(self, kind: str, text: str) -> None:
        """``text`` or ``thinking`` (the StreamRelay's delta kinds)."""
        if kind == "text":
            self.add_text(text)
        else:
            self.add_thinking(text)

    def add_text(self, text: str) -> None:
        if not text:
            return
        last = self.parts[-1] if self.parts else None
        if isinstance(last, TextPart):
            self.parts[-1] = TextPart(text=last.text + text)
        else:
            self.parts.append(TextPart(text=text))
        self._text.append(text)
        self.dirty = True

    def sign_thinking(self, signature: str) -> None:
        """Attach a provider's signature to the latest thinking block."""
        for index in range(len(self.parts) - 1, -1, -1):
            part = self.parts[index]
            if isinstance(part, ThinkingPart):
                self.parts[index] = ThinkingPart(text=part.text, signature=signature)
                self.dirty = True
                return

    def add_thinking(self, text: str) -> None:
        if not text:
            return
        last = self.parts[-1] if self.parts else None
        if isinstance(last, ThinkingPart) and last.signature is None:
            self.parts[-1] = ThinkingPart(text=last.text + text)
        else:  # a signed block is complete: what follows is a new block
            self.parts.append(ThinkingPart(text=text))
        self.dirty = True

    def add_tool_call(self, call_id: str, name: str, arguments: str) -> None:
        try:
            parsed = msgspec.json.decode(arguments or "{}")
        except (msgspec.DecodeError, RecursionError):
            parsed = None
        # a model may send arguments that are not a JSON object, or nest them deeper than
        # stored free-form JSON may be; keep the raw text visible
        deep = isinstance(parsed, dict) and json_too_deep(parsed, MAX_JSON_DEPTH)
        tool_input = parsed if isinstance(parsed, dict) and not deep else {"_raw": arguments}
        self.parts.append(ToolUsePart(id=call_id, name=name, input=tool_input))
        self.tool_calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
        self.dirty = True

    def add_tool_result(self, call_id: str, content: str, is_error: bool) -> None:
        self.parts.append(ToolResultPart(tool_use_id=call_id, content=content, is_error=is_error))
        self.dirty = True

    def add_part(self, part: ContentPart) -> int:
        """Append any part (a diff, a step, an image...); returns its index."""
        self.parts.append(part)
        self.dirty = True
        return len(self.parts) - 1

    def replace_part(self, index: int, part: ContentPart) -> None:
        """A part that changed after it was added (an agent's tool call, updated in place)."""
        self.parts[index] = part
        self.dirty = True

    def unanswered_calls(self) -> list[ToolCall]:
        """Tool calls of this reply that have no ToolResultPart yet, in order."""
        answered = {p.tool_use_id for p in self.parts if isinstance(p, ToolResultPart)}
        return [c for c in self.tool_calls if c.id not in answered]

    def restore(self, message: MessageV2) -> None:
        """Continue a stored reply (a paused tool loop resuming): its parts, calls, usage."""
        if message.parts:
            self.parts = list(message.parts)
        elif message.text_content:
            self.parts = [TextPart(text=message.text_content)]
        self._text = [message.text_content] if message.text_content else []
        self.tool_calls = list(message.tool_calls or [])
        self.usage = message.usage
        self.citations = list(message.citations or [])

    @property
    def text(self) -> str:
        return "".join(self._text)

    def snapshot(self, *, mark_clean: bool = True) -> ReplySnapshot:
        if mark_clean:
            self.dirty = False
        only_text = all(isinstance(p, TextPart) for p in self.parts)
        return ReplySnapshot(
            content_type="text" if only_text else "multipart",
            text_content=self.text,
            parts=None if only_text else list(self.parts),
            tool_calls=list(self.tool_calls) or None,
            citations=list(self.citations) or None,
        )
