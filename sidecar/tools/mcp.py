"""McpManager: MCP servers as tool sources, through the official ``mcp`` client SDK.

The ``mcp`` package is imported only when a server is actually connected (start-up time:
it pulls in pydantic, starlette...), never at module import.

Servers are configured by method (``mcp:server:upsert|list|delete``) and stored in the
``mcp_servers`` table. Each enabled server is connected lazily, the first time a request
assembles its tools: one connection task per server, owned by the manager's task group,
holds ``stdio_client`` (or ``streamable_http_client``) and a ``ClientSession`` open until
it is told to stop. Its tools are listed at connect and listed again after the server
sends ``notifications/tools/list_changed``.

Must stay true:
- tool names the model sees are ``mcp__{server}__{tool}`` with everything outside
  ``[A-Za-z0-9_-]`` replaced by ``_`` and cut to 64 characters (provider limit); the
  original tool name is what the server receives;
- a server that crashes or hangs yields a tool error within its ``toolTimeoutS`` (a
  connect within ``connectTimeoutS``); its connection is then torn down and the next use
  starts a new one;
- a stdio server never inherits our stdout (the SDK gives it a pipe); its stderr goes to
  a pipe we drain into our log (prefixed with the server name), so a chatty server never
  blocks on a full pipe; on shutdown the SDK closes stdin, waits, then kills the process
  group;
- ``env`` values are passed to the process and never logged or returned.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc
import msgspec

from protocol.common import NameParams, SuccessResult
from protocol.mcp import McpServerInfo, McpServerUpsertParams
from sidecar.errors import InvalidParams, NotFound
from sidecar.providers.redact import safe_url
from sidecar.store.async_store import AsyncStore
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput

__all__ = ["McpManager", "McpTool", "sanitize", "mcp_tool_name"]

log = logging.getLogger(__name__)

MAX_TOOL_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_SERVERS = 100


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


class _RemoteTool(msgspec.Struct, kw_only=True):
    name: str
    description: str
    schema: dict[str, Any]


class _Connection:
    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.session: Any = None
        self.tools: list[_RemoteTool] = []
        self.tools_stale = False
        self.error: str | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.done = anyio.Event()

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.stop.is_set()


class McpTool(Tool):
    source = "mcp"
    default_policy = "ask"

    def __init__(self, manager: McpManager, server: str, remote: _RemoteTool, timeout_s: float) -> None:
        self._manager = manager
        self._server = server
        self._remote = remote.name
        self.name = mcp_tool_name(server, remote.name)
        self.description = remote.description or f"{remote.name} (MCP server {server})"
        schema = dict(remote.schema) if isinstance(remote.schema, dict) else {}
        schema.setdefault("type", "object")
        self.parameters = schema
        self.server_key = f"mcp:{server}"
        # the manager enforces the server's own limit and then tears the connection down
        self.timeout_s = timeout_s + 5.0

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await self._manager.call(self._server, self._remote, args)


class McpManager:
    def __init__(self, store: AsyncStore, task_group: anyio.abc.TaskGroup) -> None:
        self._store = store
        self._tg = task_group
        self._configs: dict[str, McpServerConfig] = {}
        self._conns: dict[str, _Connection] = {}
        self._lock = anyio.Lock()
        self._closing = False

    async def load(self) -> None:
        rows = await self._store.run(lambda s: s.tools.mcp_servers())
        for name, raw in rows:
            try:
                self._configs[name] = msgspec.json.decode(raw, type=McpServerConfig)
            except msgspec.DecodeError:
                log.error("stored MCP server %r has an unreadable config; skipped", name)

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
        elif not params.url or not params.url.startswith(("http://", "https://")):
            raise InvalidParams("invalid params: url must be an http(s) URL for an http server - at `$.url`")
        for field, value in (("toolTimeoutS", params.tool_timeout_s), ("connectTimeoutS", params.connect_timeout_s)):
            if not 0 < value <= 3600:
                raise InvalidParams(f"invalid params: {field} must be in (0, 3600] - at `$.{field}`")
        if name not in self._configs and len(self._configs) >= MAX_SERVERS:
            raise InvalidParams(f"at most {MAX_SERVERS} MCP servers can be configured")
        config = McpServerConfig(
            name=name, transport=params.transport, command=params.command, args=list(params.args),
            env=dict(params.env), cwd=params.cwd, url=params.url, headers=dict(params.headers),
            enabled=params.enabled, tool_timeout_s=params.tool_timeout_s,
            connect_timeout_s=params.connect_timeout_s,
        )
        raw = msgspec.json.encode(config).decode()
        await self._store.run(lambda s: s.tools.put_mcp_server(name, raw))
        self._configs[name] = config
        await self._disconnect(name)
        return self._info(name)

    async def list_servers(self, params: Any = None) -> list[McpServerInfo]:
        return [self._info(name) for name in sorted(self._configs)]

    async def delete_server(self, params: NameParams) -> SuccessResult:
        name = sanitize(params.name)
        if name not in self._configs:
            raise NotFound(f"no MCP server named {params.name!r}")
        await self._store.run(lambda s: s.tools.delete_mcp_server(name))
        del self._configs[name]
        await self._disconnect(name)
        return SuccessResult()

    def _info(self, name: str) -> McpServerInfo:
        c = self._configs[name]
        conn = self._conns.get(name)
        status = "idle"
        if conn is not None:
            status = "connected" if conn.alive else ("error" if conn.error else "idle")
        elif c.enabled is False:
            status = "disabled"
        return McpServerInfo(
            name=c.name, transport=c.transport,  # type: ignore[arg-type]
            command=c.command, args=c.args, env_keys=sorted(c.env), cwd=c.cwd, url=c.url,
            enabled=c.enabled, tool_timeout_s=c.tool_timeout_s, connect_timeout_s=c.connect_timeout_s,
            status=status, error=conn.error if conn is not None else None,
            tools=[mcp_tool_name(name, t.name) for t in conn.tools] if conn is not None and conn.alive else [],
        )

    # ---- tools for a request ----------------------------------------------------------

    async def tools(self) -> list[McpTool]:
        """Tools of every enabled server, connecting the ones not connected yet (in parallel)."""
        names = sorted(n for n, c in self._configs.items() if c.enabled)
        if not names or self._closing:
            return []
        conns: dict[str, _Connection | None] = {}

        async def get(name: str) -> None:
            conns[name] = await self._connected(name)

        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(get, name)
        out: list[McpTool] = []
        for name in names:
            conn = conns.get(name)
            if conn is None:
                continue
            if conn.tools_stale:
                await self._refresh(conn)
            for remote in conn.tools:
                out.append(McpTool(self, name, remote, conn.config.tool_timeout_s))
        return out

    async def call(self, server: str, tool: str, args: dict[str, Any]) -> ToolOutput:
        conn = await self._connected(server)
        if conn is None:
            error = self._conns[server].error if server in self._conns else "not configured"
            raise ToolError(f"MCP server {server} is not available: {error}")
        timeout = conn.config.tool_timeout_s
        try:
            with anyio.fail_after(timeout):
                result = await conn.session.call_tool(tool, args)
        except TimeoutError:
            conn.error = f"no answer within {timeout:g} s"
            conn.stop.set()  # a hung server: tear it down, the next use reconnects
            raise ToolError(
                f"MCP server {server} did not answer {tool} within {timeout:g} s; it is restarted on next use"
            ) from None
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            if _connection_lost(exc) or not self._session_alive(conn):
                conn.error = f"connection lost: {exc or type(exc).__name__}"
                conn.stop.set()
                raise ToolError(f"MCP server {server} failed during {tool} ({exc or type(exc).__name__}); it is restarted on next use") from None
            raise ToolError(f"MCP server {server}: {tool} failed: {exc or type(exc).__name__}") from None
        return ToolOutput(text=_result_text(result), is_error=bool(getattr(result, "is_error", False)))

    def _session_alive(self, conn: _Connection) -> bool:
        return not conn.done.is_set() and not conn.stop.is_set() and conn.session is not None

    # ---- connections ------------------------------------------------------------------

    async def _connected(self, name: str) -> _Connection | None:
        async with self._lock:
            config = self._configs.get(name)
            if config is None or not config.enabled or self._closing:
                return None
            conn = self._conns.get(name)
            if conn is None or conn.done.is_set() or conn.stop.is_set():
                conn = _Connection(config)
                self._conns[name] = conn
                self._tg.start_soon(self._run, conn)
        with anyio.move_on_after(config.connect_timeout_s + 2):
            await conn.ready.wait()
        if not conn.ready.is_set():
            conn.error = f"no answer to initialize within {config.connect_timeout_s:g} s"
            conn.stop.set()
        return conn if conn.alive else None

    async def _run(self, conn: _Connection) -> None:
        config = conn.config
        try:
            async with AsyncExitStack() as stack:
                from mcp import ClientSession

                read, write = await self._open_transport(conn, stack)
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._handler(conn))
                )
                with anyio.fail_after(config.connect_timeout_s):
                    await session.initialize()
                    conn.session = session
                    conn.tools = await _list_tools(session)
                conn.error = None
                log.info("MCP server %s connected: %d tools", config.name, len(conn.tools))
                conn.ready.set()
                await conn.stop.wait()
        except TimeoutError:
            conn.error = f"no answer to initialize within {config.connect_timeout_s:g} s"
            log.warning("MCP server %s: %s", config.name, conn.error)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:  # a spawn failure, a protocol error, a crash at start
            conn.error = _describe(exc)
            log.warning("MCP server %s failed: %s", config.name, conn.error)
        finally:
            conn.session = None
            conn.ready.set()
            conn.done.set()

    async def _open_transport(self, conn: _Connection, stack: AsyncExitStack) -> tuple[Any, Any]:
        config = conn.config
        if config.transport == "http":
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            client = await stack.enter_async_context(
                httpx2.AsyncClient(headers=config.headers, timeout=httpx2.Timeout(config.tool_timeout_s, connect=config.connect_timeout_s))
            )
            streams = await stack.enter_async_context(streamable_http_client(config.url or "", http_client=client))
            return streams[0], streams[1]
        from mcp.client.stdio import StdioServerParameters, stdio_client

        read_fd, write_fd = os.pipe()
        # the drain is entered before stdio_client so it is left after it: what the server
        # writes while it shuts down is still read (and its pipe never fills)
        conn_tg = await stack.enter_async_context(anyio.create_task_group())
        drained = anyio.Event()

        async def drain() -> None:
            try:
                await _drain(read_fd, config.name)  # owns (and closes) read_fd
            finally:
                drained.set()

        async def stop_drain() -> None:
            try:
                # the server is gone: EOF is near, unless a grandchild still holds its stderr
                with anyio.move_on_after(2):
                    await drained.wait()
            finally:
                conn_tg.cancel_scope.cancel()

        stack.push_async_callback(stop_drain)
        conn_tg.start_soon(drain)
        errlog = os.fdopen(write_fd, "w")
        try:
            params = StdioServerParameters(
                command=config.command or "", args=config.args, env=config.env or None, cwd=config.cwd
            )
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        finally:
            errlog.close()  # the child holds its own copy; EOF comes when it exits
        return streams[0], streams[1]

    def _handler(self, conn: _Connection) -> Any:
        async def handle(message: Any) -> None:
            kind = type(getattr(message, "root", message)).__name__
            if kind == "ToolListChangedNotification":
                conn.tools_stale = True
            elif isinstance(message, Exception):
                log.warning("MCP server %s sent something unreadable: %s", conn.config.name, message)

        return handle

    async def _refresh(self, conn: _Connection) -> None:
        conn.tools_stale = False
        try:
            with anyio.fail_after(conn.config.tool_timeout_s):
                conn.tools = await _list_tools(conn.session)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            log.warning("MCP server %s: listing tools failed: %s", conn.config.name, _describe(exc))

    async def _disconnect(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is not None:
            conn.stop.set()
            with anyio.move_on_after(15):
                await conn.done.wait()

    async def aclose(self) -> None:
        self._closing = True
        for name in list(self._conns):
            await self._disconnect(name)


async def _list_tools(session: Any) -> list[_RemoteTool]:
    out: list[_RemoteTool] = []
    cursor = None
    for _ in range(50):  # pages; a server that never stops paging is cut off
        if cursor is None:
            result = await session.list_tools()
        else:
            from mcp.types import PaginatedRequestParams

            result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        for t in result.tools:
            out.append(_RemoteTool(name=t.name, description=t.description or "", schema=dict(t.input_schema or {})))
        cursor = getattr(result, "next_cursor", None)
        if not cursor:
            break
    return out


def _result_text(result: Any) -> str:
    chunks: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            chunks.append(block.text)
        elif kind == "image":
            chunks.append(f"[image {getattr(block, 'mime_type', '')} omitted]")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            chunks.append(text if text is not None else f"[resource {getattr(resource, 'uri', '')}]")
        else:
            chunks.append(f"[{kind or 'unknown'} content omitted]")
    structured = getattr(result, "structured_content", None)
    if not chunks and structured is not None:
        chunks.append(msgspec.json.encode(structured).decode())
    return "\n".join(chunks)


def _connection_lost(exc: Exception) -> bool:
    """An MCPError with CONNECTION_CLOSED, or a broken stream: the server is gone."""
    from mcp_types import CONNECTION_CLOSED

    if getattr(exc, "code", None) == CONNECTION_CLOSED:
        return True
    return isinstance(exc, (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _describe(inner)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _drain(fd: int, name: str) -> None:
    """Read a server's stderr pipe to EOF, logging it line by line (never blocks the child)."""
    os.set_blocking(fd, False)
    buffer = b""
    try:
        while True:
            await anyio.wait_readable(fd)
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines[-20:]:  # a flood is logged in part, read in whole
                log.info("[mcp %s] %s", name, line.decode("utf-8", "replace")[:2000])
            if len(buffer) > 65536:
                buffer = b""
    finally:
        os.close(fd)
