"""The server: binds protocol method names to code and runs the process's lifetime.

``BINDINGS`` (sidecar/bindings.py) maps every method of ``protocol.METHODS`` to an
attribute path on the App (``"sessions.create_session"`` -> ``app.sessions.create_session``);
``sidecar:initialize`` (with sidecar/handshake.py) and ``sidecar:shutdown`` are handled
here. A bound function is ``async def f(params: <params Struct>) -> result``.
A path that does not resolve once the App is open (the service is not built yet) is
still registered and answers NOT_IMPLEMENTED, so the method list the client sees is
always the whole contract. tests/test_rpc_server.py fails if a method of the contract
is neither bound nor handled here.

Lifetime (``serve``): start the peer (reading on from the early answers' LineReader,
sidecar/coldstart.py), register the handlers and start reading, then open the App with
``peer.notify``: the handshake and the ``EARLY`` methods (sidecar/bindings.py) are served
once its store is open, every other method once its services are. It
ends on stdin EOF, ``sidecar:shutdown``, SIGTERM or SIGINT, the parent's death (seen by
the Supervisor, sidecar/supervision.py) or when the output breaks, always the same way:
0. an orderly stop (``sidecar:shutdown``, the end of input) first refuses what comes after
   it (BUSY) and lets the requests read before it that the start-up held up (waiting for
   the store or the services to open) run and answer (``sidecar.startup.OPEN_WAIT_S``): a host
   may write its first requests and the shutdown at once;
1. the shutdown deadline starts (``SHUTDOWN_DEADLINE_S``; the Supervisor's thread ends
   the process when it passes, whatever is stuck) and every request from now on is
   answered BUSY (-32002);
2. running replies are aborted and their final events queued (for ``sidecar:shutdown``
   this happens before its answer, so a client that stops reading at the answer has them);
3. in-flight requests answer (a short grace, then REQUEST_CANCELLED) and reading stops;
4. the App closes (its services finish or cancel their work within what is left of the
   deadline but ``ANSWER_RESERVE_S``; a request still waiting for an App that did not open
   is answered REQUEST_CANCELLED), children still alive are killed, everything queued is
   written out and the streams close. A clean end returns normally (exit code 0).
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

from protocol import METHODS
from protocol.errors import ErrorCode
from protocol.events import TextDeltaEvent
from protocol.notifications import CHAT_STREAM
from protocol.common import EmptyParams, SuccessResult
from protocol.lifecycle import InitializeParams, InitializeResult
from sidecar.app import App, open_app
from sidecar.bindings import BINDINGS, EARLY, INITIALIZE, LIFECYCLE_METHODS, SHUTDOWN
from sidecar.coldstart import ColdStart, EarlySignals, loaded_heavy_modules
from sidecar.handshake import check_version, initialize_result
from sidecar.heap import freeze_startup
from sidecar.config import Config
from sidecar.errors import InvalidParams, SidecarError
from sidecar.rpc import Handler, JsonRpcPeer
from sidecar.rpc.framing import ReceiveStream, SendStream
from sidecar.secrets.keys import parse_key
from sidecar.startup import Startup, Step
from sidecar.supervision import SHUTDOWN_CLOCK, SHUTDOWN_DEADLINE_S, Supervisor

logger = logging.getLogger(__name__)


BENCH_NOTIFY = "sidecar:bench:notify"
BENCH_PING = "sidecar:bench:ping"
BENCH_MODULES = "sidecar:bench:modules"
"""Benchmark methods: registered only with ``--bench``, not part of the contract (not in protocol.METHODS)."""
TEST_CLOCK = "sidecar:test:clock"
"""Moves the task scheduler's test clock: registered only with ``--test-clock``, not part of
the contract (README "Scheduled tasks", sidecar/tasks/clock.py)."""

BoundFunc = Callable[[Any], Awaitable[Any]]

REPLY_STOP_BUDGET_S = 0.9
"""Of the shutdown deadline: how long running replies get to store and announce their end."""
DRAIN_GRACE_S = 0.3
"""Of the shutdown deadline: how long in-flight requests get to answer before they are cancelled."""
ANSWER_RESERVE_S = 0.6
"""Of the shutdown deadline: kept after the App's close for the drain (``DRAIN_GRACE_S``
twice at most) and the write-out, so that every request read is answered before the
Supervisor's hard exit."""


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


class TestClockParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    now: int
    """The new time, ms since the epoch (never earlier than the clock's)."""


