"""McpManager: MCP servers as tool sources, through our own MCP client.

The client (sidecar/tools/mcp_client.py on the JSON-RPC peer; streamable HTTP in
sidecar/tools/mcp_http.py) is part of the core: no SDK, no optional bundle part. httpx2 is
imported only when an HTTP server connects, in a worker thread.

Servers are configured by method (``mcp:server:upsert|list|delete``) and stored in the
``mcp_servers`` table (reached through the store gateway, ``store.run``).
``McpManager.open(store)`` is an async context manager owning one
task group: every enabled server gets a ServerSupervisor (sidecar/tools/mcp_supervisor.py)
running in it, started when the manager opens and when a server is upserted, so servers
connect in the background, back off when they fail and reconnect when they crash.

Must stay true:
- a reply never waits for a server: ``tools()`` returns the tools of the servers that are
  ready now and ``unavailable()`` names the others (the ToolService tells the model about
  them); a call to a server that is not ready is a tool error at once;
- a server process is never spawned twice at once: a supervisor replacing another
  connects only after the old one is done;
- delete, disable (upsert with ``enabled: false``), re-configuration and the manager's
  close stop the server within STOP_DEADLINE_S (all servers at once, one deadline, on
  close); after the deadline a stdio server's process group is SIGKILLed and reaped;
- the task group is entered and left in the task that opened the manager, and it is
  never exited with an exception passed through (see sidecar/tools/mcp_transport.py for
  why an exit stack must not unwind a cancellation through it);
- a stdio server never inherits our stdout and its stderr is always drained; ``env``
  and header values are passed to the server and never logged or returned, and the URL
  is listed with its userinfo and query values masked (``sidecar/secrets/mask.py``; a
  masked part sent back keeps the stored one).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec

from protocol.common import NameParams, SuccessResult
from protocol.mcp import McpServerInfo, McpServerUpsertParams
from sidecar.errors import InvalidParams, NotFound
from sidecar.http_fields import headers_problem
from sidecar.secrets.mask import mask_url
from sidecar.secrets.urls import split_secret_parts
from sidecar.store.async_store import AsyncStore
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput
from sidecar.tools.mcp_client import CallToolResult
from sidecar.tools.mcp_config import McpServerConfig, RemoteTool, mcp_tool_name, sanitize
from sidecar.tools.mcp_supervisor import ServerSupervisor, describe
from sidecar.tools.mcp_transport import STOP_STEP_S

__all__ = ["McpManager", "McpTool", "McpServerConfig", "sanitize", "mcp_tool_name", "STOP_DEADLINE_S"]

log = logging.getLogger(__name__)

MAX_SERVERS = 100
STOP_DEADLINE_S = 3 * STOP_STEP_S
"""How long a server's stop may take (close stdin, SIGTERM, SIGKILL); then its group is killed."""
KILL_REAP_S = 1.0
"""After the deadline's SIGKILL: how long to wait for the teardown to see the process gone."""


class McpTool(Tool):
    source = "mcp"
    default_policy = "ask"

    def __init__(self, manager: McpManager, server: str, remote: RemoteTool, timeout_s: float) -> None:
        self._manager = manager
        self._server = server
        self._remote = remote.name
        self.name = mcp_tool_name(server, remote.name)
        self.description = remote.description or f"{remote.name} (MCP server {server})"
        schema = dict(remote.schema)
        schema.setdefault("type", "object")
        self.parameters = schema
        self.server_key = f"mcp:{server}"
        # the supervisor enforces the server's own limit and then restarts the connection
        self.timeout_s = timeout_s + 5.0

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await self._manager.call(self._server, self._remote, args)


