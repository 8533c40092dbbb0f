"""Request bodies of the Qiming server's endpoints (reference sections 1-4), as msgspec Structs.

Owns what the client sends: field names as the server's DTOs spell them (camelCase for the
conversation API, snake_case for the computer API), absent fields left out where the server
treats missing and null alike. Nothing here is decoded from the server.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "Body",
    "ListQuery",
    "MessageQuery",
    "PushedMessage",
    "CreateBody",
    "CreateWithMessages",
    "UpdateBody",
    "ShareBody",
    "LoginBody",
    "PermissionOption",
    "PermissionBody",
    "SuggestBody",
    "PageResultBody",
    "ChatAttachment",
    "TryReqDto",
    "ComputerChatBody",
    "ComputerCancelBody",
    "ComputerOutcome",
    "ComputerPermissionResponse",
    "ComputerResolve",
    "ComputerPermissionBody",
]


class Body(msgspec.Struct, omit_defaults=True, rename="camel", kw_only=True):
    """Request bodies: absent fields are left out (the server treats missing and null alike)."""


class ListQuery(Body):
    agent_id: int | None = None
    last_id: int | None = None
    limit: int | None = None
    topic: str | None = None


class MessageQuery(Body):
    conversation_id: int
    index: int | None = None
    size: int | None = None


class PushedMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str


class CreateBody(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=False):
    agent_id: int
    variables: dict[str, Any] | None = None
    dev_mode: bool = False


class CreateWithMessages(CreateBody, kw_only=True):
    """The seed's ``/create {agentId, title, messages}`` for servers that accept messages."""

    title: str
    messages: list[PushedMessage]


class UpdateBody(Body):
    id: int
    first_message: str | None = None
    topic: str | None = None


class ShareBody(Body):
    conversation_id: int
    type: str = "CONVERSATION"
    expire_seconds: int | None = None
    content: str | None = None


class LoginBody(Body):
    phone_or_email: str
    password: str


class PermissionOption(Body):
    option_id: str
    outcome: str
    """``selected``, or ``cancelled`` (the web client sends both fields always)."""


class PermissionBody(Body):
    conversation_id: int
    tool_id: str
    option: PermissionOption


class SuggestBody(Body):
    conversation_id: int


class PageResultBody(Body):
    request_id: str
    html: str


class ChatAttachment(Body):
    """An AttachmentDto of a chat request (``fileUrl`` is required by the server)."""

    file_url: str
    file_key: str | None = None
    file_name: str | None = None
    mime_type: str | None = None


class TryReqDto(Body):
    """``POST /chat``'s body (reference section 3): the fields a client sets."""

    conversation_id: int
    message: str
    attachments: list[ChatAttachment] = []
    agent_mode: str | None = None


class ComputerChatBody(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``POST /api/computer/chat`` (the ComputerChatRequest of reference 4.2, snake_case)."""

    user_id: str
    project_id: str
    session_id: str | None = None
    prompt: str
    original_user_prompt: str | None = None
    request_id: str | None = None
    open_long_memory: bool = False


class ComputerCancelBody(msgspec.Struct, kw_only=True):
    user_id: str
    project_id: str
    session_id: str


class ComputerOutcome(msgspec.Struct, kw_only=True):
    outcome: str
    optionId: str  # noqa: N815 (the runner's spelling)


class ComputerPermissionResponse(msgspec.Struct, kw_only=True):
    outcome: ComputerOutcome


class ComputerResolve(msgspec.Struct, kw_only=True):
    session_id: str
    tool_call_id: str
    request_permission_response: ComputerPermissionResponse


class ComputerPermissionBody(msgspec.Struct, kw_only=True):
    """What the server itself sends a runner's ``/computer/notify-resolved``."""

    user_id: str
    project_id: str
    permission_resolve_request: ComputerResolve
