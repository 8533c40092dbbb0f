"""StreamRelay: one streaming message's ``chat:stream`` events, in order, with ``seq``.

Owns the event numbering of a message (``seq`` starts at 1 with ``stream_start``) and
the coalescing of deltas: the first text/thinking delta goes out at once, later ones
are merged for ``coalesce_s``: the flusher task sends what is pending when the window
closes (so a stalled provider never leaves text sitting in the buffer), or as soon as the
producer yields when it already has (the deltas of one read go out as one event, and the
producer never waits for the pipe). Every other
event first flushes the pending deltas, so the renderer always sees deltas before the
tool call, usage or finish event that followed them.

Must stay true: events of one message are sent by exactly one relay, under its lock,
with seq increasing by one; ``flush()`` is called before a finish event; ``on_delta``
sees a delta in the same step (no await between) as its event takes its seq, so the
content built from it always matches ``seq``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from protocol.events import TextDeltaEvent, ThinkingDeltaEvent
from protocol.notifications import CHAT_STREAM
from sidecar.notify import Notifier


def now_ms() -> int:
    return int(time.time() * 1000)


class StreamRelay:
    def __init__(
        self,
        notify: Notifier,
        session_id: str,
        message_id: str,
        *,
        coalesce_s: float = 0.040,
        on_delta: Callable[[str, str], None] | None = None,
    ) -> None:
        self._notify = notify
        self.session_id = session_id
        self.message_id = message_id
        self._coalesce_s = coalesce_s
        self._on_delta = on_delta
        self.seq = 0
        self._lock = anyio.Lock()
        # pending deltas as [kind, text] runs, adjacent runs of one kind merged
        self._pending: list[list[str]] = []
        self._sent_delta = False
        self._last_flush = 0.0
        self._wake = anyio.Event()
        self._closed = False

    # -- events ----------------------------------------------------------------------

    async def emit(self, event_type: type, **fields: Any) -> None:
        """Send one non-delta event (flushing pending deltas first)."""
        async with self._lock:
            await self._flush_locked()
            await self._send(event_type, fields)

    async def delta(self, kind: str, text: str) -> None:
        """Queue a ``text`` or ``thinking`` delta; the first one is sent at once."""
        if not text:
            return
        if self._pending and self._pending[-1][0] == kind:
            self._pending[-1][1] += text
        else:
            self._pending.append([kind, text])
        if not self._sent_delta or self._coalesce_s <= 0:
            self._sent_delta = True
            async with self._lock:
                await self._flush_locked()
        else:
            # the flusher sends it when the window closes, at once if it has: after the
            # deltas read with this one (one network read brings several), in one event
            self._wake.set()

    async def flush(self) -> None:
        async with self._lock:
            await self._flush_locked()

    # -- flusher ---------------------------------------------------------------------

    async def run_flusher(self) -> None:
        """Send pending deltas when their coalescing window closes; runs until close()."""
        while not self._closed:
            await self._wake.wait()
            self._wake = anyio.Event()
            if self._closed:
                break
            delay = self._last_flush + self._coalesce_s - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            async with self._lock:
                await self._flush_locked()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    # -- internals -------------------------------------------------------------------

    async def _flush_locked(self) -> None:
        if not self._pending:
            return
        # one run at a time: a flush cancelled while it waits to send leaves the runs after
        # it pending (a later flush sends them), never dropped from the reply and the stream
        while self._pending:
            kind, text = self._pending.pop(0)
            # content and seq move together, with no await in between: a snapshot taken
            # at any moment holds exactly the deltas of events 1..seq (resync relies on it)
            if self._on_delta is not None:
                self._on_delta(kind, text)
            if kind == "text":
                await self._send(TextDeltaEvent, {"text": text})
            else:
                await self._send(ThinkingDeltaEvent, {"thinking": text})
        self._last_flush = time.monotonic()

    async def _send(self, event_type: type, fields: dict[str, Any]) -> None:
        self.seq += 1
        event = event_type(
            session_id=self.session_id,
            message_id=self.message_id,
            timestamp=now_ms(),
            seq=self.seq,
            **fields,
        )
        await self._notify(CHAT_STREAM, event)
