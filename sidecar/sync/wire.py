"""The Qiming server's wire shapes (reference qiming-api.md sections 1-3), as msgspec Structs.

Owns: decoding what the server sends. Everything the server says is untrusted: every field
is optional, unknown fields are ignored (the real DTOs carry many we do not use, and newer
servers add more), ids that a gateway serialized as strings are accepted, and dates are
read both as the documented ISO-8601 strings and as epoch milliseconds.

Bounds (reference 1.4: ids and indexes are Java Longs, dates ``java.util.Date``): every
number is decoded as a ``Long`` (the int64 range, what SQLite can hold) or, for dates, as
epoch milliseconds within years 1..9999 (``EpochMs``, what ``datetime`` can show); a number
outside is a ValidationError naming the field, never a value that fails later in the
store. ``to_int`` and ``to_ms`` hold text to the same ranges (None outside). How deep a
value may nest is msgspec's to refuse (RecursionError, which every decode here catches).
Strings that are long by nature are bounded too (``Meta(max_length=...)``, counted in
characters), far above what a real server writes, so one value cannot hold a pull's memory:
a message's ``text``, ``think`` and ``quotedText`` (MAX_MESSAGE_CHARS), a conversation's
``topic`` (MAX_TOPIC_CHARS) and ``summary`` (MAX_SUMMARY_CHARS). Past them is the same
ValidationError as a number out of range: the row or the conversation is skipped, reported.
A ``/list`` row is decoded as ConversationRow, only what a pull plans with: its
``messageList`` (or ``icon``, an SVG) is never even decoded.
Must stay true: nothing here keeps a secret (``UserDto.password``, which the real
``/getLoginInfo`` may carry, is not even decoded).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

import msgspec

from protocol.limits import INT64_MAX, INT64_MIN
from sidecar.sync.errors import ServerMalformed

__all__ = [
    "Envelope",
    "AgentRef",
    "AttachmentDto",
    "ChatMessageDto",
    "ConversationDto",
    "ConversationRow",
    "ConversationPage",
    "BadRow",
    "conversation_page",
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
    "Long",
    "EpochMs",
    "MIN_MS",
    "MAX_MS",
    "MAX_MESSAGE_CHARS",
    "MAX_TOPIC_CHARS",
    "MAX_SUMMARY_CHARS",
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

    code: str | Long | None = None
    display_code: str | Long | None = None
    message: str | None = None
    data: msgspec.Raw = msgspec.field(default_factory=_raw_null)
    tid: str | Long | None = None
    success: bool | None = None


MIN_MS = -62_135_596_800_000
"""0001-01-01T00:00:00Z in epoch milliseconds."""
MAX_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z."""
Long = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
"""A Java Long."""
EpochMs = Annotated[int, msgspec.Meta(ge=MIN_MS, le=MAX_MS)] | Annotated[float, msgspec.Meta(ge=MIN_MS, le=MAX_MS)]
Id = Long | str | None
"""A Long id: a JSON number on the real server, a string behind some gateways."""
Date = str | EpochMs | None
"""ISO-8601 text (the documented form) or epoch milliseconds."""

MAX_MESSAGE_CHARS = 8 * 1024 * 1024
"""A message's ``text`` (or ``think``, ``quotedText``): a pasted log or a long answer is
some hundred thousand characters; 8 Mi is far past any of them."""
MAX_TOPIC_CHARS = 16 * 1024
"""A conversation's ``topic`` (the server's default, an LLM's title, or the first 20
characters of the first message; the local title keeps 500 of it, mapping.MAX_TITLE_CHARS)."""
MAX_SUMMARY_CHARS = 64 * 1024
"""A conversation's ``summary`` (written by the server's long-term memory: a paragraph)."""
MessageText = Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE_CHARS)]
Topic = Annotated[str, msgspec.Meta(max_length=MAX_TOPIC_CHARS)]
Summary = Annotated[str, msgspec.Meta(max_length=MAX_SUMMARY_CHARS)]


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
    id: str | Long | None = None
    role: str | None = None
    type: str | None = None
    text: MessageText | None = None
    think: MessageText | None = None
    quoted_text: MessageText | None = None
    time: Date = None
    attachments: list[AttachmentDto] | None = None
    finished: bool | None = None
    finish_reason: str | None = None
    sender_type: str | None = None


