"""JsonLineFilter: an agent's stdout with every line that is not JSON logged and dropped.

Why a filter in front of JsonRpcPeer: the peer answers a line that is not JSON with a
``-32700`` reply (right for our own stdin, where the client must learn about its bad
input). An agent that prints a banner or a stray ``print`` on stdout is not a client
that made a mistake: answering it would put a reply with ``id: null`` on the agent's
stdin, which some agents treat as a protocol violation. So junk lines are logged (first
200 bytes) and skipped here, before the peer sees them.

Must stay true:
- memory is bounded by ``max_line_bytes`` plus one chunk: a line that grows past the
  limit is discarded as it streams and reported once (its size) when it ends;
- the bytes handed on are whole lines, each a syntactically valid JSON document followed
  by ``\\n``, in the order received; what came before EOF without a newline counts as a
  last line;
- validation is a full JSON parse, so a line that starts like JSON but is cut off or
  malformed is junk too.

Fast path: notifications whose method is in ``fast`` (``session/update``) are handed to
their callback here, in arrival order, instead of being passed on to the peer. The peer
would start one task per notification (~50 us each, measured: most of the cost of a
10,000-update turn); the parse this filter does anyway already yields the params. The
callback gets the params verbatim (``msgspec.Raw``) and must not block. Because the lines
are processed in order, every update reaches its callback before the peer sees the
response that followed it on the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from anyio.abc import ByteReceiveStream

log = logging.getLogger(__name__)

_raw = msgspec.json.Decoder(msgspec.Raw)


class _Head(msgspec.Struct):
    """Just enough of an object line to recognise a fast-path notification."""

    method: Any = None
    id: Any = msgspec.UNSET
    params: msgspec.Raw = msgspec.Raw(b"null")


_head = msgspec.json.Decoder(_Head)
JUNK_LOGGED = 20


class JsonLineFilter(ByteReceiveStream):
    def __init__(
        self,
        stream: ByteReceiveStream,
        *,
        max_line_bytes: int,
        name: str = "agent",
        fast: dict[str, Callable[[msgspec.Raw], None]] | None = None,
    ) -> None:
        self._stream = stream
        self._max = max_line_bytes
        self._name = name
        self._partial = bytearray()
        self._discarding = 0
        """Bytes of an oversized line dropped so far (0: not discarding)."""
        self._eof = False
        self.junk_lines = 0
        """Lines dropped so far (not JSON, or oversized)."""
        self.fast: dict[str, Callable[[msgspec.Raw], None]] = dict(fast or {})

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            if self._eof:
                raise anyio.EndOfStream
            try:
                chunk = await self._stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._eof = True
                tail = self._finish()
                if tail:
                    return tail
                raise anyio.EndOfStream from None
            out = self._feed(chunk)
            if out:
                return out

    async def aclose(self) -> None:
        await self._stream.aclose()

    # -- internals -------------------------------------------------------------------

    def _feed(self, chunk: bytes) -> bytes:
        good: list[bytes] = []
        start = 0
        size = len(chunk)
        while start < size:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                self._absorb(chunk, start, size)
                break
            if not self._discarding and not self._partial:
                if newline - start <= self._max:
                    self._check(chunk[start:newline], good)
                else:
                    self._oversized(newline - start)
            else:
                self._absorb(chunk, start, newline)
                self._end_line(good)
            start = newline + 1
        return b"".join(good)

    def _absorb(self, chunk: bytes, start: int, end: int) -> None:
        if self._discarding:
            self._discarding += end - start
            return
        self._partial += chunk[start:end]
        if len(self._partial) > self._max:
            self._discarding = len(self._partial)
            self._partial = bytearray()

    def _end_line(self, good: list[bytes]) -> None:
        if self._discarding:
            self._oversized(self._discarding)
            self._discarding = 0
        else:
            line = bytes(self._partial)
            self._partial.clear()
            self._check(line, good)

    def _finish(self) -> bytes:
        good: list[bytes] = []
        if self._discarding or self._partial:
            self._end_line(good)
        return b"".join(good)

    def _check(self, line: bytes, good: list[bytes]) -> None:
        try:
            self._check_line(line, good)
        except Exception:  # one odd line must not end the reading (and the connection)
            self.junk_lines += 1
            log.exception("%s: skipped a stdout line that could not be handled", self._name)

    def _check_line(self, line: bytes, good: list[bytes]) -> None:
        stripped = line.strip()
        if not stripped:
            return
        first = stripped[:1]
        if first == b"{":
            try:
                head = _head.decode(stripped)
            except msgspec.ValidationError:  # valid JSON of an odd shape: the peer answers it
                good.append(stripped + b"\n")
                return
            except (msgspec.DecodeError, RecursionError):
                pass
            else:
                # a method of another type (list, object) is unhashable: the peer answers it
                fast = head.id is msgspec.UNSET and isinstance(head.method, str)
                callback = self.fast.get(head.method) if fast else None
                if callback is None:
                    good.append(stripped + b"\n")
                else:
                    try:
                        callback(head.params)
                    except Exception:  # a bug in a callback must not end the reading
                        log.exception("%s: handling a %s notification failed", self._name, head.method)
                return
        elif first == b"[":
            try:
                _raw.decode(stripped)
            except (msgspec.DecodeError, RecursionError):
                pass
            else:
                good.append(stripped + b"\n")
                return
        self.junk_lines += 1
        # a chatty agent must not flood our log: the first lines, then every 1000th
        if self.junk_lines <= JUNK_LOGGED or self.junk_lines % 1000 == 0:
            log.warning(
                "%s: skipped a stdout line that is not JSON-RPC (%d so far): %r",
                self._name,
                self.junk_lines,
                stripped[:200].decode("utf-8", "replace"),
            )

    def _oversized(self, size: int) -> None:
        self.junk_lines += 1
        log.warning("%s: skipped a stdout line of %d bytes (limit %d)", self._name, size, self._max)
