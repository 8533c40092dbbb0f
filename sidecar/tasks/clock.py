"""The scheduler's clock: the wall clock, or a clock the tests move.

``WallClock`` reads ``time.time()``; its waits are cut into slices of at most
MAX_SLEEP_S, so a wall clock that jumps (a laptop that slept, a changed system time) is
noticed within one slice. ``ManualClock`` is the documented test hook (README "Scheduled
tasks"): started with ``--test-clock MS`` (or ``CHAT_SIDECAR_TEST_CLOCK``), it stands still
at that time and moves only when ``sidecar:test:clock {now}`` (a method registered only in
that mode, not part of the contract) sets it; waits end as soon as it reaches their time.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio

__all__ = ["Clock", "WallClock", "ManualClock", "MAX_SLEEP_S"]

MAX_SLEEP_S = 30.0


class Clock(Protocol):
    def now_ms(self) -> int: ...

    async def sleep_until(self, when_ms: int | None, wake: anyio.Event) -> None:
        """Return at ``when_ms`` (None: never), when ``wake`` is set, or earlier (the
        caller checks the time again)."""
        ...


class WallClock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    async def sleep_until(self, when_ms: int | None, wake: anyio.Event) -> None:
        delay = MAX_SLEEP_S if when_ms is None else min(MAX_SLEEP_S, max(0.0, (when_ms - self.now_ms()) / 1000))
        with anyio.move_on_after(delay):
            await wake.wait()


class ManualClock:
    def __init__(self, start_ms: int) -> None:
        self._now = start_ms
        self._moved = anyio.Event()

    def now_ms(self) -> int:
        return self._now

    def set(self, now_ms: int) -> None:
        """Move the clock (forwards only: the caller checks)."""
        self._now = now_ms
        self._moved.set()
        self._moved = anyio.Event()

    async def sleep_until(self, when_ms: int | None, wake: anyio.Event) -> None:
        if when_ms is not None and self._now >= when_ms:
            return
        moved = self._moved
        async with anyio.create_task_group() as tg:

            async def first(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(first, moved)
            tg.start_soon(first, wake)
