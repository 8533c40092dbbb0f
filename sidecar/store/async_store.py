"""AsyncStore: the one way async code reaches the database (the store gateway).

Owns: keeping database work off the event loop, and bounding it. ``await store.run(fn)``
calls ``fn(store.sync)`` in a worker thread under one CapacityLimiter shared by every
caller of this store; the limiter is sized to the connections (one writer plus the
readers), so threads never queue inside the store and a burst of reads cannot take every
thread anyio has. ``fn`` reaches any repository as an attribute of the Store::

    session = await store.run(lambda s: s.sessions.get(session_id))
    run, calls = await store.run(lambda s: (s.tools.get_run(mid), s.tools.calls(mid)))

A function may make several calls in one hop (a fast path: one thread switch instead of
one per read) and may join them into one transaction with ``s.transaction()``.
Collaborators whose blocking methods read through repositories they hold (the request
builder's context reads, the turn writer) are built from ``store.sync`` and run those
methods through ``run`` too; nothing else calls the Store from async code.

Must stay true:
- no database call runs on the event loop, and none runs in a worker thread that did not
  come through ``run`` (file and CPU work, which holds no connection, uses anyio's own
  thread limiter instead, so it never takes a slot a database call waits for);
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
from sidecar.store.ids import now_ms
from sidecar.store.store import Store, open_store

__all__ = ["AsyncStore"]

T = TypeVar("T")


class AsyncStore:
    """The gateway of one Store: ``run`` is its only way in from async code."""

    def __init__(self, store: Store, *, limiter: anyio.CapacityLimiter | None = None) -> None:
        self.sync = store
        """The Store itself: for wiring collaborators whose blocking methods ``run`` calls."""
        self._limiter = limiter if limiter is not None else anyio.CapacityLimiter(3)

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
        """``fn(store)`` in a worker thread, through this store's limiter."""
        return await anyio.to_thread.run_sync(fn, self.sync, limiter=self._limiter)

    async def close(self) -> None:
        """Close the database; shielded, so it also runs while the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await self.run(Store.close)
