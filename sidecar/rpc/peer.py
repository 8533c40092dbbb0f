"""JsonRpcPeer: one JSON-RPC 2.0 endpoint over a pair of byte streams (NDJSON).

The same class serves our stdio server and the client side of ACP and MCP: it answers
incoming requests from an optional handler table (none = every method is -32601) and
sends requests and notifications of its own.

    async with JsonRpcPeer(receive_stream, send_stream, handlers) as peer:
        result = await peer.request("initialize", params, result_type=InitResult)
        await peer.notify("session/cancel", params)
        await peer.closed.wait()      # the other side went away

What a line holds is sidecar.rpc.parse's to say (a message, a batch, or the error that
answers it); routing is by shape (``messages.classify``): method + id is a request to us,
method only a notification, id without method a response to one of ours. Our ids count
up from 0; an incoming request may reuse an id we are waiting on without confusion. A
batch's replies go out together as one bounded line (sidecar.rpc.batch).

What must stay true:
- every incoming request runs in its own cancel scope on a task of the peer's task group
  and gets exactly one reply, even when it is cancelled (``$/cancelRequest`` or shutdown
  -> REQUEST_CANCELLED); cancellation of the peer itself always propagates;
- at most ``max_concurrent`` tasks run requests, batch items included; more requests
  wait in arrival order (a worker that finishes takes the next one), while reading goes
  on, so responses to our own requests and cancels are never stuck behind busy handlers;
- bad input never ends the peer: each bad line gets its error reply (or none, for a
  notification) and reading goes on; a line over the size limit, or nested deeper than
  msgspec can decode, is answered with the id its first KiB shows
  (``messages.scan_head``), so the caller's request still settles, and such a response
  to one of our requests fails that request; a line whose text holds a lone surrogate is
  answered with its id too;
- nothing we send can end the peer: a reply that cannot be encoded (too deep, a type
  msgspec does not know, anything) is logged and answered INTERNAL_ERROR, a notification
  that cannot be encoded is logged and dropped, a request of ours that cannot be encoded
  fails with RpcError;
- only the LineWriter's task writes to the send stream;
- when input ends, every pending outgoing request fails at once with PeerClosed;
- leaving the ``async with`` block normally (or ``drain_incoming``) stops reading, still
  handles the lines that had arrived by then (split, or waiting in a stdio input), lets
  in-flight requests finish (``shutdown_grace`` seconds, then cancels them), writes out
  everything queued, and closes the send stream.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import msgspec

from protocol.errors import ErrorCode
from protocol.common import CANCEL_REQUEST, CancelRequestParams
from sidecar.errors import PeerClosed, RemoteError, RpcError
from sidecar.rpc.dispatch import Dispatcher, Handlers
from sidecar.config import DEFAULT_MAX_LINE_BYTES
from sidecar.rpc.batch import BatchAnswer
from sidecar.rpc.framing import (
    OVERSIZED_HEAD_BYTES,
    Line,
    LineFilter,
    LineReader,
    LineWriter,
    OversizedLine,
    ReceiveStream,
    SendStream,
    WriterClosed,
)
from sidecar.rpc.messages import (
    ABSENT,
    Envelope,
    ErrorObject,
    Incoming,
    OutError,
    OutNotification,
    OutRequest,
    Reply,
    encode,
    error_decoder,
    error_reply,
    reply_id,
    scan_head,
    show,
)
from sidecar.rpc.parse import BatchItem, Unreadable, parse_line

logger = logging.getLogger(__name__)

CANCEL_METHOD = CANCEL_REQUEST
_cancel_params_decoder = msgspec.json.Decoder(CancelRequestParams)


def _cancel_request_params(request_id: int) -> CancelRequestParams:
    return CancelRequestParams(id=request_id)


def _id_key(request_id: Any) -> tuple[bool, Any]:
    # 1 and "1" are different ids; a tuple keeps them apart in one dict.
    return (isinstance(request_id, str), request_id)


class _Pending:
    __slots__ = ("event", "envelope")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.envelope: Envelope | None = None


_Slot = tuple[BatchAnswer, int] | None
"""Where a request's reply goes: its place in a batch, or None (a line of its own)."""
_Item = tuple[Envelope, tuple[bool, Any], "_Inflight", _Slot]


