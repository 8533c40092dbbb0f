"""JsonLines: the filter stage for a child's stdout (an ACP agent, an MCP stdio server).

Splitting is the one NDJSON reader's job (``sidecar.rpc.framing.LineReader``); this is
the stage it runs every line through (``line_filter=``). Why a filter: our own peer
answers a line that is not JSON with a ``-32700`` reply (right for our stdin, where the
client must learn about its bad input). A child that prints a banner or a stray
``print`` on stdout is not a client that made a mistake: answering it would put a reply
with ``id: null`` on its stdin, which some agents treat as a protocol violation. So junk
lines and oversized lines are logged (the first ones, then every 1000th) and dropped here.

Must stay true:
- what passes is a whole line holding one syntactically valid JSON object or array,
  stripped of surrounding whitespace, in the order received; validation is a full parse,
  so a line that starts like JSON but is cut off or malformed is junk;
- one odd line, or a bug in a fast-path callback, never ends the reading.

Fast path: notifications whose method is in ``fast`` (``session/update``) are handed to
their callback here, in arrival order, instead of being passed on to the peer. The peer
would start one task per notification (~50 us each, measured: most of the cost of a
10,000-update turn); the parse this stage does anyway already yields the params. The
callback gets the params verbatim (``msgspec.Raw``) and must not block. Because lines are
processed in order, every update reaches its callback before the peer sees the response
that followed it on the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from sidecar.rpc.framing import Line, OversizedLine

log = logging.getLogger(__name__)

_raw = msgspec.json.Decoder(msgspec.Raw)


class _Head(msgspec.Struct):
    """Just enough of an object line to recognise a fast-path notification."""

    method: Any = None
    id: Any = msgspec.UNSET
    params: msgspec.Raw = msgspec.Raw(b"null")


_head = msgspec.json.Decoder(_Head)
JUNK_LOGGED = 20


class JsonLines:
    """``LineReader(stream, limit, line_filter=JsonLines(name))``."""

    def __init__(self, name: str = "agent", *, max_line_bytes: int = 0) -> None:
        self.name = name
        self.max_line_bytes = max_line_bytes
        """For the log message of an oversized line (the reader enforces the limit)."""
        self.junk_lines = 0
        """Lines dropped so far (not JSON, or oversized)."""
        self.fast: dict[str, Callable[[msgspec.Raw], None]] = {}

    def __call__(self, line: Line) -> Line | None:
        if isinstance(line, OversizedLine):
            self._junk(f"a stdout line of {line.size} bytes (limit {self.max_line_bytes})")
            return None
        try:
            return self._check(line)
        except Exception:  # one odd line must not end the reading (and the connection)
            self.junk_lines += 1
            log.exception("%s: skipped a stdout line that could not be handled", self.name)
            return None

    def _check(self, line: bytes) -> bytes | None:
        stripped = line.strip()
        if not stripped:
            return None
        first = stripped[:1]
        if first == b"{":
            try:
                head = _head.decode(stripped)
            except msgspec.ValidationError:  # valid JSON of an odd shape: the peer answers it
                return stripped
            except (msgspec.DecodeError, RecursionError):
                pass
            else:
                # a method of another type (list, object) is unhashable: the peer answers it
                fast = head.id is msgspec.UNSET and isinstance(head.method, str)
                callback = self.fast.get(head.method) if fast else None
                if callback is None:
                    return stripped
                try:
                    callback(head.params)
                except Exception:  # a bug in a callback must not end the reading
                    log.exception("%s: handling a %s notification failed", self.name, head.method)
                return None
        elif first == b"[":
            try:
                _raw.decode(stripped)
            except (msgspec.DecodeError, RecursionError):
                pass
            else:
                return stripped
        self._junk(f"a stdout line that is not JSON-RPC: {stripped[:200].decode('utf-8', 'replace')!r}")
        return None

    def _junk(self, what: str) -> None:
        self.junk_lines += 1
        # a chatty child must not flood our log: the first lines, then every 1000th
        if self.junk_lines <= JUNK_LOGGED or self.junk_lines % 1000 == 0:
            log.warning("%s: skipped %s (%d so far)", self.name, what, self.junk_lines)
