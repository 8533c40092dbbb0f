"""Params and results of every method (seed 004 sections 5-6 plus the sidecar's own).

Params are by name. Structs that describe changes (SessionUpdates) forbid unknown
fields, so a typo or a read-only field is an invalid-params error, not a no-op.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


from protocol.events import ToolApprovalOption
from protocol.types import (
    ContentPart,
    DateRange,
    MessageRole,
    MessageV2,
    SessionMode,
    SessionV2,
    Struct,
)

__all__ = [
    "CreateSessionOptions",
    "SessionFilter",
    "SessionSortBy",
    "SessionListResult",
    "SessionUpdates",
    "MessageQueryOptions",
    "SearchOptions",
    "Attachment",
    "UserInput",
    "RegenerateOptions",
    "SuccessResult",
    "MessageIdResult",
    "SendResult",
    "ClientInfo",
    "ServerInfo",
    "ServerCapabilities",
    "InitializeParams",
    "InitializeResult",
    "EmptyParams",
    "IdParams",
    "SessionUpdateParams",
    "SessionPinParams",
    "SessionForkParams",
    "SessionImportParams",
    "MessagesGetParams",
    "MessagesTreeParams",
    "MessagesSearchParams",
    "MessagesSelectParams",
    "SendParams",
    "AbortParams",
    "RegenerateParams",
    "EditResendParams",
    "CancelRequestParams",
    "ProviderKind",
    "AcpEngineConfig",
    "ReasoningLevel",
    "ModelConfig",
    "ProviderUpsertParams",
    "ProviderInfo",
    "ProviderSetDefaultParams",
    "DefaultModel",
    "ChatSettings",
    "ChatSettingsUpdate",
    "ToolDecision",
    "ToolPolicyValue",
    "ToolApproveParams",
    "ToolApproveResult",
    "PendingToolCall",
    "ToolPendingListParams",
    "ToolPolicy",
    "ToolPolicySetParams",
    "ToolAuditEntry",
    "ToolAuditListParams",
    "ToolInfo",
    "ToolListParams",
    "WebSearchConfig",
    "ToolSettings",
    "ToolSettingsUpdate",
    "McpTransport",
    "McpServerUpsertParams",
    "McpServerInfo",
    "NameParams",
]


# ---- seed 004 section 5 -------------------------------------------------------------


class CreateSessionOptions(Struct, kw_only=True):
    """Params of ``chat:session:create``; omitted provider/model use the configured default."""

    title: str | None = None
    provider_id: str | None = None
    model_id: str | None = None
    system_prompt: str | None = None
    mode: SessionMode = "direct"
    tags: list[str] | None = None
    folder: str | None = None
    channel_id: str | None = None
    channel_meta: dict[str, Any] | None = None
    workspace_dir: str | None = None
    """Absolute path of the session's working directory (workspace tools, ACP ``cwd``)."""


SessionSortBy = Literal["updated_at", "created_at", "last_message_at"]


class SessionFilter(Struct, kw_only=True):
    """Params of ``chat:session:list``. Pinned sessions always come first."""

    search: str | None = None
    """Substring match over title and summary (case-insensitive)."""
    folder: str | None = None
    tags: list[str] | None = None
    """Every given tag must be on the session."""
    is_archived: bool | None = None
    is_pinned: bool | None = None
    channel_id: str | None = None
    date_range: DateRange | None = None
    """Bounds (inclusive, ms) on the sort field."""
    limit: int = 50
    """1..500."""
    offset: int = 0
    sort_by: SessionSortBy = "updated_at"


class SessionListResult(Struct, omit_defaults=False, kw_only=True):
    sessions: list[SessionV2]
    total: int
    """All matches, ignoring limit/offset."""


