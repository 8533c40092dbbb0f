"""VectorIndex: exact cosine search over one base's vectors of one model, in memory.

Owns the matrix a search multiplies: every vector of the base for its model, L2-normalized
float32 rows in rowid order, with the chunk rowid of each row. Loaded once from the
database (``load``: rows streamed into a preallocated matrix, no second copy), then kept up
to date by ``apply`` (the vectors a committed write added, replaced or removed) instead of
being rebuilt; a search is one matrix-vector product and a partial sort.

Must stay true:
- ``apply`` is idempotent and order-tolerant: a row added twice is stored once, removing an
  absent row does nothing, so a delta applied after a load that already saw it is harmless;
- removed rows are tombstoned (zeroed and masked) and compacted away when they exceed a
  quarter of the rows, so memory stays about the raw size of the live vectors (growth by
  a quarter at a time);
- not thread-safe by itself: the owner keeps ``load``/``apply`` exclusive of searches
  (KnowledgeIndexes: a readers-writer lock per index); several searches may read at once,
  ``search(lo=, hi=)`` over disjoint row ranges, so one query can use several cores.

BLAS threads: OpenBLAS's own worker threads spin-wait, and on a busy machine a
matrix-vector product of 5,000 x 384 took 24 ms with them instead of 0.35 ms without
(measured here, load 8 on 2 cores). So BLAS is limited to one thread when this module
loads (threadpoolctl), and a large index is split into row ranges searched in parallel by
the caller's worker threads instead.
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["VectorIndex", "limit_blas_threads"]

log = logging.getLogger(__name__)

_GROWTH = 1.25


def limit_blas_threads() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # a dependency; without it BLAS keeps its own threads
        log.warning("threadpoolctl is missing: BLAS keeps its own threads")
        return
    threadpool_limits(limits=1, user_api="blas")


limit_blas_threads()


class VectorIndex:
    def __init__(self, dims: int = 0) -> None:
        self.dims = dims
        self._matrix = np.zeros((0, dims), dtype=np.float32)
        self._rowids = np.zeros(0, dtype=np.int64)
        self._live = np.zeros(0, dtype=bool)
        self._size = 0
        self._dead = 0

    def __len__(self) -> int:
        return self._size - self._dead

    @property
    def nbytes(self) -> int:
        return int(self._matrix.nbytes + self._rowids.nbytes + self._live.nbytes)

    # ---- filling --------------------------------------------------------------------

    def reserve(self, count: int, dims: int) -> None:
        """Make room for ``count`` rows of ``dims`` (the load's VectorSink side)."""
        if self._size:
            raise RuntimeError("reserve() is for an empty index")
        self.dims = dims
        self._matrix = np.empty((count, dims), dtype=np.float32)
        self._rowids = np.empty(count, dtype=np.int64)
        self._live = np.ones(count, dtype=bool)

    def put(self, index: int, rowid: int, vector: bytes) -> None:
        row = np.frombuffer(vector, dtype="<f4")
        if row.shape[0] != self.dims:
            # a stored vector of another size cannot be compared: kept out (dead row)
            self._matrix[index] = 0.0
            self._live[index] = False
            self._dead += 1
        else:
            self._matrix[index] = row
        self._rowids[index] = rowid
        self._size = max(self._size, index + 1)

    def finish_load(self, loaded: int) -> None:
        """After ``put`` of rows 0..loaded-1 (fewer than reserved if rows vanished)."""
        if loaded < self._matrix.shape[0]:
            self._matrix = self._matrix[:loaded].copy()
            self._rowids = self._rowids[:loaded].copy()
            self._live = self._live[:loaded].copy()
        self._size = loaded

    # ---- incremental updates ----------------------------------------------------------

    def apply(self, upserted: list[tuple[int, bytes]], removed: list[int]) -> None:
        for rowid in removed:
            pos = self._find(rowid)
            if pos is not None and self._live[pos]:
                self._live[pos] = False
                self._matrix[pos] = 0.0
                self._dead += 1
        if upserted:
            if not self.dims:
                self.dims = len(upserted[0][1]) // 4
                self._matrix = np.zeros((0, self.dims), dtype=np.float32)
            upserted = sorted(upserted)
            appended: list[tuple[int, np.ndarray]] = []
            for rowid, blob in upserted:
                row = np.frombuffer(blob, dtype="<f4")
                if row.shape[0] != self.dims:
                    continue
                pos = self._find(rowid)
                if pos is not None:
                    if not self._live[pos]:
                        self._live[pos] = True
                        self._dead -= 1
                    self._matrix[pos] = row
                elif not self._size or rowid > self._rowids[self._size - 1]:
                    appended.append((rowid, row))
                else:
                    self._insert(rowid, row)  # out of order: rare (deltas applied late)
            if appended:
                self._append(appended)
        if self._dead > max(64, self._size // 4):
            self._compact()

    def _find(self, rowid: int) -> int | None:
        if not self._size:
            return None
        pos = int(np.searchsorted(self._rowids[: self._size], rowid))
        if pos < self._size and self._rowids[pos] == rowid:
            return pos
        return None

    def _ensure(self, extra: int) -> None:
        need = self._size + extra
        if need <= self._matrix.shape[0]:
            return
        capacity = max(need, int(self._matrix.shape[0] * _GROWTH) + 16)
        matrix = np.zeros((capacity, self.dims), dtype=np.float32)
        matrix[: self._size] = self._matrix[: self._size]
        rowids = np.zeros(capacity, dtype=np.int64)
        rowids[: self._size] = self._rowids[: self._size]
        live = np.zeros(capacity, dtype=bool)
        live[: self._size] = self._live[: self._size]
        self._matrix, self._rowids, self._live = matrix, rowids, live

    def _append(self, rows: list[tuple[int, np.ndarray]]) -> None:
        self._ensure(len(rows))
        for rowid, row in rows:
            self._matrix[self._size] = row
            self._rowids[self._size] = rowid
            self._live[self._size] = True
            self._size += 1

    def _insert(self, rowid: int, row: np.ndarray) -> None:
        self._ensure(1)
        pos = int(np.searchsorted(self._rowids[: self._size], rowid))
        n = self._size
        self._matrix[pos + 1 : n + 1] = self._matrix[pos:n].copy()
        self._rowids[pos + 1 : n + 1] = self._rowids[pos:n].copy()
        self._live[pos + 1 : n + 1] = self._live[pos:n].copy()
        self._matrix[pos] = row
        self._rowids[pos] = rowid
        self._live[pos] = True
        self._size += 1

    def _compact(self) -> None:
        keep = np.flatnonzero(self._live[: self._size])
        self._matrix = self._matrix[keep].copy()
        self._rowids = self._rowids[keep].copy()
        self._live = np.ones(len(keep), dtype=bool)
        self._size = len(keep)
        self._dead = 0

    # ---- search -----------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows of the matrix (live and tombstoned): the range ``search`` takes."""
        return self._size

    def search(self, query: np.ndarray, k: int, lo: int = 0, hi: int | None = None) -> list[tuple[int, float]]:
        """The ``k`` rows of ``lo:hi`` most similar to ``query`` (a unit vector):
        (rowid, cosine), best first."""
        hi = self._size if hi is None else min(hi, self._size)
        n = hi - lo
        if n <= 0 or k <= 0 or query.shape[0] != self.dims:
            return []
        scores = self._matrix[lo:hi] @ query.astype(np.float32, copy=False)
        if self._dead:
            scores[~self._live[lo:hi]] = -np.inf
        k = min(k, n)
        if k < n:
            top = np.argpartition(scores, n - k)[n - k :]
        else:
            top = np.arange(n)
        order = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self._rowids[lo + i]), float(scores[i])) for i in order if np.isfinite(scores[i])]