class Server:
    """The method table of one App, plus the two lifecycle methods.

    The table exists before the App does: ``serve`` starts reading as soon as the peer
    is up, so ``sidecar:initialize`` and the EARLY methods are answered as soon as the
    store is open (``attach_store``), while the services are still being imported and
    opened (in a worker thread, see ``sidecar.app``). Any other bound method that arrives
    before ``attach(app)`` waits for it; its params are decoded only then, so the answers
    are exactly those of an App that was open from the start.
    """

    def __init__(self, config: Config, app: App | None, stop: anyio.Event, *, cold: ColdStart | None = None) -> None:
        self.config = config
        self.app: App | None = None
        self.stop = stop
        self.closing = False
        """Set when shutdown begins: every request from then on is answered BUSY."""
        cold = cold or ColdStart()
        self._replies_stopped = False
        self.startup = Startup(services_wanted=cold.store_read)
        """Where the App's opening stands (sidecar/startup.py); a first screen answered
        early wants the services at once."""
        self.modules_at_first_answer = cold.modules_at_first_read
        self._funcs: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        if app is not None:
            self.attach(app)

    async def attach_store(self, app: App) -> None:
        """The store step of the App is open: serve the handshake and the EARLY methods."""
        self.app = app
        for method in EARLY:
            func = resolve_binding(app, BINDINGS[method])
            if func is not None:
                self._funcs[method] = func
        self.startup.reach(Step.STORE)

    def attach(self, app: App) -> None:
        """Resolve the bindings on the now open App and release the waiting requests."""
        self.app = app
        self._funcs = {}
        for method, path in BINDINGS.items():
            func = resolve_binding(app, path)
            if func is not None:
                self._funcs[method] = func
        self.startup.reach(Step.SERVICES)

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
        if self.config.test_clock_ms is not None:
            table[TEST_CLOCK] = Handler(TestClockParams, self._open_only(self.test_clock))
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

    async def settle_waiting(self) -> None:
        """An orderly stop: refuse what comes next (BUSY), and let the requests read before
        it that the start-up held up answer first (``Startup.settle``; requests that were
        already running get the drain's grace, as before)."""
        self.closing = True
        await self.startup.settle()

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
        params = Handler.for_params(METHODS[method].params)
        unimplemented = not_implemented(method)

        if method in EARLY:

            async def call_store(raw: msgspec.Raw) -> Any:
                if self.startup.step < Step.STORE:
                    return await self.startup.after(Step.STORE, lambda: call_store(raw))
                func = self._funcs.get(method)
                if func is None:
                    return await unimplemented(raw)
                try:
                    return await func(await params.decode(raw))
                finally:
                    if not self.startup.wanted:  # the first answers are out: load the rest
                        self.modules_at_first_answer = loaded_heavy_modules()
                        self.startup.want_services()

            return call_store

        async def call(raw: msgspec.Raw) -> Any:
            if self.startup.step < Step.SERVICES:
                self.startup.want_services()
                return await self.startup.after(Step.SERVICES, lambda: call(raw))
            func = self._funcs.get(method)
            if func is None:
                return await unimplemented(raw)
            return await func(await params.decode(raw))

        return call

    async def initialize(self, params: InitializeParams) -> InitializeResult:
        """Settle the secrets key on the store (the host's ``secretKey``, else the sidecar's
        own), then answer: the same answer whenever it comes (sidecar/handshake.py)."""
        host_key = None
        if params.secret_key is not None:
            try:
                host_key = parse_key(params.secret_key)
            except ValueError as exc:
                raise InvalidParams(f"invalid params: {exc} - at `$.secretKey`") from None
        if self.startup.step < Step.STORE:
            return await self.startup.after(Step.STORE, lambda: self.initialize(params))
        assert self.app is not None
        secrets = await self.app.secrets.settle(host_key)
        check_version(params)
        return initialize_result(self.config, secrets)

    async def shutdown(self, params: EmptyParams) -> SuccessResult:
        """Abort running replies (their final events go out before this answer), answer,
        then stop. A second shutdown during the first is answered the same way."""
        if not self.closing:
            logger.info("shutdown requested")
        await self.settle_waiting()
        self.begin_shutdown()
        if self.startup.step >= Step.SERVICES:
            await self.stop_replies()
        self.stop.set()  # serve() waits for this reply to be queued before it stops writing
        return SuccessResult(success=True)

    async def test_clock(self, params: TestClockParams) -> dict[str, int]:
        """Move the scheduler's test clock; answered once every time up to it was handled."""
        await self.startup.wait(Step.SERVICES)
        tasks = getattr(self.app, "tasks", None)
        if tasks is None:
            raise SidecarError("the task scheduler is not running", code=ErrorCode.NOT_IMPLEMENTED)
        return {"now": await tasks.set_test_clock(params.now)}

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
        await self.startup.wait(Step.SERVICES)
        assert self.app is not None
        notify = self.app.notify
        started = time.perf_counter()
        for seq in range(1, params.count + 1):
            await notify(CHAT_STREAM, event(seq, text))
        elapsed = time.perf_counter() - started
        line = msgspec.json.encode({"jsonrpc": "2.0", "method": CHAT_STREAM.method, "params": event(params.count, text)})
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
    cold: ColdStart | None = None,
) -> None:
    """Serve one client over the given streams until EOF, shutdown, a signal, ``stop`` or
    (with a ``supervisor``) the parent's death. ``cold``: what was answered and opened on
    these streams before the event loop, and the reader that read them (sidecar/coldstart.py)."""
    stop = stop or anyio.Event()
    # In-process (tests, embedding) the clock is reset on both sides: the deadline of this
    # server's shutdown must not bound the waits of whatever runs after it returns. With a
    # supervisor the process ends with the server (Supervisor.start resets it).
    if supervisor is None:
        SHUTDOWN_CLOCK.reset()
    try:
        await _serve(
            config, receive_stream, send_stream,
            handle_signals=handle_signals, stop=stop, supervisor=supervisor, cold=cold or ColdStart(),
        )
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
    cold: ColdStart,
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
            watchers.start_soon(_watch_signals, stop, cold.signals)
        async with JsonRpcPeer(
            receive_stream,
            send_stream,
            name="sidecar",
            max_line_bytes=config.max_line_bytes,
            autostart=False,
            shutdown_grace=DRAIN_GRACE_S,
            reader=cold.reader,
        ) as peer:
            server = Server(config, None, stop, cold=cold)
            for method, handler in server.handlers().items():
                peer.dispatcher.add(method, handler)
            peer.start_reading()  # the handshake is answered while the App opens
            watchers.start_soon(_stop_at_end_of_input, peer.closed, server, stop)
            watchers.start_soon(_on_stop, stop, server, supervisor, app_scope)
            watchers.start_soon(server.startup.warm_up, config.warmup_ms / 1000)
            try:
                with app_scope:  # its deadline is set when shutdown begins (_on_stop)
                    async with open_app(
                        config, peer.notify,
                        on_store=server.attach_store, services_wanted=server.startup.services_wanted,
                        store=cold.store,
                    ) as app:
                        server.attach(app)
                        if supervisor is not None:
                            # the process is ours (an in-process server leaves its host's
                            # heap alone): full collections walk only what comes after
                            freeze_startup()
                        logger.info("serving (data dir %s, pid %s)", app.data_dir, os.getpid())
                        await stop.wait()
                        logger.info("stopping")
                        server.begin_shutdown()
                        await server.stop_replies()
                        await peer.drain_incoming()
            finally:
                server.startup.end()  # requests still waiting for the App are answered now
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
    server.startup.stop()  # an App still waiting to load its services stops without them
    if supervisor is not None:
        supervisor.begin_shutdown()
    app_scope.deadline = anyio.current_time() + SHUTDOWN_CLOCK.bound(SHUTDOWN_DEADLINE_S - ANSWER_RESERVE_S)


def _call_soon(loop: asyncio.AbstractEventLoop, func: Callable[[], Any]) -> None:
    """Run ``func`` on the event loop from another thread (never waits for it)."""
    try:
        loop.call_soon_threadsafe(func)
    except RuntimeError:  # the loop is closed: the process is ending anyway
        pass


async def _stop_at_end_of_input(closed: anyio.Event, server: Server, stop: anyio.Event) -> None:
    """The end of input is an orderly stop, as ``sidecar:shutdown`` is."""
    await closed.wait()
    await server.settle_waiting()
    stop.set()


async def _watch_signals(stop: anyio.Event, early: EarlySignals) -> None:
    try:
        receiver = anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT)
    except NotImplementedError:  # Windows: the client ends us by closing stdin or with shutdown
        return
    with receiver as signals:
        # the loop's handlers are in place: a signal that came before them counts now
        if early.received is not None:
            logger.info("signal %s (before the event loop): stopping", signal.Signals(early.received).name)
            stop.set()
        async for signum in signals:
            if stop.is_set():
                logger.info("signal %s: already stopping", signal.Signals(signum).name)
            else:
                logger.info("signal %s: stopping", signal.Signals(signum).name)
                stop.set()

