"""CompatService: ``compat:start`` / ``compat:stop`` / ``compat:status``, the V1 endpoint's lifetime.

The endpoint is off until ``compat:start``: nothing of it runs and its HTTP stack (uvicorn)
is not even imported before that. A start checks the settings, binds the socket (a busy
port is the caller's error), imports sidecar.compat.http in a worker thread and serves
with uvicorn inside this process's event loop, in this service's task group (uvicorn's
own signal handlers are off: the sidecar owns SIGTERM/SIGINT). ``compat:stop`` and the
App's exit end the progress streams, then uvicorn (1 s grace for open requests), then
any connection still open, then the V1 pumps: bounded by STOP_TIMEOUT_S in all. Replies
already running keep running in the ChatEngine (the renderer still sees them).

Security defaults (see sidecar.compat.http): loopback only unless ``allowRemote`` with an
explicit token; a key per start unless given.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import secrets
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from protocol.common import EmptyParams
from protocol.compat import CompatStartParams, CompatStartResult, CompatStatus
from protocol.errors import ErrorCode
from sidecar.compat.endpoint import Endpoint, Engines
from sidecar.compat.progress import ProgressHub
from sidecar.compat.projects import MAX_REQUEST_ENV, Projects, Providers, Sessions, is_loader_env
from sidecar.compat.turns import Approvals, Chat, Events, GetMessage, TurnRunner
from sidecar.compat.validate import TOKEN
from sidecar.errors import InvalidParams, SidecarError
from sidecar.store.async_store import AsyncStore

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 3.0
PING_S = {"electron": 30.0, "rcoder": 15.0}
MAX_AGENT_COMMANDS = 64
MAX_WORK_DIR_ROOTS = 64


class _Running:
    def __init__(self, params: CompatStartParams, token: str, host: str, port: int) -> None:
        self.params = params
        self.token = token
        self.host = host
        self.port = port
        self.started_at = int(time.time() * 1000)
        self.endpoint: Endpoint | None = None
        self.server: Any = None
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class CompatService:
    def __init__(
        self,
        *,
        chat: Chat,
        events: Events,
        approvals: Approvals,
        sessions: Sessions,
        providers: Providers,
        store: AsyncStore,
        get_message: GetMessage,
        engines: Engines | None,
        data_dir: Path,
    ) -> None:
        self._chat = chat
        self._events = events
        self._approvals = approvals
        self._sessions = sessions
        self._providers = providers
        self._store = store
        self._get_message = get_message
        self._engines = engines
        self._data_dir = data_dir
        self._running: _Running | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()

    @classmethod
    def for_app(cls, app: Any) -> CompatService:
        """The service over an open App's chat engine, event hub, approvals, sessions and providers."""
        return cls(
            chat=app.chat,
            events=app.events,
            approvals=app.approvals,
            sessions=app.sessions,
            providers=app.providers,
            store=app.store,
            get_message=lambda message_id: app.store.run(lambda s: s.messages.get(message_id)),
            engines=getattr(app, "acp_engines", None),
            data_dir=app.data_dir,
        )

    async def __aenter__(self) -> CompatService:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        with anyio.CancelScope(shield=True):
            await self.stop()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    # -- methods --------------------------------------------------------------------

    async def start(self, params: CompatStartParams) -> CompatStartResult:
        async with self._lock:
            if self._running is not None:
                raise SidecarError(
                    f"the V1 endpoint already runs at {self._running.url} (compat:stop first)", code=ErrorCode.BAD_STATE
                )
            if self._tg is None:
                raise SidecarError("the compat service is not open", code=ErrorCode.BAD_STATE)
            host, token = _check(params)
            root = Path(params.workspace_dir) if params.workspace_dir else self._data_dir / "compat"
            started = time.perf_counter()
            http = await anyio.to_thread.run_sync(importlib.import_module, "sidecar.compat.http")
            try:
                sock = http.listen(host, params.port)
            except OSError as exc:
                raise SidecarError(
                    f"cannot listen on {host}:{params.port}: {exc.strerror or exc}", code=ErrorCode.BAD_STATE
                ) from exc
            running = _Running(params, token, host, sock.getsockname()[1])
            try:
                await self._tg.start(self._serve, running, http, sock, root)
            except BaseException:
                sock.close()
                raise
            self._running = running
            log.info(
                "V1 /computer/chat endpoint at %s (flavor %s) started in %.0f ms",
                running.url, params.flavor, (time.perf_counter() - started) * 1000,
            )
            return CompatStartResult(token=token, **_status_fields(running))

    async def stop(self, params: EmptyParams | None = None) -> CompatStatus:
        async with self._lock:
            running, self._running = self._running, None
            if running is None:
                return CompatStatus(running=False)
            with anyio.CancelScope(shield=True):
                await self._shutdown(running)
            log.info("V1 /computer/chat endpoint at %s stopped", running.url)
            return CompatStatus(running=False)

    async def status(self, params: EmptyParams | None = None) -> CompatStatus:
        running = self._running
        if running is None:
            return CompatStatus(running=False)
        return CompatStatus(**_status_fields(running))

    # -- the server -----------------------------------------------------------------

    async def _serve(
        self,
        running: _Running,
        http: Any,
        sock: Any,
        root: Path,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        params = running.params
        try:
            with running.scope:
                async with anyio.create_task_group() as pumps:
                    hub = ProgressHub(max_clients=params.max_sse_clients)
                    runner = TurnRunner(
                        chat=self._chat,
                        events=self._events,
                        approvals=self._approvals,
                        store=self._store,
                        get_message=self._get_message,
                        publish=hub.publish,
                        task_group=pumps,
                        trust_agent_mode=params.trust_agent_mode,
                        trust_approval_rules=params.trust_approval_rules,
                    )
                    projects = Projects(
                        sessions=self._sessions, providers=self._providers, root=root, agent_commands=params.agent_commands,
                        work_dir_roots=tuple(Path(r) for r in params.work_dir_roots),
                    )
                    endpoint = Endpoint(
                        flavor=params.flavor,
                        cancel_as_error=params.cancel_as_error,
                        projects=projects,
                        runner=runner,
                        hub=hub,
                        engines=self._engines,
                    )
                    ping = params.ping_interval_ms / 1000 if params.ping_interval_ms else PING_S[params.flavor]
                    app = http.V1App(
                        endpoint,
                        token=running.token,
                        ping_interval_s=ping,
                        close_after_turn=params.flavor == "rcoder",
                        leading_newline=params.flavor == "electron",
                        port=running.port,
                        check_host=not params.allow_remote,
                    )
                    running.server = http.server(app, head_timeout_s=params.head_timeout_ms / 1000)
                    running.endpoint = endpoint
                    task_status.started()
                    try:
                        await running.server.serve_on(sock)
                    except Exception:
                        log.exception("the V1 endpoint's server failed")
                    finally:
                        running.server.abort_connections()
                        pumps.cancel_scope.cancel()
        finally:
            sock.close()
            running.done.set()

    async def _shutdown(self, running: _Running) -> None:
        if running.endpoint is not None:
            running.endpoint.hub.close_all()  # progress streams end, so their requests finish
        server = running.server
        if server is not None:
            server.should_exit = True
        with anyio.move_on_after(STOP_TIMEOUT_S):
            await running.done.wait()
        if not running.done.is_set():
            log.warning("the V1 endpoint did not stop within %.0f s; cancelling it", STOP_TIMEOUT_S)
            if server is not None:
                server.force_exit = True
                server.abort_connections()
            running.scope.cancel()
            with anyio.move_on_after(1.0):
                await running.done.wait()


def _status_fields(running: _Running) -> dict[str, Any]:
    endpoint = running.endpoint
    return {
        "running": True,
        "url": running.url,
        "host": running.host,
        "port": running.port,
        "flavor": running.params.flavor,
        "started_at": running.started_at,
        "projects": endpoint.projects.count() if endpoint else 0,
        "running_turns": sum(1 for _ in endpoint.runner.running_turns()) if endpoint else 0,
        "sse_clients": endpoint.hub.client_count() if endpoint else 0,
        "connections": running.server.admission.open_count if running.server else 0,
        "max_connections": running.server.admission.caps.total if running.server else 0,
    }


def _check(params: CompatStartParams) -> tuple[str, str]:
    """The host to bind and the token; InvalidParams naming the field."""
    host = params.host.strip()
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidParams("invalid params: host must be an IP address or localhost - at `$.host`") from None
    if not address.is_loopback:
        if not params.allow_remote:
            raise InvalidParams(
                f"invalid params: {host} is not a loopback address; listening beyond this computer needs "
                "allowRemote and an explicit token - at `$.host`"
            )
        if params.token is None:
            raise InvalidParams("invalid params: allowRemote needs an explicit token - at `$.token`")
    if not 0 <= params.port <= 65535:
        raise InvalidParams("invalid params: port must be 0..65535 - at `$.port`")
    if params.token is not None and not TOKEN.fullmatch(params.token):
        raise InvalidParams("invalid params: token must be 16-256 printable ASCII characters without spaces - at `$.token`")
    if not 1 <= params.max_sse_clients <= 64:
        raise InvalidParams("invalid params: maxSseClients must be 1..64 - at `$.maxSseClients`")
    if params.ping_interval_ms is not None and not 1000 <= params.ping_interval_ms <= 600_000:
        raise InvalidParams("invalid params: pingIntervalMs must be 1000..600000 - at `$.pingIntervalMs`")
    if params.workspace_dir is not None and not Path(params.workspace_dir).is_absolute():
        raise InvalidParams("invalid params: workspaceDir must be an absolute path - at `$.workspaceDir`")
    if len(params.work_dir_roots) > MAX_WORK_DIR_ROOTS:
        raise InvalidParams(f"invalid params: at most {MAX_WORK_DIR_ROOTS} workDirRoots - at `$.workDirRoots`")
    for i, root in enumerate(params.work_dir_roots):
        if "\x00" in root or not Path(root).is_absolute() or Path(root) == Path(Path(root).anchor):
            raise InvalidParams(
                f"invalid params: workDirRoots must be absolute directories other than the file system root - at `$.workDirRoots[{i}]`"
            )
    if not 1000 <= params.head_timeout_ms <= 120_000:
        raise InvalidParams("invalid params: headTimeoutMs must be 1000..120000 - at `$.headTimeoutMs`")
    if len(params.agent_commands) > MAX_AGENT_COMMANDS:
        raise InvalidParams(f"invalid params: at most {MAX_AGENT_COMMANDS} agentCommands - at `$.agentCommands`")
    for name, command in params.agent_commands.items():
        if not name.strip() or (command.command is not None and not command.command.strip()):
            raise InvalidParams("invalid params: agentCommands names and commands must not be empty - at `$.agentCommands`")
        if len(command.request_env) > MAX_REQUEST_ENV:
            raise InvalidParams(f"invalid params: at most {MAX_REQUEST_ENV} requestEnv names - at `$.agentCommands`")
        for var in command.request_env:
            if not var or "=" in var or "\x00" in var or is_loader_env(var):
                raise InvalidParams(
                    f"invalid params: requestEnv may not name {var[:64]!r} (a loader variable or not a name) - at `$.agentCommands`"
                )
    token = params.token if params.token is not None else secrets.token_urlsafe(32)
    return host, token
