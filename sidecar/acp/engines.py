"""AcpEngines: one running process per ``acp-engine`` provider, shared by its sessions.

Owns the lifetime of engine processes:
- an engine starts on first use (``connect``), is initialized with our client
  capabilities, and is reused by every session of that provider;
- an engine that exited (crash, or it closed its stdout) is replaced on the next
  ``connect``; one whose configuration changed (provider:upsert) is stopped and replaced;
- ``aclose`` stops every engine: close stdin, wait, SIGTERM, wait, SIGKILL (see
  sidecar.children.stdio), all within a bounded time.

Each engine runs in a task of this service's task group (``_run``): the process, the
JSON-RPC peer over its pipes and a task group for its prompt calls live exactly as
long as that task; the task ends when the agent goes away or ``stop`` is asked.

Must stay true: at most one process per provider id is starting or running at a time
(a per-provider lock around ``connect``); a failed start raises ProviderError to the
caller and leaves nothing running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

import anyio
import anyio.abc

from protocol.providers import AcpEngineConfig
from sidecar.acp.client import AcpConnection
from sidecar.children.stdio import MAX_LINE_BYTES, ChildSpec, spawn_child
from sidecar.errors import ProviderError, SidecarError
from sidecar.rpc import JsonRpcPeer

log = logging.getLogger(__name__)


class _Live:
    """One engine process (running, starting or ended)."""

    def __init__(self, stamp: int) -> None:
        self.stamp = stamp
        self.conn: AcpConnection | None = None
        self.stop = anyio.Event()
        self.finished = anyio.Event()


class AcpEngines:
    def __init__(
        self,
        *,
        client_name: str,
        client_version: str,
        default_cwd: str | None = None,
    ) -> None:
        self._client = (client_name, client_version)
        self._default_cwd = default_cwd
        self._live: dict[str, _Live] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self.on_spawn: list[Callable[[str, int], None]] = []
        """Hooks called with (provider id, pid) when an engine process starts (tests, logs)."""

    async def __aenter__(self) -> AcpEngines:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    # -- use -------------------------------------------------------------------------

    def live(self, provider_id: str) -> AcpConnection | None:
        """The running engine of a provider, if any (never starts one)."""
        live = self._live.get(provider_id)
        if live is None or live.conn is None or not live.conn.alive:
            return None
        return live.conn

    async def connect(self, provider_id: str, name: str, stamp: int, config: AcpEngineConfig) -> AcpConnection:
        """The running engine of ``provider_id`` (``stamp``: its configuration version),
        started and initialized if needed. Raises ProviderError if it cannot start."""
        if self._closing or self._tg is None:
            raise SidecarError("the sidecar is shutting down")
        lock = self._locks.setdefault(provider_id, anyio.Lock())
        async with lock:
            live = self._live.get(provider_id)
            if live is not None and live.conn is not None and live.conn.alive and live.stamp == stamp:
                return live.conn
            if live is not None:
                await self._stop(live, "its configuration changed" if live.stamp != stamp else "it ended")
            live = _Live(stamp)
            self._live[provider_id] = live
            try:
                conn: AcpConnection = await self._tg.start(self._run, provider_id, name, config, live)
            except BaseException:
                live.finished.set()
                if self._live.get(provider_id) is live:
                    del self._live[provider_id]
                raise
            return conn

    async def stop(self, provider_id: str) -> None:
        """Stop a provider's engine (deleted or disabled provider)."""
        live = self._live.pop(provider_id, None)
        if live is not None:
            await self._stop(live, "it was stopped")

    async def aclose(self) -> None:
        """Stop every engine (bounded: each shutdown step has its timeout)."""
        self._closing = True
        lives = list(self._live.values())
        self._live.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for live in lives:
                    tg.start_soon(self._stop, live, "the sidecar is shutting down")

    # -- internals -------------------------------------------------------------------

    async def _stop(self, live: _Live, why: str) -> None:
        if live.finished.is_set():
            return
        if live.conn is not None:
            log.info("stopping engine %s: %s", live.conn.name, why)
        live.stop.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(60):
            await live.finished.wait()

    async def _run(
        self,
        provider_id: str,
        name: str,
        config: AcpEngineConfig,
        live: _Live,
        *,
        task_status: anyio.abc.TaskStatus[AcpConnection] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        spec = ChildSpec(
            name=name,
            kind="agent engine",
            command=config.command,
            args=tuple(config.args),
            env=dict(config.env),
            cwd=config.cwd or self._default_cwd,
            shutdown_timeout_s=config.shutdown_timeout_ms / 1000,
        )
        started = False
        failed: SidecarError | None = None
        try:
            async with spawn_child(spec) as agent:
                for hook in self.on_spawn:
                    hook(provider_id, agent.pid)
                async with JsonRpcPeer(
                    agent.stdout,
                    agent.stdin,
                    name=f"acp:{name}",
                    max_line_bytes=MAX_LINE_BYTES,
                    line_filter=agent.json_lines,
                    autostart=False,
                    cancel_method=None,  # ACP has no $/cancelRequest
                    shutdown_grace=1.0,
                ) as peer:
                    async with anyio.create_task_group() as calls:
                        conn = AcpConnection(
                            peer=peer,
                            agent=agent,
                            task_group=calls,
                            engine_id=provider_id,
                            name=name,
                            request_timeout_s=config.request_timeout_ms / 1000,
                        )
                        live.conn = conn
                        peer.start_reading()
                        try:
                            features = await conn.initialize(*self._client, timeout=config.startup_timeout_ms / 1000)
                        except SidecarError as exc:
                            # raised once the groups below have closed (not wrapped in a group)
                            failed = exc
                        else:
                            log.info(
                                "engine %s ready (pid %s, agent %s %s, load=%s fork=%s close=%s image=%s)",
                                name, agent.pid, features.agent_name or "?", features.agent_version,
                                features.load_session, features.fork_session, features.close_session,
                                features.prompt_image,
                            )
                            started = True
                            task_status.started(conn)
                            await _first(peer.closed, live.stop)
                            if peer.closed.is_set() and not live.stop.is_set():
                                log.warning("%s", await conn.describe_end())
                        conn.closing()
                        calls.cancel_scope.cancel()
        except Exception as exc:
            if started:
                log.exception("engine %s failed", name)
                return
            inner = _first_sidecar_error(exc)
            if inner is not None:
                raise inner from None
            raise ProviderError(f"the agent engine {name!r} failed to start: {type(exc).__name__}: {exc}") from exc
        finally:
            live.finished.set()
        if failed is not None:
            raise failed


def _first_sidecar_error(exc: BaseException) -> SidecarError | None:
    if isinstance(exc, SidecarError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_sidecar_error(inner)
            if found is not None:
                return found
    return None


async def _first(*events: anyio.Event) -> None:
    """Return when any of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


__all__ = ["AcpEngines"]

