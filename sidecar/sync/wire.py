"""The Qiming server's wire shapes (reference qiming-api.md sections 1-3), as msgspec Structs.

Owns: decoding what the server sends. Everything the server says is untrusted: every field
is optional, unknown fields are ignored (the real DTOs carry many we do not use, and newer
servers add more), ids that a gateway serialized as strings are accepted, and dates are
read both as the documented ISO-8601 strings and as epoch milliseconds.
Must stay true: nothing here keeps a secret (``UserDto.password``, which the real
``/getLoginInfo`` may carry, is not even decoded).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, TypeVar

import msgspec

__all__ = [
    "Envelope",
    "AgentRef",
    "AttachmentDto",
    "ChatMessageDto",
    "ConversationDto",
    "LoginResDto",
    "UserDto",
    "UserShareDto",
    "AgentOutputDto",
    "ComponentExecutingDto",
    "ComponentExecuteResult",
    "AgentExecuteResult",
    "PermissionRequestDto",
    "ComputerChatResponse",
    "SessionFrame",
    "to_ms",
    "to_int",
    "SUCCESS",
    "AUTH_CODES",
]

_T = TypeVar("_T")

SUCCESS = "0000"
AUTH_CODES = frozenset({"4010", "4011"})
"""Not logged in / session expired (4010) and the redirect variant (4011)."""


class _Wire(msgspec.Struct, rename="camel", kw_only=True):
    """Lenient: unknown fields are ignored, every field has a default."""


def _raw_null() -> msgspec.Raw:
    return msgspec.Raw(b"null")


class Envelope(_Wire):
    """``ReqResult<T>``; ``data`` is decoded separately into the endpoint's type."""

    code: str | int | None = None
    display_code: str | int | None = None
    message: str | None = None
    data: msgspec.Raw = msgspec.field(default_factory=_raw_null)
    tid: str | int | None = None
    success: bool | None = None


Id = int | str | None
"""A Long id: a JSON number on the real server, a string behind some gateways."""
Date = str | int | float | None
"""ISO-8601 text (the documented form) or epoch milliseconds."""


class AgentRef(_Wire):
    agent_id: Id = None
    name: str | None = None
    type: str | None = None
    icon: str | None = None


class AttachmentDto(_Wire):
    file_key: str | None = None
    file_url: str | None = None
    file_name: str | None = None
    mime_type: str | None = None


class ChatMessageDto(_Wire):
    index: Id = None
    id: str | int | None = None
    role: str | None = None
    type: str | None = None
    text: str | None = None
    think: str | None = None
    quoted_text: str | None = None
    time: Date = None
    attachments: list[AttachmentDto] | None = None
    finished: bool | None = None
    finish_reason: str | None = None
    sender_type: str | None = None


class ConversationDto(_Wire):
    id: Id = None
    user_id: Id = None
    uid: str | None = None
    agent_id: Id = None
    topic: str | None = None
    summary: str | None = None
    icon: str | None = None
    modified: Date = None
    created: Date = None
    agent: AgentRef | None = None
    message_list: list[ChatMessageDto] | None = None
    type: str | None = None
    task_status: str | None = None
    dev_mode: int | bool | None = None
    topic_updated: int | None = None
    sandbox_server_id: str | int | None = None
    sandbox_session_id: str | None = None


class LoginResDto(_Wire):
    token: str | None = None
    expire_date: Date = None
    reset_pass: int | None = None
    redirect: str | None = None

    def __repr__(self) -> str:
        return f"LoginResDto(token={'***' if self.token else self.token!r}, expire_date={self.expire_date!r})"

    __str__ = __repr__


class UserDto(_Wire):
    id: Id = None
    uid: str | None = None
    user_name: str | None = None
    nick_name: str | None = None
    email: str | None = None
    phone: str | None = None
    avatar: str | None = None


class UserShareDto(_Wire):
    id: Id = None
    share_key: str | None = None
    type: str | None = None
    target_id: str | int | None = None
    expire: Date = None
    created: Date = None


class ComponentExecuteResult(_Wire):
    """``result`` of a ComponentExecutingDto: ``executeId`` is the agent's toolCallId,
    ``input`` the tool's input (for a permission request, the runner's request), ``data``
    its output."""

    id: Id = None
    name: str | None = None
    type: str | None = None
    success: bool | None = None
    error: str | None = None
    data: Any = None
    input: Any = None
    execute_id: str | int | None = None
    kind: str | None = None


class ComponentExecutingDto(_Wire):
    """``data`` of a PROCESSING event (a tool, plugin, plan, permission request... step)."""

    target_id: str | int | None = None
    name: str | None = None
    original_title: str | None = None
    type: str | None = None
    status: str | None = None
    executing_message: Any = None
    result: msgspec.Raw = msgspec.field(default_factory=_raw_null)
    sub_event_type: str | None = None

    def execute_result(self) -> ComponentExecuteResult | None:
        return _decode_or_none(self.result, ComponentExecuteResult)


