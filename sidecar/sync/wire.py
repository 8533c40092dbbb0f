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
    "AgentExecuteResult",
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


class ComponentExecutingDto(_Wire):
    """``data`` of a PROCESSING event (a tool, plugin, plan... step)."""

    target_id: str | int | None = None
    name: str | None = None
    original_title: str | None = None
    type: str | None = None
    status: str | None = None
    executing_message: str | None = None
    result: Any = None
    sub_event_type: str | None = None


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


def _decode_or_none(raw: msgspec.Raw, kind: type[_T]) -> _T | None:
    if not raw or bytes(raw) == b"null":
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError:
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
