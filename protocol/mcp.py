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
    "McpServerStatus",
    "McpServerUpsertParams",
    "McpServerInfo",
]


McpTransport = Literal["stdio", "http"]

McpServerStatus = Literal["connecting", "ready", "failed", "disabled"]
"""``connecting``: starting or initializing; ``ready``: its tools are offered; ``failed``: the
last attempt failed (``error``), the next one starts at ``retryAt``; ``disabled``: ``enabled``
is false (no process runs)."""


class McpServerUpsertParams(Struct, kw_only=True):
    """``mcp:server:upsert``: an MCP server run as a stdio command or reached at an HTTP URL."""

    name: Id
    """Characters other than ``A-Za-z0-9_-`` become ``_``. Tools appear as
    ``mcp__{name}__{tool}`` when both names are words joined by single ``_`` and the whole fits
    64 characters; otherwise as ``mcp__{name'}__{tool'}__{hash}`` (both cut and made so,
    16 hex digits of the exact pair's SHA-256), so no two tools share a name."""
    transport: McpTransport = "stdio"
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    """Passed to the server process (stored sealed, never logged, never returned). The
    process inherits only a short allow-list of the sidecar's own environment (PATH, HOME,
    the locale...), never its keys: a secret the server needs goes here."""
    cwd: str | None = None
    url: str | None = None
    """Its userinfo and query values are stored sealed; a ``***`` sent back where
    ``mcp:server:list`` showed one keeps the stored part."""
    headers: dict[str, str] = {}
    """Stored sealed, every value; never returned."""
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
    """Its userinfo and every query value masked (``***``)."""
    enabled: bool = True
    tool_timeout_s: float = 60.0
    connect_timeout_s: float = 15.0
    status: McpServerStatus
    """``connecting`` (starting or initializing) | ``ready`` (its tools are offered) | ``failed``
    (``error``; the next attempt starts at ``retryAt``) | ``disabled``. Servers connect in the
    background; a reply offers the tools of the servers ready at that moment, never waits."""
    error: str | None = None
    """Why the last attempt failed (``failed`` only)."""
    retry_at: int | None = None
    """When the next attempt starts, ms since the epoch (``failed`` only; null when none will come,
    e.g. the MCP client SDK is missing); failed attempts back off exponentially (1 s doubling up
    to 60 s), and so does reconnecting a server that crashed or stopped answering."""
    tools: list[str] = []
    """Names as the model sees them (``ready`` only)."""


METHODS: dict[str, MethodSpec] = {
    "mcp:server:upsert": MethodSpec(
        McpServerUpsertParams, McpServerInfo, "Create or replace an MCP server (stdio command or HTTP URL); an enabled one starts connecting at once."
    ),
    "mcp:server:list": MethodSpec(EmptyParams, list[McpServerInfo], "Configured MCP servers and their state."),
    "mcp:server:delete": MethodSpec(NameParams, SuccessResult, "Delete an MCP server; answered once its process is stopped."),
}
"""The methods of this domain (see ``protocol.methods``)."""
