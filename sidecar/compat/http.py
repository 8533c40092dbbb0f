"""The V1 endpoint's HTTP side: an ASGI application served by uvicorn inside our event loop.

Owns what is transport: routing, the API key, body limits, JSON bodies, the envelope of
answers and the SSE stream of ``GET /computer/progress/{session_id}``. What each route
does is sidecar.compat.endpoint's.

Beyond V1 (which listened on 0.0.0.0 without authentication and with CORS ``*``):
- every request must name this computer by a loopback ``Host`` (DNS rebinding: a page
  whose name now points at 127.0.0.1 still sends its own name), unless remote callers
  were allowed; any other is 403 (code HOST_NOT_ALLOWED);
- every ``/computer/*`` request needs the key, as ``x-api-key`` (what the Qiming server's
  SandboxAgentClient sends) or ``Authorization: Bearer``; compared in constant time; a
  missing or wrong key is 401 (code 4010). ``GET /health`` stays open (it says nothing);
- no CORS headers at all (a browser page cannot call us);
- bodies up to 10 MiB (413 beyond, read no further) and read within 30 s (408); a body
  is read by msgspec, and one it cannot read is 400 VALIDATION_ERROR whatever its shape:
  its free-form fields (``attachments``, ``data_source_attachments``) are bounded to
  ``protocol.limits.MAX_JSON_DEPTH`` levels as the stdio side bounds its params
  (sidecar.jsondepth), and a body nested past what msgspec can recurse into (an unknown
  field too, which it skips by recursion) is refused the same way, never a 500; a body of
  THREAD_DECODE_BYTES or more is read in a worker thread (as the stdio side reads params);
- a progress stream whose client does not take a frame within WRITE_TIMEOUT_S is ended;
- connections are accepted, capped and given a deadline and size limits for their request
  head by sidecar.compat.guard (one server: uvicorn's HTTP/1.1 protocol behind our accept
  loop);
- uvicorn's warning for each malformed request (which anyone who can connect may send at
  will) is logged at the 1st and every LOG_EVERY-th, as the guard's own (guard.Tally); its
  upgrade warnings are dropped.

Imported only by ``compat:start`` (uvicorn is not loaded while the endpoint is off).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import anyio
import msgspec
import uvicorn

from protocol.limits import MAX_JSON_DEPTH
from sidecar.compat import wire
from sidecar.compat.endpoint import Attach, Endpoint
from sidecar.compat.frames import Frames
from sidecar.compat.guard import LOG_EVERY, Admission, Caps, GuardedProtocol, Tally, accept_loop
from sidecar.compat.progress import SseClient, TooManyClients
from sidecar.compat.validate import IDENTIFIER, host_allowed, request_authorized
from sidecar.compat.wire import V1Error, invalid
from sidecar.jsondepth import json_too_deep
from sidecar.rpc.dispatch import THREAD_DECODE_BYTES

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 10 * 1024 * 1024
BODY_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 60.0
PROGRESS_PREFIX = "/computer/progress/"
JSON = b"application/json"


class _Gone(Exception):
    """The client disconnected while we read its request."""


class V1App:
    def __init__(
        self,
        endpoint: Endpoint,
        *,
        token: str,
        ping_interval_s: float,
        close_after_turn: bool,
        leading_newline: bool,
        port: int,
        check_host: bool = True,
    ) -> None:
        self._endpoint = endpoint
        self._token = token.encode()
        self._port = port
        self._check_host = check_host
        self._ping_interval = ping_interval_s
        self._close_after_turn = close_after_turn
        self._leading_newline = leading_newline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._route(scope, receive, tracked)
        except _Gone:
            return
        except V1Error as exc:
            if not started:
                close = exc.status in (408, 413)
                await _respond(tracked, exc.status, wire.error(exc.v1_code, exc.message), close=close)
        except Exception:
            log.exception("V1 %s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                await _respond(tracked, 500, wire.error(wire.INTERNAL, "internal error"))

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        return request_authorized(headers, self._token)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        path = scope["path"]
        if self._check_host and not host_allowed(scope.get("headers", ()), self._port):
            raise V1Error(403, wire.HOST_NOT_ALLOWED, "the Host header must name this computer (localhost, 127.0.0.1 or [::1])")
        if method == "OPTIONS":
            # no CORS: a preflight learns the methods, never an allowed origin
            await send({"type": "http.response.start", "status": 204, "headers": [(b"allow", b"GET, POST, OPTIONS")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if path == "/health" and method == "GET":
            await _respond(send, 200, msgspec.json.encode(wire.HealthResponse(
                status="healthy", engineType="chat-sidecar", timestamp=_now(),
            )))
            return
        if not (path.startswith("/computer/") and self._route_known(method, path)):
            raise V1Error(404, wire.NOT_FOUND, f"Path not found: {path}")
        if not self.authorized(scope.get("headers", [])):
            raise V1Error(401, wire.AUTH_FAILED, "a valid API key is required (x-api-key or Authorization: Bearer)")
        endpoint = self._endpoint
        if path == "/computer/chat":
            req = await _read(await _body(scope, receive), wire.ComputerChatRequest)
            await _respond(send, 200, wire.ok(await endpoint.chat(req)))
        elif path.startswith(PROGRESS_PREFIX):
            await self._progress(receive, send, path[len(PROGRESS_PREFIX):])
        elif path == "/computer/agent/session/cancel":
            body = await _body(scope, receive)
            try:
                req = await _read(body, wire.ProjectRequest) if body.strip() else wire.ProjectRequest()
            except V1Error:  # V1 ignores a body it cannot read here (the query is what the server sends)
                req = wire.ProjectRequest()
            query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
            req = wire.ProjectRequest(
                user_id=_first(query, "user_id") or req.user_id,
                project_id=_first(query, "project_id") or req.project_id,
                session_id=_first(query, "session_id") or req.session_id,
            )
            await _respond(send, 200, wire.ok(await endpoint.cancel(req)))
        else:
            body = await _body(scope, receive)
            req = await _read(body, wire.ProjectRequest) if body.strip() else wire.ProjectRequest()
            if path == "/computer/agent/status":
                await _respond(send, 200, wire.ok(await endpoint.status(req)))
            else:
                await _respond(send, 200, wire.ok(await endpoint.stop(req)))

    @staticmethod
    def _route_known(method: str, path: str) -> bool:
        if path.startswith(PROGRESS_PREFIX):
            return method == "GET"
        return method == "POST" and path in (
            "/computer/chat", "/computer/agent/session/cancel", "/computer/agent/status", "/computer/agent/stop",
        )

    # -- progress (SSE) -------------------------------------------------------------

    async def _progress(self, receive: Receive, send: Send, session_id: str) -> None:
        if not IDENTIFIER.fullmatch(session_id):
            raise invalid("session_id must be 1-64 characters of [A-Za-z0-9_-]")
        endpoint = self._endpoint
        try:
            attach = await endpoint.progress(session_id)
        except TooManyClients:
            raise V1Error(429, wire.TOO_MANY_CONNECTIONS, "too many progress streams for this session") from None
        client = attach.client
        try:
            await send({
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    (b"connection", b"keep-alive"),
                ],
            })
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_disconnect, receive, tg.cancel_scope)
                if client is not None:
                    tg.start_soon(self._pings, client, endpoint.hub.frames(session_id))
                await self._stream(send, attach)
                tg.cancel_scope.cancel()
        finally:
            if client is not None:
                endpoint.hub.disconnect(client)
        with anyio.move_on_after(WRITE_TIMEOUT_S):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, send: Send, attach: Attach) -> None:
        async def write(data: bytes) -> bool:
            try:
                with anyio.fail_after(WRITE_TIMEOUT_S):
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            except TimeoutError:
                log.warning("a V1 progress client took no data for %.0f s; its stream ends", WRITE_TIMEOUT_S)
                return False
            return True

        client = attach.client
        if self._leading_newline and not await write(b"\n"):
            return
        for frame in attach.frames:
            if not await write(frame.encode()):
                return
            if frame.terminal and (client is None or self._close_after_turn):
                return
        if client is None:
            return
        while True:
            try:
                frame = await client.receive()
            except anyio.EndOfStream:
                return
            if not await write(frame.encode()):
                return
            if frame.terminal and self._close_after_turn:
                return

    async def _pings(self, client: SseClient, frames: Frames) -> None:
        if self._close_after_turn:  # rcoder sends its first heartbeat at once
            client.offer(frames.ping())
        while not client.cut:
            await anyio.sleep(self._ping_interval)
            client.offer(frames.ping())


async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _body(scope: Scope, receive: Receive) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise invalid("bad Content-Length") from None
            if declared > MAX_BODY:
                raise V1Error(413, wire.PAYLOAD_TOO_LARGE, f"the request body exceeds {MAX_BODY} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(BODY_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Gone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > MAX_BODY:
                    raise V1Error(413, wire.PAYLOAD_TOO_LARGE, f"the request body exceeds {MAX_BODY} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise V1Error(408, wire.REQUEST_TIMEOUT, f"the request body did not arrive within {BODY_TIMEOUT_S:.0f} s") from None


FREE_FORM = ("attachments", "data_source_attachments")
"""The fields of request bodies that hold any JSON (``list[Any]``)."""


async def _read(body: bytes, kind: Any) -> Any:
    """``_decode``, in a worker thread for a large body, as the stdio side decodes large
    params (a 9 MiB body of 3 million empty lists took ~1 s to decode and ~1.6 s to walk)."""
    if len(body) >= THREAD_DECODE_BYTES:
        return await anyio.to_thread.run_sync(_decode, body, kind)
    return _decode(body, kind)


def _decode(body: bytes, kind: Any) -> Any:
    if not body.strip():
        raise invalid("a JSON request body is required")
    try:
        value = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise invalid(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # nested past msgspec's recursion, a field it skips included
        raise invalid(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    if body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH:  # else nothing can nest that deep
        for name in FREE_FORM:
            if json_too_deep(getattr(value, name, None), MAX_JSON_DEPTH):
                raise invalid(f"{name} is nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values and values[0] else None


async def _respond(send: Send, status: int, body: bytes, *, close: bool = False) -> None:
    headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _now() -> str:
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


# -- the server ---------------------------------------------------------------------


class Server(uvicorn.Server):
    """uvicorn without its signal handlers (the sidecar owns SIGTERM/SIGINT) and without its
    own accept path: connections come from sidecar.compat.guard's accept loop."""

    def __init__(
        self, config: uvicorn.Config, *, authorized: Callable[[list[tuple[bytes, bytes]]], bool], head_timeout_s: float
    ) -> None:
        super().__init__(config)
        self.admission = Admission(Caps.from_limits())
        self._authorized = authorized
        self._head_timeout_s = head_timeout_s
        self._accepting = anyio.CancelScope()

    def _protocol(self) -> GuardedProtocol:
        return GuardedProtocol(
            config=self.config, server_state=self.server_state, admission=self.admission,
            authorized=self._authorized, head_timeout_s=self._head_timeout_s,
        )

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve_on(self, sock: socket.socket) -> None:
        """Serve the connections ``sock`` accepts until ``should_exit`` (then shut down)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._accept, sock)
            await self.serve(sockets=[])
            tg.cancel_scope.cancel()

    async def _accept(self, sock: socket.socket) -> None:
        with self._accepting:
            await accept_loop(sock, self.admission, self._protocol)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._accepting.cancel()  # no new connection once the shutdown starts
        await super().shutdown(sockets)

    def abort_connections(self) -> None:
        """Drop every connection still open (a client that stopped reading keeps its
        transport waiting to flush; closing it politely would wait for that client)."""
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()


def listen(host: str, port: int) -> socket.socket:
    """A listening socket (bound here so a busy port is an error of compat:start).

    Made with ``IPPROTO_TCP`` as its protocol: asyncio turns Nagle off (TCP_NODELAY) only
    on sockets that say they are TCP, and ``socket.create_server`` leaves it 0. With Nagle
    on, each small SSE frame waited for the client's delayed ACK (~40 ms, measured)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        if os.name != "nt":  # Windows' SO_REUSEADDR would let another process take the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


