"""ProgressHub: the progress streams of V1 sessions (SSE clients and the early-event buffer).

Frames of a session go to every client connected to it; while none is, they wait in the
session's early-event buffer, replayed to the next client that connects (V1 Electron's
rule: at most BUFFER_MAX frames, dropped BUFFER_TTL_S after the buffer was started if
nobody came, consumed by the first client). Beyond V1, a full buffer never loses the end
of a turn: text chunks merge into the last frame when it is a chunk of the same kind, and
the terminal frame is always kept.

Must stay true:
- ``publish`` never waits: each client has its own bounded queue (frames and bytes); a
  client that falls that far behind (it does not read) is cut off, its stream ends, and
  nobody else notices;
- clients per session are bounded (``max_clients``); ``TooManyClients`` beyond;
- every client is closed by ``close_session`` / ``close_all`` (stop, compat:stop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sidecar.compat.frames import Frame, Frames

log = logging.getLogger(__name__)

BUFFER_MAX = 50
BUFFER_TTL_S = 30.0
CLIENT_MAX_FRAMES = 4096
CLIENT_MAX_BYTES = 4 * 1024 * 1024
"""What a client may fall behind by before it is cut off."""


class TooManyClients(Exception):
    pass


class SseClient:
    """One connected progress stream: a bounded queue of frames the HTTP handler drains."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cut = False
        self.queued_bytes = 0
        self._send: MemoryObjectSendStream[Frame]
        self._receive: MemoryObjectReceiveStream[Frame]
        self._send, self._receive = anyio.create_memory_object_stream[Frame](CLIENT_MAX_FRAMES)

    def offer(self, frame: Frame) -> None:
        if self.cut:
            return
        size = len(frame)
        if self.queued_bytes + size > CLIENT_MAX_BYTES:
            self._cut_off()
            return
        try:
            self._send.send_nowait(frame)
        except anyio.WouldBlock:
            self._cut_off()
            return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.cut = True
            return
        self.queued_bytes += size

    async def receive(self) -> Frame:
        """The next frame; anyio.EndOfStream once the client was closed or cut off."""
        frame = await self._receive.receive()
        self.queued_bytes -= len(frame)
        return frame

    def close(self) -> None:
        """End the stream: the reader gets what is queued, then EndOfStream."""
        self._send.close()

    def discard(self) -> None:
        self._send.close()
        self._receive.close()

    def _cut_off(self) -> None:
        self.cut = True
        log.warning("a progress stream of session %s stopped reading; it was cut off", self.session_id)
        self._send.close()


class _Channel:
    __slots__ = ("clients", "buffer", "buffer_started", "frames")

    def __init__(self, frames: Frames) -> None:
        self.frames = frames
        self.clients: list[SseClient] = []
        self.buffer: list[Frame] = []
        self.buffer_started = 0.0


class ProgressHub:
    def __init__(self, *, max_clients: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_clients = max_clients
        self._clock = clock
        self._channels: dict[str, _Channel] = {}

    # -- sessions -------------------------------------------------------------------

    def frames(self, session_id: str) -> Frames:
        return self._channels[session_id].frames

    def ensure(self, session_id: str, frames: Callable[[], Frames]) -> Frames:
        channel = self._channels.get(session_id)
        if channel is None:
            channel = self._channels[session_id] = _Channel(frames())
        return channel.frames

    def client_count(self, session_id: str | None = None) -> int:
        if session_id is not None:
            channel = self._channels.get(session_id)
            return len(channel.clients) if channel else 0
        return sum(len(c.clients) for c in self._channels.values())

    # -- frames ---------------------------------------------------------------------

    def publish(self, session_id: str, frame: Frame) -> None:
        channel = self._channels.get(session_id)
        if channel is None:
            return
        if channel.clients:
            for client in list(channel.clients):
                client.offer(frame)
                if client.cut:
                    channel.clients.remove(client)
            return
        self._prune()
        if not channel.buffer:
            channel.buffer_started = self._clock()
        self._buffer(channel, frame)

    def _buffer(self, channel: _Channel, frame: Frame) -> None:
        buffer = channel.buffer
        if len(buffer) < BUFFER_MAX:
            buffer.append(frame)
            return
        last = buffer[-1]
        if frame.text_kind is not None and last.text_kind == frame.text_kind:
            buffer[-1] = channel.frames.merged(last, frame.message.data["content"]["text"])
        elif frame.terminal:
            buffer.append(frame)
        # other frames past the limit are dropped, as V1 did

    def _prune(self) -> None:
        now = self._clock()
        for channel in self._channels.values():
            if channel.buffer and not channel.clients and now - channel.buffer_started >= BUFFER_TTL_S:
                channel.buffer = []

    def buffered(self, session_id: str) -> bool:
        self._prune()
        channel = self._channels.get(session_id)
        return bool(channel and channel.buffer)

    def clear_buffer(self, session_id: str) -> None:
        channel = self._channels.get(session_id)
        if channel is not None:
            channel.buffer = []

    # -- clients --------------------------------------------------------------------

    def connect(self, session_id: str) -> tuple[SseClient, list[Frame]]:
        """A new client of a known session and the buffered frames it gets first (the
        buffer is consumed). TooManyClients when the session has ``max_clients`` already."""
        channel = self._channels[session_id]
        if len(channel.clients) >= self._max_clients:
            raise TooManyClients(session_id)
        self._prune()
        replay, channel.buffer = channel.buffer, []
        client = SseClient(session_id)
        channel.clients.append(client)
        return client, replay

    def disconnect(self, client: SseClient) -> None:
        channel = self._channels.get(client.session_id)
        if channel is not None and client in channel.clients:
            channel.clients.remove(client)
        client.discard()

    def close_session(self, session_id: str) -> None:
        """End every stream of the session and drop its buffer."""
        channel = self._channels.get(session_id)
        if channel is None:
            return
        for client in channel.clients:
            client.close()
        channel.clients = []
        channel.buffer = []

    def close_all(self) -> None:
        for session_id in list(self._channels):
            self.close_session(session_id)
