"""NDJSON framing: bytes -> lines (with a size limit) and lines -> bytes (one writer).

``LineReader`` splits a byte stream on ``\\n``: the one NDJSON splitter of the process
(our stdin, ACP agents, MCP stdio servers). An optional filter stage (``line_filter``)
sees every line, oversized ones included, and passes it on, replaces it, or drops it
(``None``): a peer that is not our client uses it to drop junk (sidecar/children/lines.py).
What must stay true:
- memory is bounded by ``max_line_bytes`` plus one chunk: a line that grows past the
  limit is dropped as it streams (never buffered whole) and reported once, when its end
  is reached, as an ``OversizedLine`` with its total size and its first
  OVERSIZED_HEAD_BYTES (so the peer can still name the request it answers);
- the same bytes decode to the same lines however they are chunked (one byte at a time,
  split mid-line, many lines per chunk);
- bytes after the last newline at end of input count as a final line.

``LineWriter`` owns the send stream: every outgoing line goes through its queue and one
task (``run``) writes them. It writes whatever is queued as one concatenated write, so
the stream is written (flushed) only when the queue is empty, never once per message
when messages come in bursts. After ``close()`` it drains the queue, then closes the
stream. A write failure (the reader of our output went away) marks the writer broken:
queued and later lines are dropped, since nobody can read them anyway.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import anyio

from sidecar.config import DEFAULT_MAX_LINE_BYTES
from sidecar.logging_setup import EarlyLogger

if TYPE_CHECKING:  # anyio's stream ABCs cost the first answers ~2 ms; only the types need them
    from anyio.abc import ByteReceiveStream, ByteSendStream, ObjectReceiveStream, ObjectSendStream

    from sidecar.rpc.stdio import FdReceiveStream, FdSendStream

logger = EarlyLogger(__name__)

OVERSIZED_HEAD_BYTES = 1024
"""How much of a discarded line is kept (where a request's ``"id"`` usually is)."""
WRITE_BATCH_BYTES = 1024 * 1024
"""Upper bound on one concatenated write, so a burst does not build one huge buffer."""

ReceiveStream: TypeAlias = "ByteReceiveStream | ObjectReceiveStream[bytes] | FdReceiveStream"
SendStream: TypeAlias = "ByteSendStream | ObjectSendStream[bytes] | FdSendStream"
"""Byte streams (our stdio's, sidecar/rpc/stdio.py, among them), or memory object streams of
bytes (in-process pairs in tests)."""


class OversizedLine:
    """A line longer than the limit was discarded; ``size`` is its length in bytes,
    ``head`` its first OVERSIZED_HEAD_BYTES (not part of equality). A plain class: this
    module is read before the first answers, which a dataclass would cost ~1.5 ms."""

    __slots__ = ("size", "head")

    def __init__(self, size: int, head: bytes = b"") -> None:
        self.size = size
        self.head = head

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OversizedLine) and other.size == self.size

    def __hash__(self) -> int:
        return hash(self.size)

    def __repr__(self) -> str:
        return f"OversizedLine(size={self.size})"


Line = bytes | OversizedLine
LineFilter = Callable[[Line], Line | None]
"""A filter stage: the line to pass on (the same or another), or None to drop it."""


