"""KnowledgeVectors: the vectors of the knowledge bases' chunks and the schedule of the
vectors still to be made (the base of KnowledgeRepo, sidecar/store/knowledge.py).

Owns ``kb_vectors`` (float32 little-endian BLOBs, L2-normalized, with their model and dims)
and, on ``kb_documents``, the embedding retry state of a document that was indexed while its
embedding provider failed (status ``embedding_pending``, ``embed_attempts``,
``embed_retry_at``: migration ``m_kb_embedding_retry``).

Must stay true:
- every method is one transaction; vectors of a change of model (``write_vectors``) are
  stored under the new model, which answers no search until ``switch_vector_model``
  makes it the base's ``vector_model``;
- a vector is stored only for a chunk that still has the embed hash it was made from;
- a document leaves ``embedding_pending`` only in the transaction that stores the last
  vector it lacked (``finish_embedding``), or when its base needs none any more; a failed
  attempt pushes its next one later (``embedding_failed``: never earlier than before, for
  the document and the other pending documents of its base, which wait with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.errors import NotFound
from sidecar.store import kb_common
from sidecar.store.db import Database, fetch_all, fetch_iter
from sidecar.store.ids import now_ms
from sidecar.store.kb_records import (
    DOC_COLUMNS,
    KB_COLUMNS,
    READY,
    DocRecord,
    IndexDelta,
    KbRecord,
    VectorSink,
    doc_of,
    embed_text,
    heading_decoder,
    kb_of,
)

__all__ = ["KnowledgeVectors"]


class KnowledgeVectors:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._clock = clock

    def stored_vectors(self, doc_id: str, model: str) -> dict[str, tuple[str, bytes]]:
        """chunk id -> (embed hash, vector) of a document's chunks that have a ``model`` vector."""
        with self._db.read() as conn:
            return {
                cid: (ehash, blob)
                for cid, ehash, blob in fetch_iter(conn,
                    "SELECT c.id, v.embed_hash, v.vector FROM kb_chunks c JOIN kb_vectors v"
                    " ON v.chunk_rowid = c.rowid AND v.kb_id = c.kb_id AND v.model = ?"
                    " WHERE c.document_id = ?",
                    (model, doc_id),
                )
            }

    def _first_vectors(self, conn: Any, kb_id: str, model: str, dims: int) -> None:
        """The first vectors of a base decide what answers its searches."""
        kb = self._kb(conn, kb_id)
        if kb.vector_model is None or (kb.vector_model == model and kb.vector_dims is None):
            conn.execute("UPDATE kb_bases SET vector_model = ?, vector_dims = ? WHERE id = ?", (model, dims, kb_id))

    def read_vectors(self, kb_id: str, model: str, sink: VectorSink) -> int:
        """Hand every ``model`` vector of a base to ``sink`` in rowid order; their count.
        Rows are read one at a time (the cursor is not materialized): at most one BLOB
        beside the sink's own storage."""
        with self._db.read() as conn:
            rows = fetch_all(conn,
                "SELECT count(*), max(dims) FROM kb_vectors WHERE kb_id = ? AND model = ?", (kb_id, model)
            )
            count, dims = rows[0]
            if not count:
                return 0
            sink.reserve(count, dims)
            i = 0
            for rowid, blob in fetch_iter(conn,
                "SELECT chunk_rowid, vector FROM kb_vectors WHERE kb_id = ? AND model = ? ORDER BY chunk_rowid",
                (kb_id, model),
            ):
                if i >= count:  # cannot happen inside one snapshot; guards the sink's bounds
                    break
                sink.put(i, rowid, blob)
                i += 1
            return i

    def missing_vectors(self, kb_id: str, model: str, limit: int) -> list[tuple[int, str, str]]:
        """Up to ``limit`` chunks of a base without a current ``model`` vector:
        (rowid, embed hash, ``embed_text``)."""
        return self._missing("c.kb_id = ?", kb_id, model, limit)

    def _missing(self, where: str, key: str, model: str, limit: int | None) -> list[tuple[int, str, str]]:
        commons: dict[str, frozenset[int]] = {}
        with self._db.read() as conn:
            def common(kb_id: str) -> frozenset[int]:
                if kb_id not in commons:
                    commons[kb_id] = kb_common.common_of(conn, kb_id)
                return commons[kb_id]

            return [
                (rowid, ehash, kb_common.embedded(embed_text(heading_decoder.decode(heading), text), common(kb_id)))
                for rowid, ehash, kb_id, heading, text in fetch_iter(conn,
                    "SELECT c.rowid, c.embed_hash, c.kb_id, c.heading, c.text FROM kb_chunks c"
                    " LEFT JOIN kb_vectors v ON v.kb_id = c.kb_id AND v.model = ? AND v.chunk_rowid = c.rowid"
                    f" WHERE {where} AND (v.chunk_rowid IS NULL OR v.embed_hash != c.embed_hash)"
                    " ORDER BY c.rowid LIMIT ?",
                    (model, key, -1 if limit is None else limit),
                )
            ]

    def count_vectors(self, kb_id: str, model: str) -> tuple[int, int, int | None]:
        """(chunks of the base, those with a current ``model`` vector, their dimensions)."""
        with self._db.read() as conn:
            total = fetch_all(conn, "SELECT count(*) FROM kb_chunks WHERE kb_id = ?", (kb_id,))[0][0]
            done, dims = fetch_all(conn,
                "SELECT count(*), max(v.dims) FROM kb_chunks c JOIN kb_vectors v ON v.kb_id = c.kb_id AND v.model = ?"
                " AND v.chunk_rowid = c.rowid AND v.embed_hash = c.embed_hash WHERE c.kb_id = ?",
                (model, kb_id),
            )[0]
        return total, done, dims

    def write_vectors(self, kb_id: str, model: str, dims: int, rows: list[tuple[int, str, bytes]]) -> int:
        """Store vectors (rowid, embed hash, bytes) of chunks that still exist with that hash."""
        with self._db.write() as conn:
            return len(self._store_vectors(conn, kb_id, model, dims, rows))

    def switch_vector_model(self, kb_id: str, model: str, dims: int | None) -> bool:
        """Make ``model`` answer the base's searches and drop its other vectors (False: the
        base is gone or now wants another model)."""
        with self._db.write() as conn:
            rows = fetch_all(conn,
                "SELECT embed_provider_id, embed_model_id FROM kb_bases WHERE id = ?", (kb_id,)
            )
            if not rows or f"{rows[0][0]}/{rows[0][1]}" != model:
                return False
            conn.execute("UPDATE kb_bases SET vector_model = ?, vector_dims = ? WHERE id = ?", (model, dims, kb_id))
            conn.execute("DELETE FROM kb_vectors WHERE kb_id = ? AND model != ?", (kb_id, model))
            return True

    def _store_vectors(self, conn: Any, kb_id: str, model: str, dims: int, rows: list[tuple[int, str, bytes]]) -> list[tuple[int, bytes]]:
        """Store vectors (rowid, embed hash, bytes) of chunks that still exist with that hash;
        the (rowid, bytes) stored."""
        stored: list[tuple[int, bytes]] = []
        for rowid, ehash, blob in rows:
            if fetch_all(conn,
                "INSERT OR REPLACE INTO kb_vectors(kb_id, model, chunk_rowid, embed_hash, dims, vector)"
                " SELECT ?, ?, rowid, embed_hash, ?, ? FROM kb_chunks WHERE rowid = ? AND embed_hash = ?"
                " RETURNING chunk_rowid",
                (kb_id, model, dims, blob, rowid, ehash),
            ):
                stored.append((rowid, blob))
        return stored

    # ---- the vectors still to be made (``embedding_pending``) ---------------------------

    def next_embedding_retry(self) -> tuple[str, int] | None:
        """(document id, when) of the ``embedding_pending`` document due first, if any."""
        with self._db.read() as conn:
            rows = fetch_all(conn,
                "SELECT id, coalesce(embed_retry_at, 0) FROM kb_documents WHERE status = 'embedding_pending'"
                " ORDER BY embed_retry_at, id LIMIT 1"
            )
        return (rows[0][0], rows[0][1]) if rows else None

    def pending_vectors(self, doc_id: str, model: str) -> list[tuple[int, str, str]]:
        """The chunks of a document without a current ``model`` vector: (rowid, embed hash,
        ``embed_text``)."""
        return self._missing("c.document_id = ?", doc_id, model, None)

    def finish_embedding(
        self, doc: DocRecord, model: str, dims: int | None, rows: list[tuple[int, str, bytes]]
    ) -> tuple[IndexDelta, bool] | None:
        """Store a pending document's vectors (rowid, embed hash, bytes) for its base's
        ``model`` and, when none of its chunks lacks one any more, make it ``ready`` and bring
        the base's other pending documents' next attempt forward to now (the provider
        answers again): (what changed in the vectors, whether it is ``ready``). None
        (nothing written) when the document is gone, re-indexed, no longer pending, or its
        base now embeds with another model."""
        with self._db.write() as conn:
            rows_now = fetch_all(conn,
                "SELECT d.revision, d.status, b.embed_provider_id || '/' || b.embed_model_id FROM kb_documents d"
                " JOIN kb_bases b ON b.id = d.kb_id WHERE d.id = ?", (doc.id,)
            )
            if not rows_now or rows_now[0][0] != doc.revision or rows_now[0][1] != "embedding_pending" \
                    or rows_now[0][2] != model:
                return None
            stored = self._store_vectors(conn, doc.kb_id, model, dims, rows) if dims is not None and rows else []
            if dims is not None and stored:
                self._first_vectors(conn, doc.kb_id, model, dims)
            lacking = fetch_all(conn,
                "SELECT count(*) FROM kb_chunks c LEFT JOIN kb_vectors v"
                " ON v.kb_id = c.kb_id AND v.model = ? AND v.chunk_rowid = c.rowid AND v.embed_hash = c.embed_hash"
                " WHERE c.document_id = ? AND v.chunk_rowid IS NULL", (model, doc.id),
            )[0][0]
            now = self._clock()
            if not lacking:
                conn.execute(f"UPDATE kb_documents SET {READY}, updated_at = ? WHERE id = ?", (now, doc.id))
                conn.execute(
                    "UPDATE kb_documents SET embed_retry_at = ? WHERE kb_id = ? AND status = 'embedding_pending'"
                    " AND embed_retry_at > ?", (now, doc.kb_id, now),
                )
            return IndexDelta(kb_id=doc.kb_id, model=model, upserted=stored), not lacking

    def embedding_failed(self, doc: DocRecord, message: str, delay_ms: Callable[[int], int]) -> DocRecord | None:
        """Count a failed attempt of a pending document: its next one ``delay_ms(attempts)``
        from now (attempts counted with this one); the base's other pending documents wait at least as
        long (one attempt per base and round while its provider fails). The document as it
        is now; None when it is gone, re-indexed or no longer pending."""
        with self._db.write() as conn:
            rows = fetch_all(conn,
                "SELECT embed_attempts FROM kb_documents WHERE id = ? AND revision = ? AND status = 'embedding_pending'",
                (doc.id, doc.revision),
            )
            if not rows:
                return None
            attempts = rows[0][0] + 1
            now = self._clock()
            at = now + delay_ms(attempts)
            conn.execute(
                "UPDATE kb_documents SET embed_attempts = ?, embed_retry_at = ?, error = ?, error_code = 'embedding_failed',"
                " updated_at = ? WHERE id = ?", (attempts, at, message[:2000], now, doc.id),
            )
            conn.execute(
                "UPDATE kb_documents SET embed_attempts = max(embed_attempts, ?),"
                " embed_retry_at = max(coalesce(embed_retry_at, 0), ?), error = ?, updated_at = ?"
                " WHERE kb_id = ? AND status = 'embedding_pending' AND id != ?",
                (attempts, at, message[:2000], now, doc.kb_id, doc.id),
            )
            return self._doc(conn, doc.id)

    def retry_embedding_now(self, kb_id: str) -> int:
        """Bring the next attempt of the base's pending documents forward to now (its model
        changed, or its re-embedding finished); how many."""
        with self._db.write() as conn:
            return len(fetch_all(conn,
                "UPDATE kb_documents SET embed_retry_at = ? WHERE kb_id = ? AND status = 'embedding_pending'"
                " RETURNING id", (self._clock(), kb_id),
            ))

    # ---- internals ----------------------------------------------------------------

    def _kb(self, conn: Any, kb_id: str) -> KbRecord:
        rows = fetch_all(conn, f"SELECT {KB_COLUMNS} FROM kb_bases WHERE id = ?", (kb_id,))
        if not rows:
            raise NotFound(f"knowledge base {kb_id!r} not found", data={"kbId": kb_id})
        return kb_of(rows[0])

    def _doc(self, conn: Any, doc_id: str) -> DocRecord:
        rows = fetch_all(conn, f"SELECT {DOC_COLUMNS} FROM kb_documents WHERE id = ?", (doc_id,))
        if not rows:
            raise NotFound(f"document {doc_id!r} not found", data={"documentId": doc_id})
        return doc_of(rows[0])
