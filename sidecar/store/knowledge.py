"""KnowledgeRepo: knowledge bases, documents, chunks, vectors and the chunks' full-text index.

Owns the tables of migration ``m_knowledge``: ``kb_bases``, ``kb_documents``, ``kb_chunks``,
``kb_vectors`` (through its base KnowledgeVectors, kb_vectors.py, which also keeps the
embedding retry schedule) and each base's full-text table (kb_lexical.py: contentless
FTS5 over each chunk's heading path + text, rewritten by ``sidecar/store/fts.py``).
The records and row decoding are in kb_records.py (re-exported here).

Must stay true:
- Every method is one transaction (``Database.read``/``write``): a crash leaves a document's
  previous index or its new one, never a mix. A document's chunks, their index rows and
  their vectors are written in the same transaction as its ``ready`` (or
  ``embedding_pending``: some vectors could not be made) status (``write_index``), so a
  kill during embedding leaves no vector of it visible; vectors of
  a change of model (``write_vectors``) are stored under the new model, which answers no
  search until ``switch_vector_model`` makes it the base's ``vector_model``.
- An indexing run works on one ``revision`` of its document; ``write_index`` and
  ``mark_error`` change nothing when the document is gone or a newer revision was asked
  for (delete or reindex during indexing), so a stale run never overwrites newer state.
- A chunk keeps its row (rowid, vectors) across a re-index that keeps its content-addressed
  id; chunks whose id disappears are deleted with their vectors (cascade) and full-text
  rows (here, in the same transaction).
- User text reaches MATCH only through ``fts`` quoting (kb_lexical.py).

Synchronous: ``Store.knowledge``, reached from async code through ``AsyncStore.run``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from protocol.kb import KbChunk, KnowledgeBase
from sidecar.errors import NotFound
from sidecar.store import kb_common, kb_lexical
from sidecar.store.db import Database, fetch_all, fetch_iter
from sidecar.store.ids import new_id, now_ms
from sidecar.store.kb_records import (
    CHUNK_COLUMNS,
    DOC_COLUMNS,
    KB_COLUMNS,
    READY,
    ChunkHit,
    DocRecord,
    IndexDelta,
    KbRecord,
    NewChunk,
    VectorSink,
    chunk_id,
    doc_of,
    embed_text,
    heading_decoder,
    kb_of,
)
from sidecar.store.kb_vectors import KnowledgeVectors

__all__ = [
    "KnowledgeRepo",
    "KbRecord",
    "DocRecord",
    "NewChunk",
    "IndexDelta",
    "ChunkHit",
    "VectorSink",
    "embed_text",
    "chunk_id",
]


_encode = msgspec.json.encode


class KnowledgeRepo(KnowledgeVectors):
    """Bases, documents, their chunks and full-text rows, and lexical search (the vectors
    and the embedding schedule: KnowledgeVectors)."""

    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        super().__init__(db, clock)
        self._lexical = kb_lexical.LexicalIndex()

    @staticmethod
    def rebuild_index(conn: Any) -> int:
        """Write every base's full-text table again from its chunks (after a change of
        ``fts.index_text``: the migration that folds width and case); how many rows."""
        return kb_lexical.rebuild_all(conn)

    # ---- bases --------------------------------------------------------------------

    def create_kb(
        self, *, name: str, description: str, embed: tuple[str, str] | None, chunk_size: int, chunk_overlap: int
    ) -> KbRecord:
        now = self._clock()
        kb_id = new_id()
        with self._db.write() as conn:
            conn.execute(
                f"INSERT INTO kb_bases({KB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
                (kb_id, name, description, embed[0] if embed else None, embed[1] if embed else None,
                 chunk_size, chunk_overlap, now, now),
            )
            kb_lexical.create(conn, kb_id)
            return self._kb(conn, kb_id)

    def get_kb(self, kb_id: str) -> KbRecord:
        with self._db.read() as conn:
            return self._kb(conn, kb_id)

    def kbs(self, kb_ids: Sequence[str] | None = None) -> list[KbRecord]:
        """The given bases that exist (all when None), oldest first."""
        with self._db.read() as conn:
            if kb_ids is None:
                rows = fetch_all(conn, f"SELECT {KB_COLUMNS} FROM kb_bases ORDER BY created_at, id")
            else:
                ids = list(dict.fromkeys(kb_ids))
                if not ids:
                    return []
                rows = fetch_all(conn,
                    f"SELECT {KB_COLUMNS} FROM kb_bases WHERE id IN ({','.join('?' * len(ids))})"
                    " ORDER BY created_at, id", ids,
                )
        return [kb_of(r) for r in rows]

    def kb_infos(self, kb_ids: Sequence[str] | None = None, *, reembedding: frozenset[str] = frozenset()) -> list[KnowledgeBase]:
        records = self.kbs(kb_ids)
        if not records:
            return []
        with self._db.read() as conn:
            marks = ",".join("?" * len(records))
            stats = {
                row[0]: row[1:]
                for row in fetch_iter(conn,
                    "SELECT kb_id, count(*), coalesce(sum(chunk_count), 0),"
                    " sum(status IN ('pending', 'indexing')), sum(status = 'error'), sum(status = 'embedding_pending')"
                    f" FROM kb_documents WHERE kb_id IN ({marks}) GROUP BY kb_id",
                    [r.id for r in records],
                )
            }
        return [self._info(r, stats.get(r.id, (0, 0, 0, 0, 0)), r.id in reembedding) for r in records]

    @staticmethod
    def _info(r: KbRecord, stat: tuple[Any, ...], reembedding: bool) -> KnowledgeBase:
        from protocol.kb import EmbeddingModelRef

        docs, chunks, open_docs, failed, pending = stat
        embed = (
            EmbeddingModelRef(provider_id=r.embed_provider_id, model_id=r.embed_model_id)
            if r.embed_provider_id and r.embed_model_id else None
        )
        return KnowledgeBase(
            id=r.id, name=r.name, description=r.description, embedding_model=embed, chunk_size=r.chunk_size,
            chunk_overlap=r.chunk_overlap, vector_model=r.vector_model, vector_dims=r.vector_dims,
            reembedding=reembedding, document_count=docs or 0, chunk_count=chunks or 0,
            documents_indexing=open_docs or 0, documents_failed=failed or 0,
            documents_embedding_pending=pending or 0,
            created_at=r.created_at, updated_at=r.updated_at,
        )

    def update_kb(self, kb_id: str, **changes: Any) -> KbRecord:
        """Set columns of a base (names of ``kb_bases``); ``embed`` = (provider, model) | None."""
        allowed = {"name", "description", "chunk_size", "chunk_overlap"}
        sets: list[str] = []
        args: list[Any] = []
        for key, value in changes.items():
            if key == "embed":
                sets += ["embed_provider_id = ?", "embed_model_id = ?"]
                args += [value[0], value[1]] if value else [None, None]
            elif key in allowed:
                sets.append(f"{key} = ?")
                args.append(value)
            else:
                raise ValueError(f"not a column of kb_bases: {key}")
        with self._db.write() as conn:
            self._kb(conn, kb_id)
            if sets:
                conn.execute(
                    f"UPDATE kb_bases SET {', '.join(sets)}, updated_at = ? WHERE id = ?",
                    [*args, self._clock(), kb_id],
                )
            if "embed" in changes and not changes["embed"]:
                # no model any more: lexical only, the vectors are dropped, none is waited for
                conn.execute("DELETE FROM kb_vectors WHERE kb_id = ?", (kb_id,))
                conn.execute("UPDATE kb_bases SET vector_model = NULL, vector_dims = NULL WHERE id = ?", (kb_id,))
                conn.execute(
                    f"UPDATE kb_documents SET {READY} WHERE kb_id = ? AND status = 'embedding_pending'", (kb_id,)
                )
            return self._kb(conn, kb_id)

    def delete_kb(self, kb_id: str) -> None:
        with self._db.write() as conn:
            self._kb(conn, kb_id)
            conn.execute("DELETE FROM kb_bases WHERE id = ?", (kb_id,))
            conn.execute("DELETE FROM kb_lines WHERE kb_id = ?", (kb_id,))
            kb_lexical.drop(conn, kb_id)

    # ---- documents ----------------------------------------------------------------

    def add_document(
        self, *, kb_id: str, name: str, kind: str, source: str, path: str | None, size_bytes: int,
        content_hash: str | None, body: str | None, error: tuple[str, str] | None = None,
    ) -> tuple[DocRecord, bool]:
        """A new ``pending`` document, or (the existing one, True) when the base already has
        this content. ``body``: the text of a ``text`` document (files are read when indexed)."""
        now = self._clock()
        with self._db.write() as conn:
            self._kb(conn, kb_id)
            if content_hash is not None:
                rows = fetch_all(conn,
                    f"SELECT {DOC_COLUMNS} FROM kb_documents WHERE kb_id = ? AND content_hash = ?",
                    (kb_id, content_hash),
                )
                if rows:
                    return doc_of(rows[0]), True
            doc_id = new_id()
            status, code, message = ("error", *error) if error else ("pending", None, None)
            conn.execute(
                "INSERT INTO kb_documents(id, kb_id, name, kind, source, path, size_bytes, content_hash, body,"
                " status, error_code, error, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (doc_id, kb_id, name, kind, source, path, size_bytes, content_hash, body, status, code, message,
                 now, now),
            )
            return self._doc(conn, doc_id), False

    def get_document(self, doc_id: str) -> DocRecord:
        with self._db.read() as conn:
            return self._doc(conn, doc_id)

    def list_documents(self, kb_id: str, status: str | None, limit: int, offset: int) -> list[DocRecord]:
        with self._db.read() as conn:
            self._kb(conn, kb_id)
            where, args = "kb_id = ?", [kb_id]
            if status is not None:
                where += " AND status = ?"
                args.append(status)
            rows = fetch_all(conn,
                f"SELECT {DOC_COLUMNS} FROM kb_documents WHERE {where} ORDER BY created_at, id LIMIT ? OFFSET ?",
                [*args, limit, offset],
            )
        return [doc_of(r) for r in rows]

    def common_lines(self, kb_id: str) -> frozenset[int]:
        """The base's common lines now (kb_common.py), left out of what is embedded."""
        with self._db.read() as conn:
            return kb_common.common_of(conn, kb_id)

    def document_body(self, doc_id: str) -> str | None:
        with self._db.read() as conn:
            rows = fetch_all(conn, "SELECT body FROM kb_documents WHERE id = ?", (doc_id,))
        if not rows:
            raise NotFound(f"document {doc_id!r} not found", data={"documentId": doc_id})
        body: str | None = rows[0][0]
        return body

    def chunks(self, doc_id: str) -> list[KbChunk]:
        with self._db.read() as conn:
            self._doc(conn, doc_id)
            rows = fetch_all(conn,
                f"SELECT {CHUNK_COLUMNS} FROM kb_chunks WHERE document_id = ? ORDER BY ordinal", (doc_id,)
            )
        return [
            KbChunk(id=cid, document_id=did, ordinal=o, heading=heading_decoder.decode(h), start=s, end=e,
                    page=p, tokens=t, text=text)
            for cid, did, o, h, s, e, p, t, text in rows
        ]

    def request_reindex(self, doc_id: str) -> DocRecord:
        """Queue a document again: status ``pending``, a new revision (a run of an older one
        that is still going discards its result)."""
        with self._db.write() as conn:
            self._doc(conn, doc_id)
            conn.execute(
                "UPDATE kb_documents SET status = 'pending', error = NULL, error_code = NULL, embed_attempts = 0,"
                " embed_retry_at = NULL, revision = revision + 1, updated_at = ? WHERE id = ?",
                (self._clock(), doc_id),
            )
            return self._doc(conn, doc_id)

    def request_reindex_all(self, kb_id: str) -> list[str]:
        """Queue every document of a base again (a new chunk size); their ids."""
        with self._db.write() as conn:
            self._kb(conn, kb_id)
            ids = [r[0] for r in fetch_iter(conn, "SELECT id FROM kb_documents WHERE kb_id = ? ORDER BY created_at, id", (kb_id,))]
            conn.execute(
                "UPDATE kb_documents SET status = 'pending', error = NULL, error_code = NULL, embed_attempts = 0,"
                " embed_retry_at = NULL, revision = revision + 1, updated_at = ? WHERE kb_id = ?",
                (self._clock(), kb_id),
            )
        return ids

    def claim(self, doc_id: str) -> DocRecord | None:
        """Mark a queued document ``indexing``; None when it is gone or already indexed."""
        with self._db.write() as conn:
            rows = fetch_all(conn,
                f"SELECT {DOC_COLUMNS} FROM kb_documents WHERE id = ?", (doc_id,)
            )
            if not rows:
                return None
            doc = doc_of(rows[0])
            if doc.status not in ("pending", "indexing"):
                return None
            conn.execute(
                "UPDATE kb_documents SET status = 'indexing', updated_at = ? WHERE id = ?", (self._clock(), doc_id)
            )
            return self._doc(conn, doc_id)

    def open_documents(self) -> list[str]:
        """Documents left ``pending`` or ``indexing`` (by a restart), oldest first."""
        with self._db.read() as conn:
            return [
                r[0] for r in fetch_iter(conn,
                    "SELECT id FROM kb_documents WHERE status IN ('pending', 'indexing') ORDER BY created_at, id"
                )
            ]

    def write_index(
        self, doc: DocRecord, *, body: str, pages: list[int] | None, kind: str, chunks: list[NewChunk],
        model: str | None, dims: int | None, embedding_failed: tuple[str, int] | None = None,
    ) -> IndexDelta | None:
        """Replace a document's chunks (and their vectors for ``model``) and mark it ready,
        in one transaction; None (nothing written) when the document is gone or a newer
        revision was requested meanwhile. ``embedding_failed`` = (message, ms until the next
        try): some chunks have no vector (the provider failed): ``embedding_pending``
        instead, its first failed attempt."""
        now = self._clock()
        with self._db.write() as conn:
            rows = fetch_all(conn,
                "SELECT revision, kb_id FROM kb_documents WHERE id = ?", (doc.id,)
            )
            if not rows or rows[0][0] != doc.revision:
                return None
            kb_id = rows[0][1]
            common = self._count_lines(conn, kb_id, doc.id, self._indexed_body(conn, doc.id), body)
            old = {
                cid: (rowid, ehash)
                for rowid, cid, ehash in fetch_iter(conn,
                    "SELECT rowid, id, embed_hash FROM kb_chunks WHERE document_id = ?", (doc.id,)
                )
            }
            keep = {c.id for c in chunks}
            removed = [rowid for cid, (rowid, _) in old.items() if cid not in keep]
            if removed:
                kb_lexical.delete(conn, kb_id, removed)
                conn.executemany("DELETE FROM kb_chunks WHERE rowid = ?", [(r,) for r in removed])
            fresh = [c for c in chunks if c.id not in old]
            conn.executemany(
                "INSERT INTO kb_chunks(id, kb_id, document_id, ordinal, heading, char_start, char_end,"
                " page, tokens, embed_hash, text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(c.id, kb_id, doc.id, c.ordinal, _encode(c.heading).decode(), c.start, c.end, c.page, c.tokens,
                  c.embed_hash, c.text) for c in fresh],
            )
            rowid_of = {cid: rowid for cid, (rowid, _) in old.items()}
            if fresh:
                rowid_of.update(
                    (cid, rowid) for rowid, cid in fetch_iter(conn,
                        "SELECT rowid, id FROM kb_chunks WHERE document_id = ?", (doc.id,)
                    )
                )
            reindexed: list[NewChunk] = list(fresh)
            for c in chunks:
                previous = old.get(c.id)
                if previous is None:
                    continue
                rowid, old_hash = previous
                conn.execute(
                    "UPDATE kb_chunks SET ordinal = ?, heading = ?, char_start = ?, char_end = ?, page = ?,"
                    " tokens = ?, embed_hash = ?, text = ? WHERE rowid = ?",
                    (c.ordinal, _encode(c.heading).decode(), c.start, c.end, c.page, c.tokens, c.embed_hash,
                     c.text, rowid),
                )
                if old_hash != c.embed_hash:
                    kb_lexical.delete(conn, kb_id, [rowid])
                    conn.execute("DELETE FROM kb_vectors WHERE chunk_rowid = ?", (rowid,))
                    reindexed.append(c)
            kb_lexical.write(conn, kb_id, [
                (rowid_of[c.id], kb_common.index_row(c.heading, c.text, common)) for c in reindexed
            ])
            upserted: list[tuple[int, bytes]] = []
            if model is not None and dims is not None:
                upserted = [(rowid_of[c.id], c.vector) for c in chunks if c.vector is not None]
                conn.executemany(
                    "INSERT OR REPLACE INTO kb_vectors(kb_id, model, chunk_rowid, embed_hash, dims, vector)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(kb_id, model, rowid_of[c.id], c.embed_hash, dims, c.vector) for c in chunks if c.vector is not None],
                )
            state, args = READY, []
            if embedding_failed is not None:
                state = ("status = 'embedding_pending', error = ?, error_code = 'embedding_failed', embed_attempts = 1,"
                         " embed_retry_at = ?")
                args = [embedding_failed[0][:2000], now + embedding_failed[1]]
            conn.execute(
                f"UPDATE kb_documents SET {state}, kind = ?, body = ?,"
                " pages = ?, chunk_count = ?, indexed_at = ?, updated_at = ? WHERE id = ?",
                (*args, kind, body, _encode(pages).decode() if pages is not None else None, len(chunks), now, now,
                 doc.id),
            )
            if model is not None and dims is not None:
                self._first_vectors(conn, kb_id, model, dims)
            return IndexDelta(kb_id=kb_id, model=model, upserted=upserted, removed=removed)

    def mark_error(self, doc: DocRecord, code: str, message: str) -> bool:
        """Status ``error`` for this revision of the document (False: gone or superseded)."""
        with self._db.write() as conn:
            changed = fetch_all(conn,
                "UPDATE kb_documents SET status = 'error', error = ?, error_code = ?, updated_at = ?"
                " WHERE id = ? AND revision = ? RETURNING id",
                (message[:2000], code, self._clock(), doc.id, doc.revision),
            )
        return bool(changed)

    def delete_document(self, doc_id: str) -> tuple[str, list[int]]:
        """Delete a document; (its base, the rowids of its chunks that went with it)."""
        with self._db.write() as conn:
            doc = self._doc(conn, doc_id)
            rowids = [r[0] for r in fetch_iter(conn, "SELECT rowid FROM kb_chunks WHERE document_id = ?", (doc_id,))]
            kb_lexical.delete(conn, doc.kb_id, rowids)
            counted = self._indexed_body(conn, doc_id)
            conn.execute("DELETE FROM kb_documents WHERE id = ?", (doc_id,))
            if counted is not None:
                self._count_lines(conn, doc.kb_id, doc_id, counted, None)
            return doc.kb_id, rowids

    @staticmethod
    def _indexed_body(conn: Any, doc_id: str) -> str | None:
        """The body a document was last indexed with (its lines are counted), None if never."""
        rows = fetch_all(conn, "SELECT body FROM kb_documents WHERE id = ? AND indexed_at IS NOT NULL", (doc_id,))
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    @staticmethod
    def _count_lines(conn: Any, kb_id: str, doc_id: str, removed: str | None, added: str | None) -> frozenset[int]:
        """Count a document's lines out (the body it was indexed with) and in (the body it is
        indexed with now), settle the base's common lines and rewrite the full-text rows of
        its chunks the change alters (kb_common.py); the common set now."""
        kb_common.count(conn, kb_id, removed, added)
        others = int(fetch_all(conn,
            "SELECT count(*) FROM kb_documents WHERE kb_id = ? AND indexed_at IS NOT NULL AND id != ?", (kb_id, doc_id)
        )[0][0])
        before, after = kb_common.settle(conn, kb_id, others + (added is not None))
        changed = kb_common.changed_rows(conn, kb_id, before, after)
        kb_lexical.delete(conn, kb_id, [rowid for rowid, _ in changed])
        kb_lexical.write(conn, kb_id, changed)
        return after

    # ---- search -------------------------------------------------------------------

    def lexical(self, kb_ids: Sequence[str], query: str, limit: int) -> list[tuple[int, float]]:
        """(rowid, BM25 score, higher is better) of the best ``limit`` chunks of the bases,
        each ranked on its own statistics (kb_lexical.py: what other bases hold changes
        nothing)."""
        ids = list(dict.fromkeys(kb_ids))
        if not ids:
            return []
        with self._db.read() as conn:
            sizes = {k: 0 for k in ids}
            sizes.update(fetch_all(conn,
                "SELECT kb_id, coalesce(sum(chunk_count), 0) FROM kb_documents"
                f" WHERE kb_id IN ({','.join('?' * len(ids))}) GROUP BY kb_id", ids,
            ))
            return self._lexical.search(conn, sizes, query, limit)

    def chunk_meta(self, rowids: Sequence[int]) -> dict[int, tuple[str, int]]:
        """rowid -> (document id, tokens) of the chunks that exist (what ranking needs)."""
        out: dict[int, tuple[str, int]] = {}
        ids = list(rowids)
        with self._db.read() as conn:
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                out.update(
                    (rowid, (did, tokens)) for rowid, did, tokens in fetch_iter(conn,
                        f"SELECT rowid, document_id, tokens FROM kb_chunks WHERE rowid IN ({','.join('?' * len(part))})",
                        part,
                    )
                )
        return out

    def hits(self, rowids: Sequence[int]) -> dict[int, ChunkHit]:
        if not rowids:
            return {}
        with self._db.read() as conn:
            out: dict[int, ChunkHit] = {}
            ids = list(rowids)
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                for row in fetch_iter(conn,
                    "SELECT c.rowid, c.id, c.kb_id, c.document_id, d.name, c.ordinal, c.heading, c.char_start,"
                    " c.char_end, c.page, c.tokens, c.text FROM kb_chunks c JOIN kb_documents d ON d.id = c.document_id"
                    f" WHERE c.rowid IN ({','.join('?' * len(part))})",
                    part,
                ):
                    rowid, cid, kb_id, did, dname, ordinal, heading, start, end, page, tokens, text = row
                    out[rowid] = ChunkHit(
                        rowid=rowid, id=cid, kb_id=kb_id, document_id=did, document_name=dname, ordinal=ordinal,
                        heading=heading_decoder.decode(heading), start=start, end=end, page=page,
                        tokens=tokens, text=text,
                    )
            return out
