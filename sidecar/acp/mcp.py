"""The MCP servers the user configured (``mcp:server:*``), in the shape ACP's session/new wants.

An agent engine gets the same tools as a direct-mode session: every enabled stdio server
as ``McpServerStdio {name, command, args, env:[{name, value}]}``; HTTP servers only when
the agent advertised ``mcpCapabilities.http`` (as ``{type:"http", name, url, headers}``).
A server whose policy (``mcp:<server>``) is ``deny`` is not passed, nor its env values and
headers: the agent runs the servers it gets itself, so that policy is the only way to keep
one, and its secrets, from an agent (its tool calls then ask through the agent's own
``session/request_permission``, not the sidecar's per-tool policies).
Stored configs are read tolerantly: one that does not decode is skipped (and logged),
it never fails a turn. Env values and headers are passed, never logged.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import msgspec

from sidecar.acp.types import AcpStruct, AgentFeatures
from sidecar.tools.mcp import McpServerConfig

log = logging.getLogger(__name__)


class NameValue(AcpStruct, omit_defaults=False):
    name: str
    value: str


class McpServerStdio(AcpStruct, omit_defaults=False):
    name: str
    command: str
    args: list[str]
    env: list[NameValue]


class McpServerHttp(AcpStruct, omit_defaults=False, kw_only=True):
    type: str = "http"
    name: str
    url: str
    headers: list[NameValue]


def acp_mcp_servers(rows: list[tuple[str, str]], features: AgentFeatures, *, denied: Collection[str] = ()) -> list[Any]:
    """``rows``: (name, config JSON) as ToolStore.mcp_servers() returns them; ``denied``: the
    names of the servers whose policy is ``deny``."""
    servers: list[Any] = []
    for name, raw in rows:
        try:
            config = msgspec.json.decode(raw, type=McpServerConfig)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("MCP server %r has an unreadable config; not passed to the agent", name)
            continue
        if not config.enabled or name in denied or config.name in denied:
            continue
        if config.transport == "stdio" and config.command:
            servers.append(
                McpServerStdio(
                    name=config.name,
                    command=config.command,
                    args=list(config.args),
                    env=[NameValue(name=k, value=v) for k, v in config.env.items()],
                )
            )
        elif config.transport == "http" and config.url and features.mcp_http:
            servers.append(
                McpServerHttp(
                    name=config.name,
                    url=config.url,
                    headers=[NameValue(name=k, value=v) for k, v in config.headers.items()],
                )
            )
    return servers
