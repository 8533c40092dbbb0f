"""ChatStreamEvent: the ``chat:stream`` notification payloads (seed 004 section 4.2).

One tagged union on ``type``. Every event carries ``sessionId``, ``messageId``,
``timestamp`` (ms) and ``seq``, which increases by one per event of a message
starting at 1 with ``stream_start``; a renderer that sees a gap resyncs from
``chat:messages:get`` (which returns the partial content and last ``seq``).
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

from protocol.limits import Int64
from protocol.errors import ErrorCode
from protocol.types import Citation, ContentPart, Struct, Usage

__all__ = [
    "StreamToolCall",
    "StreamToolResult",
    "StreamStartEvent",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallStartEvent",
    "ToolCallDeltaEvent",
    "ToolResultEvent",
    "UsageEvent",
    "StreamEndEvent",
    "ErrorEvent",
    "AbortedEvent",
    "NoticeEvent",
    "PlanEntry",
    "PlanEvent",
    "CitationsEvent",
    "ContentReplacedEvent",
    "ToolApprovalOption",
    "ToolApprovalRequiredEvent",
    "ChatStreamEvent",
    "FinalEvent",
    "FinishReason",
    "NoticeCode",
]

FinishReason = Literal[
    "stop", "length", "tool_calls", "content_filter", "refusal", "max_turn_requests", "other"
]

ToolDecision = Literal["approved", "denied", "answered"]
"""What ``chat:tool:approve`` can decide."""

ApprovalSource = Literal["tool", "acp"]
"""Where a call that needs a decision comes from: ``tool`` (a tool of the direct-mode loop)
or ``acp`` (an agent engine's permission request)."""

NoticeCode = Literal[
    "acp_session_replaced", "acp_history_unavailable", "acp_history_kept", "acp_content_not_sent",
    "stream_unsupported", "context_trimmed", "remote_content_not_sent", "remote_permission_unanswered",
]
"""``acp_session_replaced``: the agent could not reload the conversation after a restart and
starts a new agent session without the earlier turns; ``acp_history_unavailable``: the agent
session of this branch is unknown to the engine; ``acp_history_kept``: the turn continues
(a fork of) an agent session that went on past this point (a regenerate, an edit, an older
branch): the agent cannot go back, so the later turns stay in its context;
``acp_content_not_sent``: parts of the user
message (e.g. images) that the agent does not accept were left out; ``stream_unsupported``:
the endpoint refused to stream this model, so it is asked for whole replies from now on (the
model's ``stream`` became false); ``context_trimmed``: older messages were left out of this
request so it fits the model's context window (the notice says how many);
``remote_content_not_sent``: a remote agent (a channel's remote-agent route) gets the user
message's text only, its attachments were left out; ``remote_permission_unanswered``: the
remote agent asked for a permission a channel cannot answer."""


class StreamToolCall(Struct, kw_only=True):
    """``toolCall`` of tool_call_start (whole name) and tool_call_delta (``arguments`` = fragment)."""

    id: str
    name: str
    arguments: str = ""


class StreamToolResult(Struct, kw_only=True):
    tool_call_id: str
    output: str
    is_error: bool = False


class _Event(Struct, tag_field="type", kw_only=True):
    session_id: str
    message_id: str
    timestamp: Int64
    seq: Int64


class StreamStartEvent(_Event, tag="stream_start", kw_only=True):
    """The assistant message ``messageId`` exists and starts streaming."""

    parent_id: str | None = None
    model_id: str | None = None
    provider_id: str | None = None


class TextDeltaEvent(_Event, tag="text_delta", kw_only=True):
    text: str


class ThinkingDeltaEvent(_Event, tag="thinking_delta", kw_only=True):
    thinking: str


class ToolCallStartEvent(_Event, tag="tool_call_start", kw_only=True):
    tool_call: StreamToolCall


class ToolCallDeltaEvent(_Event, tag="tool_call_delta", kw_only=True):
    tool_call: StreamToolCall


class ToolResultEvent(_Event, tag="tool_result", kw_only=True):
    tool_result: StreamToolResult


class UsageEvent(_Event, tag="usage", kw_only=True):
    usage: Usage


class StreamEndEvent(_Event, tag="stream_end", kw_only=True):
    """The message completed; ``usage`` is its final total."""

    finish_reason: FinishReason | None = None
    usage: Usage | None = None


class CitationsEvent(_Event, tag="citations", kw_only=True):
    """The sources the reply may cite so far, in marker order (every one of them, not only
    the new ones): sent before the text that may use them (after the request's retrieval),
    again after a ``knowledge_search`` call added some, and before ``stream_end`` when the
    finished reply's check changed them (``dangling`` markers it wrote that point at no
    sent chunk). What ``chat:messages:get`` returns as ``citations``."""

    citations: list[Citation]


class ErrorEvent(_Event, tag="error", kw_only=True):
    """The message ended with an error; its partial content is stored."""

    error: str
    code: ErrorCode | None = None
    """An ErrorCode value when one applies (for example PROVIDER_ERROR)."""


class AbortedEvent(_Event, tag="aborted", kw_only=True):
    """The message was aborted (chat:abort, a newer send, or shutdown); partial content kept."""

    reason: str | None = None


class ToolApprovalOption(Struct, kw_only=True):
    """One choice offered for a pending call (ACP ``session/request_permission`` options)."""

    option_id: str
    name: str
    kind: str
    """ACP kinds: allow_once | allow_always | reject_once | reject_always (others passed on)."""


class ToolApprovalRequiredEvent(_Event, tag="tool_approval_required", kw_only=True):
    """A tool call waits for ``chat:tool:approve``; the reply is ``paused`` until no call of
    it is pending (it is not a final event: more events of this message follow)."""

    tool_call: StreamToolCall
    """The whole call: id, name and the complete arguments JSON text."""
    decisions: list[ToolDecision] = msgspec.field(default_factory=lambda: ["approved", "denied", "answered"])
    """The decisions chat:tool:approve accepts for this call."""
    options: list[ToolApprovalOption] | None = None
    """ACP permission options, when the call comes from an agent engine."""
    source: ApprovalSource = "tool"
    """``tool`` (a tool of the direct-mode loop) or ``acp`` (an agent engine's request)."""
    preview: str | None = None
    """What the call would change, for the user to judge (e.g. ``soul_update``: a unified
    diff of Soul.md); None when the tool has nothing to show beyond its arguments."""


class NoticeEvent(_Event, tag="notice", kw_only=True):
    """Something the user should know about this reply that is not an error (it goes on).

    ``code`` says which notice it is (see NoticeCode)."""

    notice: str
    code: NoticeCode | None = None


class PlanEntry(Struct, kw_only=True):
    """One step of an agent's plan (ACP ``plan`` entry)."""

    content: str
    priority: str | None = None
    """high | medium | low (as the agent sent it)."""
    status: str | None = None
    """pending | in_progress | completed (as the agent sent it)."""


class PlanEvent(_Event, tag="plan", kw_only=True):
    """The agent's whole current plan (each ACP ``plan`` update replaces the previous one);
    its steps are also stored as step_start / step_finish parts."""

    entries: list[PlanEntry]


class ContentReplacedEvent(_Event, tag="content_replaced", kw_only=True):
    """The stored text of the reply differs from what was streamed (an output rewrite after
    streaming: citation markers normalized, assistant regex rules, think tags closed, images
    moved to files...): show ``text`` (and ``parts``) instead of what was streamed. Sent at
    most once, right before ``stream_end``."""

    text: str
    """The reply's stored ``textContent``."""
    parts: list[ContentPart] | None = None
    """The stored parts, when the reply is multipart (text with thinking, tools, images)."""


ChatStreamEvent = Union[
    StreamStartEvent,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallStartEvent,
    ToolCallDeltaEvent,
    ToolResultEvent,
    UsageEvent,
    StreamEndEvent,
    ErrorEvent,
    AbortedEvent,
    ToolApprovalRequiredEvent,
    NoticeEvent,
    PlanEvent,
    CitationsEvent,
    ContentReplacedEvent,
]

FinalEvent = Union[StreamEndEvent, ErrorEvent, AbortedEvent]
"""The events that end a message's stream: exactly one of them is its last event."""