class SessionUpdates(Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields ``chat:session:update`` may change; anything else is invalid params."""

    title: str | None = None
    summary: str | None = None
    system_prompt: str | None = None
    tags: list[str] | None = None
    folder: str | None = None
    is_pinned: bool | None = None
    is_archived: bool | None = None
    provider_id: str | None = None
    model_id: str | None = None
    channel_id: str | None = None
    channel_meta: dict[str, Any] | None = None
    workspace_dir: str | None = None
    """An absolute path; "" clears it."""


class MessageQueryOptions(Struct, kw_only=True):
    """Options of ``chat:messages:get``."""

    leaf_id: str | None = None
    """Return the path root -> this message instead of the active branch."""
    limit: int | None = None
    """At most this many messages (the newest ones of the path), 1..10000."""
    before: str | None = None
    """Page backwards: only messages of the path that come before this message id."""
    all_branches: bool = False
    """Every message of the session in creation order (ignores leafId)."""


class SearchOptions(Struct, kw_only=True):
    """Options of ``chat:messages:search``."""

    session_id: str | None = None
    role: MessageRole | None = None
    date_range: DateRange | None = None
    include_archived: bool = True
    """False leaves out messages of archived sessions."""
    limit: int = 20
    """1..200."""
    offset: int = 0


class Attachment(Struct, kw_only=True):
    name: str
    data: str
    """Base64 of the bytes (the seed's ``Buffer``)."""
    mime_type: str


class UserInput(Struct, kw_only=True):
    content: str | list[ContentPart]
    attachments: list[Attachment] | None = None


class RegenerateOptions(Struct, kw_only=True):
    model_id: str | None = None
    provider_id: str | None = None
    temperature: float | None = None


# ---- results ------------------------------------------------------------------------


class SuccessResult(Struct, omit_defaults=False, kw_only=True):
    success: bool = True


class MessageIdResult(Struct, omit_defaults=False, kw_only=True):
    message_id: str
    """The assistant message being generated."""


class SendResult(Struct, omit_defaults=False, kw_only=True):
    message_id: str
    """The assistant message being generated (events carry this id)."""
    user_message_id: str
    """The stored user message."""


# ---- sidecar lifecycle --------------------------------------------------------------


class ClientInfo(Struct, kw_only=True):
    name: str
    version: str | None = None


class ServerInfo(Struct, omit_defaults=False, kw_only=True):
    name: str
    version: str


class ServerCapabilities(Struct, omit_defaults=False, kw_only=True):
    methods: list[str]
    """Every method this process answers (including not-implemented ones)."""
    implemented: list[str]
    """The methods that are implemented (the others answer NOT_IMPLEMENTED)."""
    notifications: list[str]
    """Notifications this process sends."""
    max_line_bytes: int
    """Input lines longer than this are rejected with MESSAGE_TOO_LARGE."""


class InitializeParams(Struct, kw_only=True):
    protocol_version: int | None = None
    client_info: ClientInfo | None = None


class InitializeResult(Struct, omit_defaults=False, kw_only=True):
    protocol_version: int
    server_info: ServerInfo
    capabilities: ServerCapabilities
    data_dir: str


class EmptyParams(Struct, forbid_unknown_fields=False, kw_only=True):
    """Methods without params accept an absent or empty object."""


# ---- method params (seed 004 section 6) --------------------------------------------


class IdParams(Struct, kw_only=True):
    id: str


class SessionUpdateParams(Struct, kw_only=True):
    id: str
    updates: SessionUpdates


class SessionPinParams(Struct, kw_only=True):
    id: str
    pinned: bool


class SessionForkParams(Struct, kw_only=True):
    id: str
    message_id: str
    """The copy holds the path root -> this message."""


class SessionImportParams(Struct, kw_only=True):
    """``chat:session:import``: a SessionExport's session and messages (all branches)."""

    session: SessionV2
    messages: list[MessageV2]
    replace: bool = False
    """Overwrite a session with the same id; otherwise an existing id is BAD_STATE."""


class MessagesGetParams(Struct, kw_only=True):
    session_id: str
    options: MessageQueryOptions | None = None


class MessagesTreeParams(Struct, kw_only=True):
    session_id: str


class MessagesSearchParams(Struct, kw_only=True):
    query: str
    options: SearchOptions | None = None


class MessagesSelectParams(Struct, kw_only=True):
    session_id: str
    leaf_id: str
    """Any message of the session; the active branch becomes root -> the newest leaf below it."""


class SendParams(Struct, kw_only=True):
    session_id: str
    input: UserInput


class AbortParams(Struct, kw_only=True):
    session_id: str


class RegenerateParams(Struct, kw_only=True):
    session_id: str
    message_id: str | None = None
    """The assistant message to regenerate (default: the last one of the active branch)."""
    options: RegenerateOptions | None = None


class EditResendParams(Struct, kw_only=True):
    session_id: str
    message_id: str
    """The user message to edit; the new one becomes its sibling."""
    new_content: str


class CancelRequestParams(Struct, kw_only=True):
    """``$/cancelRequest``: cancel an in-flight request of ours by its id."""

    id: int | str




# ---- providers (issue 4) -------------------------------------------------------------

ProviderKind = Literal["openai-compat", "anthropic", "ollama", "acp-engine"]
ReasoningLevel = Literal["off", "auto", "low", "medium", "high", "max"]


class ModelConfig(Struct, kw_only=True):
    """A model offered by a provider; prices are USD per million tokens."""

    id: str
    name: str | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    supports_tools: bool = True
    supports_reasoning: bool = False
    supports_images: bool = False
    input_price: float = 0.0
    output_price: float = 0.0


class AcpEngineConfig(Struct, kw_only=True):
    """How to run an agent engine (a provider of type ``acp-engine``, issue 7).

    The engine is one subprocess speaking the Agent Client Protocol on its stdin/stdout,
    shared by every ``mode: "acp"`` session that uses this provider and started on first use.
    """

    command: str
    """The executable (a path, or a name looked up in PATH)."""
    args: list[str] = []
    env: dict[str, str] = {}
    """Environment of the engine, passed explicitly (only PATH, HOME, USER, LANG and a few
    other variables of the sidecar's own environment are inherited). Never logged;
    ``provider:list`` masks values whose name suggests a secret, and an update that sends
    such a masked value (``***``) back keeps the stored one."""
    cwd: str | None = None
    """Working directory of the engine process (default: the data dir). Each session's
    agent ``cwd`` is its ``workspaceDir``, else ``<dataDir>/acp/<sessionId>``."""
    auto_allow: list[str] = []
    """ACP tool kinds (read, search, think, fetch, edit, delete, move, execute, other) whose
    permission requests are allowed without asking (the stored tool policy
    ``acp:<providerId>:<kind>`` still wins)."""
    startup_timeout_ms: int = 30_000
    """Start + ``initialize`` must finish within this."""
    request_timeout_ms: int = 60_000
    """session/new, load, fork and close must be answered within this."""
    cancel_timeout_ms: int = 5_000
    """After ``session/cancel`` the turn waits this long for the agent to end it, then ends it."""
    shutdown_timeout_ms: int = 2_000
    """Shutdown: after closing stdin, after SIGTERM and after SIGKILL, wait at most this long."""


class ProviderUpsertParams(Struct, kw_only=True):
    """``provider:upsert``: create (no id, or an unknown id) or replace a provider."""

    id: str | None = None
    name: str
    type: ProviderKind
    base_url: str = ""
    """Required for the HTTP provider types; unused by ``acp-engine``."""
    engine: AcpEngineConfig | None = None
    """Required for ``acp-engine``: the command that runs the agent engine."""
    api_key: str | None = None
    """Stored, never returned. Omitted/null on update keeps the stored key; "" clears it."""
    api_key_env: str | None = None
    """Name of an environment variable holding the key (used when no key is stored)."""
    headers: dict[str, str] = {}
    body: dict[str, Any] = {}
    """Merged into every request body last (it may override generated fields)."""
    models: list[ModelConfig] = []
    enabled: bool = True


class ProviderInfo(Struct, omit_defaults=False, kw_only=True):
    """A provider as ``provider:list`` shows it: the key itself is never included."""

    id: str
    name: str
    type: ProviderKind
    base_url: str
    has_api_key: bool
    engine: AcpEngineConfig | None = None
    """For ``acp-engine``: env values whose name suggests a secret are masked (``***``)."""
    api_key_env: str | None = None
    headers: dict[str, str] = {}
    """Header values whose name suggests a secret (auth, key, token, secret) are masked."""
    body: dict[str, Any] = {}
    models: list[ModelConfig] = []
    enabled: bool = True
    is_default: bool = False
    created_at: int
    updated_at: int


class ProviderSetDefaultParams(Struct, kw_only=True):
    provider_id: str
    model_id: str


class DefaultModel(Struct, omit_defaults=False, kw_only=True):
    provider_id: str
    model_id: str


class ChatSettings(Struct, omit_defaults=False, kw_only=True):
    """Engine settings (``settings:get`` / ``settings:update``)."""

    generate_titles: bool = True
    """After the first exchange, name the session with a short model call."""
    title_model: DefaultModel | None = None
    """Model for titles; default: the session's own model."""
    delta_coalesce_ms: int = 40
    """Text/thinking deltas after the first are merged for this long (0 = every delta)."""
    persist_interval_ms: int = 250
    """Partial content of a streaming reply is written at least this often."""
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None
    temperature: float | None = None
    top_p: float | None = None


class ChatSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    """Fields of ChatSettings to change; unknown fields are invalid params."""

    generate_titles: bool | None = None
    title_model: DefaultModel | None = None
    delta_coalesce_ms: int | None = None
    persist_interval_ms: int | None = None
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None
    temperature: float | None = None
    top_p: float | None = None


# ---- tools and approvals (issue 5) --------------------------------------------------

ToolDecision = Literal["approved", "denied", "answered"]
ToolPolicyValue = Literal["auto", "ask", "deny"]
"""auto: run without asking; ask: a pending approval first; deny: never run (denied result)."""


class ToolApproveParams(Struct, kw_only=True):
    """``chat:tool:approve``: decide one pending tool call."""

    session_id: str
    tool_call_id: str
    decision: ToolDecision
    answer: str | None = None
    """Required for ``answered``: the text the model gets as the tool's result."""
    remember: bool = False
    """With ``approved``: always allow this tool from now on (its policy becomes auto);
    with ``denied``: never run it (policy deny). Recorded in the audit trail."""
    message_id: str | None = None
    """Disambiguates a tool call id that occurs in several messages of the session."""
    option_id: str | None = None
    """ACP: the permission option to answer with (default: chosen from decision/remember)."""


class ToolApproveResult(Struct, omit_defaults=False, kw_only=True):
    success: bool = True
    resumed: bool = False
    """True when this decision was the last pending one and the generation resumed."""


class PendingToolCall(Struct, omit_defaults=False, kw_only=True):
    """A tool call waiting for a decision (``tool:pending:list``)."""

    session_id: str
    message_id: str
    tool_call_id: str
    tool_name: str
    arguments: str
    source: str = "tool"
    options: list[ToolApprovalOption] | None = None
    created_at: int


class ToolPendingListParams(Struct, kw_only=True):
    session_id: str | None = None


class ToolPolicy(Struct, omit_defaults=False, kw_only=True):
    key: str
    """A tool name (``workspace_write_file``, ``mcp__files__delete``) or ``mcp:<server>``
    for every tool of an MCP server (a tool's own policy wins over its server's)."""
    policy: ToolPolicyValue
    updated_at: int


class ToolPolicySetParams(Struct, kw_only=True):
    key: str
    policy: ToolPolicyValue | None
    """None removes the stored policy (the default applies again)."""


class ToolAuditEntry(Struct, omit_defaults=False, kw_only=True):
    """One decision about one tool call: who, when, which call, which arguments."""

    id: int
    at: int
    session_id: str
    message_id: str
    tool_call_id: str
    tool_name: str
    arguments: str
    decision: str
    """requested | approved | denied | answered | cancelled | policy:auto | policy:deny"""
    actor: str
    """user | policy | system"""
    source: str = "tool"
    answer: str | None = None
    note: str | None = None


class ToolAuditListParams(Struct, kw_only=True):
    session_id: str | None = None
    tool_call_id: str | None = None
    limit: int = 100
    """1..1000, newest first."""
    offset: int = 0


class ToolInfo(Struct, omit_defaults=False, kw_only=True):
    """A tool as ``tool:list`` shows it for a session (what the model would be offered)."""

    name: str
    description: str
    source: str
    """web | local | conversation | workspace | skill | mcp | system"""
    policy: ToolPolicyValue
    """The effective policy (stored policy, else the default)."""
    default_policy: ToolPolicyValue
    parameters: dict[str, Any] = {}


class ToolListParams(Struct, kw_only=True):
    session_id: str | None = None


class WebSearchConfig(Struct, kw_only=True):
    """A SearXNG-style JSON search endpoint: GET ``url?q=...&format=json`` -> ``results``."""

    url: str
    kind: Literal["searxng"] = "searxng"
    max_results: int = 5
    timeout_s: float = 15.0


class ToolSettings(Struct, omit_defaults=False, kw_only=True):
    """Tool configuration (``tool:settings:get`` / ``tool:settings:update``)."""

    enabled: bool = True
    """False: no tools are offered at all."""
    local_tools: list[str] = msgspec.field(default_factory=lambda: ["get_current_time"])
    """Built-in local tools offered to the model."""
    conversation_search: bool = True
    """Offer ``search_conversations`` over the stored messages."""
    web_search: WebSearchConfig | None = None
    skills_dirs: list[str] = []
    """Folders whose sub-folders holding a SKILL.md are skills (plus ``<dataDir>/skills``)."""
    tool_timeout_s: float = 60.0
    """A tool call that takes longer ends with an error result."""
    command_timeout_s: float = 120.0
    """Default limit of ``workspace_run_command``."""


class ToolSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool | None = None
    local_tools: list[str] | None = None
    conversation_search: bool | None = None
    web_search: WebSearchConfig | None = None
    clear_web_search: bool = False
    skills_dirs: list[str] | None = None
    tool_timeout_s: float | None = None
    command_timeout_s: float | None = None


McpTransport = Literal["stdio", "http"]


class McpServerUpsertParams(Struct, kw_only=True):
    """``mcp:server:upsert``: an MCP server run as a stdio command or reached at an HTTP URL."""

    name: str
    """Tools appear as ``mcp__{name}__{tool}``; characters other than ``A-Za-z0-9_-`` become ``_``."""
    transport: McpTransport = "stdio"
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    """Passed to the server process (never logged, never returned)."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    enabled: bool = True
    tool_timeout_s: float = 60.0
    connect_timeout_s: float = 15.0


class McpServerInfo(Struct, omit_defaults=False, kw_only=True):
    name: str
    transport: McpTransport
    command: str | None = None
    args: list[str] = []
    env_keys: list[str] = []
    cwd: str | None = None
    url: str | None = None
    enabled: bool = True
    tool_timeout_s: float = 60.0
    connect_timeout_s: float = 15.0
    status: str = "idle"
    """idle (not connected yet) | connected | error"""
    error: str | None = None
    tools: list[str] = []
    """Names as the model sees them, once connected."""


class NameParams(Struct, kw_only=True):
    name: str
