"""ServerSupervisor: one enabled MCP server, kept connected in the background.

The McpManager starts one supervisor per enabled server in its own task group (at start-up
and on upsert) and stops it on delete, disable, re-configuration and shutdown. ``run`` loops:
open the link (sidecar/tools/mcp_transport.py), ``initialize`` and list the tools within
``connectTimeoutS`` (our MCP client, sidecar/tools/mcp_client.py), serve (state ``ready``) until told to stop or the connection ends, then
wait out a backoff (state ``failed``, with the error and the time of the next attempt) and
connect again. Replies never wait for any of it: they use ``tools`` and ``call`` of a ready
supervisor and get a ToolError at once from one that is not.

Must stay true:
- at most one process (or HTTP session) per supervisor at a time, and a supervisor that
  replaces another (``previous``) connects only once the previous one is done: a server is
  never spawned twice at once;
- failed connects back off exponentially (BACKOFF_BASE_S doubling up to BACKOFF_MAX_S);
  a server that was ready and then crashed or stopped answering counts as one more
  failure, so a crash loop backs off too; the count starts again only after a connection
  stayed ready for STABLE_S;
- ``stop(deadline)`` ends the connection at once (a connect in progress is abandoned) and
  gives its teardown until ``deadline``; a stdio server's stop is close stdin, SIGTERM and
  SIGKILL to its process group, each wait bounded (shielded inside spawn_child), and
  ``kill()`` sends SIGKILL to the group for a teardown that is still running after it;
- everything the connection opens is entered and left in this supervisor's own task, in
  nested ``async with`` blocks; cancellation is never swallowed;
- server text (errors, tool results) is untrusted: it is shown to the user and the model
  only as data, and an error kept for ``mcp:server:list`` is cut to ERROR_CHARS.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any, Literal

import anyio

from sidecar.errors import PeerClosed
from sidecar.tools.base import ToolError
from sidecar.tools.mcp_client import CallToolResult, McpSession
from sidecar.tools.mcp_config import McpServerConfig, RemoteTool
from sidecar.tools.mcp_transport import Link, LinkError, open_link

__all__ = ["ServerSupervisor", "SupervisorState", "BACKOFF_BASE_S", "BACKOFF_MAX_S", "STABLE_S", "describe"]

log = logging.getLogger(__name__)

SupervisorState = Literal["connecting", "ready", "failed"]

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_S = 60.0
"""A connection that stayed ready this long resets the backoff."""
ERROR_CHARS = 500


def backoff_delay(failures: int) -> float:
    """The wait before the next attempt after ``failures`` (>= 1) failures in a row."""
    return min(BACKOFF_BASE_S * 2.0 ** max(0, failures - 1), BACKOFF_MAX_S)


class ServerSupervisor:
    def __init__(self, config: McpServerConfig, *, previous: ServerSupervisor | None = None) -> None:
        self.config = config
        self.state: SupervisorState = "connecting"
        self.error: str | None = None
        """Why the last attempt failed (state ``failed``)."""
        self.retry_at_ms: int | None = None
        """When the next attempt starts (state ``failed``), ms since the epoch."""
        self.tools: tuple[RemoteTool, ...] = ()
        """The server's tools while ``ready``."""
        self.done = anyio.Event()
        self.spawns = 0
        """Connection attempts so far (each one a process for a stdio server)."""
        self._previous = previous
        self._session: McpSession | None = None
        self._link: Link | None = None
        self._stopping = anyio.Event()
        self._stop_deadline: float | None = None
        self._wake = anyio.Event()
        """Set to end the current connection (stop or restart)."""
        self._restart_reason: str | None = None
        self._scope: anyio.CancelScope | None = None
        """The current connection's whole lifetime (its teardown gets the stop deadline)."""
        self._active: anyio.CancelScope | None = None
        """The current connection's connect-and-serve part (cancelled by stop and restart)."""
        self._tools_changed = anyio.Event()
        self._failures = 0

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self._session is not None

    # ---- control (from the manager) ---------------------------------------------------

    def stop(self, deadline: float) -> None:
        """End the connection now; its teardown must be over by ``deadline`` (anyio time)."""
        self._stopping.set()
        self._stop_deadline = deadline if self._stop_deadline is None else min(deadline, self._stop_deadline)
        self._end_connection()
        if self._scope is not None:
            self._scope.deadline = min(self._scope.deadline, self._stop_deadline)

    def kill(self) -> None:
        """SIGKILL the stdio server's whole process group (a stop that overran its deadline)."""
        link = self._link
        if link is None or link.pid is None or sys.platform == "win32":
            return
        log.warning("MCP server %s (pid %s) did not stop in time: killing its process group", self.name, link.pid)
        try:
            os.killpg(link.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def restart(self, session: object, reason: str) -> None:
        """End the connection ``session`` belongs to (if it is still the current one)."""
        if session is not None and session is self._session:
            self._restart_reason = reason
            self._end_connection()

    def _end_connection(self) -> None:
        self._session = None  # no new calls on it from now on
        self._wake.set()
        if self._active is not None:
            self._active.cancel()

    # ---- calls (from replies) -----------------------------------------------------------

    def not_ready_text(self) -> str:
        if self.state == "failed":
            wait = ""
            if self.retry_at_ms is not None:
                wait = f"; next attempt in {max(0.0, (self.retry_at_ms - time.time() * 1000) / 1000):.0f} s"
            return f"failed: {self.error or 'unknown error'}{wait}"
        return "still connecting"

    async def call(self, tool: str, args: dict[str, Any]) -> CallToolResult:
        session = self._session
        if session is None or self.state != "ready":
            raise ToolError(f"MCP server {self.name} is not connected ({self.not_ready_text()})")
        timeout = self.config.tool_timeout_s
        try:
            with anyio.fail_after(timeout):
                return await session.call_tool(tool, args)
        except TimeoutError:
            self.restart(session, f"no answer to {tool} within {timeout:g} s")
            raise ToolError(
                f"MCP server {self.name} did not answer {tool} within {timeout:g} s; it is restarted in the background"
            ) from None
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            if self._stopping.is_set():
                raise ToolError(f"MCP server {self.name} was stopped during {tool}") from None
            if _connection_lost(exc) or session is not self._session:
                self.restart(session, f"the connection was lost during {tool}: {describe(exc)}")
                raise ToolError(
                    f"MCP server {self.name} failed during {tool} ({describe(exc)}); it is reconnected in the background"
                ) from None
            raise ToolError(f"MCP server {self.name}: {tool} failed: {describe(exc)}") from None

    # ---- the loop (the manager's task group owns it) -----------------------------------

    async def run(self) -> None:
        try:
            if self._previous is not None:
                await _wait_any(self._previous.done, self._stopping)
                self._previous = None
            while not self._stopping.is_set():
                self.state = "connecting"
                try:
                    ready_for = await self._connection()
                except Exception as exc:  # a bug of ours: this server fails, the others go on
                    log.exception("MCP server %s: the connection failed unexpectedly", self.name)
                    self.error, ready_for = describe(exc)[:ERROR_CHARS], 0.0
                if self._stopping.is_set():
                    break
                if ready_for >= STABLE_S:
                    self._failures = 0
                self._failures += 1
                delay = backoff_delay(self._failures)
                self.retry_at_ms = int((time.time() + delay) * 1000)
                self.state = "failed"
                log.warning("MCP server %s: %s; next attempt in %g s", self.name, self.error, delay)
                with anyio.move_on_after(delay):
                    await self._stopping.wait()
                self.retry_at_ms = None
        finally:
            self._session = None
            self._link = None
            self.tools = ()
            self.done.set()

    async def _connection(self) -> float:
        """One connection from spawn to teardown; how long it was ready (0: never). Sets ``error``."""
        config = self.config
        self._wake = anyio.Event()
        self._restart_reason = None
        self._tools_changed = anyio.Event()
        ready_at: float | None = None
        error: str | None = None
        self.spawns += 1
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self._stop_deadline is not None:
                scope.deadline = self._stop_deadline
            try:
                async with open_link(config) as link:
                    self._link = link
                    session = McpSession(link.peer, on_tools_changed=self._on_tools_changed, on_version=link.use_version)
                    with anyio.CancelScope() as active:
                        self._active = active
                        if self._wake.is_set():
                            active.cancel()
                        tools: list[RemoteTool] | None = None
                        step = "initialize"
                        with anyio.move_on_after(config.connect_timeout_s):
                            await session.initialize()
                            step = "tools/list"
                            tools = await session.list_tools()
                        if tools is None:
                            if not (link.closed.is_set() or session.closed.is_set()):
                                error = f"no answer to {step} within {config.connect_timeout_s:g} s"
                        else:
                            self.tools = tuple(tools)
                            self.error = None
                            self._session = session
                            self.state = "ready"
                            ready_at = anyio.current_time()
                            log.info("MCP server %s ready: %d tools (pid %s)", self.name, len(tools), link.pid)
                            async with anyio.create_task_group() as tg:
                                tg.start_soon(self._refresh_tools, session)
                                tg.start_soon(_set_when, link.closed, self._wake)
                                tg.start_soon(_set_when, session.closed, self._wake)
                                await self._wake.wait()
                                tg.cancel_scope.cancel()
                    self._active = None
                    self._session = None
                    self.tools = ()
                # the link is closed: a stdio server's exit status is known now
                if error is None:
                    if ready_at is not None:
                        error = self._restart_reason or link.exit_note() or "the server closed the connection"
                    else:
                        error = link.exit_note() or "the connection closed before the server was ready"
            except Exception as exc:  # a spawn failure, a protocol error, a crash at start
                # a crash is told by how the process ended; a protocol error by itself (the
                # process was only stopped because of it)
                lost = self._link is not None and _connection_lost(_leaf(exc))
                note = self._link.exit_note() if lost and self._link is not None else None
                error = note or describe(exc)
            finally:
                self._active = None
                self._session = None
                self._link = None
                self._scope = None
                if not self._stopping.is_set():
                    self.state = "connecting"
        if error is not None:
            self.error = error[:ERROR_CHARS]
        return 0.0 if ready_at is None else anyio.current_time() - ready_at

    def _on_tools_changed(self) -> None:
        self._tools_changed.set()

    async def _refresh_tools(self, session: McpSession) -> None:
        while True:
            await self._tools_changed.wait()
            self._tools_changed = anyio.Event()
            try:
                with anyio.fail_after(self.config.tool_timeout_s):
                    tools = await session.list_tools()
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                log.warning("MCP server %s: listing its changed tools failed: %s", self.name, describe(exc))
                continue
            if session is self._session:
                self.tools = tuple(tools)


async def _wait_any(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


async def _set_when(event: anyio.Event, target: anyio.Event) -> None:
    await event.wait()
    target.set()


def _connection_lost(exc: BaseException) -> bool:
    """The peer closed before answering, or a broken stream: the server is gone."""
    return isinstance(exc, (PeerClosed, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError))


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    if isinstance(exc, LinkError):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return describe(inner)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
