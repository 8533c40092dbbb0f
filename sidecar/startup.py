"""Where the App's opening stands, for the server's requests that wait on it.

One state (``Startup``) and one wake-up, instead of an event per fact: the step the App
has reached (``NOTHING`` -> ``STORE``: the handshake and the ``EARLY`` methods are served
-> ``SERVICES``: every method is), whether the services are wanted yet (the App loads them
once they are, ``services_wanted``), whether the server is stopping, and whether the App's
opening is over without the services (it stopped or failed). What must stay true:
- a request held up by the start-up (``after``) is counted from the moment it waits until
  it has answered, so an orderly stop lets it finish first (``settle``, bounded by
  OPEN_WAIT_S); once the opening is over without the step it needs, it is answered
  REQUEST_CANCELLED at once, never left for the hard deadline;
- the services are wanted by the first request that needs them, the first answer of an
  EARLY method (a first screen is out: load the rest), or an idle delay after the store
  step (``warm_up``); a stop before any of these leaves them unloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import TypeVar

import anyio

from protocol.errors import ErrorCode
from sidecar.errors import SidecarError

logger = logging.getLogger(__name__)

T = TypeVar("T")

OPEN_WAIT_S = 15.0
"""The longest an orderly stop (``sidecar:shutdown``, the end of input) waits for the App
a request read before it needs (a migration, the services' imports); then those requests
are answered REQUEST_CANCELLED and the stop goes on."""


class Step(IntEnum):
    NOTHING = 0
    STORE = 1
    SERVICES = 2


class Startup:
    def __init__(self, *, services_wanted: bool = False) -> None:
        self.step = Step.NOTHING
        self.wanted = services_wanted
        """The services are needed: the App loads them."""
        self.stopping = False
        self.over = False
        """The App's opening ended short of SERVICES (it stopped or failed)."""
        self.held = 0
        """Requests held up by the start-up that have not answered yet."""
        self._changed = anyio.Event()

    def _change(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    def reach(self, step: Step) -> None:
        self.step = max(self.step, step)
        self._change()

    def want_services(self) -> None:
        if not self.wanted:
            self.wanted = True
            self._change()

    def stop(self) -> None:
        """The server is stopping: an App still waiting to load its services stops without."""
        self.stopping = True
        self._change()

    def end(self) -> None:
        """The App's opening is over: requests still waiting for a step it did not reach are
        answered now."""
        self.over = True
        self._change()

    async def services_wanted(self) -> bool:
        """Until the services are wanted (True) or the server stops before anything asked
        for them (False: a request that arrived before the stop still asked, and is served)."""
        await self._until(lambda: self.wanted or self.stopping)
        return self.wanted

    async def wait(self, step: Step) -> None:
        """Until ``step`` is reached (for what must not be counted as held, e.g. benchmarks)."""
        await self._until(lambda: self.step >= step)

    async def after(self, step: Step, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` once ``step`` is reached, counted as held up by the start-up
        until it answers; REQUEST_CANCELLED if the opening ends short of ``step``."""
        self.held += 1
        try:
            await self._until(lambda: self.step >= step or self.over)
            if self.step < step:
                raise SidecarError(
                    "request cancelled: the sidecar stopped before its services were open",
                    code=ErrorCode.REQUEST_CANCELLED,
                )
            return await call()
        finally:
            self.held -= 1
            self._change()

    async def settle(self) -> None:
        """An orderly stop: let the requests held up by the start-up answer first (bounded
        by OPEN_WAIT_S)."""
        if not self.held:
            return
        logger.info("the stop waits for %d request%s read before it (held up by the start-up)",
                    self.held, "" if self.held == 1 else "s")
        with anyio.move_on_after(OPEN_WAIT_S) as scope:
            await self._until(lambda: not self.held)
        if scope.cancelled_caught:
            logger.warning("the services did not open within %.0f s of the stop", OPEN_WAIT_S)

    async def warm_up(self, delay: float) -> None:
        """Want the services ``delay`` seconds after the store step if nothing asked yet (a
        client that only shook hands then idles gets them loaded before its first send)."""
        await self.wait(Step.STORE)
        with anyio.move_on_after(delay):
            await self._until(lambda: self.wanted)
        self.want_services()


__all__ = ["OPEN_WAIT_S", "Startup", "Step"]