class McpManager:
    def __init__(self, store: AsyncStore, task_group: anyio.abc.TaskGroup) -> None:
        """Use ``McpManager.open(store)``: it owns the task group."""
        self._store = store
        self._tg = task_group
        self._configs: dict[str, McpServerConfig] = {}
        self._servers: dict[str, ServerSupervisor] = {}
        """The running supervisor of every enabled server."""
        self._lock = anyio.Lock()
        self._closing = False

    @classmethod
    @asynccontextmanager
    async def open(cls, store: AsyncStore, *, close_deadline_s: float = STOP_DEADLINE_S) -> AsyncIterator[McpManager]:
        """Load the stored servers, start the enabled ones; on exit stop them all, bounded."""
        async with anyio.create_task_group() as tg:
            manager = cls(store, tg)
            try:
                await manager._load()
                yield manager
            finally:
                with anyio.CancelScope(shield=True):
                    await manager.aclose(close_deadline_s)
                tg.cancel_scope.cancel()

    async def _load(self) -> None:
        rows = await self._store.run(lambda s: s.tools.mcp_servers())
        for name, raw in rows:
            try:
                self._configs[name] = msgspec.json.decode(raw, type=McpServerConfig)
            except msgspec.DecodeError:
                log.error("stored MCP server %r has an unreadable config; skipped", name)
        for name, config in sorted(self._configs.items()):
            if config.enabled:
                self._start(config)

    @property
    def configured(self) -> bool:
        return any(c.enabled for c in self._configs.values())

    # ---- methods --------------------------------------------------------------------

    async def upsert_server(self, params: McpServerUpsertParams) -> McpServerInfo:
        name = sanitize(params.name)
        if not name or len(name) > 40 or not name.strip("_"):
            raise InvalidParams("invalid params: name must have 1..40 characters of A-Za-z0-9_- - at `$.name`")
        if params.transport == "stdio":
            if not params.command or not params.command.strip():
                raise InvalidParams("invalid params: command is required for a stdio server - at `$.command`")
        elif (
            not params.url or not params.url.startswith(("http://", "https://"))
            or split_secret_parts(params.url) is None
        ):
            raise InvalidParams("invalid params: url must be an http(s) URL for an http server - at `$.url`")
        if problem := headers_problem(params.headers):
            raise InvalidParams(f"invalid params: {problem} - at `$.headers`")
        for field, value in (("toolTimeoutS", params.tool_timeout_s), ("connectTimeoutS", params.connect_timeout_s)):
            if not 0 < value <= 3600:
                raise InvalidParams(f"invalid params: {field} must be in (0, 3600] - at `$.{field}`")
        config = McpServerConfig(
            name=name, transport=params.transport, command=params.command, args=list(params.args),
            env=dict(params.env), cwd=params.cwd, url=params.url, headers=dict(params.headers),
            enabled=params.enabled, tool_timeout_s=params.tool_timeout_s,
            connect_timeout_s=params.connect_timeout_s,
        )
        raw = msgspec.json.encode(config).decode()
        async with self._lock:
            if name not in self._configs and len(self._configs) >= MAX_SERVERS:
                raise InvalidParams(f"at most {MAX_SERVERS} MCP servers can be configured")
            stored = await self._store.run(lambda s: s.tools.put_mcp_server(name, raw))
            config = msgspec.json.decode(stored, type=McpServerConfig)  # masked URL parts restored
            self._configs[name] = config
            await self._stop(name)
            if config.enabled and not self._closing:
                self._start(config)
            return self._info(name)

    async def list_servers(self, params: object = None) -> list[McpServerInfo]:
        return [self._info(name) for name in sorted(self._configs)]

    async def delete_server(self, params: NameParams) -> SuccessResult:
        name = sanitize(params.name)
        async with self._lock:
            if name not in self._configs:
                raise NotFound(f"no MCP server named {params.name!r}")
            await self._store.run(lambda s: s.tools.delete_mcp_server(name))
            del self._configs[name]
            await self._stop(name)
        return SuccessResult()

    def _info(self, name: str) -> McpServerInfo:
        c = self._configs[name]
        server = self._servers.get(name)
        info = McpServerInfo(
            name=c.name, transport="http" if c.transport == "http" else "stdio",
            command=c.command, args=c.args, env_keys=sorted(c.env), cwd=c.cwd,
            url=mask_url(c.url) if c.url is not None else None,
            enabled=c.enabled, tool_timeout_s=c.tool_timeout_s, connect_timeout_s=c.connect_timeout_s,
            status="disabled",
        )
        if server is None:
            return info
        if server.ready:
            info.status = "ready"
            info.tools = [mcp_tool_name(name, t.name) for t in server.tools]
        elif server.state == "failed":
            info.status = "failed"
            info.error = server.error
            info.retry_at = server.retry_at_ms
        else:
            info.status = "connecting"
        return info

    # ---- tools for a request ----------------------------------------------------------

    def servers(self) -> dict[str, list[str] | None]:
        """Every configured server (enabled or not) -> the names of its tools when it is
        ready now, None when they are not known (connecting, failed, disabled)."""
        out: dict[str, list[str] | None] = {}
        for name in sorted(self._configs):
            server = self._servers.get(name)
            out[name] = [mcp_tool_name(name, t.name) for t in server.tools] if server is not None and server.ready else None
        return out

    def tools(self) -> list[McpTool]:
        """The tools of every server that is ready now (never waits for one)."""
        out: list[McpTool] = []
        for name in sorted(self._servers):
            server = self._servers[name]
            if server.ready:
                out.extend(McpTool(self, name, remote, server.config.tool_timeout_s) for remote in server.tools)
        return out

    def unavailable(self) -> list[tuple[str, str]]:
        """(name, "connecting" | "failed") of every enabled server that is not ready now."""
        return [
            (name, "failed" if server.state == "failed" else "connecting")
            for name, server in sorted(self._servers.items())
            if not server.ready
        ]

    async def call(self, server: str, tool: str, args: dict[str, Any]) -> ToolOutput:
        supervisor = self._servers.get(server)
        if supervisor is None:
            why = "disabled" if server in self._configs else "not configured"
            raise ToolError(f"MCP server {server} is not available: {why}")
        result = await supervisor.call(tool, args)
        return ToolOutput(text=_result_text(result), is_error=result.is_error)

    # ---- supervisors ------------------------------------------------------------------

    def _start(self, config: McpServerConfig) -> None:
        previous = self._servers.pop(config.name, None)
        supervisor = ServerSupervisor(config, previous=previous)
        self._servers[config.name] = supervisor
        self._tg.start_soon(supervisor.run, name=f"mcp server {config.name}")

    async def _stop(self, name: str) -> None:
        supervisor = self._servers.pop(name, None)
        if supervisor is not None:
            await _stop_all([supervisor], STOP_DEADLINE_S)

    async def aclose(self, deadline_s: float = STOP_DEADLINE_S) -> None:
        """Stop every server at once, all within ``deadline_s``; then kill what is left."""
        self._closing = True
        supervisors = list(self._servers.values())
        self._servers.clear()
        if supervisors:
            await _stop_all(supervisors, deadline_s)


