"""``chat:tool:approve`` and ``tool:*``: tool calls waiting for a decision, policies, the audit trail, tool settings.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocol.limits import AuditPageLimit, Id, Int64, JsonObject, Offset, Title
from protocol.events import ApprovalSource, ToolApprovalOption, ToolDecision
from protocol.types import Struct
from protocol.common import EmptyParams
from protocol.common import MethodSpec

__all__ = [
    "ToolDecision",
    "ApprovalSource",
    "ToolSource",
    "ToolOfferedBy",
    "AuditDecision",
    "AuditActor",
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
]


ToolSource = Literal["memory", "knowledge", "web", "local", "conversation", "workspace", "skill", "mcp", "system"]
"""Where a tool comes from (``tool:list``)."""

ToolOfferedBy = Literal["settings", "enabledTools", "memory", "soul", "knowledge", "helper"]
"""Why a request is offered a tool (``tool:list``): ``settings``: the assistant's
``enabledTools`` is null, so every tool the tool settings enable; ``enabledTools``: the
assistant names it (or its MCP server); ``memory`` / ``soul`` / ``knowledge``: the
assistant's ``memory.enabled`` / ``context.evolveSoul`` / knowledge bases bring it, whatever
``enabledTools`` says; ``helper``: ``read_tool_output`` and ``get_session_capabilities``,
which come with any other tool."""

AuditDecision = Literal[
    "requested", "approved", "denied", "answered", "cancelled",
    "policy:auto", "policy:deny", "remember:auto", "remember:deny", "rule:allow", "rule:deny",
]
"""``requested``: the call waits for a decision; approved/denied/answered: the user's
decision; ``cancelled``: the reply ended first; ``policy:*``: a stored policy decided
without asking; ``remember:*``: the decision also stored a policy (``note`` names its key);
``rule:*``: a V1 ``/computer/chat`` request's approval rules (or its yolo mode) decided
(actor ``compat``)."""

AuditActor = Literal["user", "policy", "system", "compat"]


ToolPolicyValue = Literal["auto", "ask", "deny"]
"""auto: run without asking; ask: a pending approval first; deny: never run (denied result)."""


class ToolApproveParams(Struct, kw_only=True):
    """``chat:tool:approve``: decide one pending tool call."""

    session_id: Id
    tool_call_id: Id
    decision: ToolDecision
    answer: str | None = None
    """Required for ``answered``: the text the model gets as the tool's result."""
    remember: bool = False
    """With ``approved``: always allow this tool from now on (its policy becomes auto);
    with ``denied``: never run it (policy deny). Recorded in the audit trail."""
    message_id: Id | None = None
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
    source: ApprovalSource = "tool"
    options: list[ToolApprovalOption] | None = None
    created_at: Int64


class ToolPendingListParams(Struct, kw_only=True):
    session_id: Id | None = None


class ToolPolicy(Struct, omit_defaults=False, kw_only=True):
    key: str
    """A tool name (``workspace_write_file``, ``mcp__files__delete``) or ``mcp:<server>``
    for every tool of an MCP server (a tool's own policy wins over its server's)."""
    policy: ToolPolicyValue
    updated_at: Int64


class ToolPolicySetParams(Struct, kw_only=True):
    key: Title
    policy: ToolPolicyValue | None
    """None removes the stored policy (the default applies again)."""


class ToolAuditEntry(Struct, omit_defaults=False, kw_only=True):
    """One decision about one tool call: who, when, which call, which arguments."""

    id: Int64
    at: Int64
    session_id: str
    message_id: str
    tool_call_id: str
    tool_name: str
    arguments: str
    decision: AuditDecision
    actor: AuditActor
    source: ApprovalSource = "tool"
    answer: str | None = None
    note: str | None = None


class ToolAuditListParams(Struct, kw_only=True):
    session_id: Id | None = None
    tool_call_id: Id | None = None
    limit: AuditPageLimit = 100
    """1..1000, newest first."""
    offset: Offset = 0


class ToolInfo(Struct, omit_defaults=False, kw_only=True):
    """A tool as ``tool:list`` shows it for a session (what the model would be offered)."""

    name: str
    description: str
    source: ToolSource
    policy: ToolPolicyValue
    """The effective policy (stored policy, else the default)."""
    default_policy: ToolPolicyValue
    parameters: JsonObject = {}
    offered_by: ToolOfferedBy = "settings"
    """Why it is offered (see ToolOfferedBy)."""


class ToolListParams(Struct, kw_only=True):
    session_id: Id | None = None


class WebSearchConfig(Struct, kw_only=True):
    """A SearXNG-style JSON search endpoint: GET ``url?q=...&format=json`` -> ``results``."""

    url: str
    kind: Literal["searxng"] = "searxng"
    max_results: Int64 = 5
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
    """Fields of ToolSettings to change. A field left out keeps its value; ``null`` resets
    it to its default (``webSearch: null`` removes the search endpoint)."""

    enabled: bool | None | UnsetType = UNSET
    local_tools: list[str] | None | UnsetType = UNSET
    conversation_search: bool | None | UnsetType = UNSET
    web_search: WebSearchConfig | None | UnsetType = UNSET
    clear_web_search: bool = False
    """Older form of ``webSearch: null`` (kept for compatibility)."""
    skills_dirs: list[str] | None | UnsetType = UNSET
    tool_timeout_s: float | None | UnsetType = UNSET
    command_timeout_s: float | None | UnsetType = UNSET


METHODS: dict[str, MethodSpec] = {
    "chat:tool:approve": MethodSpec(
        ToolApproveParams, ToolApproveResult,
        "Approve, deny or answer a pending tool call; the reply resumes when none is pending.",
    ),
    "tool:pending:list": MethodSpec(
        ToolPendingListParams, list[PendingToolCall], "Tool calls waiting for a decision."
    ),
    "tool:list": MethodSpec(ToolListParams, list[ToolInfo], "The tools a session's model is offered."),
    "tool:policy:get": MethodSpec(EmptyParams, list[ToolPolicy], "Stored tool policies (auto/ask/deny)."),
    "tool:policy:set": MethodSpec(
        ToolPolicySetParams, list[ToolPolicy], "Set or clear the policy of a tool or an MCP server."
    ),
    "tool:audit:list": MethodSpec(
        ToolAuditListParams, list[ToolAuditEntry], "The audit trail of tool-call decisions, newest first."
    ),
    "tool:settings:get": MethodSpec(EmptyParams, ToolSettings, "Tool configuration."),
    "tool:settings:update": MethodSpec(ToolSettingsUpdate, ToolSettings, "Change tool configuration."),
}
"""The methods of this domain (see ``protocol.methods``)."""