class _QuietUvicorn(logging.Filter):
    """What uvicorn's log says of each request, kept to what is worth reading:

    - it warns at every request that proposes an upgrade it does not do; Java's HttpClient
      proposes ``h2c`` on every plain-HTTP request, so those warnings are dropped;
    - it warns at every malformed request (answered 400), which anyone who can connect
      may send at will (32,672 lines in 10 s from one client, measured): the 1st and every
      LOG_EVERY-th are kept, with the count so far (guard.Tally, the guard's own rule).
    """

    UPGRADES = ("Unsupported upgrade request.", "No supported WebSocket library detected.")
    INVALID = "Invalid HTTP request received."

    def __init__(self) -> None:
        super().__init__()
        self.invalid = Tally()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.UPGRADES):
            return False
        if message.startswith(self.INVALID):
            if not self.invalid.add():
                return False
            record.msg = "Invalid HTTP request received (400; %d so far, logged at the 1st and every %dth)"
            record.args = (self.invalid.count, LOG_EVERY)
        return True


_quiet = _QuietUvicorn()


def server(app: V1App, *, head_timeout_s: float) -> Server:
    uvicorn_log = logging.getLogger("uvicorn.error")
    if _quiet not in uvicorn_log.filters:
        uvicorn_log.addFilter(_quiet)
    config = uvicorn.Config(
        app,
        # h11, not httptools: httptools drops the body of a request that proposes an
        # upgrade (Java's HttpClient proposes h2c on every plain-HTTP request; measured)
        http="h11",
        lifespan="off",
        log_config=None,
        access_log=False,
        ws="none",
        interface="asgi3",
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=1,
        limit_concurrency=None,  # the admission caps connections (sidecar.compat.guard)
    )
    config.load()
    return Server(config, authorized=app.authorized, head_timeout_s=head_timeout_s)
