"""The server: binds protocol method names to code and runs the process's lifetime.

This is the only place that knows method names. ``BINDINGS`` maps every method of
``protocol.METHODS`` to an attribute path on the App (``"sessions.create_session"``
-> ``app.sessions.create_session``); ``sidecar:initialize`` and ``sidecar:shutdown`` are
handled here. A bound function is ``async def f(params: <params Struct>) -> result``.
A path that does not resolve once the App is open (the service is not built yet) is
still registered and answers NOT_IMPLEMENTED, so the method list the client sees is
always the whole contract. tests/test_rpc_server.py fails if a method of the contract
is neither bound nor handled here.

Lifetime (``serve``): start the peer, register the handlers and start reading, then
open the App with ``peer.notify`` (requests other than the handshake wait for it). It
ends on stdin EOF, ``sidecar:shutdown``, SIGTERM or SIGINT, the parent's death (seen by
the Supervisor, sidecar/supervision.py) or when the output breaks, always the same way:
1. the shutdown deadline starts (``SHUTDOWN_DEADLINE_S``; the Supervisor's thread ends
   the process when it passes, whatever is stuck) and every request from now on is
   answered BUSY (-32002);
2. running replies are aborted and their final events queued (for ``sidecar:shutdown``
   this happens before its answer, so a client that stops reading at the answer has them);
3. in-flight requests answer (a short grace, then REQUEST_CANCELLED) and reading stops;
4. the App closes (its services finish or cancel their work within what is left of the
   deadline), children still alive are killed, everything queued is written out and the
   streams close. A clean end returns normally (exit code 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

import sidecar
from protocol import METHODS, NOTIFICATIONS, PROTOCOL_VERSION
from protocol.errors import ErrorCode
from protocol.events import TextDeltaEvent
from protocol.common import EmptyParams, SuccessResult
from protocol.lifecycle import InitializeParams, InitializeResult, ServerCapabilities, ServerInfo
from sidecar.app import App, open_app
from sidecar.config import Config
from sidecar.errors import InvalidParams, SidecarError
from sidecar.rpc import Handler, JsonRpcPeer
from sidecar.rpc.framing import ReceiveStream, SendStream
from sidecar.secrets.keys import parse_key
from sidecar.supervision import SHUTDOWN_CLOCK, SHUTDOWN_DEADLINE_S, Supervisor

logger = logging.getLogger(__name__)

INITIALIZE = "sidecar:initialize"
SHUTDOWN = "sidecar:shutdown"
LIFECYCLE_METHODS = (INITIALIZE, SHUTDOWN)
"""Methods of the contract handled by the Server itself."""

BINDINGS: dict[str, str] = {
    "chat:session:create": "sessions.create_session",
    "chat:session:list": "sessions.list_sessions",
    "chat:session:get": "sessions.get_session",
    "chat:session:update": "sessions.update_session",
    "chat:session:delete": "sessions.delete_session",
    "chat:session:archive": "sessions.archive_session",
    "chat:session:pin": "sessions.pin_session",
    "chat:session:fork": "sessions.fork_session",
    "chat:session:export": "sessions.export_session",
    "chat:session:import": "sessions.import_session",
    "chat:messages:get": "sessions.get_messages",
    "chat:messages:tree": "sessions.get_tree",
    "chat:messages:search": "sessions.search_messages",
    "chat:messages:select": "sessions.select_branch",
    "chat:send": "chat.send",
    "chat:abort": "chat.abort",
    "chat:regenerate": "chat.regenerate",
    "chat:editResend": "chat.edit_resend",
    "provider:list": "providers.list_providers",
    "provider:upsert": "providers.upsert_provider",
    "provider:delete": "providers.delete_provider",
    "provider:setDefault": "providers.set_default",
    "settings:get": "settings.get_settings",
    "settings:update": "settings.update_settings",
    "chat:tool:approve": "approvals.approve",
    "tool:pending:list": "approvals.list_pending",
    "tool:policy:get": "approvals.get_policies",
    "tool:policy:set": "approvals.set_policy",
    "tool:audit:list": "approvals.list_audit",
    "tool:list": "tools.list_tools",
    "tool:settings:get": "tools.get_settings",
    "tool:settings:update": "tools.update_settings",
    "mcp:server:upsert": "mcp.upsert_server",
    "mcp:server:list": "mcp.list_servers",
    "mcp:server:delete": "mcp.delete_server",
    "assistant:list": "assistants.list_assistants",
    "assistant:get": "assistants.get_assistant",
    "assistant:upsert": "assistants.upsert_assistant",
    "assistant:delete": "assistants.delete_assistant",
    "assistant:setDefault": "assistants.set_default_assistant",
    "chat:context:get": "context.get_context",
    "chat:context:update": "context.update_context",
    "chat:context:compact": "context.compact",
    "compat:start": "compat.start",
    "compat:stop": "compat.stop",
    "compat:status": "compat.status",
    "channel:message": "channels.message",
    "channel:ack": "channels.ack",
    "channel:config:list": "channels.list_configs",
    "channel:config:get": "channels.get_config",
    "channel:config:upsert": "channels.upsert_config",
    "channel:config:delete": "channels.delete_config",
    "kb:create": "knowledge.create_kb",
    "kb:list": "knowledge.list_kbs",
    "kb:get": "knowledge.get_kb",
    "kb:update": "knowledge.update_kb",
    "kb:delete": "knowledge.delete_kb",
    "kb:document:add": "knowledge.add_document",
    "kb:document:list": "knowledge.list_documents",
    "kb:document:get": "knowledge.get_document",
    "kb:document:delete": "knowledge.delete_document",
    "kb:document:reindex": "knowledge.reindex_document",
    "kb:search": "knowledge.search",
    "kb:settings:get": "knowledge.get_settings",
    "kb:settings:update": "knowledge.update_settings",
    "server:configure": "sync.configure",
    "server:status": "sync.status",
    "server:logout": "sync.logout",
    "sync:pull": "sync.pull",
    "sync:push": "sync.push",
    "sync:run": "sync.run",
    "sync:settings:get": "sync.get_settings",
    "sync:settings:update": "sync.update_settings",
    "server:conversation:update": "sync.update_conversation",
    "server:conversation:delete": "sync.delete_conversation",
    "server:conversation:share": "sync.share_conversation",
    "server:session:create": "sync.create_server_session",
    "chat:suggest": "sync.suggest",
    "server:chat:pageResult": "sync.page_result",
    "storage:gc": "storage.gc",
    "chat:messages:update": "sessions.update_message",
    "chat:messages:delete": "sessions.delete_messages",
    "chat:messages:page": "sessions.get_page",
    "chat:messages:searchPage": "sessions.search_page",
    "chat:session:summarize": "side.summarize_session",
    "chat:session:title": "side.title_session",
    "memory:list": "memory.list_memories",
    "memory:get": "memory.get_memory",
    "memory:create": "memory.create_memory",
    "memory:update": "memory.update_memory",
    "memory:delete": "memory.delete_memory",
    "memory:restore": "memory.restore_memory",
    "memory:purge": "memory.purge_memory",
    "memory:search": "memory.search_memories",
    "memory:proposal:list": "memory.list_proposals",
    "memory:accept": "memory.accept",
    "memory:reject": "memory.reject",
    "assistant:soul:get": "souls.get",
    "assistant:soul:set": "souls.set",
    "assistant:soul:history": "souls.history",
    "assistant:soul:revert": "souls.revert",
}
"""Method name -> attribute path on the App of the ``async def f(params) -> result`` that answers it."""

STORE_METHODS = frozenset(
    {"chat:session:list", "chat:session:get", "chat:messages:get", "chat:messages:tree", "chat:messages:search"}
)
"""Answered as soon as the store is open (they read it and nothing else): a cold start's
first screen needs no provider, pipeline or tool module."""
HEAVY_MODULES = (
    "sidecar.providers", "sidecar.pipeline", "sidecar.tools", "sidecar.acp", "sidecar.retrieval",
    "sidecar.channels", "sidecar.compat", "sidecar.sync", "sidecar.engine.chat", "mcp", "jsonschema",
    "jinja2", "pypdf", "numpy", "tiktoken", "httpx2", "uvicorn", "selectolax", "markdown_it",
)
"""What the store step must not import (``sidecar:bench:modules`` reports which are loaded)."""



def loaded_heavy_modules() -> list[str]:
    import sys

    return sorted(m for m in HEAVY_MODULES if m in sys.modules)


BENCH_NOTIFY = "sidecar:bench:notify"
BENCH_PING = "sidecar:bench:ping"
BENCH_MODULES = "sidecar:bench:modules"
"""Benchmark methods: registered only with ``--bench``, not part of the contract (not in protocol.METHODS)."""

BoundFunc = Callable[[Any], Awaitable[Any]]

REPLY_STOP_BUDGET_S = 0.9
"""Of the shutdown deadline: how long running replies get to store and announce their end."""
DRAIN_GRACE_S = 0.3
"""Of the shutdown deadline: how long in-flight requests get to answer before they are cancelled."""


def resolve_binding(app: App, path: str) -> BoundFunc | None:
    """The callable at ``path`` on ``app``, or None when a step is missing."""
    target: Any = app
    for part in path.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target if callable(target) else None


def not_implemented(method: str) -> BoundFunc:
    async def answer(params: Any) -> Any:
        raise SidecarError(f"{method} is not implemented yet", code=ErrorCode.NOT_IMPLEMENTED)

    return answer


class BenchNotifyParams(msgspec.Struct, kw_only=True):
    count: int
    size: int = 120
    """Bytes of each event's JSON (the notification's params), at least the empty event's size."""


