"""The event stream of a forwarded turn: followed across drops and silences, never repeated.

Owns how a turn's events are read from the server, whichever chat API it has (the
server's ``chatApi`` setting):

- ``conversation`` (the real server): ``POST /api/agent/conversation/chat`` (a TryReqDto)
  streams AgentOutputDto ``data:`` lines, the last one ``completed: true``;
  ``GET /chat/sub/{conversationId}`` re-attaches to a running turn: the server replays the
  turn's events from its start, then the live ones, and answers a single ERROR
  ("Conversation not executing") once the turn is over;
- ``computer`` (the seed's shape): ``POST /api/computer/chat`` starts the prompt and
  answers at once with the runner's session id; ``GET /api/computer/progress/{sessionId}``
  streams the desktop's ``/computer/progress`` frames (reference 4.4: ``event: <subType>``,
  ``data:`` a UnifiedSessionMessage); any ``sessionPromptEnd`` ends the turn (the stream may
  stay open after it: it is not read further). Reconnecting to the same URL re-attaches.

``Follower.events`` yields the turn's events until the one that ends it. Every event
(heart beats included: the server sends one every 10 s) restarts the idle timer; a stream
that ends early, drops, or stays silent for longer than the idle timeout is closed and
re-attached, with backoff, at most MAX_REATTACH times in a row without a new event.

No repeats: every content event (anything but a heart beat) is recorded by a canonical key
(its type and its data re-encoded with sorted keys). A re-attached stream whose first
content event is the turn's first one is a replay: events matching the recorded sequence
are skipped, and the first that differs (or goes past it) is new. A stream that starts
with another event continues where the turn is (the desktop's progress stream replays only
what it buffered while no client was connected). The follower can be iterated again after
its consumer stopped (a cancelled turn drains the rest after ``/chat/stop``): it then
re-attaches the same way.

Must stay true: an event is yielded at most once per turn; a failure to start the turn
(the first request) is raised as it is, never retried by re-attaching (nothing may run the
turn twice); AuthRequired and ConversationGone are never retried.

``stop_and_drain`` is how a stopped turn ends (a forwarded turn's, a remote agent's): the
stop call (bounded), then the rest of the turn mapped for at most a grace period, so the
reply keeps what the other side still sent before it ended.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any, Generic, Protocol, TypeVar

import anyio
import msgspec

from sidecar.sync.errors import AuthRequired, ConversationGone, QimingError, ServerUnreachable

__all__ = ["Follower", "ReplayFilter", "MAX_REATTACH", "canonical_key", "stop_and_drain", "StoppableMapper"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REATTACH = 5
"""Re-attachments in a row that bring no new event before the turn is given up."""
REATTACH_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 4.0)

_any = msgspec.json.Decoder()
_sorted = msgspec.json.Encoder(order="sorted")


def canonical_key(kind: str, data: bytes) -> bytes:
    """A content event's identity: its kind and its data with sorted keys (a server that
    re-serializes a cached event may order the keys differently)."""
    try:
        body = _sorted.encode(_any.decode(data)) if data else b"null"
    except (msgspec.DecodeError, RecursionError):
        body = bytes(data)
    return kind.encode() + b"\x00" + body


class ReplayFilter:
    """Tells which events of a re-attached stream the turn has already had (see the module
    docstring): the recorded keys are compared in order from the first."""

    def __init__(self, recorded: list[bytes]) -> None:
        self._recorded = recorded
        self._end = len(recorded)
        self._pos = 0
        self._live = False

    def is_repeat(self, key: bytes) -> bool:
        if self._live:
            return False
        if self._pos < self._end and key == self._recorded[self._pos]:
            self._pos += 1
            return True
        self._live = True
        if self._pos:
            log.info("re-attached stream: replay of %d events skipped", self._pos)
        return False


Opener = Callable[[], AbstractAsyncContextManager[AsyncIterator[T]]]


class Follower(Generic[T]):
    """One turn's events: the first stream from ``open_first``, re-attached with
    ``open_again``. ``key`` gives a content event's key (None: a heart beat); ``ends``
    says whether an event ends the turn."""

    def __init__(
        self,
        *,
        open_first: Opener[T],
        open_again: Opener[T],
        key: Callable[[T], bytes | None],
        ends: Callable[[T], bool],
        idle_s: float,
        what: str,
        first_starts: bool = True,
    ) -> None:
        """``first_starts``: the first stream starts the turn (``POST /chat``), so failing
        to open it is the turn's failure; otherwise (the computer API, started before) it
        is re-attached like any other."""
        self._open_first: Opener[T] | None = open_first
        self._first_starts = first_starts
        self._open_again = open_again
        self._key = key
        self._ends = ends
        self._idle_s = idle_s
        self._what = what
        self.recorded: list[bytes] = []
        self.reattached = 0
        """Re-attachments made (for logs and tests)."""
        self.ended = False

    async def events(self) -> AsyncGenerator[T, None]:
        failures = 0
        while not self.ended:
            first = self._open_first is not None
            opener = self._open_first or self._open_again
            self._open_first = None
            replay = None if first else ReplayFilter(list(self.recorded))
            if not first:
                self.reattached += 1
            fresh = False
            opened = False
            try:
                async with opener() as stream:
                    opened = True
                    while True:
                        item: T | _EndMarker = _END
                        with anyio.move_on_after(self._idle_s) as idle:
                            item = await anext(stream, _END)
                        if idle.cancelled_caught:
                            log.warning("%s: no event for %.1f s; re-attaching", self._what, self._idle_s)
                            break
                        if isinstance(item, _EndMarker):
                            log.info("%s: the stream ended before the turn did; re-attaching", self._what)
                            break
                        key = self._key(item)
                        if key is not None:
                            if replay is not None and replay.is_repeat(key):
                                continue
                            self.recorded.append(key)
                            fresh = True
                            failures = 0
                        if self._ends(item):
                            self.ended = True
                        yield item
                        if self.ended:
                            return
            except (AuthRequired, ConversationGone):
                raise
            except QimingError as exc:
                if first and not opened and self._first_starts:
                    raise  # the turn was refused, or we cannot tell whether it started: never twice
                log.warning("%s: %s; re-attaching", self._what, exc.message)
            if fresh:
                continue
            failures += 1
            if failures > MAX_REATTACH:
                raise ServerUnreachable(
                    f"{self._what}: the turn's stream was lost and could not be re-attached"
                    f" ({MAX_REATTACH} attempts)"
                )
            await anyio.sleep(REATTACH_BACKOFF_S[min(failures, len(REATTACH_BACKOFF_S)) - 1])


class _EndMarker:
    """Stands for "the stream ended" inside ``Follower.events``."""


_END = _EndMarker()


class StoppableMapper(Protocol):
    stopping: bool

    async def apply(self, item: Any) -> object | None:
        """Map one event; not None once the turn ended."""
        ...


async def stop_and_drain(
    stop: Callable[[], Awaitable[object]], follower: Follower[Any], mapper: StoppableMapper, *,
    stop_call_s: float, grace_s: float, what: str,
) -> bool:
    """Stop the turn (``stop``, at most ``stop_call_s``), then keep mapping what the stream
    still brings for at most ``grace_s``; False when the turn did not end in that time."""
    mapper.stopping = True
    try:
        with anyio.move_on_after(stop_call_s):
            await stop()
    except QimingError as exc:
        log.warning("stopping %s failed: %s", what, exc.message)
    with anyio.move_on_after(grace_s) as scope:
        try:
            async with aclosing(follower.events()) as events:
                async for item in events:
                    if await mapper.apply(item) is not None:
                        break
        except QimingError as exc:
            log.info("after the stop of %s: %s", what, exc.message)
    return not scope.cancelled_caught
