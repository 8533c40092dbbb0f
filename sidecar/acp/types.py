"""The ACP messages this client sends and receives, as msgspec Structs (protocol version 1).

Owns the shapes of the Agent Client Protocol as seen from the client side: requests we
send (initialize, session/new|load|fork|close|prompt, session/cancel), the agent's
requests we answer (session/request_permission, fs/read_text_file, fs/write_text_file)
and the ``session/update`` notification.

Must stay true (tolerance, see ../shared/reference/acp-notes.md):
- unknown fields are ignored everywhere (msgspec's default), ``_meta`` included;
- a ``session/update`` is decoded in two steps: the envelope keeps ``update`` as
  ``msgspec.Raw`` (kept verbatim for ``acp_parts``), then ``decode_update`` tries the
  known kinds and falls back to ``UnknownUpdate`` for any other or malformed kind: an
  update never raises;
- capabilities are read defensively (``AgentFeatures.from_result``): a flag that is
  absent, null or not ``true`` is false.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

PROTOCOL_VERSION = 1


class AcpErrorCode(enum.IntEnum):
    """ACP's own error codes, in the answers we give an agent. ACP numbers them on its own:
    the same number may mean something else in our protocol's ErrorCode (-32002 is our BUSY)."""

    RESOURCE_NOT_FOUND = -32002


