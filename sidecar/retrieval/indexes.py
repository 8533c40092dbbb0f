"""VectorIndexes: the in-memory VectorIndex of each (key, model), loaded on first search.

A key partitions the vectors: a knowledge base's id (KnowledgeService, the default source
``Store.knowledge``) or a memory scope (MemoryService, source ``Store.memory``). The source
is the repository whose ``read_vectors(key, model, sink)`` streams a partition's vectors.

Owns when an index is loaded, updated and dropped:
- ``search`` loads the (key, model) index from the database the first time it is needed
  (a store hop), then answers from memory;
- ``apply`` (a knowledge IndexDelta) and ``update`` hand a committed write's vectors to
  the loaded index (an index not loaded yet ignores them: it will read the committed
  rows when it loads);
- ``drop`` forgets a key's indexes (base deleted, model switched or cleared; scope gone).
``generation`` counts every change, so callers can cache results per generation.

A search of an index of at least SPLIT_ROWS rows is split into one row range per core,
each searched in its own worker thread (``anyio.to_thread``), then merged: BLAS runs one
thread per call (see vectors.py), so the split is what uses the cores. A range's coded
search reranks its share of the pool (``VectorIndex.search(share=)``): the split computes
as many exact cosines as a search of the whole index, not that many per range.

Must stay true: loads and applies of one index are exclusive of each other and of its
searches (a readers-writer lock per index: searches read together); everything runs in
worker threads (a load reads the database, so it runs through ``AsyncStore.run``; searches
and applies hold no connection and use anyio's own threads); ``apply`` is idempotent (see VectorIndex), so a delta racing a load is
neither lost nor doubled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import anyio

from sidecar import parts
from sidecar.store.async_store import AsyncStore
from sidecar.store.knowledge import IndexDelta, VectorSink

if TYPE_CHECKING:
    import numpy as np

    from sidecar.retrieval.vectors import VectorIndex
    from sidecar.store.store import Store

__all__ = ["VectorIndexes", "KnowledgeIndexes", "VectorSource"]


class VectorSource(Protocol):
    """A repository holding vectors by (key, model): KnowledgeRepo, MemoryRepo."""

    def read_vectors(self, key: str, model: str, sink: VectorSink, /) -> int: ...


def _knowledge(store: Store) -> VectorSource:
    return store.knowledge


SPLIT_ROWS = 32_768
PARTS = max(1, min(4, os.cpu_count() or 1))


class _ReadWriteLock:
    """Many readers or one writer (searches read; loads and applies write)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class _Slot:
    def __init__(self) -> None:
        self.lock = _ReadWriteLock()
        self.index: VectorIndex | None = None


