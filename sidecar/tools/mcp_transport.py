"""The two ways to reach an MCP server, as the stream pair ``mcp.ClientSession`` takes.

``open_link(config)`` is an async context manager yielding a Link: ``read`` and ``write``
(the SDK's SessionMessage streams), ``closed`` (set when the server can no longer answer:
its process exited, its stdout ended, a write failed) and, for a stdio server, ``pid``.

stdio: the process runs under sidecar/children/stdio.py's ``spawn_child``, the one place
that owns child processes speaking JSON-RPC on stdio: its own session and process group
(so what it starts is signalled with it), stderr always drained into our log, the
environment allow-list of sidecar/children/env.py plus the configured ``env``, stdout
lines that are not JSON dropped (and lines over its limit). Leaving the block closes stdin, waits, sends SIGTERM and then SIGKILL to the
whole group (each wait ``STOP_STEP_S``), reaps the process and kills what is left of its
group. Its stdout is read until the process is gone, so a server flushing output on its
way out never blocks on a full pipe.

http: streamable HTTP through the SDK's client, on an httpx2 client of our own (the
configured headers, the connect timeout).

Must stay true: every context manager and task group here is entered and left by the task
that opened the link, in nested ``async with`` blocks (no exit stack: an ``AsyncExitStack``
unwinding a cancellation through an anyio task group can make a CancelledError its own
``__context__``, and anyio's task bookkeeping then loops on it forever).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sidecar.children.stdio import MAX_LINE_BYTES, ChildSpec, ChildStartError, spawn_child
from sidecar.rpc.framing import LineReader
from sidecar.tools.mcp_config import McpServerConfig

if TYPE_CHECKING:
    from mcp.client._transport import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage

__all__ = ["Link", "LinkError", "open_link", "STOP_STEP_S"]

log = logging.getLogger(__name__)

STOP_STEP_S = 0.3
"""Each wait of a stdio server's stop: after closing stdin, after SIGTERM, after SIGKILL."""


class LinkError(Exception):
    """The server could not be reached at all (its command would not start)."""


@dataclass
class Link:
    read: ReadStream[SessionMessage | Exception]
    write: WriteStream[SessionMessage]
    closed: anyio.Event = field(default_factory=anyio.Event)
    """Set when the server can no longer answer (stdio: process exit, end of stdout, a failed write)."""
    pid: int | None = None
    """The stdio server's process id, which is also its process group id."""
    exit_note: Callable[[], str | None] = lambda: None
    """Why the link closed, once it has (exit code, last stderr line)."""


@asynccontextmanager
async def open_link(config: McpServerConfig) -> AsyncIterator[Link]:
    if config.transport == "http":
        async with _http_link(config) as link:
            yield link
    else:
        async with _stdio_link(config) as link:
            yield link


@asynccontextmanager
async def _http_link(config: McpServerConfig) -> AsyncIterator[Link]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(config.tool_timeout_s, connect=config.connect_timeout_s)
    async with httpx2.AsyncClient(headers=config.headers, timeout=timeout) as client:
        async with streamable_http_client(config.url or "", http_client=client) as (read, write):
            yield Link(read=read, write=write)


@asynccontextmanager
async def _stdio_link(config: McpServerConfig) -> AsyncIterator[Link]:
    from mcp.shared.message import SessionMessage
    from mcp_types import jsonrpc_message_adapter

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
            read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
            closed = anyio.Event()

            async def read_stdout() -> None:
                # after the session is gone (read_recv closed) the rest is read and dropped
                try:
                    async with read_send:
                        async for line in LineReader(agent.stdout, MAX_LINE_BYTES, line_filter=agent.json_lines):
                            assert isinstance(line, bytes)  # the stage drops oversized lines
                            item: SessionMessage | Exception
                            try:
                                item = SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
                            except ValueError as exc:  # valid JSON, not JSON-RPC: the session logs it
                                item = exc
                            try:
                                await read_send.send(item)
                            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                                pass
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
                finally:
                    closed.set()

            async def write_stdin() -> None:
                try:
                    async with write_recv:
                        async for message in write_recv:
                            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                            await agent.stdin.send(data.encode() + b"\n")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    closed.set()  # the server stopped reading: requests would wait forever

            async def watch_exit() -> None:
                await agent.exited.wait()
                closed.set()

            def exit_note() -> str | None:
                return None if agent.returncode is None else f"the server {agent.exit_reason()}"

            async with anyio.create_task_group() as tg:
                tg.start_soon(read_stdout)
                tg.start_soon(write_stdin)
                tg.start_soon(watch_exit)
                try:
                    yield Link(read=read_recv, write=write_send, closed=closed, pid=agent.pid, exit_note=exit_note)
                finally:
                    read_recv.close()
                    write_send.close()
                    # stdout is still read while the process stops; terminate() is shielded
                    # and bounded, and spawn_child's own exit finds the process gone
                    await agent.terminate()
                    tg.cancel_scope.cancel()  # a grandchild may still hold the pipes open
    except ChildStartError as exc:
        cause: Any = exc.__cause__
        why = (getattr(cause, "strerror", None) or str(cause)) if cause is not None else str(exc)
        raise LinkError(f"cannot start {config.command!r}: {why}") from exc
