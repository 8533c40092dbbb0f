"""KeyedLocks: one anyio.Lock per key (a session id), kept only while it is in use.

Per-session locks in a dict that only grows cost memory for every id ever seen, including
bogus ones from outside. Here an entry exists only while some task holds or waits for its
lock, so the table is as large as the work in flight.

Must stay true: two tasks that hold the same key at the same time share one lock (the
entry is removed only when its last holder or waiter leaves, cancellation included).
A leaf module: the engine, the pipeline, memory, channels and the V1 endpoint use it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

__all__ = ["KeyedLocks"]


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.users = 0


class KeyedLocks:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def locked(self, key: str) -> bool:
        """True while some task holds (or waits for) ``key``."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