class ConversationRow(_Wire):
    """A ``/list`` row: only what a pull plans and imports with (unknown fields, the row's
    ``messageList`` included, are skipped by the decoder, never built)."""

    id: Id = None
    agent_id: Id = None
    topic: Topic | None = None
    summary: Summary | None = None
    modified: Date = None
    created: Date = None
    sandbox_session_id: str | None = None


class ConversationDto(ConversationRow):
    """One conversation as ``/{id}``, ``/create`` and ``/update`` answer it."""

    user_id: Id = None
    uid: str | None = None
    icon: str | None = None
    agent: AgentRef | None = None
    message_list: list[ChatMessageDto] | None = None
    type: str | None = None
    task_status: str | None = None
    dev_mode: Long | bool | None = None
    topic_updated: Long | None = None
    sandbox_server_id: str | Long | None = None


class BadRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of a listing the bounds refused."""

    position: int
    """Its place in the page (0-based)."""
    conversation_id: int | None
    """Its id, when that at least is a Long."""
    shown_id: str
    """Its id as the server sent it (an excerpt), for the report."""
    error: ServerMalformed
    """BadServerData for a value out of bounds, plain ServerMalformed for a row that is not
    an object at all."""


class ConversationPage(msgspec.Struct, frozen=True, kw_only=True):
    """One ``/list`` page: the rows that decoded, the rows that did not, and how many came."""

    rows: list[ConversationRow]
    bad: list[BadRow]
    size: int
    """Rows the server sent (good and bad): a page is short when this is below the limit."""
    last_id: int | None
    """The id of the page's last row (the walk's cursor), when it is a Long."""


class _RowId(msgspec.Struct):
    id: Any = None


_row_id = msgspec.json.Decoder(_RowId)
_conversation = msgspec.json.Decoder(ConversationRow)


def conversation_page(raws: list[msgspec.Raw], refuse: Callable[[str, Exception], ServerMalformed]) -> ConversationPage:
    """Each row of a ``/list`` page decoded on its own: one out of bounds is a BadRow (its
    error made by ``refuse(what, exc)``), the others are read."""
    rows: list[ConversationRow] = []
    bad: list[BadRow] = []
    last_id: int | None = None
    for position, raw in enumerate(raws):
        try:
            row = _conversation.decode(raw)
            cid = to_int(row.id)
        except (msgspec.DecodeError, RecursionError) as exc:
            cid, shown = _id_of(raw)
            bad.append(BadRow(position=position, conversation_id=cid, shown_id=shown,
                              error=refuse(f"row {position} (id {shown})", exc)))
        else:
            rows.append(row)
        if position == len(raws) - 1:
            last_id = cid
    return ConversationPage(rows=rows, bad=bad, size=len(raws), last_id=last_id)


def _id_of(raw: msgspec.Raw) -> tuple[int | None, str]:
    """A refused row's id as a Long (None when it is not one) and as shown in a report."""
    try:
        value = _row_id.decode(raw).id
    except (msgspec.DecodeError, RecursionError):
        return None, "unreadable"
    try:
        shown = msgspec.json.encode(value).decode()
    except (TypeError, RecursionError):
        shown = "unreadable"
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return (to_int(value) if isinstance(value, (int, str)) else None), shown


class LoginResDto(_Wire):
    token: str | None = None
    expire_date: Date = None
    reset_pass: Long | None = None
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
    target_id: str | Long | None = None
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
    execute_id: str | Long | None = None
    kind: str | None = None


class ComponentExecutingDto(_Wire):
    """``data`` of a PROCESSING event (a tool, plugin, plan, permission request... step)."""

    target_id: str | Long | None = None
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
    start_time: EpochMs | None = None
    end_time: EpochMs | None = None
    prompt_tokens: Long | None = None
    completion_tokens: Long | None = None
    total_tokens: Long | None = None
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

    project_id: str | Long | None = None
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
    """A Long id as an int (None when absent, not a whole number, or outside int64)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if INT64_MIN <= value <= INT64_MAX else None
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit() and len(text) <= 20:
            number = int(text)
            return number if INT64_MIN <= number <= INT64_MAX else None
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
        return int(value) if MIN_MS <= value <= MAX_MS else None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text) if len(text) <= 15 and int(text) <= MAX_MS else None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return int(stamp.timestamp() * 1000)
