"""The method table: each method name -> its params and result types.

The only place that lists method names with their types. ``sidecar/server.py``
binds handlers to these names; ``tools/gen_protocol.py`` generates the JSON Schema
and TypeScript from this table.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.context import (
    AssistantIdParams,
    AssistantProfile,
    AssistantUpsertParams,
    ContextCompactParams,
    ContextCompactResult,
    ContextGetParams,
    ContextUpdateParams,
    SessionContextInfo,
)
from protocol.events import ChatStreamEvent
from protocol.params import (
    AbortParams,
    CancelRequestParams,
    ChatSettings,
    ChatSettingsUpdate,
    CreateSessionOptions,
    EditResendParams,
    EmptyParams,
    IdParams,
    InitializeParams,
    InitializeResult,
    MessageIdResult,
    MessagesGetParams,
    MessagesSearchParams,
    MessagesSelectParams,
    MessagesTreeParams,
    ProviderInfo,
    ProviderSetDefaultParams,
    ProviderUpsertParams,
    RegenerateParams,
    SendParams,
    SendResult,
    SessionFilter,
    SessionForkParams,
    SessionImportParams,
    SessionListResult,
    SessionPinParams,
    SessionUpdateParams,
    SuccessResult,
    McpServerInfo,
    McpServerUpsertParams,
    NameParams,
    PendingToolCall,
    ToolApproveParams,
    ToolApproveResult,
    ToolAuditEntry,
    ToolAuditListParams,
    ToolInfo,
    ToolListParams,
    ToolPendingListParams,
    ToolPolicy,
    ToolPolicySetParams,
    ToolSettings,
    ToolSettingsUpdate,
)
from protocol.types import MessageTreeNode, MessageV2, SearchResult, SessionExport, SessionV2


class MethodSpec(msgspec.Struct, frozen=True):
    """One method (or notification) of the contract."""

    params: Any
    """A Struct type; the JSON-RPC params object decodes to it."""
    result: Any
    """The result type (a Struct, list[...] or None for notifications)."""
    doc: str
    direction: str = "client->server"
    """``client->server`` for requests we answer, ``server->client`` for notifications we send."""


METHODS: dict[str, MethodSpec] = {
    # lifecycle
    "sidecar:initialize": MethodSpec(
        InitializeParams, InitializeResult, "Handshake: protocol version, server info, capabilities, data dir."
    ),
    "sidecar:shutdown": MethodSpec(
        EmptyParams, SuccessResult, "Finish running work, answer, then exit 0."
    ),
    # sessions
    "chat:session:create": MethodSpec(CreateSessionOptions, SessionV2, "Create a session."),
    "chat:session:list": MethodSpec(
        SessionFilter, SessionListResult, "List sessions matching a filter, pinned first."
    ),
    "chat:session:get": MethodSpec(IdParams, SessionV2, "One session by id."),
    "chat:session:update": MethodSpec(
        SessionUpdateParams, SessionV2, "Change title, tags, folder, prompt, model and similar fields."
    ),
    "chat:session:delete": MethodSpec(
        IdParams, SuccessResult, "Delete a session and everything under it."
    ),
    "chat:session:archive": MethodSpec(IdParams, SuccessResult, "Archive a session."),
    "chat:session:pin": MethodSpec(SessionPinParams, SuccessResult, "Pin or unpin a session."),
    "chat:session:fork": MethodSpec(
        SessionForkParams, SessionV2, "New session holding a copy of the path root -> messageId."
    ),
    "chat:session:export": MethodSpec(
        IdParams, SessionExport, "A whole session with all branches as one JSON document."
    ),
    "chat:session:import": MethodSpec(
        SessionImportParams, SessionV2, "Store an exported session (all branches)."
    ),
    # messages
    "chat:messages:get": MethodSpec(
        MessagesGetParams, list[MessageV2], "Messages of the active branch (or another leaf, a page, all)."
    ),
    "chat:messages:tree": MethodSpec(
        MessagesTreeParams, list[MessageTreeNode], "The whole message tree, active path marked."
    ),
    "chat:messages:search": MethodSpec(
        MessagesSearchParams, list[SearchResult], "Full-text search over messages (Chinese and English)."
    ),
    "chat:messages:select": MethodSpec(
        MessagesSelectParams, list[MessageV2], "Switch the active branch; returns the new active path."
    ),
    # chat
    "chat:send": MethodSpec(
        SendParams, SendResult, "Store the user message and start generating; events follow on chat:stream."
    ),
    "chat:abort": MethodSpec(AbortParams, SuccessResult, "Stop the running generation of a session."),
    "chat:regenerate": MethodSpec(
        RegenerateParams, MessageIdResult, "Generate a sibling of an assistant reply."
    ),
    "chat:editResend": MethodSpec(
        EditResendParams, MessageIdResult, "Add an edited sibling of a user message and generate."
    ),
    # providers and settings
    "provider:list": MethodSpec(EmptyParams, list[ProviderInfo], "Configured providers (keys never shown)."),
    "provider:upsert": MethodSpec(
        ProviderUpsertParams, ProviderInfo, "Create or replace a provider and its models."
    ),
    "provider:delete": MethodSpec(IdParams, SuccessResult, "Delete a provider."),
    "provider:setDefault": MethodSpec(
        ProviderSetDefaultParams, SuccessResult, "Provider and model for new sessions."
    ),
    "settings:get": MethodSpec(EmptyParams, ChatSettings, "Engine settings."),
    "settings:update": MethodSpec(ChatSettingsUpdate, ChatSettings, "Change engine settings."),
    # tools and approvals (issue 5)
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
    "mcp:server:upsert": MethodSpec(
        McpServerUpsertParams, McpServerInfo, "Create or replace an MCP server (stdio command or HTTP URL)."
    ),
    "mcp:server:list": MethodSpec(EmptyParams, list[McpServerInfo], "Configured MCP servers and their state."),
    "mcp:server:delete": MethodSpec(NameParams, SuccessResult, "Delete an MCP server (its process is stopped)."),
    # assistant profiles and the context window (issue 6)
    "assistant:list": MethodSpec(EmptyParams, list[AssistantProfile], "Assistant profiles, the default marked."),
    "assistant:get": MethodSpec(AssistantIdParams, AssistantProfile, "One assistant profile."),
    "assistant:upsert": MethodSpec(
        AssistantUpsertParams, AssistantProfile, "Create or replace an assistant profile (validated)."
    ),
    "assistant:delete": MethodSpec(
        AssistantIdParams, SuccessResult, "Delete a profile (not the default; its sessions fall back to the default)."
    ),
    "assistant:setDefault": MethodSpec(
        AssistantIdParams, SuccessResult, "The profile of sessions that did not choose one."
    ),
    "chat:context:get": MethodSpec(
        ContextGetParams, SessionContextInfo, "A session's profile, truncation strategy and rolling summary."
    ),
    "chat:context:update": MethodSpec(
        ContextUpdateParams, SessionContextInfo, "Choose a session's assistant profile and truncation strategy."
    ),
    "chat:context:compact": MethodSpec(
        ContextCompactParams, ContextCompactResult,
        "Summarize the old part of the active branch now (target size, extra instructions).",
    ),
}

NOTIFICATIONS: dict[str, MethodSpec] = {
    "chat:stream": MethodSpec(
        ChatStreamEvent, None, "One streaming event of a reply.", direction="server->client"
    ),
    "chat:session:updated": MethodSpec(
        SessionV2, None, "A session changed outside a request of the renderer (title, counters).",
        direction="server->client",
    ),
    "$/cancelRequest": MethodSpec(
        CancelRequestParams, None, "Cancel an in-flight request (LSP convention).",
    ),
}
