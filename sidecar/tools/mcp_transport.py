"""The two ways to reach an MCP server, each as a JSON-RPC peer ready for McpSession.

``open_link(config)`` is an async context manager yielding a Link: ``peer`` (a
sidecar.rpc.peer.JsonRpcPeer made by ``mcp_client.new_peer``, not reading yet), ``closed``
(set when the server can no longer answer: its process exited, the HTTP server became
unreachable or ended the session; the peer's own ``closed`` covers the end of its input
and a failed write), ``use_version`` (the negotiated version, for the HTTP headers) and,
for a stdio server, ``pid``.

stdio: the process runs under sidecar/children/stdio.py's ``spawn_child``, the one place
that owns child processes speaking JSON-RPC on stdio: its own session and process group
(so what it starts is signalled with it), stderr always drained into our log, the
environment allow-list of sidecar/children/env.py plus the configured ``env``, stdout
lines that are not JSON dropped (and lines over its limit). The peer reads its stdout and
writes its stdin. Leaving the block closes stdin, waits, sends SIGTERM and then SIGKILL to
the whole group (each wait ``STOP_STEP_S``), reaps the process and kills what is left of
its group, all while the peer still reads: its stdout is read until the process is gone,
so a server flushing output on its way out never blocks on a full pipe.

http: streamable HTTP (sidecar/tools/mcp_http.py) on an httpx2 client of our own (the
configured headers, the connect timeout, no redirects), the same line limit as stdio.

Must stay true: every context manager and task group here is entered and left by the task
that opened the link, in nested ``async with`` blocks (no exit stack of ours: an
``AsyncExitStack`` unwinding a cancellation through an anyio task group can make a
CancelledError its own ``__context__``, and anyio's task bookkeeping then loops on it forever;
the peer's own ``__aenter__`` keeps its one context in a stack, as for ACP, and
tests/test_tools_mcp_exit.py cancels through it in every state).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from sidecar.children.lines import JsonLines
from sidecar.children.stdio import MAX_LINE_BYTES, ChildSpec, ChildStartError, spawn_child
from sidecar.http_fields import headers_problem
from sidecar.rpc.peer import JsonRpcPeer
from sidecar.tools.mcp_client import new_peer
from sidecar.tools.mcp_config import McpServerConfig

__all__ = ["Link", "LinkError", "open_link", "STOP_STEP_S"]

log = logging.getLogger(__name__)

STOP_STEP_S = 0.3
"""Each wait of a stdio server's stop: after closing stdin, after SIGTERM, after SIGKILL."""


class LinkError(Exception):
    """The server could not be reached at all (its command would not start)."""


@dataclass
class Link:
    peer: JsonRpcPeer
    closed: anyio.Event = field(default_factory=anyio.Event)
    """Set when the server can no longer answer (stdio: process exit; http: unreachable, session ended)."""
    pid: int | None = None
    """The stdio server's process id, which is also its process group id."""
    exit_note: Callable[[], str | None] = lambda: None
    """Why the link closed, once it has (exit code, last stderr line; the HTTP failure)."""
    use_version: Callable[[str], None] = lambda version: None
    """Told the negotiated protocol version (streamable HTTP sends it as a header)."""


@asynccontextmanager
async def open_link(config: McpServerConfig) -> AsyncIterator[Link]:
    if config.transport == "http":
        async with _http_link(config) as link:
            yield link
    else:
        async with _stdio_link(config) as link:
            yield link


def _import_http() -> None:
    import httpx2  # noqa: F401

    import sidecar.tools.mcp_http  # noqa: F401


@asynccontextmanager
async def _http_link(config: McpServerConfig) -> AsyncIterator[Link]:
    if "sidecar.tools.mcp_http" not in sys.modules:  # httpx2 is ~100 ms: imported off the event loop
        await anyio.to_thread.run_sync(_import_http, abandon_on_cancel=True)
    import httpx2

    from sidecar.tools.mcp_http import open_channel

    if problem := headers_problem(config.headers):  # stored by a version that did not check them
        raise LinkError(f"{problem}: mcp:server:upsert with headers an HTTP request can carry")
    timeout = httpx2.Timeout(config.tool_timeout_s, connect=config.connect_timeout_s)
    async with httpx2.AsyncClient(headers=config.headers, timeout=timeout, follow_redirects=False) as client:
        async with open_channel(client, config.url or "", max_bytes=MAX_LINE_BYTES) as channel:
            name = f"mcp {config.name}"
            junk = JsonLines(name, max_line_bytes=MAX_LINE_BYTES)  # what is not JSON is dropped, as on stdio
            async with new_peer(
                channel.peer_receive, channel.peer_send, name=name, max_line_bytes=MAX_LINE_BYTES, line_filter=junk
            ) as peer:
                yield Link(peer=peer, closed=channel.closed, exit_note=channel.exit_note, use_version=channel.use_version)


@asynccontextmanager
async def _stdio_link(config: McpServerConfig) -> AsyncIterator[Link]:
    if config.cwd is not None and not Path(config.cwd).is_dir():  # one stat: short
        raise LinkError(f"the working directory {config.cwd!r} does not exist")
    spec = ChildSpec(
        name=f"mcp {config.name}",
        kind="MCP server",
        command=config.command or "",
        args=tuple(config.args),
        env=dict(config.env),
        cwd=config.cwd,
        shutdown_timeout_s=STOP_STEP_S,
    )
    try:
        async with spawn_child(spec) as agent:

            def exit_note() -> str | None:
                return None if agent.returncode is None else f"the server {agent.exit_reason()}"

            async with new_peer(
                agent.stdout, agent.stdin, name=spec.name, max_line_bytes=MAX_LINE_BYTES, line_filter=agent.json_lines
            ) as peer:
                try:
                    yield Link(peer=peer, closed=agent.exited, pid=agent.pid, exit_note=exit_note)
                finally:
                    # the peer still reads stdout while the process stops; terminate() is
                    # shielded and bounded, and spawn_child's own exit finds the process gone
                    await agent.terminate()
    except ChildStartError as exc:
        cause: Any = exc.__cause__
        why = (getattr(cause, "strerror", None) or str(cause)) if cause is not None else str(exc)
        raise LinkError(f"cannot start {config.command!r}: {why}") from exc
