"""The V1 agent-runner HTTP wire: request bodies, the HttpResult envelope, response bodies.

The shapes are those of nuwaxcode's desktop client (``computerServer.ts``) and the Rust
agent runner (rcoder ``shared_types``), which the Qiming server's SandboxAgentClient
calls: snake_case fields, every answer wrapped as
``{"code", "message", "data", "tid", "success"}`` in that key order (``code`` "0000" is
success). Requests are read leniently as V1 did (ids may be JSON numbers, unknown fields
are ignored); everything is still checked before use (``sidecar.compat.validate``).

Fields of ComputerChatRequest this endpoint does not act on, and why: ``original_user_prompt``
and ``open_long_memory`` (V1's own memory; memory here is the assistant profile's),
``user_prompt`` (an rcoder template), ``agent_config.context_servers`` (the agent gets
the sidecar's configured MCP servers), ``resource_limits``, ``pod_id``, ``tenant_id``,
``space_id``, ``isolation_type`` (container placement). ``attachments`` become parts of the
user message (sidecar.compat.attachments); ``data_source_attachments`` are refused when
non-empty (not supported).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from sidecar.errors import SidecarError

SUCCESS = "0000"
VALIDATION_ERROR = "VALIDATION_ERROR"
NOT_FOUND = "NOT_FOUND"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
AUTH_FAILED = "4010"
"""rcoder's "api key auth failed"."""
INTERNAL = "5000"
"""V1 Electron's code for engine and handler failures."""
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
HOST_NOT_ALLOWED = "HOST_NOT_ALLOWED"

Id = str | int
"""V1 ids arrive as strings; some callers send numbers (a conversation id)."""


class _In(msgspec.Struct, kw_only=True):
    """Base of request bodies: snake_case as sent, unknown fields ignored."""


class ModelProviderIn(_In):
    id: Id | None = None
    name: str | None = None
    provider: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None
    default_model: str | None = None
    api_protocol: str | None = None
    """``anthropic`` or ``openai`` (``ollama`` also accepted here)."""
    requires_openai_auth: bool | None = None


class ToolApprovalRuleIn(_In):
    """One rule of ``agent_server.tool_approval_rules`` (see sidecar.compat.rules)."""

    patterns: list[str] = []
    action: str = "ask"
    tool_kind: str | None = None


class AgentServerIn(_In):
    agent_id: str | None = None
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    agent_mode: str | None = None
    tool_approval_rules: list[ToolApprovalRuleIn] | None = None


class AgentConfigIn(_In):
    agent_server: AgentServerIn | None = None


class ComputerChatRequest(_In):
    user_id: Id | None = None
    project_id: Id | None = None
    session_id: Id | None = None
    prompt: str | None = None
    request_id: Id | None = None
    system_prompt: str | None = None
    model_provider: ModelProviderIn | None = None
    agent_config: AgentConfigIn | None = None
    agent_work_dir: Id | None = None
    attachments: list[Any] | None = None
    data_source_attachments: list[Any] | None = None


class ProjectRequest(_In):
    """Body (or query) of status, stop and cancel."""

    user_id: Id | None = None
    project_id: Id | None = None
    session_id: Id | None = None


# -- responses ----------------------------------------------------------------------


class ChatResponse(msgspec.Struct, kw_only=True):
    project_id: str
    session_id: str
    error: str | None = None
    request_id: str | None = None
    is_new_session: bool | msgspec.UnsetType = msgspec.UNSET
    """Electron only (rcoder does not send it)."""


class StatusResponse(msgspec.Struct, kw_only=True):
    user_id: str
    project_id: str
    is_alive: bool
    session_id: str | None
    status: Literal["Busy", "Idle"] | None
    last_activity: str | None
    created_at: str | None


class StopResponse(msgspec.Struct, kw_only=True):
    success: bool
    message: str
    user_id: str
    project_id: str


class CancelResponse(msgspec.Struct, kw_only=True):
    success: bool
    session_id: str


class HealthResponse(msgspec.Struct, kw_only=True):
    status: str
    engineType: str  # noqa: N815 - V1's name
    timestamp: str


class HttpResult(msgspec.Struct, kw_only=True):
    code: str
    message: str
    data: Any = None
    tid: str | None = None
    success: bool


_encoder = msgspec.json.Encoder()


def ok(data: Any) -> bytes:
    return _encoder.encode(HttpResult(code=SUCCESS, message="success", data=data, success=True))


def error(code: str, message: str) -> bytes:
    return _encoder.encode(HttpResult(code=code, message=message, data=None, success=False))


def text_id(value: Id | None) -> str | None:
    """A V1 id as text (numbers as their decimal form); None stays None."""
    return None if value is None else str(value)


class V1Error(SidecarError):
    """A request the endpoint answers with an error envelope: HTTP ``status`` and V1 ``v1_code``.

    The one error type of the shim; sidecar.compat.http turns it into the response."""

    def __init__(self, status: int, v1_code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.v1_code = v1_code


def invalid(message: str) -> V1Error:
    return V1Error(400, VALIDATION_ERROR, message)
