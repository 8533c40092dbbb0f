"""The V1 endpoint's connections: admitted one at a time, capped, and given a deadline for their head.

uvicorn's own accept path (asyncio's ``create_server``) takes every pending connection in
one go, has no deadline for the request head and only a cap that answers 503 once it is
reached: 1,100 connections sending half a request line kept an authenticated caller out
for good, and under a 256-descriptor limit 300 of them left the rest of the process
(stdio, the database, providers) without descriptors. So the endpoint accepts on its own
(``accept_loop``) and hands each connection to uvicorn's HTTP/1.1 protocol, extended here
(``GuardedProtocol``); uvicorn still does everything HTTP. The rules:

- ``Caps.from_limits``: at most ``total`` connections are open at once, derived from
  RLIMIT_NOFILE (a quarter of the descriptors, at least RESERVED_FDS, stay for the rest of
  the process), and at most ``unauthenticated`` (half of them) are connections on which
  no request with the key has come yet;
- a connection is accepted only when there is room: when there is none, the oldest
  unauthenticated connection is dropped to make it (so a caller with the key always gets
  in: its request is read as soon as it is accepted, long before it is the oldest), and
  when every open connection is authenticated, new ones wait in the kernel's queue until
  one closes; the queue is taken in batches, so it drains faster than attackers fill it;
- the request head (request line and headers) must arrive within ``head_timeout_s`` of
  the connection's start, or of the first byte of its next request on a kept-alive
  connection; else the connection is answered 408 and closed. The body has its own
  deadline (sidecar.compat.http);
- a request head (request line, headers, blank line) holds at most MAX_HEAD_BYTES bytes
  and MAX_HEADER_LINES header lines, else it is answered 431 and the connection closes.
  h11's own limit applies only while a head is incomplete: a 100 KiB head arriving in one
  read was parsed whole, in pure Python on the sidecar's loop, and kept while the
  connection lived. So ``HeadLimitedConnection`` counts the bytes of each head as they
  arrive, however the reads are cut, from the start of the connection or of the next
  request on a kept-alive one (pipelined bytes that came with the previous request
  included), and h11 never parses a head past the limits;
- once its response is complete, a request's headers are dropped (the connection may
  stay open, idle, for the keep-alive time);
- a request head carrying the key (sidecar.compat.validate.request_authorized) makes its
  connection authenticated for the rest of its life;
- what any client can repeat at will is logged at its 1st occurrence and every
  LOG_EVERY-th (``Tally``), never once per occurrence.

Must stay true: a descriptor is taken (``accept``) only when the count of open
connections, those dropped but not yet closed and those accepted but not yet handed over
included, is below ``total``; nothing here blocks the event loop; every byte h11 may
parse as a request head has been counted by ``HeadCount`` first (``receive_data`` while
a head is expected, ``start_next_cycle`` for what h11 holds already); nothing in the
application reads a request's headers after its response is complete.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import h11
import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from sidecar.compat import wire

__all__ = [
    "Caps", "Admission", "GuardedProtocol", "HeadCount", "HeadLimitedConnection", "Tally", "accept_loop",
    "RESERVED_FDS", "MAX_HEAD_BYTES", "MAX_HEADER_LINES", "LOG_EVERY",
]

log = logging.getLogger(__name__)

RESERVED_FDS = 128
"""Descriptors always left to the rest of the process (stdio, SQLite and its WAL, provider
and MCP connections, agent pipes, logs), whatever the limit."""
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 4096
NO_LIMIT_FDS = 65536
"""What an unlimited RLIMIT_NOFILE (or a platform without one) counts as."""
WINDOWS_FDS = 2048
MAX_HEAD_BYTES = 16 * 1024
"""The largest request head (request line, headers and the blank line after them)."""
MAX_HEADER_LINES = 100
"""The most header lines a request head may hold."""
LOG_EVERY = 1000


class Tally:
    """How often one thing a client can repeat at will happened, and whether to log this
    time: the 1st and every LOG_EVERY-th (the count goes into the line)."""

    def __init__(self) -> None:
        self.count = 0

    def add(self) -> bool:
        self.count += 1
        return self.count == 1 or self.count % LOG_EVERY == 0


class Caps(msgspec.Struct, frozen=True):
    total: int
    unauthenticated: int

    @classmethod
    def from_limits(cls, soft_limit: int | None = None) -> Caps:
        """The caps for the process's RLIMIT_NOFILE soft limit (or ``soft_limit``)."""
        if soft_limit is None:
            soft_limit = _soft_limit()
        spare = soft_limit - max(RESERVED_FDS, soft_limit // 4)
        total = max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, spare))
        return cls(total=total, unauthenticated=max(MIN_CONNECTIONS // 2, total // 2))


def _soft_limit() -> int:
    if sys.platform == "win32":
        return WINDOWS_FDS
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NO_LIMIT_FDS if soft == resource.RLIM_INFINITY or soft <= 0 else soft


class Admission:
    """The open connections of one endpoint, the unauthenticated ones oldest first."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self._open: set[GuardedProtocol] = set()
        self._waiting: OrderedDict[GuardedProtocol, None] = OrderedDict()
        self._closing: set[GuardedProtocol] = set()
        """Dropped, their descriptors not released yet."""
        self._arriving = 0
        """Accepted, not handed to their protocol yet (their descriptors count)."""
        self._freed = anyio.Event()
        self.dropped = Tally()
        """Unauthenticated connections dropped to make room (for the log)."""
        self.heads_refused = Tally()
        """Request heads past MAX_HEAD_BYTES or MAX_HEADER_LINES (for the log)."""

    @property
    def open_count(self) -> int:
        return len(self._open)

    def accepted(self) -> None:
        self._arriving += 1

    def handed_over(self) -> None:
        self._arriving -= 1
        self._freed.set()
        self._freed = anyio.Event()

    def opened(self, connection: GuardedProtocol) -> None:
        self._open.add(connection)
        self._waiting[connection] = None

    def authenticated(self, connection: GuardedProtocol) -> None:
        self._waiting.pop(connection, None)

    def closed(self, connection: GuardedProtocol) -> None:
        self._open.discard(connection)
        self._closing.discard(connection)
        self._waiting.pop(connection, None)
        self._freed.set()
        self._freed = anyio.Event()

    def make_room(self) -> bool:
        """Whether one more connection may be accepted now. Past a cap, the oldest
        unauthenticated connections are dropped; their descriptors count until they are
        released (False until then: ``wait_freed``)."""
        caps = self.caps
        held = len(self._open) + self._arriving
        while self._waiting and (
            len(self._waiting) + self._arriving >= caps.unauthenticated or held - len(self._closing) >= caps.total
        ):
            oldest, _ = self._waiting.popitem(last=False)
            self._closing.add(oldest)
            if self.dropped.add():
                log.warning(
                    "V1 endpoint: %d connections without the key dropped so far to make room"
                    " (at most %d of %d open connections may be without it)",
                    self.dropped.count, caps.unauthenticated, caps.total,
                )
            oldest.drop()
        return held < caps.total

    async def wait_freed(self) -> None:
        await self._freed.wait()


_BLANK_LINE = re.compile(rb"\n\r?\n")
"""Where h11 ends a request head (it takes a bare LF as a line end too)."""


class HeadCount:
    """The bytes and lines of one request head, counted as they arrive, however the reads
    are cut. Looks at no more than MAX_HEAD_BYTES + 1 bytes of a head, and at nothing once
    the head is complete (what follows is a body or the next request)."""

    __slots__ = ("size", "newlines", "complete", "_tail")

    def __init__(self) -> None:
        self.size = 0
        self.newlines = 0
        self.complete = False
        self._tail = b""

    def feed(self, data: bytes) -> bool:
        """Count ``data`` as the next bytes of the head; False once the head is past a limit."""
        if self.complete or not data:
            return True
        window = data[: MAX_HEAD_BYTES - self.size + 1]  # one byte more shows the limit passed
        tail = self._tail
        found = _BLANK_LINE.search(tail + window) if tail else _BLANK_LINE.search(window)
        if found is not None:
            window = window[: found.end() - len(tail)]  # a match never lies in the tail alone
            self.complete = True
        self.size += len(window)
        self.newlines += window.count(b"\n")
        self._tail = (tail + window)[-2:]
        # the request line's end is a newline, and so is the blank line's
        header_lines = self.newlines - (2 if self.complete else 1)
        return self.size <= MAX_HEAD_BYTES and header_lines <= MAX_HEADER_LINES


class HeadLimitedConnection(h11.Connection):
    """h11's server side, which counts every request head before parsing it. Past a limit
    it takes no more data and ``next_event`` answers PAUSED: ``refused`` is set and the
    protocol answers 431."""

    def __init__(self) -> None:
        super().__init__(h11.SERVER)
        self.head = HeadCount()
        self.refused = False

    def receive_data(self, data: bytes) -> None:
        if self.refused:
            return
        if not self.head.feed(data):
            self.refused = True
            return
        super().receive_data(data)

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.head = HeadCount()
        pending, _ = self.trailing_data  # the next request's first bytes, if they came already
        if pending and not self.head.feed(pending):
            self.refused = True

    def next_event(self) -> h11.Event | type[h11.NEED_DATA | h11.PAUSED]:
        if self.refused:
            return h11.PAUSED
        return super().next_event()


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline and size limits for each request head,
    the key noted, and each request's headers dropped after its response."""

    def __init__(
        self,
        *,
        config: Config,
        server_state: ServerState,
        admission: Admission,
        authorized: Callable[[list[tuple[bytes, bytes]]], bool],
        head_timeout_s: float,
    ) -> None:
        super().__init__(config=config, server_state=server_state, app_state={})
        self.conn = self._conn = HeadLimitedConnection()
        self._admission = admission
        self._authorized = authorized
        self._head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None
        self._seen_cycle: Any = None
        self.authenticated = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._admission.opened(self)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)  # -> handle_events

    def handle_events(self) -> None:
        """uvicorn's, after new data or a complete response (a pipelined request)."""
        super().handle_events()
        if self._conn.refused:
            self._refuse_head()
            return
        cycle = self.cycle
        if cycle is not None and cycle is not self._seen_cycle:  # a request head was read
            self._seen_cycle = cycle
            self._disarm()
            if not self.authenticated and self._authorized(self.headers):
                self.authenticated = True
                self._admission.authenticated(self)

    def on_response_complete(self) -> None:
        # the protocol, its cycle and the request's scope share this list: emptied, the
        # headers are not kept while the connection waits for its next request
        if self.headers is not None:
            self.headers.clear()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._admission.closed(self)
        super().connection_lost(exc)

    def drop(self) -> None:
        """Close at once, unread and unanswered (to make room for another connection)."""
        self._disarm()
        self.transport.abort()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            self._answer_and_close(
                b"408 Request Timeout", wire.REQUEST_TIMEOUT,
                f"the request head did not arrive within {self._head_timeout_s:g} s",
            )
        else:
            self.transport.close()

    def _refuse_head(self) -> None:
        """431 and close: the head being read is past a limit (no response is under way:
        a head is counted only while the previous request's response is complete)."""
        if self.transport.is_closing():
            return
        self._disarm()
        refused = self._admission.heads_refused
        if refused.add():
            log.warning(
                "V1 endpoint: %d request heads refused so far (431: over %d bytes or %d header lines)",
                refused.count, MAX_HEAD_BYTES, MAX_HEADER_LINES,
            )
        self._answer_and_close(
            b"431 Request Header Fields Too Large", wire.HEADERS_TOO_LARGE,
            f"the request head exceeds {MAX_HEAD_BYTES} bytes or {MAX_HEADER_LINES} header lines",
        )

    def _answer_and_close(self, status: bytes, code: str, message: str) -> None:
        body = wire.error(code, message)
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (status, len(body), body)
        )
        self.transport.close()


