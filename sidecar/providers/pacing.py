"""Read pacing for the providers' connections: many streams at once, fewer, larger reads.

A model streams a delta every few milliseconds; read as it arrives, each delta costs the
event loop a wakeup of its own (the socket's readiness, a receive, a task switch, a read
timeout armed and disarmed) whatever the delta holds. With tens of replies streaming at
once those wakeups are most of the loop's work, and every request of the client waits
behind them. ``PacedBackend`` wraps the HTTP client's network backend so that, while many
provider connections are reading at once, a connection's next read waits until its
previous read is ``pace`` old: the deltas that arrived meanwhile are in the socket buffer
and come in with one read.

The pace grows with the number of connections reading at once (``PACE_PER_READER_S``
each, capped at ``MAX_PACE_S``): one stream is read as before; with fifty, each is read at
most every ``MAX_PACE_S``, which is the relay's default coalescing window (the renderer
gets merged deltas at that rate anyway).

Must stay true:
- a read is delayed, never dropped or split: the bytes, their order and every error
  (timeouts included) are the inner stream's; the delay is bounded by ``MAX_PACE_S`` and
  cancellable;
- the first reads after a request is written (the response's head and first bytes) are
  never delayed, so the first delta of a reply goes out as soon as it arrives;
- a read that filled its buffer is followed at once (a fast stream is never throttled);
- the read timeout still counts from the read itself, not from the pause before it.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable
from typing import Any

import anyio
import httpcore2
import httpx2

__all__ = ["MAX_PACE_S", "PACE_PER_READER_S", "PacedBackend", "pace_client", "pace_for"]

PACE_PER_READER_S = 0.001
"""What each connection reading at once adds to the pause between a connection's reads."""
MAX_PACE_S = 0.040
"""The longest pause between two reads of one connection (the default ``deltaCoalesceMs``)."""
UNPACED_READS = 2
"""Reads after each write that are never delayed (the response's head, its first bytes)."""

_clock = time.monotonic
_sleep = anyio.sleep


def pace_for(readers: int) -> float:
    """The pause between two reads of one connection while ``readers`` connections read."""
    if readers <= 1:
        return 0.0
    return min(MAX_PACE_S, readers * PACE_PER_READER_S)


class _Readers:
    """How many paced connections are reading (inside ``read``, its pause included)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class _PacedStream(httpcore2.AsyncNetworkStream):
    __slots__ = ("_inner", "_readers", "_last", "_unpaced")

    def __init__(self, inner: httpcore2.AsyncNetworkStream, readers: _Readers) -> None:
        self._inner = inner
        self._readers = readers
        self._last = 0.0
        """When the previous read returned (monotonic); 0: it filled its buffer, or none yet."""
        self._unpaced = UNPACED_READS

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        readers = self._readers
        readers.count += 1
        try:
            if self._unpaced > 0:
                self._unpaced -= 1
            elif self._last:
                delay = self._last + pace_for(readers.count) - _clock()
                if delay > 0:
                    await _sleep(delay)
            data = await self._inner.read(max_bytes, timeout)
        finally:
            readers.count -= 1
        self._last = 0.0 if len(data) >= max_bytes else _clock()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._unpaced = UNPACED_READS  # a new request: its answer's first reads go at once
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        inner = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _PacedStream(inner, self._readers)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


_READERS = _Readers()
"""Every provider connection of the process counts in one number."""


class PacedBackend(httpcore2.AsyncNetworkBackend):
    """``inner``'s connections, their reads paced (see the module docstring); ``readers``:
    the count they share (by default the process's, every provider's client)."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend, readers: _Readers | None = None) -> None:
        self._inner = inner
        self._readers = _READERS if readers is None else readers

    @property
    def readers(self) -> int:
        return self._readers.count

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        return _PacedStream(stream, self._readers)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)
        return _PacedStream(stream, self._readers)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def pace_client(client: httpx2.AsyncClient) -> bool:
    """Pace the reads of ``client``'s own connections (its default transport's pool; mounts
    and test transports are left as they are). httpx2 takes no network backend through its
    public API, so this wraps the pool's (``_network_backend``, read when a connection is
    opened); False when that is not there (another httpx2: reads are simply not paced)."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(backend, httpcore2.AsyncNetworkBackend):
        return False
    if not isinstance(backend, PacedBackend):
        setattr(pool, "_network_backend", PacedBackend(backend))
    return True