class AcpStruct(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Base of every ACP message: camelCase on the wire, unknown fields ignored."""


# ---- initialize ----------------------------------------------------------------------


class FsCapability(AcpStruct):
    read_text_file: bool = False
    write_text_file: bool = False


class ClientCapabilities(AcpStruct, omit_defaults=False):
    fs: FsCapability
    terminal: bool = False


class Implementation(AcpStruct):
    name: str
    version: str = ""
    title: str | None = None


class InitializeParams(AcpStruct):
    protocol_version: int
    client_capabilities: ClientCapabilities
    client_info: Implementation | None = None


class AgentFeatures(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent advertised in ``initialize`` (every flag false unless sent as true)."""

    protocol_version: int = PROTOCOL_VERSION
    load_session: bool = False
    fork_session: bool = False
    close_session: bool = False
    prompt_image: bool = False
    prompt_audio: bool = False
    prompt_embedded_context: bool = False
    mcp_http: bool = False
    mcp_sse: bool = False
    agent_name: str = ""
    agent_version: str = ""

    @classmethod
    def from_result(cls, result: Any) -> AgentFeatures:
        """Read an ``initialize`` result (plain JSON values) without trusting its shape."""
        top = result if isinstance(result, dict) else {}
        caps = _obj(top.get("agentCapabilities"))
        prompt = _obj(caps.get("promptCapabilities"))
        mcp = _obj(caps.get("mcpCapabilities"))
        session = _obj(caps.get("sessionCapabilities"))
        info = _obj(top.get("agentInfo"))
        version = top.get("protocolVersion")
        return cls(
            protocol_version=version if type(version) is int else PROTOCOL_VERSION,
            load_session=caps.get("loadSession") is True,
            # an object (even {}) advertises the method; absent or null does not
            fork_session=isinstance(session.get("fork"), dict),
            close_session=isinstance(session.get("close"), dict),
            prompt_image=prompt.get("image") is True,
            prompt_audio=prompt.get("audio") is True,
            prompt_embedded_context=prompt.get("embeddedContext") is True,
            mcp_http=mcp.get("http") is True,
            mcp_sse=mcp.get("sse") is True,
            agent_name=str(info.get("title") or info.get("name") or ""),
            agent_version=str(info.get("version") or ""),
        )


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# ---- sessions ------------------------------------------------------------------------


class NewSessionParams(AcpStruct, omit_defaults=False):
    cwd: str
    mcp_servers: list[Any] = []


class SessionIdResult(AcpStruct):
    """Result of session/new and session/fork (other fields, modes etc., are ignored)."""

    session_id: str


class LoadSessionParams(AcpStruct, omit_defaults=False):
    session_id: str
    cwd: str
    mcp_servers: list[Any] = []


class ForkSessionParams(AcpStruct, omit_defaults=False):
    session_id: str
    cwd: str
    mcp_servers: list[Any] = []


class SessionIdParams(AcpStruct):
    """session/cancel (a notification) and session/close."""

    session_id: str


# ---- prompt content (client -> agent) -------------------------------------------------


class _Block(AcpStruct, tag_field="type"):
    pass


class TextBlock(_Block, tag="text"):
    text: str


class ImageBlock(_Block, tag="image"):
    data: str
    """Base64 of the image bytes."""
    mime_type: str
    uri: str | None = None


class ResourceLinkBlock(_Block, tag="resource_link"):
    uri: str
    name: str
    mime_type: str | None = None


class TextResource(AcpStruct):
    uri: str
    text: str
    mime_type: str | None = None


class BlobResource(AcpStruct):
    uri: str
    blob: str
    mime_type: str | None = None


class EmbeddedResourceBlock(_Block, tag="resource"):
    resource: TextResource | BlobResource


PromptBlock = TextBlock | ImageBlock | ResourceLinkBlock | EmbeddedResourceBlock


class PromptParams(AcpStruct):
    session_id: str
    prompt: list[PromptBlock]


class AcpUsage(AcpStruct):
    """``PromptResponse.usage`` (unstable in schema 1.19): token totals of the turn."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    thought_tokens: int | None = None
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None


class PromptResult(AcpStruct):
    stop_reason: str = "end_turn"
    """end_turn | max_tokens | max_turn_requests | refusal | cancelled (others: treated as end)."""
    usage: Any = None
    """Kept loose: read with ``prompt_usage`` so a malformed usage never fails the turn."""


def prompt_usage(result: PromptResult) -> AcpUsage | None:
    if not isinstance(result.usage, dict):
        return None
    try:
        return msgspec.convert(result.usage, AcpUsage)
    except msgspec.ValidationError:
        return None


# ---- session/update (agent -> client) --------------------------------------------------


class SessionNotification(AcpStruct):
    session_id: str
    update: msgspec.Raw
    """Kept verbatim (it goes into ``acp_parts`` as received)."""


class ContentIn(AcpStruct):
    """A content block as an agent sends it; any ``type`` is accepted."""

    type: str = "text"
    text: str | None = None
    data: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    name: str | None = None
    resource: Any = None


class _Update(AcpStruct, tag_field="sessionUpdate"):
    pass


class AgentMessageChunk(_Update, tag="agent_message_chunk"):
    content: ContentIn
    message_id: str | None = None


class AgentThoughtChunk(_Update, tag="agent_thought_chunk"):
    content: ContentIn
    message_id: str | None = None


class UserMessageChunk(_Update, tag="user_message_chunk"):
    content: ContentIn
    message_id: str | None = None


class ToolCallFields(AcpStruct):
    """Fields of tool_call / tool_call_update / a permission request's toolCall.

    UNSET means "not sent" (an update changes only the fields it sends)."""

    tool_call_id: str
    title: str | None | msgspec.UnsetType = msgspec.UNSET
    kind: str | None | msgspec.UnsetType = msgspec.UNSET
    status: str | None | msgspec.UnsetType = msgspec.UNSET
    content: list[Any] | None | msgspec.UnsetType = msgspec.UNSET
    locations: list[Any] | None | msgspec.UnsetType = msgspec.UNSET
    raw_input: Any = msgspec.UNSET
    raw_output: Any = msgspec.UNSET


class ToolCallStart(_Update, ToolCallFields, tag="tool_call"):
    pass


class ToolCallProgress(_Update, ToolCallFields, tag="tool_call_update"):
    pass


class PlanEntry(AcpStruct):
    content: str
    priority: str | None = None
    status: str | None = None


class PlanUpdate(_Update, tag="plan"):
    entries: list[PlanEntry] = []


class ContextUsageUpdate(_Update, tag="usage_update"):
    used: int | None = None
    """Tokens currently in the context."""
    size: int | None = None
    """The context window in tokens."""
    cost: Any = None


KnownUpdate = (
    AgentMessageChunk
    | AgentThoughtChunk
    | UserMessageChunk
    | ToolCallStart
    | ToolCallProgress
    | PlanUpdate
    | ContextUsageUpdate
)


class UnknownUpdate(msgspec.Struct, frozen=True):
    """An update of a kind we do not map (or a malformed known kind): kept raw only."""

    kind: str


class _Head(msgspec.Struct):
    sessionUpdate: Any = None


_update_decoder = msgspec.json.Decoder(KnownUpdate)
_head_decoder = msgspec.json.Decoder(_Head)
notification_decoder = msgspec.json.Decoder(SessionNotification)


def decode_update(raw: msgspec.Raw | bytes) -> KnownUpdate | UnknownUpdate:
    """The typed update, or UnknownUpdate(kind) for anything else; never raises."""
    try:
        return _update_decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    try:
        kind = _head_decoder.decode(raw).sessionUpdate
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        kind = None
    return UnknownUpdate(kind if isinstance(kind, str) else "?")


# ---- agent -> client requests --------------------------------------------------------


class PermissionOption(AcpStruct):
    option_id: str
    name: str = ""
    kind: str = "allow_once"
    """allow_once | allow_always | reject_once | reject_always (others passed on)."""


class RequestPermissionParams(AcpStruct):
    session_id: str
    tool_call: ToolCallFields
    options: list[PermissionOption] = []


class SelectedOutcome(AcpStruct, tag_field="outcome", tag="selected"):
    option_id: str


class CancelledOutcome(AcpStruct, tag_field="outcome", tag="cancelled"):
    pass


class RequestPermissionResult(AcpStruct, omit_defaults=False):
    outcome: SelectedOutcome | CancelledOutcome


class ReadTextFileParams(AcpStruct):
    session_id: str
    path: str
    line: int | None = None
    """1-based first line to return."""
    limit: int | None = None
    """At most this many lines."""


class ReadTextFileResult(AcpStruct, omit_defaults=False):
    content: str


class WriteTextFileParams(AcpStruct):
    session_id: str
    path: str
    content: str


class EmptyResult(AcpStruct):
    """``{}``: the result of fs/write_text_file."""

