"""What a forwarded turn's server events mean for the reply (the ReplyFeed of its lifecycle).

Owns the mapping of both chat APIs (sidecar/sync/chatstream.py reads them):

ConversationEvents, AgentOutputDto (reference section 3):
    MESSAGE, type CHAT      text delta; a ``finished`` message with finishReason ERROR is the
                            error text that precedes a failed FINAL_RESULT (not content)
    MESSAGE, type THINK     thinking delta
    PROCESSING              a ComponentExecutingDto: REQUEST_PERMISSION (subEventType) is a
                            permission request (``on_permission``); type Plan is the agent's
                            plan (``plan``); anything else is tool activity keyed by
                            ``result.executeId`` (the agent's toolCallId): the first sight is a
                            ToolUsePart + tool_call_start, FINISHED / FAILED its result
    HEART_BEAT              nothing (the stream follower's idle timer restarts on it)
    FINAL_RESULT            usage (promptTokens / completionTokens) and the end: ``success``
                            -> Completed; not successful -> Failed with the server's error (the
                            partial text stays), or Aborted when nobody reported an error (the
                            turn was stopped: here with chat:abort, or on another device)
    ERROR                   a turn that is not running (``/chat/sub`` after its end): the
                            caller catches up from the stored message
ComputerEvents, progress frames (reference 4.4): ``agentSessionUpdate`` data is an ACP
    session update, mapped by the ACP UpdateMapper exactly as an agent's own; a
    ``request_permission`` frame is a permission request; ``sessionPromptEnd`` ends the
    turn (end_turn, max_tokens, max_turn_requests, refusal -> Completed with that finish
    reason; cancelled -> Aborted; error -> Failed with its description; any other -> Completed
    "other"); ``heartbeat`` and ``sessionPromptStart`` carry nothing.

Must stay true: nothing the server sends raises out of ``apply`` (a malformed event is
logged and skipped); tool inputs are kept only as JSON objects of bounded depth.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from protocol.events import FinishReason, PlanEntry, ToolApprovalOption
from protocol.types import ToolUsePart, Usage
from sidecar.acp.mapping import UpdateMapper
from sidecar.engine.lifecycle import Aborted, Completed, Ending, Failed, ReplyFeed
from sidecar.jsondepth import json_too_deep
from sidecar.sync.chatstream import canonical_key
from sidecar.sync.errors import ChatFailed
from sidecar.sync.wire import (
    AgentOutputDto,
    ChatMessageDto,
    ComponentExecutingDto,
    ComponentExecuteResult,
    PermissionRequestDto,
    SessionFrame,
)

__all__ = [
    "ConversationEvents",
    "ComputerEvents",
    "PermissionAsk",
    "DEFAULT_OPTIONS",
    "FINISH_REASONS",
    "ending_of_message",
    "frame_key",
    "frame_ends",
]

log = logging.getLogger(__name__)

MAX_INPUT_DEPTH = 32
"""Deeper tool inputs from the server are not kept as objects (stored JSON stays servable)."""
MAX_OUTPUT_CHARS = 200_000
"""A tool result shown in the reply is cut to this many characters."""
FINISH_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "endturn": "stop",
    "max_tokens": "length",
    "max_turn_requests": "max_turn_requests",
    "refusal": "refusal",
}
DEFAULT_OPTIONS = [
    ToolApprovalOption(option_id="allow", name="Allow", kind="allow_once"),
    ToolApprovalOption(option_id="reject", name="Reject", kind="reject_once"),
]
"""Offered when a permission request names no options (the web client answers a cancel
with optionId "reject" the same way)."""
_json = msgspec.json.Encoder()
_ABORT_HINTS = ("cancel", "stop", "interrupt", "abort")


class PermissionAsk(msgspec.Struct, frozen=True, kw_only=True):
    """A permission request of the server's agent, as the approval flow needs it."""

    tool_call_id: str
    title: str
    kind: str
    arguments: str
    """The tool call's input as JSON text."""
    options: list[ToolApprovalOption]


OnPermission = Callable[[PermissionAsk], None]


