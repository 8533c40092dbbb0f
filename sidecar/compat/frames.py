"""V1 progress frames: ChatStreamEvents of a turn -> ``GET /computer/progress`` SSE events.

A frame is ``event: <subType>\\ndata: <UnifiedSessionMessage JSON>\\n\\n`` where the message is
``{sessionId, acpSessionId?, messageType, subType, data, timestamp}`` (compact JSON, keys
in that order, UTF-8 as is), as V1 wrote it. ``sessionId`` (and ``acpSessionId``) is the
local session id that ``/computer/chat`` returned.

Mapping (``FrameBuilder``):

    stream_start            prompt_start          sessionPromptStart   {request_id}
    text_delta              agent_message_chunk   agentSessionUpdate   content {type: text, text}
    thinking_delta          agent_thought_chunk   agentSessionUpdate   content {type: text, text}
    tool_call_start         tool_call             agentSessionUpdate   toolCallId, title, status pending, rawInput
    tool_approval_required  tool_call_update      (only when the arguments are new: rawInput)
    tool_result             tool_call_update      status completed|failed, content [text], rawInput if unsent
    plan                    plan                  agentSessionUpdate   entries
    usage (context known)   usage_update          agentSessionUpdate   used, size
    stream_end              end_turn | max_tokens | max_turn_requests | refusal   sessionPromptEnd
    aborted                 cancelled (or error "Session cancelled" with cancel_as_error)
    error                   error                 sessionPromptEnd
    tool_call_delta, notice (no frame)

Flavors (README "V1 /computer/chat" lists every difference):
- electron: ``data`` of an update is the ACP update object (``sessionUpdate`` first);
  ``acpSessionId`` present (not on pings and the idle end); end ``data`` is
  ``{reason: "end_turn", description: "Prompt completed: end_turn"}``, error ``{reason:
  "error", description}``; timestamps ``2026-03-09T02:25:01.120Z``;
- rcoder: ``data`` is the ACP payload without ``sessionUpdate`` plus ``request_id``; no
  ``acpSessionId``; end ``{reason: "EndTurn", description: "Normal end", request_id}``,
  error ``{code, message, request_id}``; timestamps as chrono writes them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from protocol.compat import CompatFlavor
from protocol.events import (
    AbortedEvent,
    ChatStreamEvent,
    ErrorEvent,
    PlanEvent,
    StreamEndEvent,
    StreamStartEvent,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolApprovalRequiredEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEvent,
    UsageEvent,
)

PROMPT_START = "sessionPromptStart"
PROMPT_END = "sessionPromptEnd"
UPDATE = "agentSessionUpdate"
HEARTBEAT = "heartbeat"

IDLE_DESCRIPTION = "Agent 当前无在执行任务"
SESSION_CANCELLED = "Session cancelled"
FINISH_SUBTYPES = {
    "stop": "end_turn",
    "length": "max_tokens",
    "max_turn_requests": "max_turn_requests",
    "refusal": "refusal",
    "content_filter": "refusal",
}
"""ChatStreamEvent finish reasons -> V1 end subtypes (any other reason ends as end_turn)."""
RCODER_REASONS = {
    "end_turn": ("EndTurn", "Normal end"),
    "max_tokens": ("MaxTokens", "Max token limit reached"),
    "max_turn_requests": ("MaxTurnRequests", "Max turn request limit reached"),
    "refusal": ("Refusal", "Agent refused to continue"),
    "cancelled": ("Cancelled", "User cancelled"),
}
INTERNAL_ERROR_CODE = -32603


class _Message(msgspec.Struct, rename="camel", kw_only=True):
    session_id: str
    acp_session_id: str | msgspec.UnsetType = msgspec.UNSET
    message_type: str
    sub_type: str
    data: Any
    timestamp: str


_encoder = msgspec.json.Encoder()


class Frame:
    """One SSE event. ``terminal``: it ends the turn (a sessionPromptEnd)."""

    __slots__ = ("event", "message", "terminal", "_bytes", "text_kind")

    def __init__(self, message: _Message, *, text_kind: str | None = None) -> None:
        self.event = message.sub_type
        self.message = message
        self.terminal = message.message_type == PROMPT_END
        self.text_kind = text_kind
        """``agent_message_chunk`` / ``agent_thought_chunk`` frames carry text that can be merged."""
        self._bytes: bytes | None = None

    def encode(self) -> bytes:
        if self._bytes is None:
            self._bytes = b"event: " + self.event.encode() + b"\ndata: " + _encoder.encode(self.message) + b"\n\n"
        return self._bytes

    def __len__(self) -> int:
        return len(self.encode())


def _iso_ms(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _chrono(now: dt.datetime, utc_suffix: str = "Z") -> str:
    # chrono's AutoSi: no fraction, or 3, 6 digits as the value needs (Python has microseconds)
    base = now.strftime("%Y-%m-%dT%H:%M:%S")
    us = now.microsecond
    if us == 0:
        frac = ""
    elif us % 1000 == 0:
        frac = f".{us // 1000:03d}"
    else:
        frac = f".{us:06d}"
    return base + frac + utc_suffix


class Frames:
    """Makes the frames of one session for one flavor (the clock is injectable for tests)."""

    def __init__(self, flavor: CompatFlavor, session_id: str, *, cancel_as_error: bool = False, clock: Any = None) -> None:
        self.flavor = flavor
        self.session_id = session_id
        self.cancel_as_error = cancel_as_error
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))

    def _now(self) -> dt.datetime:
        return self._clock()

    def timestamp(self) -> str:
        now = self._now()
        return _iso_ms(now) if self.flavor == "electron" else _chrono(now)

    def _message(self, message_type: str, sub_type: str, data: Any, *, acp: bool = True) -> _Message:
        return _Message(
            session_id=self.session_id,
            acp_session_id=self.session_id if acp and self.flavor == "electron" else msgspec.UNSET,
            message_type=message_type,
            sub_type=sub_type,
            data=data,
            timestamp=self.timestamp(),
        )

    # -- frames that belong to no turn ----------------------------------------------

    def ping(self) -> Frame:
        now = self._now()
        stamp = _iso_ms(now) if self.flavor == "electron" else _chrono(now, "+00:00")
        data = {"type": "heartbeat", "message": "keep-alive", "timestamp": stamp}
        return Frame(self._message(HEARTBEAT, "ping", data, acp=False))

    def idle_end(self) -> Frame:
        data = {"reason": "EndTurn", "description": IDLE_DESCRIPTION}
        return Frame(self._message(PROMPT_END, "end_turn", data, acp=False))

    # -- a turn ---------------------------------------------------------------------

    def update(self, kind: str, body: dict[str, Any], request_id: str | None, *, text_kind: str | None = None) -> Frame:
        if self.flavor == "electron":
            data: dict[str, Any] = {"sessionUpdate": kind, **body}
        else:
            data = dict(body)
            if request_id is not None:
                data["request_id"] = request_id
        return Frame(self._message(UPDATE, kind, data), text_kind=text_kind)

    def text(self, kind: str, text: str, request_id: str | None) -> Frame:
        return self.update(kind, {"content": {"type": "text", "text": text}}, request_id, text_kind=kind)

    def prompt_start(self, request_id: str | None) -> Frame:
        return Frame(self._message(PROMPT_START, "prompt_start", {} if request_id is None else {"request_id": request_id}))

    def end(self, sub_type: str, request_id: str | None) -> Frame:
        if self.flavor == "electron":
            data: dict[str, Any] = {"reason": sub_type, "description": f"Prompt completed: {sub_type}"}
        else:
            reason, description = RCODER_REASONS.get(sub_type, ("EndTurn", "Normal end"))
            data = {"reason": reason, "description": description}
            if request_id is not None:
                data["request_id"] = request_id
        return Frame(self._message(PROMPT_END, sub_type, data))

    def cancelled(self, request_id: str | None) -> Frame:
        if self.cancel_as_error:
            return self.error(SESSION_CANCELLED, None, request_id)
        return self.end("cancelled", request_id)

    def error(self, description: str, code: int | None, request_id: str | None) -> Frame:
        if self.flavor == "electron":
            data: dict[str, Any] = {"reason": "error", "description": description}
        else:
            data = {"code": INTERNAL_ERROR_CODE if code is None else code, "message": description}
            if request_id is not None:
                data["request_id"] = request_id
        return Frame(self._message(PROMPT_END, "error", data))

    def merged(self, first: Frame, text: str) -> Frame:
        """``first`` (a text frame) with ``text`` appended (the early buffer merges when full)."""
        assert first.text_kind is not None
        data = dict(first.message.data)
        content = dict(data["content"])
        content["text"] = content.get("text", "") + text
        data["content"] = content
        message = msgspec.structs.replace(first.message, data=data)
        return Frame(message, text_kind=first.text_kind)


class _Tool:
    __slots__ = ("arguments", "sent")

    def __init__(self, arguments: str) -> None:
        self.arguments = arguments
        self.sent: str | None = None
        """The arguments text last sent as rawInput (None: not sent as an object yet)."""


def _raw_input(arguments: str) -> Any:
    """The arguments as JSON (None when they are not a complete JSON document yet)."""
    if not arguments:
        return None
    try:
        return msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return None


class FrameBuilder:
    """The frames of one turn (one assistant message), event by event."""

    def __init__(self, frames: Frames, request_id: str | None) -> None:
        self.frames = frames
        self.request_id = request_id
        self._tools: dict[str, _Tool] = {}

    def build(self, event: ChatStreamEvent) -> list[Frame]:
        f = self.frames
        rid = self.request_id
        if isinstance(event, TextDeltaEvent):
            return [f.text("agent_message_chunk", event.text, rid)] if event.text else []
        if isinstance(event, ThinkingDeltaEvent):
            return [f.text("agent_thought_chunk", event.thinking, rid)] if event.thinking else []
        if isinstance(event, StreamStartEvent):
            return [f.prompt_start(rid)]
        if isinstance(event, ToolCallStartEvent):
            call = event.tool_call
            tool = self._tools[call.id] = _Tool(call.arguments)
            body: dict[str, Any] = {"toolCallId": call.id, "title": call.name, "status": "pending"}
            raw = _raw_input(call.arguments)
            body["rawInput"] = raw if raw is not None else {}
            if raw is not None:
                tool.sent = call.arguments
            return [f.update("tool_call", body, rid)]
        if isinstance(event, ToolCallDeltaEvent):
            tool = self._tools.setdefault(event.tool_call.id, _Tool(""))
            tool.arguments += event.tool_call.arguments
            return []
        if isinstance(event, ToolApprovalRequiredEvent):
            call = event.tool_call
            tool = self._tools.setdefault(call.id, _Tool(call.arguments))
            tool.arguments = call.arguments
            raw = _raw_input(call.arguments)
            if raw is None or tool.sent == call.arguments:
                return []
            tool.sent = call.arguments
            return [f.update("tool_call_update", {"toolCallId": call.id, "rawInput": raw}, rid)]
        if isinstance(event, ToolResultEvent):
            result = event.tool_result
            body = {"toolCallId": result.tool_call_id, "status": "failed" if result.is_error else "completed"}
            known = self._tools.get(result.tool_call_id)
            if known is not None and known.sent != known.arguments:
                raw = _raw_input(known.arguments)
                if raw is not None:
                    body["rawInput"] = raw
                    known.sent = known.arguments
            body["content"] = [{"type": "content", "content": {"type": "text", "text": result.output}}]
            return [f.update("tool_call_update", body, rid)]
        if isinstance(event, UsageEvent):
            usage = event.usage
            if usage.context_used is None and usage.context_size is None:
                return []
            body = {}
            if usage.context_used is not None:
                body["used"] = usage.context_used
            if usage.context_size is not None:
                body["size"] = usage.context_size
            return [f.update("usage_update", body, rid)]
        if isinstance(event, StreamEndEvent):
            return [f.end(FINISH_SUBTYPES.get(event.finish_reason or "stop", "end_turn"), rid)]
        if isinstance(event, AbortedEvent):
            return [f.cancelled(rid)]
        if isinstance(event, ErrorEvent):
            return [f.error(event.error, event.code, rid)]
        if isinstance(event, PlanEvent):
            return [f.update("plan", {"entries": msgspec.to_builtins(event.entries)}, rid)]
        return []


FINAL_TYPES = (StreamEndEvent, AbortedEvent, ErrorEvent)


def is_final(event: ChatStreamEvent) -> bool:
    return isinstance(event, FINAL_TYPES)
