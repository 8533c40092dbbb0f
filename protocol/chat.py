"""``chat:send``, ``chat:abort``, ``chat:regenerate``, ``chat:editResend``: the user's input and the ids a turn creates.
"""

from __future__ import annotations

from typing import Union

from protocol.limits import Id
from protocol.providers import ReasoningLevel
from protocol.types import FilePart, ImagePart, Struct, TextPart
from protocol.common import SuccessResult
from protocol.common import MethodSpec

__all__ = [
    "Attachment",
    "InputPart",
    "UserInput",
    "RegenerateOptions",
    "SendOptions",
    "SuggestionsParams",
    "MessageIdResult",
    "SendResult",
    "SendParams",
    "AbortParams",
    "RegenerateParams",
    "EditResendParams",
]


class Attachment(Struct, kw_only=True):
    name: str
    data: str
    """Base64 of the bytes (the seed's ``Buffer``)."""
    mime_type: str


InputPart = Union[TextPart, ImagePart, FilePart]
"""The parts a user message may be sent with (stored messages hold every ContentPart;
tool, thinking, step and diff parts come from the model or an agent, never from the user)."""


class UserInput(Struct, kw_only=True):
    content: str | list[InputPart]
    attachments: list[Attachment] | None = None


class RegenerateOptions(Struct, kw_only=True):
    """Overrides for this one reply (the session keeps its own provider and model)."""

    model_id: Id | None = None
    provider_id: Id | None = None
    temperature: float | None = None
    """0..2; default: settings ``temperature``."""
    reasoning: ReasoningLevel | None = None
    """Default: settings ``reasoning``."""
    tools: bool | None = None
    """False: no tools are offered for this reply (the model is told it has none)."""


class SendOptions(RegenerateOptions, kw_only=True):
    """``chat:send`` per-send overrides, the same as regenerate's (direct-mode sessions)."""


class MessageIdResult(Struct, omit_defaults=False, kw_only=True):
    message_id: str
    """The assistant message being generated."""


class SendResult(Struct, omit_defaults=False, kw_only=True):
    message_id: str
    """The assistant message being generated (events carry this id)."""
    user_message_id: str
    """The stored user message."""


class SendParams(Struct, kw_only=True):
    session_id: Id
    input: UserInput
    options: SendOptions | None = None


class AbortParams(Struct, kw_only=True):
    session_id: Id


class RegenerateParams(Struct, kw_only=True):
    session_id: Id
    message_id: Id | None = None
    """The assistant message to regenerate (default: the last one of the active branch)."""
    options: RegenerateOptions | None = None


class EditResendParams(Struct, kw_only=True):
    session_id: Id
    message_id: Id
    """The user message to edit; the new one becomes its sibling."""
    new_content: str


class SuggestionsParams(Struct, omit_defaults=False, kw_only=True):
    """``chat:suggestions``: follow-up questions proposed for a finished reply (also stored as
    the message's ``suggestions``)."""

    session_id: str
    message_id: str
    suggestions: list[str]


METHODS: dict[str, MethodSpec] = {
    "chat:send": MethodSpec(
        SendParams, SendResult, "Store the user message and start generating; events follow on chat:stream."
    ),
    "chat:abort": MethodSpec(AbortParams, SuccessResult, "Stop the running generation of a session."),
    "chat:regenerate": MethodSpec(
        RegenerateParams, MessageIdResult, "Generate a sibling of an assistant reply."
    ),
    "chat:editResend": MethodSpec(
        EditResendParams, SendResult, "Add an edited sibling of a user message and generate."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
