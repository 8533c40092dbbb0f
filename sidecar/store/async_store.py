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
  renderer's reads that must stay fast whatever streams: lists, searches, gets;
- ``await store.persist(fn)`` is for the frequent, small writes of streaming replies (their
  partial content): the writes submitted while one batch is being written are written
  together as the next batch, one transaction through ``run``, each in its own savepoint
  (one that fails, fails alone: its caller gets its exception, the others commit). So 50
  streaming replies cost a few transactions and thread hops per persistence tick instead
  of 50 that would take the run lane in turn. Batches are written one after the other, in
  order; a write waits at most for the batch before its own.

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
- ``persist`` returns once its write is committed (or raises its failure), and cannot be
  cancelled in between: a caller that was stopped has still written, so whatever it writes
  next (a reply's final row) comes after it;
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
from sidecar.store.db import TransactionLost, read_lane
from sidecar.store.ids import now_ms
from sidecar.store.store import Store, open_store

__all__ = ["AsyncStore"]

T = TypeVar("T")

READ_LANE = 2
"""Threads the read lane runs at once (the machine's cores are what reads share)."""


def _read_only(fn: Callable[[Store], T], store: Store) -> T:
    with read_lane():
        return fn(store)


class _Write:
    __slots__ = ("fn", "error")

    def __init__(self, fn: Callable[[Store], None]) -> None:
        self.fn = fn
        self.error: BaseException | None = None


class _Batch:
    __slots__ = ("writes", "done")

    def __init__(self) -> None:
        self.writes: list[_Write] = []
        self.done = anyio.Event()


def _write_batch(writes: list[_Write], store: Store) -> None:
    with store.transaction():
        for write in writes:
            try:
                with store.savepoint():
                    write.fn(store)
            except TransactionLost:  # nothing of the batch stands: every write failed
                raise
            except Exception as exc:  # this write's failure is its caller's, not the batch's
                write.error = exc


class AsyncStore:
    """The gateway of one Store: ``run``, ``read`` and ``persist`` are its only ways in from async code."""

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
        self._open: _Batch | None = None
        """The batch that takes new ``persist`` writes (its leader waits for ``_writing``)."""
        self._writing: anyio.Event | None = None
        """Set when the batch being written is committed (None: none is being written)."""

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

    async def persist(self, fn: Callable[[Store], None]) -> None:
        """``fn(store)`` in the next batch of persistence writes; returns once it committed,
        raises what it raised (see the module docstring)."""
        write = _Write(fn)
        with anyio.CancelScope(shield=True):  # bounded: at most the batch before, then this one
            batch = self._open
            if batch is not None:
                batch.writes.append(write)
                await batch.done.wait()
            else:
                await self._lead(write)
        if write.error is not None:
            raise write.error

    async def _lead(self, first: _Write) -> None:
        """Open a batch with ``first``, wait for the batch being written, then write this one
        with every write that joined it meanwhile."""
        batch = self._open = _Batch()
        batch.writes.append(first)
        while self._writing is not None:
            await self._writing.wait()
        self._open = None
        self._writing = batch.done
        try:
            await self.run(partial(_write_batch, batch.writes))
        except Exception as exc:  # the transaction itself failed: nothing of it was written
            for write in batch.writes:
                write.error = write.error or exc
        finally:
            self._writing = None
            batch.done.set()

    async def close(self) -> None:
        """Close the database; shielded, so it also runs while the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await self.run(Store.close)
