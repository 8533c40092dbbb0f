"""AsyncStore: the one way async code reaches the database (the store gateway).

Owns: keeping database work off the event loop, and bounding it, in two lanes:

- ``await store.run(fn)`` calls ``fn(store.blocking)`` in a worker thread under the run lane's
  CapacityLimiter, shared by every caller of ``run``; it is sized to the connections (one
  writer plus the readers), so threads never queue inside the store and a burst of calls
  cannot take every thread anyio has. Anything may go here, writes included;
- ``await store.read(fn)`` is the read lane: its own limiter and its own reader
  connections (sidecar/store/db.py ``read_lane``), so a read never queues behind the
  writes that hold the run lane (every streaming reply persists its partial content
  there); ``fn`` must only read, and a write inside it raises ``ReadLaneWrite``. For the
  renderer's reads that must stay fast whatever streams: lists, searches, gets.

``fn`` reaches any repository as an attribute of the Store::

    session = await store.read(lambda s: s.sessions.get(session_id))
    run, calls = await store.run(lambda s: (s.tools.get_run(mid), s.tools.calls(mid)))

A function may make several calls in one hop (a fast path: one thread switch instead of
one per read) and may join them into one transaction with ``s.transaction()``.
Collaborators whose blocking methods read through repositories they hold (the request
builder's context reads, the turn writer) are built from ``store.blocking`` and run those
methods through ``run`` too; nothing else calls the Store from async code.

Must stay true:
- no database call runs on the event loop, and none runs in a worker thread that did not
  come through ``run`` or ``read`` (file and CPU work, which holds no connection, uses anyio's own
  thread limiter instead, so it never takes a slot a database call waits for);
- the read lane never takes the write lock, so what it waits for is bounded by reads alone;
  a read sees what was committed before it began (one snapshot per repository call);
- cancellation waits for the running call to finish (it is short, and one transaction at
  most per repository call), so a cancelled caller never leaves a transaction half-done.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from sidecar.secrets.box import SecretBox
from sidecar.store.db import read_lane
from sidecar.store.ids import now_ms
from sidecar.store.store import Store, open_store

__all__ = ["AsyncStore"]

T = TypeVar("T")

READ_LANE = 2
"""Threads the read lane runs at once (the machine's cores are what reads share)."""


def _read_only(fn: Callable[[Store], T], store: Store) -> T:
    with read_lane():
        return fn(store)


class AsyncStore:
    """The gateway of one Store: ``run`` and ``read`` are its only ways in from async code."""

    def __init__(
        self,
        store: Store,
        *,
        limiter: anyio.CapacityLimiter | None = None,
        read_limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self.blocking = store
        """The Store itself, whose every method blocks: for wiring collaborators whose
        blocking methods ``run`` calls (never called from the event loop)."""
        self._limiter = limiter if limiter is not None else anyio.CapacityLimiter(3)
        self._read_limiter = read_limiter if read_limiter is not None else anyio.CapacityLimiter(READ_LANE)

    @classmethod
    async def open(
        cls,
        data_dir: str | Path,
        *,
        clock: Callable[[], int] = now_ms,
        readers: int = 2,
        secrets: SecretBox | None = None,
    ) -> AsyncStore:
        """``open_store`` (migrate, recover) in a worker thread; ``secrets`` as for Store."""
        store = await anyio.to_thread.run_sync(
            partial(open_store, data_dir, clock=clock, readers=readers, secrets=secrets)
        )
        return cls(store, limiter=anyio.CapacityLimiter(readers + 1))

    async def run(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` in a worker thread, through the run lane (writes allowed)."""
        return await anyio.to_thread.run_sync(fn, self.blocking, limiter=self._limiter)

    async def read(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` in a worker thread of the read lane: reads only, on the lane's own
        connections, never behind the run lane's writes."""
        return await anyio.to_thread.run_sync(_read_only, fn, self.blocking, limiter=self._read_limiter)

    async def close(self) -> None:
        """Close the database; shielded, so it also runs while the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await self.run(Store.close)
