"""KeyedWorkers: at most one drain task per key (a session's turns, a chat's deliveries).

``kick(key)`` starts ``drain(key)`` in the owner's task group unless one runs; a kick while
it runs makes it drain once more when it returns, so work queued during the last look is
never stranded. A drain that raises is logged and retried after a pause (three times),
then left until the next kick; it never reaches the task group.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio
import anyio.abc

__all__ = ["KeyedWorkers"]

log = logging.getLogger(__name__)

K = TypeVar("K")
RETRIES = 3
RETRY_DELAY_S = 2.0


class KeyedWorkers(Generic[K]):
    def __init__(self, task_group: anyio.abc.TaskGroup, drain: Callable[[K], Awaitable[None]], name: str) -> None:
        self._tg = task_group
        self._drain = drain
        self._name = name
        self._again: dict[K, bool] = {}

    def kick(self, key: K) -> None:
        if key in self._again:
            self._again[key] = True
            return
        self._again[key] = False
        self._tg.start_soon(self._run, key)

    def running(self, key: K) -> bool:
        return key in self._again

    async def _run(self, key: K) -> None:
        failures = 0
        try:
            while True:
                self._again[key] = False
                try:
                    await self._drain(key)
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("%s worker %r failed (%d)", self._name, key, failures)
                    if failures > RETRIES:
                        return
                    await anyio.sleep(RETRY_DELAY_S)
                    continue
                if not self._again.get(key):
                    return
        finally:
            self._again.pop(key, None)
