"""What is stored about an MCP server, and the names its tools get.

``McpServerConfig`` is the JSON kept in the ``mcp_servers`` table (one row per server) and
the input of every connection. Must stay true:
- its repr never shows a secret: ``env`` and header values, ``args`` and the URL's
  credentials or query may all carry one;
- tool names the model sees are ``mcp__{server}__{tool}`` with everything outside
  ``[A-Za-z0-9_-]`` replaced by ``_`` and cut to 64 characters (provider limit); the
  original tool name is what the server receives.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from sidecar.providers.redact import safe_url

__all__ = ["McpServerConfig", "RemoteTool", "sanitize", "mcp_tool_name", "MAX_TOOL_NAME"]

MAX_TOOL_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sanitize(name: str) -> str:
    return _UNSAFE.sub("_", name.strip())


def mcp_tool_name(server: str, tool: str) -> str:
    return f"mcp__{sanitize(server)}__{sanitize(tool)}"[:MAX_TOOL_NAME]


class McpServerConfig(msgspec.Struct, kw_only=True):
    name: str
    transport: str = "stdio"
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    enabled: bool = True
    tool_timeout_s: float = 60.0
    connect_timeout_s: float = 15.0

    def __repr__(self) -> str:
        # env and header values are secrets, args and the URL's query may carry them too
        return (
            f"McpServerConfig(name={self.name!r}, transport={self.transport!r}, command={self.command!r}, "
            f"url={_shown_url(self.url)!r}, env keys={sorted(self.env)}, header names={sorted(self.headers)})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list every field, the secrets included
        return [
            ("name", self.name),
            ("transport", self.transport),
            ("command", self.command),
            ("url", _shown_url(self.url)),
            ("env_keys", sorted(self.env)),
            ("header_names", sorted(self.headers)),
        ]


def _shown_url(url: str | None) -> str | None:
    return None if url is None else safe_url(url)


class RemoteTool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as a server listed it (its own name, not the sanitised one)."""

    name: str
    description: str
    schema: dict[str, Any]
