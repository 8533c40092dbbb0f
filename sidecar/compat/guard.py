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
- a request head carrying the key (sidecar.compat.validate.request_authorized) makes its
  connection authenticated for the rest of its life.

Must stay true: a descriptor is taken (``accept``) only when the count of open
connections, those dropped but not yet closed and those accepted but not yet handed over
included, is below ``total``; nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from sidecar.compat import wire

__all__ = ["Caps", "Admission", "GuardedProtocol", "accept_loop", "RESERVED_FDS"]

log = logging.getLogger(__name__)

RESERVED_FDS = 128
"""Descriptors always left to the rest of the process (stdio, SQLite and its WAL, provider
and MCP connections, agent pipes, logs), whatever the limit."""
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 4096
NO_LIMIT_FDS = 65536
"""What an unlimited RLIMIT_NOFILE (or a platform without one) counts as."""
WINDOWS_FDS = 2048


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
        self.dropped = 0
        """Unauthenticated connections dropped to make room (for the log)."""

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
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "V1 endpoint: %d connections without the key dropped so far to make room"
                    " (at most %d of %d open connections may be without it)",
                    self.dropped, caps.unauthenticated, caps.total,
                )
            oldest.drop()
        return held < caps.total

    async def wait_freed(self) -> None:
        await self._freed.wait()


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request head and the key noted."""

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
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and cycle is not self._seen_cycle:  # a request head was read
            self._seen_cycle = cycle
            self._disarm()
            if not self.authenticated and self._authorized(self.headers):
                self.authenticated = True
                self._admission.authenticated(self)

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
            body = wire.error(
                wire.REQUEST_TIMEOUT, f"the request head did not arrive within {self._head_timeout_s:g} s"
            )
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
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