class _AcpOption(_Wire):
    option_id: str | None = None
    name: str | None = None
    kind: str | None = None


class _AcpToolCall(_Wire):
    tool_call_id: str | None = None
    title: str | None = None
    kind: str | None = None
    raw_input: Any = None


class PermissionRequestDto(_Wire):
    """An agent's ``session/request_permission`` as the server relays it: the ACP request
    (``toolCall``, ``options``) under ``request_permission_request`` (or camelCase, or at the
    top), and ``tool_call_id``. Field names in both spellings, as the web client reads them."""

    tool_call_id: str | None = None
    tool_call: _AcpToolCall | None = None
    options: list[_AcpOption] | None = None

    @classmethod
    def from_input(cls, value: Any) -> PermissionRequestDto:
        if not isinstance(value, dict):
            return cls()
        inner = value.get("request_permission_request") or value.get("requestPermissionRequest")
        merged: dict[str, Any] = dict(inner) if isinstance(inner, dict) else {}
        for key, alias in (("toolCall", "tool_call"), ("options", None), ("toolCallId", "tool_call_id")):
            if key not in merged:
                found = value.get(key, value.get(alias) if alias else None)
                if found is None and alias is not None:
                    found = merged.get(alias)
                if found is not None:
                    merged[key] = found
        call = merged.get("toolCall")
        if isinstance(call, dict) and "toolCallId" not in call and "tool_call_id" in call:
            call = {**call, "toolCallId": call["tool_call_id"]}
            merged["toolCall"] = call
        if isinstance(merged.get("options"), list):
            merged["options"] = [
                {**o, "optionId": o.get("optionId", o.get("option_id"))} if isinstance(o, dict) else o
                for o in merged["options"]
            ]
        try:
            return msgspec.convert(merged, cls)
        except msgspec.ValidationError:
            return cls()


class AgentExecuteResult(_Wire):
    """``data`` of the FINAL_RESULT event."""

    success: bool | None = None
    error: str | None = None
    start_time: int | float | None = None
    end_time: int | float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    output_text: str | None = None


class AgentOutputDto(_Wire):
    """One ``data:`` line of the chat SSE; ``data``'s shape depends on ``event_type``."""

    request_id: str | None = None
    event_type: str | None = None
    error: str | None = None
    data: msgspec.Raw = msgspec.field(default_factory=_raw_null)
    completed: bool = False

    def message(self) -> ChatMessageDto | None:
        """``data`` of a MESSAGE event (a delta in ``text``), None when absent or not an object."""
        return _decode_or_none(self.data, ChatMessageDto)

    def component(self) -> ComponentExecutingDto | None:
        return _decode_or_none(self.data, ComponentExecutingDto)

    def result(self) -> AgentExecuteResult | None:
        return _decode_or_none(self.data, AgentExecuteResult)


class ComputerChatResponse(msgspec.Struct, kw_only=True):
    """``data`` of ``POST /api/computer/chat`` (HttpResult<ChatResponse>, snake_case)."""

    project_id: str | int | None = None
    session_id: str | None = None
    request_id: str | None = None
    error: str | None = None


class SessionFrame(_Wire):
    """One ``/computer/progress`` frame (reference 4.4): a UnifiedSessionMessage, with the
    SSE ``event:`` name it came under."""

    session_id: str | None = None
    message_type: str | None = None
    sub_type: str | None = None
    data: msgspec.Raw = msgspec.field(default_factory=_raw_null)
    timestamp: Date = None
    event: str = ""

    def data_object(self) -> dict[str, Any]:
        found = _decode_or_none(self.data, dict)
        return {str(k): v for k, v in found.items()} if found is not None else {}

    def update_raw(self) -> msgspec.Raw:
        """``data`` as an ACP session update (``sessionUpdate`` filled in from the sub type
        when a runner leaves it out)."""
        data = self.data_object()
        if "sessionUpdate" not in data and self.sub_type:
            data["sessionUpdate"] = self.sub_type
        return msgspec.Raw(msgspec.json.encode(data))


def _decode_or_none(raw: msgspec.Raw, kind: type[_T]) -> _T | None:
    if not raw or bytes(raw) == b"null":
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None


def to_int(value: Id) -> int | None:
    """A Long id as an int (None when absent or not a whole number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
    return None


def to_ms(value: Date) -> int | None:
    """Epoch milliseconds of a server date; None when absent or unreadable.

    ISO-8601 with an offset is the documented form; text without an offset is read as UTC
    (a server whose Jackson time zone was overridden to a local zone would be off by it:
    the reference cannot tell, see its open question 3).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return int(stamp.timestamp() * 1000)
