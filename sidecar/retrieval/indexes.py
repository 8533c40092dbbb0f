"""KnowledgeIndexes: the in-memory VectorIndex of each (base, model), loaded on first search.

Owns when an index is loaded, updated and dropped:
- ``search`` loads the (base, model) index from the database the first time it is needed
  (in a worker thread), then answers from memory;
- ``apply`` hands a committed write's IndexDelta to the loaded index (an index not loaded
  yet ignores it: it will read the committed rows when it loads);
- ``drop`` forgets a base's indexes (base deleted, model switched or cleared).
``generation`` counts every change, so callers can cache results per generation.

Must stay true: every load, apply and search of one index holds that index's lock (they all
run in worker threads), and ``apply`` is idempotent (see VectorIndex), so a delta racing a
load is neither lost nor doubled.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from sidecar.store.knowledge import IndexDelta, KnowledgeRepo

if TYPE_CHECKING:
    import numpy as np

    from sidecar.retrieval.vectors import VectorIndex

__all__ = ["KnowledgeIndexes"]


class _Slot:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index: VectorIndex | None = None


class KnowledgeIndexes:
    def __init__(self, repo: KnowledgeRepo) -> None:
        self._repo = repo
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._guard = threading.Lock()
        self.generation = 0

    def _slot(self, kb_id: str, model: str) -> _Slot:
        with self._guard:
            slot = self._slots.get((kb_id, model))
            if slot is None:
                slot = self._slots[(kb_id, model)] = _Slot()
            return slot

    def _loaded(self, kb_id: str, model: str, slot: _Slot) -> VectorIndex:
        """The slot's index, loading it first (caller holds ``slot.lock``)."""
        if slot.index is None:
            from sidecar.retrieval.vectors import VectorIndex  # numpy: loaded on first use

            index = VectorIndex()
            loaded = self._repo.read_vectors(kb_id, model, index)
            index.finish_load(loaded)
            slot.index = index
        return slot.index

    def search_blocking(
        self, targets: Sequence[tuple[str, str]], query: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        """The best ``k`` (rowid, cosine) over the (base, model) indexes of one model."""
        hits: list[tuple[int, float]] = []
        for kb_id, model in targets:
            slot = self._slot(kb_id, model)
            with slot.lock:
                hits.extend(self._loaded(kb_id, model, slot).search(query, k))
        hits.sort(key=lambda h: -h[1])
        return hits[:k]

    async def search(self, targets: Sequence[tuple[str, str]], query: np.ndarray, k: int) -> list[tuple[int, float]]:
        return await anyio.to_thread.run_sync(self.search_blocking, list(targets), query, k)

    def apply_blocking(self, delta: IndexDelta) -> None:
        self.generation += 1
        if delta.model is None or (not delta.upserted and not delta.removed):
            if delta.removed:
                self._remove_everywhere(delta.kb_id, delta.removed)
            return
        slot = self._slot(delta.kb_id, delta.model)
        with slot.lock:
            if slot.index is not None:
                slot.index.apply(delta.upserted, delta.removed)
        if delta.removed:
            self._remove_everywhere(delta.kb_id, delta.removed, skip=delta.model)

    def _remove_everywhere(self, kb_id: str, rowids: list[int], skip: str | None = None) -> None:
        with self._guard:
            slots = [(m, s) for (k, m), s in self._slots.items() if k == kb_id and m != skip]
        for _, slot in slots:
            with slot.lock:
                if slot.index is not None:
                    slot.index.apply([], rowids)

    async def apply(self, delta: IndexDelta) -> None:
        await anyio.to_thread.run_sync(self.apply_blocking, delta)

    def drop(self, kb_id: str, *, keep_model: str | None = None) -> None:
        self.generation += 1
        with self._guard:
            for key in [k for k in self._slots if k[0] == kb_id and k[1] != keep_model]:
                del self._slots[key]

    def loaded_bytes(self) -> int:
        with self._guard:
            slots = list(self._slots.values())
        return sum(s.index.nbytes for s in slots if s.index is not None)