class LineReader:
    def __init__(
        self,
        stream: ReceiveStream,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        *,
        line_filter: LineFilter | None = None,
    ) -> None:
        self._stream = stream
        self._max = max_line_bytes
        self._filter = line_filter
        self._partial = bytearray()
        self._discarding = False
        self._discarded = 0
        self._head = b""
        self._ready: deque[bytes | OversizedLine] = deque()
        self._eof = False

    async def receive(self) -> Line:
        """The next line without its ``\\n`` (after the filter); raises anyio.EndOfStream
        at end of input."""
        while True:
            while not self._ready:
                if self._eof:
                    raise anyio.EndOfStream
                try:
                    chunk = await self._stream.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._finish()
                    continue
                self.feed(chunk)
            line = self._ready.popleft()
            if self._filter is None:
                return line
            passed = self._filter(line)
            if passed is not None:
                return passed

    def __aiter__(self) -> LineReader:
        return self

    async def __anext__(self) -> Line:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def next_ready(self) -> Line | None:
        """The next line already split (after the filter), without reading: None when
        none is complete. With ``feed`` and ``put_back``, the reader works before an event
        loop exists (sidecar/coldstart.py)."""
        while self._ready:
            line = self._ready.popleft()
            passed = line if self._filter is None else self._filter(line)
            if passed is not None:
                return passed
        return None

    def feed_waiting(self) -> None:
        """Split what the input already holds, without waiting (a stream with
        ``read_waiting``, the stdio one; other streams hold nothing unread here)."""
        read_waiting = getattr(self._stream, "read_waiting", None)
        if read_waiting is not None and not self._eof:
            chunk = read_waiting()
            if chunk:
                self.feed(chunk)

    def put_back(self, line: Line) -> None:
        """Return ``line`` (just taken by ``next_ready``) to the front: it is read again first."""
        self._ready.appendleft(line)

    def feed(self, chunk: bytes) -> None:
        """Split ``chunk`` into the ready queue (public for tests and benchmarks)."""
        start = 0
        size = len(chunk)
        while start < size:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                self._absorb(chunk, start, size)
                return
            if not self._discarding and not self._partial and newline - start <= self._max:
                self._ready.append(chunk[start:newline])  # the common case: a whole line, one copy
            else:
                self._absorb(chunk, start, newline)
                self._end_line()
            start = newline + 1

    def _absorb(self, chunk: bytes, start: int, end: int) -> None:
        """Add part of a line that is not complete yet (or whose start was in an earlier chunk)."""
        if self._discarding:
            self._discarded += end - start
            return
        self._partial += chunk[start:end]
        if len(self._partial) > self._max:
            self._discarding = True
            self._discarded = len(self._partial)
            self._head = bytes(self._partial[:OVERSIZED_HEAD_BYTES])
            self._partial = bytearray()  # release the memory, not just the length

    def _end_line(self) -> None:
        if self._discarding:
            self._ready.append(OversizedLine(self._discarded, self._head))
            self._discarding = False
            self._discarded = 0
            self._head = b""
        else:
            self._ready.append(bytes(self._partial))
            self._partial.clear()

    def _finish(self) -> None:
        self._eof = True
        if self._discarding or self._partial:
            self._end_line()


class WriterClosed(Exception):
    """The writer was closed or broke; the line was not sent."""


class LineWriter:
    def __init__(
        self, stream: SendStream, max_queue: int = 1024, on_broken: Callable[[], None] | None = None
    ) -> None:
        self._stream = stream
        self._on_broken = on_broken
        send, receive = anyio.create_memory_object_stream[bytes](max_queue if max_queue > 0 else math.inf)
        self._queue_send = send
        self._queue_receive = receive
        self.broken = False
        """True once a write failed; later lines are dropped."""

    async def send(self, line: bytes) -> None:
        """Queue one encoded line (ending in ``\\n``); waits only when the queue is full.

        Not yielding when there is room is deliberate: a producer emitting a burst of
        events fills the queue and the writer then sends the whole burst in one write.
        Raises WriterClosed after ``close()`` or a write failure.
        """
        try:
            self._queue_send.send_nowait(line)
        except anyio.WouldBlock:
            try:
                await self._queue_send.send(line)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise WriterClosed from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise WriterClosed from None

    def send_nowait(self, line: bytes) -> bool:
        """Queue a line if there is room right now; False if it was dropped."""
        try:
            self._queue_send.send_nowait(line)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def close(self) -> None:
        """No more lines: ``run`` writes what is queued, closes the stream and returns."""
        self._queue_send.close()

    async def run(self) -> None:
        receive = self._queue_receive
        try:
            async with receive:
                while True:
                    try:
                        first = await receive.receive()
                    except anyio.EndOfStream:
                        return
                    batch = [first]
                    total = len(first)
                    while total < WRITE_BATCH_BYTES:
                        try:
                            line = receive.receive_nowait()
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                        batch.append(line)
                        total += len(line)
                    if self.broken:
                        continue
                    try:
                        await self._stream.send(b"".join(batch) if len(batch) > 1 else first)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                        logger.warning("output stream failed, dropping further output: %r", exc)
                        self.broken = True
                        self._queue_send.close()
                        if self._on_broken is not None:
                            self._on_broken()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                try:
                    await self._stream.aclose()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