def _bounded_input(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if json_too_deep(value, MAX_INPUT_DEPTH):
        return {"_raw": "(nested too deep to show)"}
    return value if isinstance(value, dict) else {"_raw": value}


def _text_of(value: Any) -> str:
    """A tool output as text: strings as they are, text contents joined, else JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(i, dict) for i in value):
        pieces = []
        for item in value:
            inner = item.get("content") if isinstance(item.get("content"), dict) else item
            if isinstance(inner, dict) and isinstance(inner.get("text"), str):
                pieces.append(inner["text"])
        text = "\n".join(pieces) if pieces else _safe_json(value)
    else:
        text = _safe_json(value)
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "…"


def _safe_json(value: Any) -> str:
    if json_too_deep(value, MAX_INPUT_DEPTH):
        return "(nested too deep to show)"
    try:
        return _json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return str(value)


def _permission(request: PermissionRequestDto, fallback_id: str | None) -> PermissionAsk | None:
    call = request.tool_call
    call_id = request.tool_call_id or (call.tool_call_id if call is not None else None) or fallback_id
    if not call_id:
        return None
    title = (call.title if call is not None else None) or ""
    kind = (call.kind if call is not None else None) or "other"
    options = [
        ToolApprovalOption(option_id=o.option_id, name=o.name or o.option_id, kind=o.kind or "allow_once")
        for o in request.options or []
        if o.option_id
    ]
    raw_input = call.raw_input if call is not None else None
    return PermissionAsk(
        tool_call_id=str(call_id), title=title or kind, kind=kind,
        arguments=_safe_json(_bounded_input(raw_input)), options=options or list(DEFAULT_OPTIONS),
    )


class ConversationEvents:
    """AgentOutputDto -> the reply (see the module docstring)."""

    def __init__(self, reply: ReplyFeed, on_permission: OnPermission) -> None:
        self._reply = reply
        self._on_permission = on_permission
        self.request_id: str | None = None
        """The turn's id on the server (its assistant message has this id)."""
        self.text = ""
        """The text streamed so far (a catch-up adds only what comes after it)."""
        self.error_text: str | None = None
        self.stopping = False
        """Set once the turn was stopped from here: its end is an abort, not a failure."""
        self._tools: dict[str, tuple[int, str, dict[str, Any]]] = {}
        self._results: dict[str, tuple[int, str, bool]] = {}
        self._asked: set[str] = set()

    async def apply(self, dto: AgentOutputDto) -> Ending | None:
        """Map one event; the Ending when it ends the turn."""
        if dto.request_id and self.request_id is None:
            self.request_id = dto.request_id
        kind = (dto.event_type or "").upper()
        try:
            if kind == "MESSAGE":
                message = dto.message()
                if message is not None:
                    await self._message(message)
            elif kind == "PROCESSING":
                component = dto.component()
                if component is not None:
                    await self._component(component)
            elif kind == "FINAL_RESULT":
                return await self._final(dto)
            elif kind == "ERROR":
                return Failed(ChatFailed(dto.error or "the server reported an error"), close_open=False)
        except Exception:  # a server event must never end the turn by itself
            log.exception("could not map a %s event", kind)
        return None

    async def add_text(self, text: str) -> None:
        """Text of the turn that did not come as an event (a catch-up)."""
        self.text += text
        await self._reply.text(text)

    async def _message(self, message: ChatMessageDto) -> None:
        text = message.text or ""
        if message.finished and (message.finish_reason or "").upper() == "ERROR":
            self.error_text = text.strip() or self.error_text
            return
        if not text:
            return
        if (message.type or "CHAT").upper() == "THINK":
            await self._reply.thinking(text)
        else:
            self.text += text
            await self._reply.text(text)

    async def _component(self, component: ComponentExecutingDto) -> None:
        result = component.execute_result()
        if (component.sub_event_type or "").upper() == "REQUEST_PERMISSION":
            request = PermissionRequestDto.from_input(result.input if result is not None else None)
            ask = _permission(request, str(result.execute_id) if result and result.execute_id else None)
            if ask is not None and not self.stopping and ask.tool_call_id not in self._asked:
                self._asked.add(ask.tool_call_id)  # a replay of the request must not ask twice
                self._on_permission(ask)
            return
        if (component.type or "") == "Plan":
            entries = result.data if result is not None else None
            if isinstance(entries, list):
                await self._reply.plan([
                    PlanEntry(content=str(e.get("content", "")), priority=_str(e.get("priority")),
                              status=_str(e.get("status")))
                    for e in entries if isinstance(e, dict)
                ])
            return
        call_id = _call_id(component, result)
        name = component.original_title or component.name or (result.name if result else None) or component.type or "tool"
        arguments = _bounded_input(result.input if result is not None else None)
        known = self._tools.get(call_id)
        if known is None:
            index = await self._reply.part(ToolUsePart(id=call_id, name=name, input=arguments))
            await self._reply.tool_call_started(call_id, name, _safe_json(arguments))
            self._tools[call_id] = (index, name, arguments)
        elif (known[1], known[2]) != (name, arguments):
            self._reply.replace_part(known[0], ToolUsePart(id=call_id, name=name, input=arguments))
            self._tools[call_id] = (known[0], name, arguments)
        status = (component.status or "").upper()
        if status not in ("FINISHED", "FAILED"):
            return
        failed = status == "FAILED" or (result is not None and result.success is False)
        output = _text_of(result.data) if result is not None else ""
        if not output:
            output = (result.error if result is not None else None) or _text_of(component.executing_message)
        done = self._results.get(call_id)
        if done is None:
            index = await self._reply.tool_result(call_id, output, failed)
            self._results[call_id] = (index, output, failed)
        elif (done[1], done[2]) != (output, failed):
            await self._reply.tool_result(call_id, output, failed, replace=done[0])
            self._results[call_id] = (done[0], output, failed)

    async def _final(self, dto: AgentOutputDto) -> Ending:
        result = dto.result()
        if result is not None and (result.prompt_tokens or result.completion_tokens):
            await self._reply.report_usage(
                Usage(input_tokens=result.prompt_tokens or 0, output_tokens=result.completion_tokens or 0),
                announce=True,
            )
        if result is not None and result.success:
            return Completed("stop")
        error = (result.error if result is not None else None) or dto.error or self.error_text
        if self.stopping or not error:
            return Aborted("the turn was stopped on the server" if not self.stopping else None)
        return Failed(ChatFailed(error), close_open=True)


def ending_of_message(message: ChatMessageDto | None) -> Ending:
    """How a turn ended, read from its stored assistant message (a catch-up after the
    stream was lost for good)."""
    if message is None:
        return Failed(ChatFailed("the turn's stream was lost and the server kept no reply"), close_open=True)
    reason = (message.finish_reason or "").strip()
    if reason.upper() == "ERROR":
        return Failed(ChatFailed(message.text or "the server reported an error"), close_open=True)
    if any(hint in reason.lower() for hint in _ABORT_HINTS) or message.finished is False:
        return Aborted("the turn was stopped on the server")
    return Completed(FINISH_REASONS.get(reason.lower(), "stop"))


def _call_id(component: ComponentExecutingDto, result: ComponentExecuteResult | None) -> str:
    if result is not None and result.execute_id not in (None, ""):
        return str(result.execute_id)
    if component.target_id not in (None, -1, "-1", ""):
        return f"{component.type or 'component'}:{component.target_id}"
    return f"{component.type or 'component'}:{component.name or 'unnamed'}"


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def frame_key(frame: SessionFrame) -> bytes | None:
    """A progress frame's identity for the stream follower (None: carries nothing)."""
    if frame.message_type in ("heartbeat", "sessionPromptStart"):
        return None
    return canonical_key(f"{frame.message_type}|{frame.sub_type or frame.event}", bytes(frame.data))


def frame_ends(frame: SessionFrame) -> bool:
    return frame.message_type == "sessionPromptEnd"


class ComputerEvents:
    """Progress frames -> the reply (see the module docstring)."""

    def __init__(self, reply: ReplyFeed, on_permission: OnPermission) -> None:
        self._mapper = UpdateMapper(reply)
        self._on_permission = on_permission
        self.stopping = False
        self._asked: set[str] = set()

    async def apply(self, frame: SessionFrame) -> Ending | None:
        message_type = frame.message_type or ""
        sub = frame.sub_type or frame.event or ""
        try:
            if message_type == "sessionPromptEnd":
                return self._end(sub, frame)
            if sub in ("request_permission", "AcpRequestPermission") or message_type == "acpRequestPermission":
                request = PermissionRequestDto.from_input(frame.data_object())
                ask = _permission(request, None)
                if ask is not None and not self.stopping and ask.tool_call_id not in self._asked:
                    self._asked.add(ask.tool_call_id)
                    self._on_permission(ask)
                return None
            if message_type == "agentSessionUpdate":
                await self._mapper.apply(frame.update_raw())
        except Exception:
            log.exception("could not map a %s frame", sub or message_type)
        return None

    def _end(self, sub: str, frame: SessionFrame) -> Ending:
        data = frame.data_object()
        reason = sub.lower() if sub else str(data.get("reason") or "").lower()
        if reason == "cancelled" or self.stopping:
            return Aborted(None if self.stopping else "the agent cancelled the turn")
        if reason == "error":
            description = data.get("description") or data.get("message") or "the agent reported an error"
            return Failed(ChatFailed(str(description)), close_open=True)
        return Completed(FINISH_REASONS.get(reason, "other"))