class _Inflight:
    __slots__ = ("scope", "reason")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.reason = "request cancelled"


class JsonRpcPeer:
    def __init__(
        self,
        receive_stream: ReceiveStream,
        send_stream: SendStream,
        handlers: Handlers | None = None,
        *,
        name: str = "rpc",
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_queue: int = 1024,
        autostart: bool = True,
        shutdown_grace: float = 5.0,
        cancel_method: str | None = CANCEL_METHOD,
        cancel_params: Callable[[int], Any] | None = None,
        max_concurrent: int = 64,
        line_filter: LineFilter | None = None,
        reader: LineReader | None = None,
    ) -> None:
        """``autostart=False`` delays reading until ``start_reading()`` (so handlers can be
        added once the services they call exist); ``cancel_method`` is the notification
        sent when one of our requests is cancelled or times out (None: send nothing) and
        ``cancel_params`` its params from the request's id (MCP names it ``requestId``);
        ``max_concurrent`` bounds the tasks running incoming requests (more wait in order);
        ``line_filter`` is a stage every input line passes first (framing.LineReader);
        ``reader``: the LineReader of ``receive_stream`` already in use (lines it holds are
        read first), instead of a new one."""
        self.name = name
        self.max_line_bytes = max_line_bytes
        self.dispatcher = Dispatcher(handlers)
        self.shutdown_grace = shutdown_grace
        self.cancel_method = cancel_method
        self.cancel_params = cancel_params or _cancel_request_params
        self.closed = anyio.Event()
        """Set when the other side is gone: our input ended (EOF, read error,
        ``stop_reading``) or our output broke."""
        self._receive_stream = receive_stream
        self._reader = reader or LineReader(receive_stream, max_line_bytes, line_filter=line_filter)
        self._writer = LineWriter(send_stream, max_queue, on_broken=self._on_output_broken)
        self._autostart = autostart
        self._next_id = 0
        self._pending: dict[int, _Pending] = {}
        self._inflight: dict[tuple[bool, Any], _Inflight] = {}
        self._notification_scopes: set[anyio.CancelScope] = set()
        self.max_concurrent = max(1, max_concurrent)
        self._queued: deque[_Item] = deque()
        self._workers = 0
        self._tasks: anyio.abc.TaskGroup | None = None
        self._reader_scope: anyio.CancelScope | None = None
        self._reader_done = anyio.Event()
        self._draining = False
        """The drain has begun: lines the reader already holds are answered, then it stops."""
        self._active = 0
        self._idle: anyio.Event | None = None
        self._input_ended = False
        self._stack: AsyncExitStack | None = None

    # ---- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> JsonRpcPeer:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await stack.enter_async_context(self._running())
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._stack is not None
        stack, self._stack = self._stack, None
        return await stack.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        writer_done = anyio.Event()

        async def run_writer() -> None:
            try:
                await self._writer.run()
            finally:
                writer_done.set()

        async with anyio.create_task_group() as outer:
            outer.start_soon(run_writer)
            try:
                async with anyio.create_task_group() as tasks:
                    self._tasks = tasks
                    if self._autostart:
                        self.start_reading()
                    yield
                    # Normal exit only (an exception skips this and cancels the tasks).
                    await self.drain_incoming()
            finally:
                self._tasks = None
                self._input_done()
                self._writer.close()
                with anyio.CancelScope(shield=True):
                    await _close_quietly(self._receive_stream)
            with anyio.move_on_after(self.shutdown_grace, shield=True):
                await writer_done.wait()
            outer.cancel_scope.cancel()

    def start_reading(self) -> None:
        if self._tasks is None:
            raise RuntimeError("start_reading() needs a running peer (inside `async with`)")
        if self._reader_scope is None and not self._input_ended:
            self._reader_scope = anyio.CancelScope()
            self._tasks.start_soon(self._read_loop, self._reader_scope)

    def stop_reading(self) -> None:
        """Read no more input (already dispatched requests go on)."""
        if self._reader_scope is not None:
            self._reader_scope.cancel()
        else:
            self._input_done()
            self._reader_done.set()

    async def drain_incoming(self) -> None:
        """Stop reading, then wait for in-flight incoming work to answer; after
        ``shutdown_grace`` seconds cancel what is left (answered REQUEST_CANCELLED).
        The lines that had arrived when the drain began (split by the reader, or waiting
        in the input) are still handled, so a request pipelined behind a shutdown gets
        its answer (BUSY, from the server's handlers) instead of none."""
        self._draining = True
        self.stop_reading()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self.shutdown_grace):
                await self._reader_done.wait()
                await self._wait_idle()
            for inflight in list(self._inflight.values()):
                inflight.reason = "request cancelled: the server is shutting down"
                inflight.scope.cancel()
            for scope in list(self._notification_scopes):
                scope.cancel()
            with anyio.move_on_after(self.shutdown_grace):
                await self._wait_idle()

    async def _wait_idle(self) -> None:
        while self._active:
            self._idle = anyio.Event()
            await self._idle.wait()

    def _input_done(self) -> None:
        if self._input_ended:
            return
        self._input_ended = True
        for pending in self._pending.values():
            pending.event.set()  # envelope None: the requester raises PeerClosed
        self.closed.set()

    def _on_output_broken(self) -> None:
        self.closed.set()

    # ---- outgoing -----------------------------------------------------------------------

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (``params``: a Struct or plain values; None = no params).

        A notification to a peer that is gone is dropped (logged at debug level):
        notifications are fire-and-forget and the sender has nothing to recover.
        """
        try:
            line = encode(OutNotification(method=method, params=msgspec.UNSET if params is None else params))
        except Exception:  # never fatal: the event is lost, the process goes on
            logger.exception("%s: notification %s could not be encoded; dropped", self.name, method)
            return
        try:
            await self._writer.send(line)
        except WriterClosed:
            logger.debug("%s: dropped notification %s, output closed", self.name, method)

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        result_type: Any = None,
        timeout: float | None = None,
        announce_cancel: bool = True,
    ) -> Any:
        """Send a request and wait for its response.

        Returns the result decoded into ``result_type`` (plain JSON values if None).
        Raises RemoteError (code/message/data as received) for an error response,
        PeerClosed when the peer goes away first, TimeoutError after ``timeout``
        seconds, RpcError when the result does not decode into ``result_type``.
        A timed-out or cancelled request is announced to the peer with ``cancel_method``
        (unless ``announce_cancel`` is false: MCP's ``initialize`` must not be cancelled).
        """
        if self._input_ended or self._writer.broken:
            raise PeerClosed(f"{self.name}: the peer is closed")
        request_id = self._next_id
        self._next_id += 1
        try:
            line = encode(OutRequest(id=request_id, method=method, params=msgspec.UNSET if params is None else params))
        except Exception as exc:
            raise RpcError(f"{self.name}: the params of {method} cannot be encoded: {type(exc).__name__}") from exc
        pending = _Pending()
        self._pending[request_id] = pending
        try:
            try:
                await self._writer.send(line)
            except WriterClosed:
                raise PeerClosed(f"{self.name}: the peer is closed") from None
            try:
                with anyio.fail_after(timeout) if timeout is not None else anyio.CancelScope():
                    await pending.event.wait()
            except BaseException:
                if pending.envelope is None and self.cancel_method and announce_cancel and not self._input_ended:
                    cancel = OutNotification(method=self.cancel_method, params=self.cancel_params(request_id))
                    self._writer.send_nowait(encode(cancel))
                raise
        finally:
            del self._pending[request_id]
        envelope = pending.envelope
        if envelope is None:
            raise PeerClosed(f"{self.name}: the peer closed before answering {method}")
        if envelope.error is not ABSENT:
            raise _remote_error(method, envelope.error)
        if envelope.result is ABSENT:
            raise RpcError(f"{self.name}: malformed response to {method}: no result")
        try:
            if result_type is None:
                return msgspec.json.decode(envelope.result)
            return msgspec.json.decode(envelope.result, type=result_type)
        except msgspec.DecodeError as exc:  # ValidationError included
            raise RpcError(f"{self.name}: invalid result for {method}: {exc}") from exc
        except RecursionError as exc:
            raise RpcError(f"{self.name}: invalid result for {method}: nested too deep") from exc

    # ---- incoming -----------------------------------------------------------------------

    async def _read_loop(self, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                while True:
                    try:
                        line = await self._reader.receive()
                    except anyio.EndOfStream:
                        logger.debug("%s: end of input", self.name)
                        return
                    except OSError as exc:
                        logger.warning("%s: reading input failed: %r", self.name, exc)
                        return
                    await self._take(line)
            if self._draining:
                # the drain: the lines that have arrived (what the reader holds and what the
                # input has waiting) are still handled; nothing more is read
                self._reader.feed_waiting()
                while (arrived := self._reader.next_ready()) is not None:
                    await self._take(arrived)
        finally:
            self._input_done()
            self._reader_done.set()

    async def _take(self, line: Line) -> None:
        if isinstance(line, OversizedLine):
            await self._on_oversized(line)
            return
        try:
            await self._handle_line(line)
        except Exception:
            # A bug in routing must not end the connection: log it, answer, read on.
            logger.exception("%s: failed to handle an input line", self.name)
            await self._send_reply(error_reply(None, ErrorCode.INTERNAL_ERROR, "internal error"))

    async def _on_oversized(self, line: OversizedLine) -> None:
        message = (
            f"message too large: {line.size} bytes, the limit is {self.max_line_bytes}"
            " (--max-line-bytes; attachments travel as base64, 4/3 of their size)"
        )
        await self._reject_unreadable(line.head, ErrorCode.MESSAGE_TOO_LARGE, message)

    async def _reject_unreadable(self, head: bytes, code: ErrorCode, message: str) -> None:
        """A line that cannot be read whole (too large, nested too deep) is answered with
        the id its first bytes show (so the caller's request settles), or null; such a
        response to one of our requests fails that request instead."""
        info = scan_head(head[:OVERSIZED_HEAD_BYTES])
        if info.is_response and not info.has_method:
            pending = self._pending.get(info.id) if type(info.id) is int else None
            if pending is not None and pending.envelope is None:
                error = ErrorObject(int(code), message)
                pending.envelope = Envelope(id=info.id, error=msgspec.Raw(encode(error)[:-1]))
                pending.event.set()
            logger.warning("%s: response to id %s dropped: %s", self.name, show(info.id), message)
            return  # a response is never answered
        await self._send_reply(error_reply(info.id, code, message))

    async def _handle_line(self, line: bytes) -> None:
        parsed = parse_line(line)
        if parsed is None:
            return
        if isinstance(parsed, Unreadable):
            await self._reject_unreadable(parsed.head, parsed.code, parsed.message)
        elif isinstance(parsed, list):
            await self._start_batch(parsed)
        elif isinstance(parsed, Incoming):
            reply = self._route(parsed)
            if reply is not None:
                await self._send_reply(reply)
        else:
            await self._send_reply(parsed)

    def _route(self, incoming: Incoming) -> Reply | None:
        """Handle one message; returns an immediate reply (errors found without a handler)."""
        envelope = incoming.envelope
        kind = incoming.kind
        if kind == "request":
            key = _id_key(envelope.id)
            if key in self._inflight:
                return error_reply(
                    reply_id(envelope), ErrorCode.INVALID_REQUEST, f"invalid request: id {show(envelope.id)} is already in flight"
                )
            inflight = _Inflight()
            self._inflight[key] = inflight  # registered now, so a cancel right behind it finds it
            self._start_request(envelope, key, inflight)
        elif kind == "notification":
            self._on_notification(envelope)
        elif kind == "response":
            self._on_response(envelope)
        elif kind == "invalid_params":
            if envelope.id is msgspec.UNSET:
                logger.warning("%s: notification %s dropped: %s", self.name, show(envelope.method), incoming.reason)
                return None
            return error_reply(envelope.id, ErrorCode.INVALID_PARAMS, incoming.reason)
        elif kind == "dropped":
            logger.warning("%s: message dropped: %s", self.name, incoming.reason)
        else:
            return error_reply(reply_id(envelope), ErrorCode.INVALID_REQUEST, f"invalid request: {incoming.reason}")
        return None

    def _spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        assert self._tasks is not None
        self._active += 1
        self._tasks.start_soon(self._tracked, func, *args)

    async def _tracked(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await func(*args)
        finally:
            self._active -= 1
            if not self._active and self._idle is not None:
                self._idle.set()

    def _start_request(
        self, envelope: Envelope, key: tuple[bool, Any], inflight: _Inflight, slot: _Slot = None
    ) -> None:
        # A bounded set of worker tasks runs requests, each in its own cancel scope: a
        # client pipelining thousands of requests costs a queue entry each, not a task
        # each (thousands of live tasks made the garbage collector the bottleneck).
        # Reading goes on meanwhile, so responses and cancels are never stuck behind them.
        # Batch items take the same workers (``slot`` says where their reply goes).
        if self._workers < self.max_concurrent:
            self._workers += 1
            self._spawn(self._request_worker, (envelope, key, inflight, slot))
        else:
            self._queued.append((envelope, key, inflight, slot))

    def _answer_if_queued(self, inflight: _Inflight) -> None:
        """A cancelled request still waiting for a worker is answered now, not when its turn comes."""
        for item in self._queued:
            if item[2] is inflight:
                self._queued.remove(item)
                envelope, key, _, slot = item
                del self._inflight[key]
                self._spawn(self._deliver, slot, error_reply(envelope.id, ErrorCode.REQUEST_CANCELLED, inflight.reason))
                return

    async def _request_worker(self, item: _Item | None) -> None:
        try:
            while item is not None:
                envelope, key, inflight, slot = item
                await self._deliver(slot, await self._answer(envelope, key, inflight))
                item = self._queued.popleft() if self._queued else None
        finally:
            self._workers -= 1

    async def _deliver(self, slot: _Slot, reply: Reply) -> None:
        if slot is None:
            await self._send_reply(reply)
            return
        batch, index = slot
        batch.put(index, reply)
        batch.waiting -= 1
        if batch.waiting == 0:
            await self._send_batch(batch)

    async def _answer(self, envelope: Envelope, key: tuple[bool, Any], inflight: _Inflight) -> Reply:
        reply: Reply | None = None
        try:
            if inflight.scope.cancel_called:  # cancelled while it waited for a worker
                return error_reply(envelope.id, ErrorCode.REQUEST_CANCELLED, inflight.reason)
            with inflight.scope:
                reply = await self.dispatcher.dispatch(envelope.method, envelope.params, envelope.id)
        finally:
            del self._inflight[key]
        if reply is None:
            return error_reply(envelope.id, ErrorCode.REQUEST_CANCELLED, inflight.reason)
        return reply

    async def _start_batch(self, items: list[BatchItem]) -> None:
        """Route every item; requests go to the shared workers and the batch reply is sent
        when the last of them is answered (at once if it holds none)."""
        batch = BatchAnswer(len(items), self._encode_reply)
        requests: list[tuple[int, Envelope, tuple[bool, Any], _Inflight]] = []
        for index, item in enumerate(items):
            if not isinstance(item, Incoming):
                batch.put(index, item)
                continue
            envelope = item.envelope
            if item.kind == "request" and _id_key(envelope.id) not in self._inflight:
                key = _id_key(envelope.id)
                inflight = _Inflight()
                self._inflight[key] = inflight
                requests.append((index, envelope, key, inflight))
            else:
                reply = self._route(item)
                if reply is not None:
                    batch.put(index, reply)
        if not requests:
            await self._send_batch(batch)
            return
        batch.waiting = len(requests)
        for index, envelope, key, inflight in requests:
            self._start_request(envelope, key, inflight, (batch, index))

    async def _send_batch(self, batch: BatchAnswer) -> None:
        line = batch.line()
        if line is not None:
            await self._send_line(line)

    def _on_notification(self, envelope: Envelope) -> None:
        method = envelope.method
        if method == CANCEL_METHOD:
            try:
                params = _cancel_params_decoder.decode(envelope.params)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
                logger.warning("%s: ignoring malformed %s: %s", self.name, CANCEL_METHOD, exc)
                return
            inflight = self._inflight.get(_id_key(params.id))
            if inflight is not None:
                inflight.scope.cancel()
                self._answer_if_queued(inflight)
            return
        if method not in self.dispatcher:
            logger.debug("%s: ignoring notification for unknown method %r", self.name, method)
            return
        self._spawn(self._run_notification, envelope)

    async def _run_notification(self, envelope: Envelope) -> None:
        with anyio.CancelScope() as scope:
            self._notification_scopes.add(scope)
            try:
                reply = await self.dispatcher.dispatch(envelope.method, envelope.params, None)
            finally:
                self._notification_scopes.discard(scope)
        if isinstance(reply, OutError):
            logger.warning("%s: notification %s failed: %s", self.name, envelope.method, reply.error.message)

    def _on_response(self, envelope: Envelope) -> None:
        request_id = envelope.id
        pending = self._pending.get(request_id) if type(request_id) is int else None
        if pending is None:
            if envelope.error is not ABSENT:
                logger.warning(
                    "%s: error reply to unknown id %s dropped: %s",
                    self.name, show(request_id), bytes(envelope.error)[:300].decode("utf-8", "replace"),
                )
            else:
                logger.warning("%s: response to unknown id %s dropped", self.name, show(request_id))
            return
        pending.envelope = envelope
        pending.event.set()

    # ---- writing replies ---------------------------------------------------------------

    async def _send_reply(self, reply: Reply) -> None:
        await self._send_line(self._encode_reply(reply))

    async def _send_line(self, line: bytes) -> None:
        try:
            await self._writer.send(line)
        except WriterClosed:
            logger.debug("%s: output closed, reply dropped", self.name)

    def _encode_reply(self, reply: Reply) -> bytes:
        try:
            return encode(reply)
        except Exception:  # RecursionError, TypeError, EncodeError...: never fatal
            logger.exception("%s: the reply to request %s could not be encoded", self.name, show(reply.id))
            return encode(error_reply(reply.id, ErrorCode.INTERNAL_ERROR, "internal error: unencodable result"))


async def _close_quietly(stream: ReceiveStream) -> None:
    try:
        await stream.aclose()
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


def _remote_error(method: str, raw_error: msgspec.Raw) -> RpcError:
    try:
        error = error_decoder.decode(raw_error)
    except (msgspec.DecodeError, RecursionError):
        return RpcError(f"malformed error response to {method}")
    data = None if error.data is msgspec.UNSET else error.data
    try:
        code: Any = ErrorCode(error.code)
    except ValueError:
        code = error.code  # a code outside our table is passed on as the peer sent it
    return RemoteError(error.message, code=code, data=data)