class VectorIndexes:
    def __init__(self, store: AsyncStore, source: Callable[[Store], VectorSource] = _knowledge) -> None:
        self._store = store
        self._source = source
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._guard = threading.Lock()
        self.generation = 0

    def _slot(self, kb_id: str, model: str) -> _Slot:
        with self._guard:
            slot = self._slots.get((kb_id, model))
            if slot is None:
                slot = self._slots[(kb_id, model)] = _Slot()
            return slot

    def _loaded(self, repo: VectorSource, kb_id: str, model: str, slot: _Slot) -> VectorIndex:
        """The slot's index, loaded first from ``repo`` if need be (blocking: a store hop)."""
        with slot.lock.read():
            if slot.index is not None:
                return slot.index
        with slot.lock.write():
            if slot.index is None:
                parts.require("vectors")
                from sidecar.retrieval.vectors import VectorIndex  # numpy: loaded on first use

                index = VectorIndex()
                loaded = repo.read_vectors(kb_id, model, index)
                index.finish_load(loaded)
                slot.index = index
            return slot.index

    def _loader(self, key: str, model: str, slot: _Slot) -> Callable[[Store], VectorIndex]:
        return lambda s: self._loaded(self._source(s), key, model, slot)

    def _search_part(
        self, slot: _Slot, query: np.ndarray, k: int, lo: int, hi: int | None, share: float = 1.0
    ) -> list[tuple[int, float]]:
        with slot.lock.read():
            return slot.index.search(query, k, lo, hi, share) if slot.index is not None else []

    def search_blocking(
        self, repo: VectorSource, targets: Sequence[tuple[str, str]], query: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        """The best ``k`` (rowid, cosine) over the (base, model) indexes of one model, in the
        calling thread (no split; an index not loaded yet is read from ``repo``)."""
        hits: list[tuple[int, float]] = []
        for kb_id, model in targets:
            slot = self._slot(kb_id, model)
            self._loaded(repo, kb_id, model, slot)
            hits.extend(self._search_part(slot, query, k, 0, None))
        hits.sort(key=lambda h: -h[1])
        return hits[:k]

    def holding_blocking(self, targets: Sequence[tuple[str, str]], rowids: Sequence[int]) -> set[int]:
        """The ``rowids`` that have a vector in one of the loaded (key, model) indexes of
        ``targets`` (blocking: a read lock; an index not loaded holds none)."""
        held: set[int] = set()
        for key, model in targets:
            slot = self._slot(key, model)
            with slot.lock.read():
                if slot.index is not None:
                    held |= slot.index.holds(rowids)
        return held

    async def search(self, targets: Sequence[tuple[str, str]], query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """``search_blocking`` in worker threads, a large index split over the cores (small
        indexes together in one worker-thread hop)."""
        hits: list[tuple[int, float]] = []
        slots = []
        for kb_id, model in targets:
            slot = self._slot(kb_id, model)
            if slot.index is None:  # first use: read from the database (a store hop)
                await self._store.run(self._loader(kb_id, model, slot))
            slots.append(slot)
        if sum(slot.index.rows for slot in slots if slot.index is not None) < SPLIT_ROWS or PARTS == 1:
            def together() -> list[tuple[int, float]]:
                found: list[tuple[int, float]] = []
                for slot in slots:
                    found.extend(self._search_part(slot, query, k, 0, None))
                return found

            hits = await anyio.to_thread.run_sync(together)
            hits.sort(key=lambda h: -h[1])
            return hits[:k]
        for kb_id, model in targets:
            slot = self._slot(kb_id, model)
            index = slot.index
            if index is None:  # first use: read from the database (a store hop)
                index = await self._store.run(lambda s: self._loaded(self._source(s), kb_id, model, slot))
            rows = index.rows
            if rows < SPLIT_ROWS or PARTS == 1:
                hits.extend(await anyio.to_thread.run_sync(self._search_part, slot, query, k, 0, None))
                continue
            step = -(-rows // PARTS)
            parts: list[list[tuple[int, float]]] = [[] for _ in range(PARTS)]

            async def part(i: int) -> None:
                lo, hi = i * step, min(rows, (i + 1) * step)
                parts[i] = await anyio.to_thread.run_sync(self._search_part, slot, query, k, lo, hi, (hi - lo) / rows)

            async with anyio.create_task_group() as tg:
                for i in range(PARTS):
                    tg.start_soon(part, i)
            for found in parts:
                hits.extend(found)
        hits.sort(key=lambda h: -h[1])
        return hits[:k]

    def apply_blocking(self, delta: IndexDelta) -> None:
        self.update_blocking(delta.kb_id, delta.model, delta.upserted, delta.removed)

    def update_blocking(
        self, key: str, model: str | None, upserted: list[tuple[int, bytes]], removed: list[int]
    ) -> None:
        """Vectors of ``key`` a committed write added or replaced (for ``model``) and rows it
        removed (``model`` None: removed from every model's index of the key)."""
        self.generation += 1
        if model is None or (not upserted and not removed):
            if removed:
                self._remove_everywhere(key, removed)
            return
        slot = self._slot(key, model)
        with slot.lock.write():
            if slot.index is not None:
                slot.index.apply(upserted, removed)
        if removed:
            self._remove_everywhere(key, removed, skip=model)

    def _remove_everywhere(self, kb_id: str, rowids: list[int], skip: str | None = None) -> None:
        with self._guard:
            slots = [(m, s) for (k, m), s in self._slots.items() if k == kb_id and m != skip]
        for _, slot in slots:
            with slot.lock.write():
                if slot.index is not None:
                    slot.index.apply([], rowids)

    async def apply(self, delta: IndexDelta) -> None:
        await anyio.to_thread.run_sync(self.apply_blocking, delta)

    async def update(self, key: str, model: str | None, upserted: list[tuple[int, bytes]], removed: list[int]) -> None:
        await anyio.to_thread.run_sync(self.update_blocking, key, model, upserted, removed)

    def drop(self, kb_id: str, *, keep_model: str | None = None) -> None:
        self.generation += 1
        with self._guard:
            for key in [k for k in self._slots if k[0] == kb_id and k[1] != keep_model]:
                del self._slots[key]

    def loaded_bytes(self) -> int:
        with self._guard:
            slots = list(self._slots.values())
        return sum(s.index.nbytes for s in slots if s.index is not None)


KnowledgeIndexes = VectorIndexes
"""The knowledge bases' VectorIndexes (source ``Store.knowledge``, keys are base ids)."""
