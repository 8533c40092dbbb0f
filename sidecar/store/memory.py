"""MemoryRepo: long-term memories, their vectors and full-text index, and the encoder's
proposals (their records: memory_records.py; the versions of each Soul.md: souls.py).

Owns these tables of migration ``m_memory``:
- ``memories``: one row per version of a memory. A row's content (scope, kind, text,
  task/outcome/context, key, source, flags) never changes after it is written; only its
  state does: ``superseded_by`` (a newer version replaced it), ``deleted_at`` (soft delete),
  the use counter. Active = neither superseded nor deleted; only active rows reach
  retrieval, the basic memory text and the tools.
- ``memory_vectors``: float32 little-endian BLOBs (L2-normalized) per (scope, model, row),
  cascading with their row; ``read_vectors`` streams only those of active rows.
- ``memories_fts``: contentless FTS5 over each row's text (+ task, outcome, context)
  rewritten by the CJK bigram scheme of ``sidecar/store/fts.py``, plus a token of its scope
  (``fts.key_token``) so a search is confined to the scopes asked for.
- ``memory_proposals``: what the encoder proposed (``pending`` until accepted or rejected;
  they go with their session).

Must stay true:
- every method is one transaction; ``supersede`` writes the new version and marks the old
  one in the same transaction and refuses an old version that is no longer active, so two
  updates of one memory never both succeed (no fork of its history);
- user text reaches MATCH only through ``fts`` quoting;
- a scope's rows are never read for another scope: every read takes the scopes explicitly.

Synchronous: ``Store.memory``, reached from async code through
``AsyncStore.run``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from protocol.errors import ErrorCode
from protocol.memory import ProposalStatus
from sidecar.errors import NotFound, StoreError
from sidecar.store import fts
from sidecar.store.db import Database, fetch_all, fetch_iter
from sidecar.store.ids import new_id, now_ms
from sidecar.store.knowledge import VectorSink
from sidecar.store.memory_records import (
    MEMORY_COLUMNS,
    PROPOSAL_COLUMNS,
    MemoryRecord,
    NewMemory,
    ProposalRecord,
    memory_from_row,
    proposal_from_row,
)

__all__ = ["MemoryRepo", "scope_token", "VectorRow"]
_ACTIVE = "superseded_by IS NULL AND deleted_at IS NULL"
_ACTIVE_M = "m.superseded_by IS NULL AND m.deleted_at IS NULL"
_encode = msgspec.json.encode

DOC_COUNT_CACHE = 10_000
"""Terms whose document counts are kept at most (then the cache starts over)."""
LEXICAL_CANDIDATES = 1000
"""Rows (summed over the kept terms' document counts) a lexical search scores at most,
unless its rarest term alone matches more."""

VectorRow = tuple[str, int, bytes]
"""(scope, memory rowid, vector bytes): what a vector write changed, for the in-memory index."""


def scope_token(scope: str) -> str:
    """The token of a scope in the ``scope`` column of ``memories_fts``."""
    return fts.key_token("m", scope)


def _body(*texts: str | None) -> str:
    """The index text of a memory's text, task, outcome and context."""
    return fts.index_text("\n".join(t for t in texts if t))


def _marks(n: int) -> str:
    return ",".join("?" * n)


class MemoryRepo:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._clock = clock
        self._df: dict[str, int] = {}
        """Document counts of lexical terms (``_doc_count``), cleared by every write to the index."""

    @staticmethod
    def rebuild_index(conn: Any) -> int:
        """Write every row of ``memories_fts`` again from its memory (after a change of
        ``fts.index_text``: the migration that folds width and case); how many."""
        return fts.rebuild(conn, "memories_fts", ("body", "scope"), (
            (rowid, _body(*texts), scope_token(scope))
            for rowid, scope, *texts in conn.execute("SELECT rowid, scope, text, task, outcome, context FROM memories")
        ))

    # ---- writing ------------------------------------------------------------------

    def create(self, new: NewMemory) -> MemoryRecord:
        with self._db.write() as conn:
            return self._insert(conn, new, supersedes=None)

    def supersede(self, old_id: str, new: NewMemory) -> tuple[MemoryRecord, MemoryRecord]:
        """Write ``new`` as the next version of the active memory ``old_id``: (new, old as
        it is now). BAD_STATE when ``old_id`` is superseded or deleted already."""
        with self._db.write() as conn:
            old = self._get(conn, old_id)
            if not old.active:
                raise StoreError(
                    f"memory {old_id!r} is {old.status}: only an active memory can be updated",
                    code=ErrorCode.BAD_STATE, data={"memoryId": old_id, "status": old.status},
                )
            record = self._insert(conn, new, supersedes=old_id)
            conn.execute(
                "UPDATE memories SET superseded_by = ?, updated_at = ? WHERE rowid = ?",
                (record.id, record.created_at, old.rowid),
            )
            return record, self._get(conn, old_id)

    def _insert(self, conn: Any, new: NewMemory, *, supersedes: str | None) -> MemoryRecord:
        now = self._clock()
        mid = new_id()
        conn.execute(
            "INSERT INTO memories(id, scope, kind, text, task, outcome, context, topic_key, norm_hash, source_kind,"
            " session_id, message_id, tool_call_id, flags, supersedes, tokens, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (mid, new.scope, new.kind, new.text, new.task, new.outcome, new.context, new.key, new.norm_hash,
             new.source_kind, new.session_id, new.message_id, new.tool_call_id, _encode(new.flags).decode(),
             supersedes, new.tokens, now, now),
        )
        record = self._get(conn, mid)
        self._df.clear()
        conn.execute(
            "INSERT INTO memories_fts(rowid, body, scope) VALUES (?, ?, ?)",
            (record.rowid, _body(new.text, new.task, new.outcome, new.context), scope_token(new.scope)),
        )
        return record

    def delete(self, memory_id: str) -> MemoryRecord:
        """Soft delete (idempotent): the row stays, out of every request."""
        with self._db.write() as conn:
            record = self._get(conn, memory_id)
            if record.deleted_at is None:
                now = self._clock()
                conn.execute("UPDATE memories SET deleted_at = ?, updated_at = ? WHERE rowid = ?",
                             (now, now, record.rowid))
            return self._get(conn, memory_id)

    def restore(self, memory_id: str) -> MemoryRecord:
        """Undo a soft delete (idempotent); a superseded version comes back superseded."""
        with self._db.write() as conn:
            record = self._get(conn, memory_id)
            if record.deleted_at is not None:
                conn.execute("UPDATE memories SET deleted_at = NULL, updated_at = ? WHERE rowid = ?",
                             (self._clock(), record.rowid))
            return self._get(conn, memory_id)

    def purge(self, memory_id: str) -> list[tuple[str, int]]:
        """Delete the memory and every version of it for real: (scope, rowid) of the rows gone."""
        with self._db.write() as conn:
            chain = self._chain(conn, self._get(conn, memory_id))
            self._df.clear()
            conn.execute(f"DELETE FROM memories WHERE rowid IN ({_marks(len(chain))})", [r.rowid for r in chain])
            return [(r.scope, r.rowid) for r in chain]

    def purge_scope(self, scope: str) -> int:
        """Delete every memory (all versions) and pending proposal of a scope; how many rows."""
        with self._db.write() as conn:
            count = fetch_all(conn, "SELECT count(*) FROM memories WHERE scope = ?", (scope,))[0][0]
            conn.execute("DELETE FROM memories WHERE scope = ?", (scope,))
            self._df.clear()
            conn.execute("DELETE FROM memory_proposals WHERE scope = ? OR assistant_id = ?", (scope, scope))
            return int(count)

    def mark_used(self, rowids: Sequence[int]) -> None:
        if not rowids:
            return
        with self._db.write() as conn:
            conn.execute(
                f"UPDATE memories SET use_count = use_count + 1, last_used_at = ? WHERE rowid IN ({_marks(len(rowids))})",
                [self._clock(), *rowids],
            )

    # ---- reading ------------------------------------------------------------------

    def get(self, memory_id: str) -> MemoryRecord:
        with self._db.read() as conn:
            return self._with_models(conn, [self._get(conn, memory_id)])[0]

    def versions(self, memory_id: str) -> list[MemoryRecord]:
        """Every version of the memory, oldest first."""
        with self._db.read() as conn:
            return self._with_models(conn, self._chain(conn, self._get(conn, memory_id)))

    def by_rowids(self, rowids: Sequence[int], *, active_only: bool = True) -> dict[int, MemoryRecord]:
        ids = list(dict.fromkeys(rowids))
        out: dict[int, MemoryRecord] = {}
        with self._db.read() as conn:
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                where = f"rowid IN ({_marks(len(part))})" + (f" AND {_ACTIVE}" if active_only else "")
                records = [memory_from_row(r) for r in fetch_iter(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where}", part)]
                out.update((r.rowid, r) for r in self._with_models(conn, records))
        return out

    def list_page(
        self,
        *,
        scopes: Sequence[str] | None,
        kind: str | None,
        query: str | None,
        status: str,
        limit: int,
        offset: int,
    ) -> tuple[list[MemoryRecord], int]:
        """Newest first; ``scopes`` None: every scope; ``query``: full-text, every word of it
        (as message search: a CJK run as a phrase of its bigrams)."""
        where: list[str] = []
        args: list[Any] = []
        join = ""
        if scopes is not None:
            if not scopes:
                return [], 0
            where.append(f"m.scope IN ({_marks(len(scopes))})")
            args.extend(scopes)
        if kind is not None:
            where.append("m.kind = ?")
            args.append(kind)
        if status == "active":
            where.append(_ACTIVE_M)
        elif status == "superseded":
            where.append("m.superseded_by IS NOT NULL AND m.deleted_at IS NULL")
        elif status == "deleted":
            where.append("m.deleted_at IS NOT NULL")
        if query is not None:
            expr = fts.build_match(fts.parse_query(query[: fts.MAX_QUERY_CHARS]))
            if expr is None:
                return [], 0
            join = " JOIN memories_fts ON memories_fts.rowid = m.rowid"
            where.append("memories_fts MATCH ?")
            args.append(expr)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self._db.read() as conn:
            total = fetch_all(conn, f"SELECT count(*) FROM memories m{join}{clause}", args)[0][0]
            rows = fetch_all(conn, 
                f"SELECT {', '.join('m.' + c.strip() for c in MEMORY_COLUMNS.split(','))} FROM memories m{join}{clause}"
                " ORDER BY m.created_at DESC, m.rowid DESC LIMIT ? OFFSET ?",
                [*args, limit, offset],
            )
            return self._with_models(conn, [memory_from_row(r) for r in rows]), int(total)

    def same_text(self, scopes: Sequence[str], norm_hash: str) -> MemoryRecord | None:
        """An active memory of the scopes whose normalized text hashes to ``norm_hash``."""
        if not scopes:
            return None
        with self._db.read() as conn:
            rows = fetch_all(conn, 
                f"SELECT {MEMORY_COLUMNS} FROM memories WHERE scope IN ({_marks(len(scopes))}) AND norm_hash = ?"
                f" AND {_ACTIVE} ORDER BY created_at DESC LIMIT 1",
                [*scopes, norm_hash],
            )
        return memory_from_row(rows[0]) if rows else None

    def with_key(self, scope: str, key: str) -> MemoryRecord | None:
        """The active memory of ``scope`` with topic ``key`` (the newest, if several)."""
        with self._db.read() as conn:
            rows = fetch_all(conn, 
                f"SELECT {MEMORY_COLUMNS} FROM memories WHERE scope = ? AND topic_key = ? AND {_ACTIVE}"
                " ORDER BY created_at DESC LIMIT 1",
                (scope, key),
            )
        return memory_from_row(rows[0]) if rows else None

    def lexical(self, scopes: Sequence[str], query: str, limit: int) -> list[tuple[int, float]]:
        """(rowid, BM25 score, higher is better) of the best ``limit`` active memories of the scopes.

        The terms scored are ``fts.affordable_terms`` with LEXICAL_CANDIDATES rows at most
        ("the user ..." is in most memories: it is dropped while a rarer term remains)."""
        terms = fts.retrieval_terms(query)
        if not terms or not scopes:
            return []
        with self._db.read() as conn:
            if len(terms) > 1:
                # every row of the index is a row of ``memories`` (its own b-tree: cheaper to count)
                total = fetch_all(conn, "SELECT count(*) FROM memories")[0][0]
                counts = [self._doc_count(conn, t) for t in terms]
                kept = fts.affordable_terms(counts, total, LEXICAL_CANDIDATES)
                terms = [terms[i] for i in kept] or terms
            expr = fts.retrieval_match(terms, "scope", [scope_token(s) for s in scopes])
            if expr is None:
                return []
            rows = fetch_all(conn, 
                "SELECT memories_fts.rowid, bm25(memories_fts, 1.0, 0.0) AS r FROM memories_fts"
                f" JOIN memories m ON m.rowid = memories_fts.rowid WHERE memories_fts MATCH ? AND {_ACTIVE_M}"
                " ORDER BY r LIMIT ?",
                (expr, limit),
            )
        return [(rowid, -score) for rowid, score in rows]

    def _doc_count(self, conn: Any, term: str) -> int:
        """Rows of the index a MATCH term matches, cached until the next write to the index
        (a count computed across a concurrent write may be one write old: it only steers
        which terms are scored)."""
        count = self._df.get(term)
        if count is None:
            count = int(fetch_all(conn, "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH ?", (term,))[0][0])
            if len(self._df) >= DOC_COUNT_CACHE:
                self._df.clear()
            self._df[term] = count
        return count

    def basic(self, scopes: Sequence[str], depth: int) -> tuple[list[int], list[int]]:
        """Rowids of the active memories of the scopes: the ``depth`` newest, and the ``depth``
        most used (ties: newest first)."""
        if not scopes:
            return [], []
        marks = _marks(len(scopes))
        with self._db.read() as conn:
            newest = [r[0] for r in fetch_iter(conn, 
                f"SELECT rowid FROM memories WHERE scope IN ({marks}) AND {_ACTIVE}"
                " ORDER BY created_at DESC, rowid DESC LIMIT ?", [*scopes, depth])]
            used = [r[0] for r in fetch_iter(conn, 
                f"SELECT rowid FROM memories WHERE scope IN ({marks}) AND {_ACTIVE} AND use_count > 0"
                " ORDER BY use_count DESC, created_at DESC LIMIT ?", [*scopes, depth])]
        return newest, used

    def active_count(self, scopes: Sequence[str]) -> int:
        if not scopes:
            return 0
        with self._db.read() as conn:
            return int(fetch_all(conn, 
                f"SELECT count(*) FROM memories WHERE scope IN ({_marks(len(scopes))}) AND {_ACTIVE}", list(scopes)
            )[0][0])

    def scopes(self) -> list[str]:
        """Every scope that holds an active memory."""
        with self._db.read() as conn:
            return [r[0] for r in fetch_iter(conn, f"SELECT DISTINCT scope FROM memories WHERE {_ACTIVE}")]

    # ---- vectors ------------------------------------------------------------------

    def read_vectors(self, scope: str, model: str, sink: VectorSink, /) -> int:
        """Hand every ``model`` vector of the active memories of ``scope`` to ``sink`` in rowid order."""
        with self._db.read() as conn:
            query = (
                " FROM memory_vectors v JOIN memories m ON m.rowid = v.memory_rowid"
                f" WHERE v.scope = ? AND v.model = ? AND {_ACTIVE_M}"
            )
            count, dims = fetch_all(conn, f"SELECT count(*), max(v.dims){query}", (scope, model))[0]
            if not count:
                return 0
            sink.reserve(count, dims)
            i = 0
            for rowid, blob in fetch_iter(conn, f"SELECT v.memory_rowid, v.vector{query} ORDER BY v.memory_rowid",
                                            (scope, model)):
                if i >= count:
                    break
                sink.put(i, rowid, blob)
                i += 1
            return i

    def vectors_of(self, rowids: Sequence[int], model: str) -> dict[int, tuple[str, bytes]]:
        """rowid -> (scope, vector) of ``model`` for the rows that have one."""
        if not rowids:
            return {}
        with self._db.read() as conn:
            return {
                rowid: (scope, blob)
                for rowid, scope, blob in fetch_iter(conn, 
                    f"SELECT memory_rowid, scope, vector FROM memory_vectors WHERE model = ?"
                    f" AND memory_rowid IN ({_marks(len(rowids))})",
                    [model, *rowids],
                )
            }

    def missing_vectors(self, scope: str, model: str, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` active memories of ``scope`` without a ``model`` vector: (rowid, text)."""
        with self._db.read() as conn:
            return [
                (rowid, text)
                for rowid, text in fetch_iter(conn, 
                    "SELECT m.rowid, m.text FROM memories m LEFT JOIN memory_vectors v"
                    " ON v.scope = m.scope AND v.model = ? AND v.memory_rowid = m.rowid"
                    f" WHERE m.scope = ? AND {_ACTIVE_M} AND v.memory_rowid IS NULL"
                    " ORDER BY m.rowid LIMIT ?",
                    (model, scope, limit),
                )
            ]

    def write_vectors(self, model: str, dims: int, rows: Iterable[tuple[int, bytes]]) -> list[VectorRow]:
        """Store vectors of rows that still exist; (scope, rowid, vector) of those written."""
        written: list[VectorRow] = []
        with self._db.write() as conn:
            for rowid, blob in rows:
                found = fetch_all(conn, 
                    "INSERT OR REPLACE INTO memory_vectors(memory_rowid, model, scope, dims, vector)"
                    " SELECT rowid, ?, scope, ?, ? FROM memories WHERE rowid = ? RETURNING scope",
                    (model, dims, blob, rowid),
                )
                if found:
                    written.append((found[0][0], rowid, blob))
        return written

    # ---- proposals ----------------------------------------------------------------

    def add_proposal(self, proposal: ProposalRecord) -> ProposalRecord:
        with self._db.write() as conn:
            proposal = msgspec.structs.replace(proposal, id=proposal.id or new_id(),
                                               created_at=proposal.created_at or self._clock())
            conn.execute(
                "INSERT INTO memory_proposals(id, session_id, message_id, assistant_id, scope, kind, text, task,"
                " outcome, context, topic_key, action, supersedes, reason, flags, status, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
                (proposal.id, proposal.session_id, proposal.message_id, proposal.assistant_id, proposal.scope,
                 proposal.kind, proposal.text, proposal.task, proposal.outcome, proposal.context, proposal.key,
                 proposal.action, proposal.supersedes, proposal.reason, _encode(proposal.flags).decode(),
                 proposal.created_at),
            )
            return proposal

    def get_proposal(self, proposal_id: str) -> ProposalRecord:
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {PROPOSAL_COLUMNS} FROM memory_proposals WHERE id = ?",
                                (proposal_id,))
        if not rows:
            raise NotFound(f"memory proposal {proposal_id!r} not found", data={"proposalId": proposal_id})
        return proposal_from_row(rows[0])

    def pending_proposals(self, session_id: str | None, limit: int) -> list[ProposalRecord]:
        where = "status = 'pending'" + (" AND session_id = ?" if session_id is not None else "")
        args: list[Any] = [session_id] if session_id is not None else []
        with self._db.read() as conn:
            return [proposal_from_row(r) for r in fetch_iter(conn, 
                f"SELECT {PROPOSAL_COLUMNS} FROM memory_proposals WHERE {where} ORDER BY created_at, id LIMIT ?",
                [*args, limit])]

    def decide_proposal(self, proposal_id: str, status: ProposalStatus) -> bool:
        """``pending`` -> ``status``; False when it was decided already (or is gone)."""
        with self._db.write() as conn:
            conn.execute(
                "UPDATE memory_proposals SET status = ?, decided_at = ? WHERE id = ? AND status = 'pending'",
                (status, self._clock(), proposal_id),
            )
            return bool(conn.changes())

    # ---- internals ----------------------------------------------------------------

    def _get(self, conn: Any, memory_id: str) -> MemoryRecord:
        rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (memory_id,))
        if not rows:
            raise NotFound(f"memory {memory_id!r} not found", data={"memoryId": memory_id})
        return memory_from_row(rows[0])

    def _chain(self, conn: Any, record: MemoryRecord) -> list[MemoryRecord]:
        """Every version ``record`` belongs to, oldest first (bounded against a broken link loop)."""
        older: list[MemoryRecord] = []
        seen = {record.id}
        current = record
        while current.supersedes and len(seen) < 10_000:
            rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (current.supersedes,))
            if not rows or rows[0][1] in seen:
                break
            current = memory_from_row(rows[0])
            seen.add(current.id)
            older.append(current)
        newer: list[MemoryRecord] = []
        current = record
        while current.superseded_by and len(seen) < 10_000:
            rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (current.superseded_by,))
            if not rows or rows[0][1] in seen:
                break
            current = memory_from_row(rows[0])
            seen.add(current.id)
            newer.append(current)
        return [*reversed(older), record, *newer]

    def _with_models(self, conn: Any, records: list[MemoryRecord]) -> list[MemoryRecord]:
        if not records:
            return records
        by_row = {r.rowid: r for r in records}
        ids = list(by_row)
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            for rowid, model in fetch_iter(conn, 
                f"SELECT memory_rowid, model FROM memory_vectors WHERE memory_rowid IN ({_marks(len(part))})"
                " ORDER BY model", part,
            ):
                by_row[rowid].models.append(model)
        return records