class BenchNotifyResult(msgspec.Struct, kw_only=True, rename="camel"):
    count: int
    event_bytes: int
    line_bytes: int
    """Bytes of the last notification line (envelope and newline included)."""
    elapsed_ms: float
    """Time to encode and queue all notifications (they are written before this reply)."""


class Server:
    """The method table of one App, plus the two lifecycle methods.

    The table exists before the App does: ``serve`` starts reading as soon as the peer
    is up, so ``sidecar:initialize`` is answered while the services are still being
    imported and opened (in a worker thread, see ``sidecar.app``). A bound method that
    arrives before ``attach(app)`` waits for it; its params are decoded only then, so
    the answers are exactly those of an App that was open from the start.
    """

    def __init__(self, config: Config, app: App | None, stop: anyio.Event) -> None:
        self.config = config
        self.app: App | None = None
        self.stop = stop
        self.closing = False
        """Set when shutdown begins: every request from then on is answered BUSY."""
        self.initialized = False
        """The handshake came: the secrets key is settled as soon as the store is open."""
        self._replies_stopped = False
        self.store_ready = anyio.Event()
        """The store is open: STORE_METHODS are served."""
        self.stopping = anyio.Event()
        """Set when shutdown begins (an App still waiting to load its services stops without)."""
        self.modules_at_first_answer: list[str] | None = None
        self.want_services = anyio.Event()
        """Set by the first request that needs the other services, by the first answer of
        a store method, or after an idle delay (``serve``): the App then loads them."""
        self.ready = anyio.Event()
        self.implemented: list[str] = sorted([*LIFECYCLE_METHODS, *BINDINGS])
        """Before ``attach``: every bound method (``open_app`` attaches a service for each,
        tests/test_rpc_server.py checks it); after: the bindings that resolved."""
        self._funcs: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        if app is not None:
            self.attach(app)

    async def attach_store(self, app: App) -> None:
        """The store step of the App is open: settle the secrets key if the handshake
        already came, then serve STORE_METHODS."""
        if self.initialized:
            await app.secrets.settle()
        self.app = app
        for method in STORE_METHODS:
            func = resolve_binding(app, BINDINGS[method])
            if func is not None:
                self._funcs[method] = func
        self.store_ready.set()

    async def services_wanted(self) -> bool:
        """Wait until the other services are needed (True) or the server stops before
        anything asked for them (False: a request that arrived before the stop still
        asked, and is served)."""
        async with anyio.create_task_group() as tg:

            async def first(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(first, self.want_services)
            tg.start_soon(first, self.stopping)
        return self.want_services.is_set()

    def attach(self, app: App) -> None:
        """Resolve the bindings on the now open App and release the waiting requests."""
        self.app = app
        self._funcs = {}
        for method, path in BINDINGS.items():
            func = resolve_binding(app, path)
            if func is not None:
                self._funcs[method] = func
        self.implemented = sorted([*LIFECYCLE_METHODS, *self._funcs])
        self.store_ready.set()
        self.ready.set()

    def handlers(self) -> dict[str, Handler[Any]]:
        table: dict[str, Handler[Any]] = {
            INITIALIZE: Handler(InitializeParams, self._open_only(self.initialize)),
            SHUTDOWN: Handler(EmptyParams, self.shutdown),
        }
        for method in BINDINGS:
            # Raw params: decoded by the bound call once the App is open (a method whose
            # service is missing answers NOT_IMPLEMENTED whatever its params)
            table[method] = Handler(msgspec.Raw, self._open_only(self._bound(method)))
        if self.config.bench:
            table[BENCH_NOTIFY] = Handler(BenchNotifyParams, self._open_only(self.bench_notify))
            table[BENCH_PING] = Handler(EmptyParams, self._open_only(self.bench_ping))
            table[BENCH_MODULES] = Handler(EmptyParams, self.bench_modules)
        missing = set(METHODS) - set(table)
        if missing:  # guarded by a test too; this keeps a partial deployment honest
            logger.error("methods of the contract without a handler: %s", ", ".join(sorted(missing)))
        return table

    def _open_only(self, func: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        """``func``, answering BUSY once shutdown has begun."""

        async def call(params: Any) -> Any:
            if self.closing:
                raise SidecarError("the sidecar is shutting down", code=ErrorCode.BUSY)
            return await func(params)

        return call

    def begin_shutdown(self) -> None:
        """Refuse new requests and start the shutdown deadline (idempotent)."""
        self.closing = True
        SHUTDOWN_CLOCK.begin(SHUTDOWN_DEADLINE_S)

    async def stop_replies(self) -> None:
        """Abort every running reply; their final events are queued when this returns
        (bounded: a reply that does not end in time is ended by crash recovery at the
        next start)."""
        if self._replies_stopped:
            return
        self._replies_stopped = True
        chat = getattr(self.app, "chat", None) if self.app is not None else None
        if chat is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_CLOCK.bound(REPLY_STOP_BUDGET_S)) as scope:
            await chat.aclose()
        if scope.cancelled_caught:
            logger.warning("running replies did not end within %.1f s of shutdown", REPLY_STOP_BUDGET_S)

    def _bound(self, method: str) -> Callable[[msgspec.Raw], Awaitable[Any]]:
        params = Handler(METHODS[method].params, _unused)
        unimplemented = not_implemented(method)

        if method in STORE_METHODS:

            async def call_store(raw: msgspec.Raw) -> Any:
                if not self.store_ready.is_set():
                    await self.store_ready.wait()
                func = self._funcs.get(method)
                if func is None:
                    return await unimplemented(raw)
                try:
                    return await func(await params.decode(raw))
                finally:
                    if not self.want_services.is_set():  # the first answers are out: load the rest
                        self.modules_at_first_answer = loaded_heavy_modules()
                        self.want_services.set()

            return call_store

        async def call(raw: msgspec.Raw) -> Any:
            if not self.ready.is_set():
                self.want_services.set()
                await self.ready.wait()
            func = self._funcs.get(method)
            if func is None:
                return await unimplemented(raw)
            return await func(await params.decode(raw))

        return call

    async def initialize(self, params: InitializeParams) -> InitializeResult:
        host_key = None
        if params.secret_key is not None:
            try:
                host_key = parse_key(params.secret_key)
            except ValueError as exc:
                raise InvalidParams(f"invalid params: {exc} - at `$.secretKey`") from None
            await self.store_ready.wait()  # the key is applied to the store before the answer
        self.initialized = True
        secrets = None
        if self.store_ready.is_set() and self.app is not None:
            secrets = await self.app.secrets.settle(host_key)
        client = params.client_info
        logger.info(
            "initialize from %s %s (protocol %s)",
            client.name if client else "unknown client",
            (client.version or "") if client else "",
            params.protocol_version,
        )
        if params.protocol_version is not None and params.protocol_version != PROTOCOL_VERSION:
            # A client built for another version would misread this wire: refuse the
            # handshake (the client shows the error); the process keeps serving.
            raise SidecarError(
                f"protocol version mismatch: the client speaks protocol {params.protocol_version},"
                f" this sidecar speaks protocol {PROTOCOL_VERSION}",
                code=ErrorCode.BAD_STATE,
                data={"expected": PROTOCOL_VERSION, "got": params.protocol_version},
            )
        return InitializeResult(
            protocol_version=PROTOCOL_VERSION,
            server_info=ServerInfo(name=sidecar.SERVER_NAME, version=sidecar.__version__),
            capabilities=ServerCapabilities(
                methods=sorted(METHODS),
                implemented=self.implemented,
                notifications=sorted(n for n, spec in NOTIFICATIONS.items() if spec.direction == "server->client"),
                max_line_bytes=self.config.max_line_bytes,
            ),
            data_dir=self.config.data_dir,
            secrets=secrets,
        )

    async def shutdown(self, params: EmptyParams) -> SuccessResult:
        """Abort running replies (their final events go out before this answer), answer,
        then stop. A second shutdown during the first is answered the same way."""
        if not self.closing:
            logger.info("shutdown requested")
        self.begin_shutdown()
        if self.ready.is_set():
            await self.stop_replies()
        self.stop.set()  # serve() waits for this reply to be queued before it stops writing
        return SuccessResult(success=True)

    async def bench_modules(self, params: EmptyParams) -> dict[str, list[str] | None]:
        """The HEAVY_MODULES loaded now, and when the first store method was answered
        before anything asked for the other services (benchmarks and the cold-start test)."""
        return {"now": loaded_heavy_modules(), "atFirstAnswer": self.modules_at_first_answer}

    async def bench_ping(self, params: EmptyParams) -> str:
        """The smallest possible request: measures the RPC path alone (benchmarks only)."""
        return "pong"

    async def bench_notify(self, params: BenchNotifyParams) -> BenchNotifyResult:
        """Emit ``count`` chat:stream text deltas of ``size`` bytes each (benchmarks only)."""
        if not 0 <= params.count <= 10_000_000:
            raise InvalidParams("invalid params: count must be 0..10000000")
        timestamp = int(time.time() * 1000)

        def event(seq: int, text: str) -> TextDeltaEvent:
            return TextDeltaEvent(session_id="s1", message_id="m1", timestamp=timestamp, seq=seq, text=text)

        # Every event is padded to the size of the one with the largest seq.
        empty = len(msgspec.json.encode(event(params.count, "")))
        if not empty <= params.size <= 1_000_000:
            raise InvalidParams(f"invalid params: size must be {empty}..1000000")
        text = "x" * (params.size - empty)
        await self.ready.wait()
        assert self.app is not None
        notify = self.app.notify
        started = time.perf_counter()
        for seq in range(1, params.count + 1):
            await notify("chat:stream", event(seq, text))
        elapsed = time.perf_counter() - started
        line = msgspec.json.encode({"jsonrpc": "2.0", "method": "chat:stream", "params": event(params.count, text)})
        return BenchNotifyResult(
            count=params.count, event_bytes=params.size, line_bytes=len(line) + 1, elapsed_ms=elapsed * 1000
        )


async def serve(
    config: Config,
    receive_stream: ReceiveStream,
    send_stream: SendStream,
    *,
    handle_signals: bool = False,
    stop: anyio.Event | None = None,
    supervisor: Supervisor | None = None,
) -> None:
    """Serve one client over the given streams until EOF, shutdown, a signal, ``stop`` or
    (with a ``supervisor``) the parent's death."""
    stop = stop or anyio.Event()
    # In-process (tests, embedding) the clock is reset on both sides: the deadline of this
    # server's shutdown must not bound the waits of whatever runs after it returns. With a
    # supervisor the process ends with the server (Supervisor.start resets it).
    if supervisor is None:
        SHUTDOWN_CLOCK.reset()
    try:
        await _serve(config, receive_stream, send_stream, handle_signals=handle_signals, stop=stop, supervisor=supervisor)
    finally:
        if supervisor is None:
            SHUTDOWN_CLOCK.reset()


async def _serve(
    config: Config,
    receive_stream: ReceiveStream,
    send_stream: SendStream,
    *,
    handle_signals: bool,
    stop: anyio.Event,
    supervisor: Supervisor | None,
) -> None:
    if supervisor is not None:
        loop = asyncio.get_running_loop()

        def parent_died() -> None:  # called from the Supervisor's thread
            logger.warning("the parent process is gone: stopping")
            _call_soon(loop, stop.set)

        supervisor.start(parent_died)
    app_scope = anyio.CancelScope()
    async with anyio.create_task_group() as watchers:
        if handle_signals:
            watchers.start_soon(_watch_signals, stop)
        async with JsonRpcPeer(
            receive_stream,
            send_stream,
            name="sidecar",
            max_line_bytes=config.max_line_bytes,
            autostart=False,
            shutdown_grace=DRAIN_GRACE_S,
        ) as peer:
            server = Server(config, None, stop)
            for method, handler in server.handlers().items():
                peer.dispatcher.add(method, handler)
            peer.start_reading()  # the handshake is answered while the App opens
            watchers.start_soon(_set_when, peer.closed, stop)
            watchers.start_soon(_on_stop, stop, server, supervisor, app_scope)
            watchers.start_soon(_warm_up, server, config.warmup_ms / 1000)
            with app_scope:  # its deadline is set when shutdown begins (_on_stop)
                async with open_app(
                    config, peer.notify, on_store=server.attach_store, services_wanted=server.services_wanted
                ) as app:
                    server.attach(app)
                    logger.info("serving (data dir %s, pid %s)", app.data_dir, os.getpid())
                    await stop.wait()
                    logger.info("stopping")
                    server.begin_shutdown()
                    await server.stop_replies()
                    await peer.drain_incoming()
            if app_scope.cancelled_caught:
                logger.warning("the services did not close within the shutdown deadline")
            # The App is closed; leaving the peer writes out what is queued.
        logger.info("stopped")
        watchers.cancel_scope.cancel()


async def _on_stop(
    stop: anyio.Event, server: Server, supervisor: Supervisor | None, app_scope: anyio.CancelScope
) -> None:
    """Once stopping: start the deadline, and bound the App (also while it is still opening)."""
    await stop.wait()
    server.begin_shutdown()
    server.stopping.set()  # an App still waiting to load its services stops without them
    if supervisor is not None:
        supervisor.begin_shutdown()
    app_scope.deadline = anyio.current_time() + SHUTDOWN_CLOCK.bound(SHUTDOWN_DEADLINE_S)


async def _warm_up(server: Server, delay: float) -> None:
    """Load the services ``delay`` seconds after the store opened if nothing asked yet
    (a client that only shook hands then idles gets them loaded before its first send)."""
    await server.store_ready.wait()
    with anyio.move_on_after(delay):
        await server.want_services.wait()
    server.want_services.set()


def _call_soon(loop: asyncio.AbstractEventLoop, func: Callable[[], Any]) -> None:
    """Run ``func`` on the event loop from another thread (never waits for it)."""
    try:
        loop.call_soon_threadsafe(func)
    except RuntimeError:  # the loop is closed: the process is ending anyway
        pass


async def _set_when(event: anyio.Event, target: anyio.Event) -> None:
    await event.wait()
    target.set()


async def _watch_signals(stop: anyio.Event) -> None:
    try:
        receiver = anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT)
    except NotImplementedError:  # Windows: the client ends us by closing stdin or with shutdown
        return
    with receiver as signals:
        async for signum in signals:
            if stop.is_set():
                logger.info("signal %s: already stopping", signal.Signals(signum).name)
            else:
                logger.info("signal %s: stopping", signal.Signals(signum).name)
                stop.set()



async def _unused(params: Any) -> Any:  # Handler used only for its params decoder
    raise AssertionError("not called")
