"""McpSession: the client side of one MCP connection, on our JSON-RPC peer.

The MCP wire as a client needs it for tools, written against the specification (versions
2025-06-18 and 2025-11-25; the official SDK's client was the reference) on
``sidecar.rpc.peer.JsonRpcPeer``, the one JSON-RPC engine of the process (framing, ids,
the request/response lifecycle, cancellation). The transport (sidecar/tools/mcp_transport.py
for stdio, sidecar/tools/mcp_http.py for streamable HTTP) builds the peer with
``new_peer``; this module owns what goes over it:

- ``initialize``: we offer PROTOCOL_VERSIONS[0] (the latest we speak) and accept any of
  PROTOCOL_VERSIONS the server answers with; another version fails the connection with
  McpProtocolError naming both. Then ``notifications/initialized``. ``initialize`` is
  never announced as cancelled (the specification forbids it);
- ``tools/list`` page by page (``nextCursor``), at most MAX_TOOL_PAGES pages; a server
  that does not declare the ``tools`` capability has no tools (nothing is asked);
- ``tools/call``: its result as CallToolResult (content blocks, ``isError``,
  ``structuredContent``); a call cancelled or timed out is announced to the server with
  ``notifications/cancelled`` (the peer does it, with our ``requestId``);
- the server's requests: ``ping`` is answered ``{}``, anything else -32601 (the peer's
  dispatcher: we declare no client capabilities, so a server has nothing else to ask);
  ``notifications/tools/list_changed`` calls ``on_tools_changed``; other notifications
  are logged at debug level and dropped.

Must stay true: everything read from the server is untrusted. Results are validated by
msgspec Structs as they are decoded (a result that does not match fails that request with
McpProtocolError, never the process); lines are bounded by the transport's limit (the
peer fails the request an oversized response answers); text taken from the server for an
error is cut to MAX_SERVER_TEXT.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec

import sidecar
from sidecar.errors import RpcError
from sidecar.rpc.dispatch import Handler
from sidecar.rpc.framing import LineFilter, ReceiveStream, SendStream
from sidecar.rpc.peer import JsonRpcPeer
from sidecar.tools.mcp_config import RemoteTool

__all__ = [
    "PROTOCOL_VERSIONS",
    "LATEST_PROTOCOL_VERSION",
    "MAX_TOOL_PAGES",
    "McpProtocolError",
    "McpSession",
    "CallToolResult",
    "ContentBlock",
    "new_peer",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The MCP versions we speak, newest first (what tools use is the same in all of them)."""
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[0]
MAX_TOOL_PAGES = 50
"""A server that never stops paging its tools is cut off here."""
MAX_SERVER_TEXT = 200
CANCELLED = "notifications/cancelled"
TOOLS_CHANGED = "notifications/tools/list_changed"


class McpProtocolError(RpcError):
    """The server broke the protocol: a version we do not speak, a result of the wrong shape."""


# ---- what the server sends (validated as decoded; unknown fields are ignored) ----------


class ServerInfo(msgspec.Struct, kw_only=True):
    name: str = ""
    version: str = ""


class InitializeResult(msgspec.Struct, kw_only=True, rename="camel"):
    protocol_version: str
    capabilities: dict[str, Any] = {}
    server_info: ServerInfo = msgspec.field(default_factory=ServerInfo)
    instructions: str | None = None


class ToolInfo(msgspec.Struct, kw_only=True, rename="camel"):
    name: str
    description: str | None = None
    input_schema: Any = None


class ListToolsResult(msgspec.Struct, kw_only=True, rename="camel"):
    tools: list[ToolInfo]
    next_cursor: str | None = None


class ResourceContents(msgspec.Struct, kw_only=True):
    uri: str = ""
    text: str | None = None


class ContentBlock(msgspec.Struct, kw_only=True, rename="camel"):
    """One block of a tool result. Types we show: ``text``, ``image``, ``resource``; the
    others (``audio``, ``resource_link``, future ones) are named and left out."""

    type: str
    text: str | None = None
    mime_type: str = ""
    resource: ResourceContents | None = None


class CallToolResult(msgspec.Struct, kw_only=True, rename="camel"):
    content: list[ContentBlock] = []
    is_error: bool = False
    structured_content: dict[str, Any] | None = None


class _AnyParams(msgspec.Struct):
    """Params we do not read (``ping``'s, ``list_changed``'s: ``_meta`` at most)."""


class _CancelledParams(msgspec.Struct, rename="camel", omit_defaults=True):
    request_id: int
    reason: str = ""


# ---- what we send ------------------------------------------------------------------------


