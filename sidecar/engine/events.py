"""EventHub: every notification the process sends, to the client and to in-process listeners.

Services send notifications with ``await hub.publish(method, params)`` (it is the App's
``notify``). The hub writes each one to the client first, then offers the ``chat:stream``
events to in-process subscribers: the V1 ``/computer/chat`` shim turns them into its SSE
frames, channels render replies for an IM platform. A subscriber listens to one session, or
to every session.

Must stay true:
- a subscriber can never stall a reply or the client: ``offer`` never waits. A subscriber
  whose buffer is full is cut off (``overflowed`` is set, its stream ends); it resyncs
  from ``chat:messages:get`` like a renderer that saw a gap in ``seq``;
- the client sees every notification whatever the subscribers do (a failing subscriber
  is dropped and logged, never raised into the publisher);
- subscriptions are scoped: ``with hub.subscribe(...) as sub`` removes it on exit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from protocol.events import ChatStreamEvent
from protocol.notifications import CHAT_STREAM
from sidecar.notify import Send

log = logging.getLogger(__name__)

DEFAULT_BUFFER = 4096
"""Events a subscriber may fall behind by before it is cut off (deltas are coalesced, so a
reply of tens of thousands of tokens stays far below it while the subscriber keeps up)."""


class Subscription:
    """The events of one session (or all sessions) from the moment of subscribing."""

    def __init__(self, session_id: str | None, buffer: int) -> None:
        self.session_id = session_id
        self.overflowed = False
        self._send: MemoryObjectSendStream[ChatStreamEvent]
        self._receive: MemoryObjectReceiveStream[ChatStreamEvent]
        self._send, self._receive = anyio.create_memory_object_stream[ChatStreamEvent](
            max_buffer_size=buffer if buffer > 0 else math.inf
        )

    def offer(self, event: ChatStreamEvent) -> None:
        """Queue ``event`` without waiting; a full buffer ends the subscription."""
        if self.overflowed:
            return
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.overflowed = True
            log.warning("event subscriber of %s fell behind; cut off", self.session_id or "all sessions")
            self._send.close()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.overflowed = True

    async def receive(self) -> ChatStreamEvent:
        """The next event; raises anyio.EndOfStream once the subscription ended."""
        return await self._receive.receive()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ChatStreamEvent:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._send.close()
        self._receive.close()


class EventHub:
    def __init__(self, send: Send) -> None:
        self._send = send
        self._by_session: dict[str, set[Subscription]] = {}
        self._all: set[Subscription] = set()

    async def publish(self, method: str, params: Any = None) -> None:
        await self._send(method, params)
        if method != CHAT_STREAM.method or not (self._all or self._by_session):
            return
        for sub in (*self._by_session.get(params.session_id, ()), *self._all):
            try:
                sub.offer(params)
            except Exception:  # a listener's bug must not reach the reply that published
                log.exception("event subscriber failed; dropped")
                self._remove(sub)

    @contextmanager
    def subscribe(self, session_id: str | None = None, *, buffer: int = DEFAULT_BUFFER) -> Iterator[Subscription]:
        """Listen to the ``chat:stream`` events of ``session_id`` (None: every session)."""
        sub = Subscription(session_id, buffer)
        if session_id is None:
            self._all.add(sub)
        else:
            self._by_session.setdefault(session_id, set()).add(sub)
        try:
            yield sub
        finally:
            self._remove(sub)
            sub.close()

    def _remove(self, sub: Subscription) -> None:
        if sub.session_id is None:
            self._all.discard(sub)
            return
        subs = self._by_session.get(sub.session_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._by_session[sub.session_id]
