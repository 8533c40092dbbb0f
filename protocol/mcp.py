"""``mcp:server:*``: MCP servers (a stdio command or an HTTP URL) whose tools the model is offered.
"""

from __future__ import annotations

from typing import Literal

from protocol.limits import Id
from protocol.types import Struct
from protocol.common import EmptyParams, NameParams, SuccessResult
from protocol.common import MethodSpec

__all__ = [
    "McpTransport",
    "McpServerUpsertParams",
    "McpServerInfo",
]


McpTransport = Literal["stdio", "http"]


class McpServerUpsertParams(Struct, kw_only=True):
    """``mcp:server:upsert``: an MCP server run as a stdio command or reached at an HTTP URL."""

    name: Id
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


METHODS: dict[str, MethodSpec] = {
    "mcp:server:upsert": MethodSpec(
        McpServerUpsertParams, McpServerInfo, "Create or replace an MCP server (stdio command or HTTP URL)."
    ),
    "mcp:server:list": MethodSpec(EmptyParams, list[McpServerInfo], "Configured MCP servers and their state."),
    "mcp:server:delete": MethodSpec(NameParams, SuccessResult, "Delete an MCP server (its process is stopped)."),
}
"""The methods of this domain (see ``protocol.methods``)."""
