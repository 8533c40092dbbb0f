"""What is stored about an MCP server, and the names its tools get.

``McpServerConfig`` is the JSON kept in the ``mcp_servers`` table (one row per server) and
the input of every connection. Must stay true:
- its repr never shows a secret: ``env`` and header values, ``args`` and the URL's
  credentials or query may all carry one;
- the tool name the model sees, and that policies and ``enabledTools`` name, belongs to one
  (server, tool) pair only, whatever names servers choose: it is ``mcp__{server}__{tool}``
  when both are plain (``[A-Za-z0-9-]`` words joined by single ``_``) and it fits the
  providers' 64 characters; otherwise ``mcp__{server'}__{tool'}__{hash}``, the two cut
  and made plain (runs of ``_`` and other characters as one ``_``), and 16 hex digits of
  the SHA-256 of the exact pair. Split at ``__`` the first form has three parts, the second
  four, so they never meet; a server cannot list a tool whose name is another server's
  tool's (``a`` + ``b__c`` and ``a__b`` + ``c`` no longer share ``mcp__a__b__c``), or a
  tool of its own under another name (``read.file`` and ``read_file``). The original tool
  name is what the server receives.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from sidecar.providers.redact import safe_url

__all__ = ["McpServerConfig", "RemoteTool", "sanitize", "mcp_tool_name", "tool_name_prefix", "MAX_TOOL_NAME"]

MAX_TOOL_NAME = 64
MAX_SERVER_PART = 24
"""How much of a server's name a tool name holds (the rest of the 64 is the tool's)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PLAIN = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")
_NOT_WORD = re.compile(r"[^A-Za-z0-9-]+")


def sanitize(name: str) -> str:
    return _UNSAFE.sub("_", name.strip())


def _plain(name: str) -> bool:
    return _PLAIN.fullmatch(name) is not None


def _made_plain(name: str, limit: int) -> str:
    return _NOT_WORD.sub("_", name).strip("_")[:limit].rstrip("_") or "x"


def _server_part(server: str) -> str:
    return server if _plain(server) and len(server) <= MAX_SERVER_PART else _made_plain(server, MAX_SERVER_PART)


def tool_name_prefix(server: str) -> str:
    """What every tool name of ``server`` starts with (servers whose names differ only in
    characters a name cannot hold share it)."""
    return f"mcp__{_server_part(server)}__"


def mcp_tool_name(server: str, tool: str) -> str:
    """The name of ``server``'s tool ``tool``: one pair's only (see the module's docstring)."""
    head = tool_name_prefix(server)
    if _server_part(server) == server and _plain(tool) and len(head) + len(tool) <= MAX_TOOL_NAME:
        return head + tool
    digest = hashlib.sha256(f"{server}\0{tool}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{head}{_made_plain(tool, MAX_TOOL_NAME - len(head) - 2 - len(digest))}__{digest}"


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
