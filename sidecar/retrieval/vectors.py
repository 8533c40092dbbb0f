"""VectorIndex: cosine search over one base's vectors of one model, in memory.

Owns the matrix a search multiplies: every vector of the base for its model, L2-normalized
float32 rows in rowid order, with the chunk rowid of each row. Loaded once from the
database (``load``: rows streamed into a preallocated matrix, no second copy), then kept up
to date by ``apply`` (the vectors a committed write added, replaced or removed) instead of
being rebuilt.

A search of fewer than APPROX_ROWS rows (counted per ``lo:hi`` range: a large index is
searched in one range per core) is exact: one matrix-vector product and a partial sort.
Over more, reading the whole float32 matrix for every query is what costs (it is
memory-bound: 10-15 ms for 10^5 x 384 here), so each row also keeps a sign code, one bit
per dimension of the row minus the index's mean vector (48 bytes for 384 dimensions, 3% of
the row), and a search ranks every row by the Hamming distance of its code to the query's,
then computes the exact cosine of the RERANK_FACTOR x k nearest codes (at least
RERANK_MIN) and returns the best k of those: the scores returned are exact; a row can be
missed only when its code ranks it outside that pool (recall against the exact search is
printed by tools/bench/bench_retrieval.py). The mean is taken at load and compaction, and
again whenever the index has doubled since (codes without it lose the dimensions every
vector shares).

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
from collections.abc import Sequence

import numpy as np

__all__ = ["VectorIndex", "limit_blas_threads"]

log = logging.getLogger(__name__)

_GROWTH = 1.25
APPROX_ROWS = 20_000
"""A search over this many rows or more ranks by sign codes first (see the module doc)."""
RERANK_FACTOR = 40
RERANK_MIN = 1_000
"""The exact cosines a coded search computes: max(RERANK_FACTOR x k, RERANK_MIN)."""
_CODE_BLOCK = 8192
"""Rows coded at a time (a bounded temporary, not a copy of the matrix)."""


def limit_blas_threads() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # a dependency; without it BLAS keeps its own threads
        log.warning("threadpoolctl is missing: BLAS keeps its own threads")
        return
    threadpool_limits(limits=1, user_api="blas")


limit_blas_threads()


def _code_words(dims: int) -> int:
    return -(-dims // 64)


class VectorIndex:
    def __init__(self, dims: int = 0) -> None:
        self.dims = dims
        self._matrix = np.zeros((0, dims), dtype=np.float32)
        self._rowids = np.zeros(0, dtype=np.int64)
        self._live = np.zeros(0, dtype=bool)
        self._codes = np.zeros((_code_words(dims), 0), dtype=np.uint64)
        """Word j of every row's sign code in row j (a search reads each word contiguously)."""
        self._center = np.zeros(dims, dtype=np.float32)
        self._centered_rows = 0
        """Rows when the center was last taken (it is taken again once they double)."""
        self._size = 0
        self._dead = 0

    def __len__(self) -> int:
        return self._size - self._dead

    @property
    def nbytes(self) -> int:
        return int(self._matrix.nbytes + self._rowids.nbytes + self._live.nbytes + self._codes.nbytes)

    # ---- sign codes -------------------------------------------------------------------

    def _code(self, rows: np.ndarray) -> np.ndarray:
        """The sign codes of ``rows`` (float32, dims wide) around the center: words x rows."""
        bits = np.packbits(rows > self._center, axis=1)
        pad = _code_words(self.dims) * 8 - bits.shape[1]
        if pad:
            bits = np.pad(bits, ((0, 0), (0, pad)))
        return np.ascontiguousarray(bits).view(np.uint64).T

    def _recenter(self) -> None:
        """Take the mean of the live rows as the center and code every row again."""
        n = self._size
        if n:
            live = self._live[:n]
            total = np.zeros(self.dims, dtype=np.float64)
            for lo in range(0, n, _CODE_BLOCK):
                block = self._matrix[lo : lo + _CODE_BLOCK][live[lo : lo + _CODE_BLOCK]]
                total += block.sum(axis=0, dtype=np.float64)
            alive = int(live.sum())
            self._center = (total / max(alive, 1)).astype(np.float32)
        for lo in range(0, n, _CODE_BLOCK):
            hi = min(n, lo + _CODE_BLOCK)
            self._codes[:, lo:hi] = self._code(self._matrix[lo:hi])
        self._centered_rows = n

    # ---- filling --------------------------------------------------------------------

    def reserve(self, count: int, dims: int) -> None:
        """Make room for ``count`` rows of ``dims`` (the load's VectorSink side)."""
        if self._size:
            raise RuntimeError("reserve() is for an empty index")
        self.dims = dims
        self._matrix = np.empty((count, dims), dtype=np.float32)
        self._rowids = np.empty(count, dtype=np.int64)
        self._live = np.ones(count, dtype=bool)
        self._codes = np.zeros((_code_words(dims), count), dtype=np.uint64)
        self._center = np.zeros(dims, dtype=np.float32)

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
            self._codes = self._codes[:, :loaded].copy()
        self._size = loaded
        self._recenter()

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
                self._codes = np.zeros((_code_words(self.dims), 0), dtype=np.uint64)
                self._center = np.zeros(self.dims, dtype=np.float32)
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
                    self._codes[:, pos] = self._code(row[None, :])[:, 0]
                elif not self._size or rowid > self._rowids[self._size - 1]:
                    appended.append((rowid, row))
                else:
                    self._insert(rowid, row)  # out of order: rare (deltas applied late)
            if appended:
                self._append(appended)
        if self._dead > max(64, self._size // 4):
            self._compact()
        elif self._size >= 2 * max(self._centered_rows, APPROX_ROWS // 4):
            self._recenter()  # amortized: at most once per doubling

    def holds(self, rowids: Sequence[int]) -> set[int]:
        """The ``rowids`` that have a live vector here."""
        if not self._size or not rowids:
            return set()
        wanted = np.asarray(rowids, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._rowids[: self._size], wanted), self._size - 1)
        found = (self._rowids[pos] == wanted) & self._live[pos]
        return {int(r) for r in wanted[found]}

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
        codes = np.zeros((self._codes.shape[0], capacity), dtype=np.uint64)
        codes[:, : self._size] = self._codes[:, : self._size]
        self._matrix, self._rowids, self._live, self._codes = matrix, rowids, live, codes

    def _append(self, rows: list[tuple[int, np.ndarray]]) -> None:
        self._ensure(len(rows))
        start = self._size
        for rowid, row in rows:
            self._matrix[self._size] = row
            self._rowids[self._size] = rowid
            self._live[self._size] = True
            self._size += 1
        self._codes[:, start : self._size] = self._code(self._matrix[start : self._size])

    def _insert(self, rowid: int, row: np.ndarray) -> None:
        self._ensure(1)
        pos = int(np.searchsorted(self._rowids[: self._size], rowid))
        n = self._size
        self._matrix[pos + 1 : n + 1] = self._matrix[pos:n].copy()
        self._rowids[pos + 1 : n + 1] = self._rowids[pos:n].copy()
        self._live[pos + 1 : n + 1] = self._live[pos:n].copy()
        self._codes[:, pos + 1 : n + 1] = self._codes[:, pos:n].copy()
        self._matrix[pos] = row
        self._rowids[pos] = rowid
        self._live[pos] = True
        self._codes[:, pos] = self._code(row[None, :])[:, 0]
        self._size += 1

    def _compact(self) -> None:
        keep = np.flatnonzero(self._live[: self._size])
        self._matrix = self._matrix[keep].copy()
        self._rowids = self._rowids[keep].copy()
        self._live = np.ones(len(keep), dtype=bool)
        self._codes = np.zeros((self._codes.shape[0], len(keep)), dtype=np.uint64)
        self._size = len(keep)
        self._dead = 0
        self._recenter()

    # ---- search -----------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Rows of the matrix (live and tombstoned): the range ``search`` takes."""
        return self._size

    def search(
        self, query: np.ndarray, k: int, lo: int = 0, hi: int | None = None, share: float = 1.0
    ) -> list[tuple[int, float]]:
        """The ``k`` rows of ``lo:hi`` most similar to ``query`` (a unit vector):
        (rowid, cosine), best first. ``share``: the part of the whole index ``lo:hi`` is,
        when one search is split into row ranges; a coded search of a range reranks that
        share of the pool, so a split search computes as many exact cosines as one over
        every row (the pool's rows are read from memory at random: the costliest step)."""
        hi = self._size if hi is None else min(hi, self._size)
        n = hi - lo
        if n <= 0 or k <= 0 or query.shape[0] != self.dims:
            return []
        query = query.astype(np.float32, copy=False)
        pool = max(int(max(RERANK_FACTOR * k, RERANK_MIN) * min(1.0, share)), k)
        if n >= APPROX_ROWS and pool < n:
            return self._coded_search(query, k, pool, lo, hi)
        scores = self._matrix[lo:hi] @ query
        if self._dead:
            scores[~self._live[lo:hi]] = -np.inf
        k = min(k, n)
        if k < n:
            top = np.argpartition(scores, n - k)[n - k :]
        else:
            top = np.arange(n)
        order = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self._rowids[lo + i]), float(scores[i])) for i in order if np.isfinite(scores[i])]

    def _coded_search(self, query: np.ndarray, k: int, pool: int, lo: int, hi: int) -> list[tuple[int, float]]:
        """``search`` over many rows: the rows of the ``pool`` nearest sign codes (and those
        tied with the last of them), then their exact cosines."""
        code = self._code(query[None, :])[:, 0]
        word = np.empty(hi - lo, dtype=np.uint64)
        distance = np.zeros(hi - lo, dtype=np.uint16)
        for j in range(len(code)):
            np.bitwise_xor(self._codes[j, lo:hi], code[j], out=word)
            distance += np.bitwise_count(word)
        if self._dead:
            distance[~self._live[lo:hi]] = len(code) * 64 + 1  # past every real distance
        # the distance the pool reaches, from a histogram (cheaper than a partial sort)
        reach = int(np.searchsorted(np.cumsum(np.bincount(distance)), pool))
        near = np.flatnonzero(distance <= reach)
        if self._dead:
            near = near[self._live[lo + near]]
        if not len(near):
            return []
        scores = self._matrix[lo + near] @ query
        k = min(k, len(near))
        top = np.argpartition(scores, len(near) - k)[len(near) - k :] if k < len(near) else np.arange(len(near))
        order = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self._rowids[lo + near[i]]), float(scores[i])) for i in order]