MAX_ACCEPT_BATCH = 64
"""Connections taken from the kernel's queue per wake-up (at most an eighth of the
unauthenticated cap, so one batch can never drop a connection whose head is about to be
read): a queue that drains faster than attackers fill it keeps the wait of the caller with
the key short."""


async def accept_loop(
    listener: socket.socket, admission: Admission, protocol: Callable[[], GuardedProtocol]
) -> None:
    """Accept connections on ``listener`` for as long as it runs, each only when the
    admission has room, and hand each to a new ``protocol()``."""
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    failures = 0

    async def hand_over(conn: socket.socket) -> None:
        try:
            await loop.connect_accepted_socket(protocol, conn)
        except OSError as exc:
            log.info("V1 endpoint: a connection closed before it was set up: %s", exc)
            conn.close()
        finally:
            admission.handed_over()

    batch = max(1, min(MAX_ACCEPT_BATCH, admission.caps.unauthenticated // 8))
    async with anyio.create_task_group() as tg:
        while True:
            await anyio.wait_readable(listener)
            for _ in range(batch):
                while not admission.make_room():
                    await admission.wait_freed()
                try:
                    conn, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break  # the queue is empty (or the client gave up)
                except OSError as exc:  # out of descriptors despite the reserve, or a connection aborted
                    failures += 1
                    if failures == 1 or failures % 100 == 0:
                        log.warning("V1 endpoint: accepting a connection failed (%d times): %s", failures, exc)
                    await anyio.sleep(0.05)
                    break
                conn.setblocking(False)
                admission.accepted()
                tg.start_soon(hand_over, conn)