async def _stop_all(supervisors: list[ServerSupervisor], deadline_s: float) -> None:
    deadline = anyio.current_time() + deadline_s
    for supervisor in supervisors:
        supervisor.stop(deadline)
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(deadline_s):
            for supervisor in supervisors:
                await supervisor.done.wait()
        late = [s for s in supervisors if not s.done.is_set()]
        for supervisor in late:
            supervisor.kill()
        with anyio.move_on_after(KILL_REAP_S):
            for supervisor in late:
                await supervisor.done.wait()
        for supervisor in late:
            if not supervisor.done.is_set():
                # its replacement (if any) still waits for it: never two processes at once
                log.error("MCP server %s did not stop after SIGKILL", supervisor.name)


def _result_text(result: CallToolResult) -> str:
    chunks: list[str] = []
    for block in result.content:
        kind = block.type
        if kind == "text" and block.text is not None:  # McpSession refuses a text block without text
            chunks.append(block.text)
        elif kind == "image":
            chunks.append(f"[image {block.mime_type} omitted]")
        elif kind == "resource":
            resource = block.resource
            text = resource.text if resource is not None else None
            chunks.append(text if text is not None else f"[resource {resource.uri if resource is not None else ''}]")
        else:
            chunks.append(f"[{kind or 'unknown'} content omitted]")
    structured = result.structured_content
    if not chunks and structured is not None:
        try:
            chunks.append(msgspec.json.encode(structured).decode())
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            chunks.append(f"[structured content that cannot be shown: {describe(exc)}]")
    return "\n".join(chunks)
