"""Outgoing rate limits per channel and the loop guard per chat.

Owns: ``TokenBucket`` (platform messages per minute with a burst; ``acquire(n)`` waits for
``n`` tokens, callers queue in order) and ``LoopGuard`` (more than ``max_events`` replies in
``window`` in one chat, as when two bots answer each other, start a cooldown during which
the chat gets no replies). Both are in memory: after a restart a chat starts with a full
bucket and no cooldown, which errs towards answering.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import anyio

__all__ = ["TokenBucket", "LoopGuard"]


class TokenBucket:
    def __init__(self, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.burst = max(1, burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._stamp = clock()
        self._lock = anyio.Lock()

    def configure(self, per_minute: int, burst: int) -> None:
        self._refill()
        self.per_minute = per_minute
        self.burst = max(1, burst)
        self._tokens = min(self._tokens, float(self.burst))

    def _refill(self) -> None:
        now = self._clock()
        if self.per_minute > 0:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.per_minute / 60.0)
        self._stamp = now

    def wait_time(self, n: int) -> float:
        """Seconds until ``n`` tokens are there (0: now)."""
        if self.per_minute <= 0:
            return 0.0
        self._refill()
        need = min(n, self.burst) - self._tokens
        return 0.0 if need <= 0 else need * 60.0 / self.per_minute

    async def acquire(self, n: int = 1) -> None:
        """Take ``n`` tokens (at most the burst), waiting for them; FIFO among waiters."""
        async with self._lock:
            while True:
                delay = self.wait_time(n)
                if delay <= 0:
                    break
                await anyio.sleep(delay)
            if self.per_minute > 0:
                self._tokens -= min(n, self.burst)


class LoopGuard:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._events: dict[tuple[str, str], deque[float]] = {}
        self._cooldown: dict[tuple[str, str], float] = {}

    def cooling(self, key: tuple[str, str]) -> bool:
        until = self._cooldown.get(key)
        if until is None:
            return False
        if self._clock() >= until:
            del self._cooldown[key]
            return False
        return True

    def record(self, key: tuple[str, str], max_events: int, window_ms: int, cooldown_ms: int) -> bool:
        """Count a reply in this chat; True when it trips the guard (a cooldown starts)."""
        now = self._clock()
        events = self._events.setdefault(key, deque())
        events.append(now)
        while events and events[0] <= now - window_ms / 1000.0:
            events.popleft()
        if len(events) > max_events:
            events.clear()
            if cooldown_ms > 0:
                self._cooldown[key] = now + cooldown_ms / 1000.0
            return True
        if len(self._events) > 10_000:  # forget idle chats
            for other in [k for k, v in self._events.items() if not v or v[-1] <= now - window_ms / 1000.0]:
                del self._events[other]
        return False