class _ClientInfo(msgspec.Struct):
    name: str
    version: str


class _InitializeParams(msgspec.Struct, rename="camel"):
    protocol_version: str
    capabilities: dict[str, Any]
    client_info: _ClientInfo


class _ListToolsParams(msgspec.Struct, omit_defaults=True):
    cursor: str | None = None


class _CallToolParams(msgspec.Struct):
    name: str
    arguments: dict[str, Any]


def _cancelled(request_id: int) -> _CancelledParams:
    return _CancelledParams(request_id=request_id, reason="the call was cancelled or timed out")


def new_peer(
    receive: ReceiveStream,
    send: SendStream,
    *,
    name: str,
    max_line_bytes: int,
    line_filter: LineFilter | None = None,
    shutdown_grace: float = 0.5,
) -> JsonRpcPeer:
    """The JSON-RPC peer of an MCP connection (not reading until McpSession starts it)."""
    return JsonRpcPeer(
        receive,
        send,
        name=name,
        max_line_bytes=max_line_bytes,
        line_filter=line_filter,
        autostart=False,
        cancel_method=CANCELLED,
        cancel_params=_cancelled,
        shutdown_grace=shutdown_grace,
        max_concurrent=4,  # the server's requests are pings
    )


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SERVER_TEXT else text[:MAX_SERVER_TEXT] + "..."


class McpSession:
    def __init__(
        self,
        peer: JsonRpcPeer,
        *,
        on_tools_changed: Callable[[], None] = lambda: None,
        on_version: Callable[[str], None] = lambda version: None,
    ) -> None:
        """Registers the answers to the server and starts the peer reading.
        ``on_version`` learns the negotiated version before ``initialized`` is sent (the
        HTTP transport puts it in a header from then on)."""
        self._peer = peer
        self._on_tools_changed = on_tools_changed
        self._on_version = on_version
        self.protocol_version: str | None = None
        self.server: InitializeResult | None = None
        peer.dispatcher.add("ping", Handler(_AnyParams, self._ping))
        peer.dispatcher.add(TOOLS_CHANGED, Handler(_AnyParams, self._tools_changed))
        peer.start_reading()

    @property
    def closed(self) -> anyio.Event:
        """Set when the server can no longer answer (its input ended, our output broke)."""
        return self._peer.closed

    @property
    def has_tools(self) -> bool:
        return self.server is not None and isinstance(self.server.capabilities.get("tools"), dict)

    async def initialize(self) -> InitializeResult:
        params = _InitializeParams(
            protocol_version=LATEST_PROTOCOL_VERSION,
            capabilities={},
            client_info=_ClientInfo(name=sidecar.SERVER_NAME, version=sidecar.__version__),
        )
        result = await self._request("initialize", params, InitializeResult, announce_cancel=False)
        if result.protocol_version not in PROTOCOL_VERSIONS:
            raise McpProtocolError(
                f"the server speaks MCP version {_cut(result.protocol_version)!r}; this client speaks "
                + ", ".join(PROTOCOL_VERSIONS)
            )
        self.protocol_version = result.protocol_version
        self.server = result
        self._on_version(result.protocol_version)
        await self._peer.notify("notifications/initialized")
        return result

    async def list_tools(self) -> list[RemoteTool]:
        """Every tool the server lists (at most MAX_TOOL_PAGES pages of them)."""
        if not self.has_tools:
            return []
        out: list[RemoteTool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await self._request("tools/list", _ListToolsParams(cursor=cursor), ListToolsResult)
            for tool in page.tools:
                schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                out.append(RemoteTool(name=tool.name, description=tool.description or "", schema=dict(schema)))
            cursor = page.next_cursor
            if not cursor:
                break
        return out

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        result = await self._request("tools/call", _CallToolParams(name=name, arguments=arguments), CallToolResult)
        for block in result.content:
            if block.type == "text" and block.text is None:
                raise McpProtocolError(f"malformed result of tools/call {_cut(name)!r}: a text block without text")
        return result

    async def _request(self, method: str, params: Any, result_type: type[T], *, announce_cancel: bool = True) -> T:
        try:
            result: T = await self._peer.request(method, params, result_type=result_type, announce_cancel=announce_cancel)
            return result
        except RpcError as exc:
            if type(exc) is RpcError:  # a result that does not decode, a malformed response
                raise McpProtocolError(_cut(str(exc))) from None
            raise

    async def _ping(self, params: _AnyParams) -> dict[str, Any]:
        return {}

    async def _tools_changed(self, params: _AnyParams) -> None:
        if self.has_tools:
            self._on_tools_changed()
