"""MemoryUpkeepRepo: what memory upkeep reads and writes beside MemoryRepo's own methods:
statistics, the expiry candidates, merging memories into one version chain, the
consolidation proposals (``memory_merges``, migration ``m_memory_upkeep``) and export reads.

Merging (``merge``), in one transaction: the memories (active, one scope) are taken oldest
first; each one's chain is spliced after the previous one's (the previous head is
superseded by the root of the next chain, which now supersedes it), so their versions form
one linear chain; then, when the merged text differs, a new version supersedes the last one
(MemoryRepo.supersede). Nothing is deleted: every version stays in the chain (``memory:get``).
A memory that changed meanwhile (superseded, deleted, in another scope) makes the merge
BAD_STATE and nothing is written.

Synchronous: ``Store.memory_upkeep`` through ``AsyncStore.run``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from protocol.errors import ErrorCode
from protocol.memory import MemoryKind
from protocol.memory_upkeep import MergeStatus
from sidecar.errors import NotFound, StoreError
from sidecar.store.db import Database, fetch_all
from sidecar.store.ids import new_id, now_ms
from sidecar.store.memory import MemoryRepo
from sidecar.store.memory_records import MEMORY_COLUMNS, MemoryRecord, NewMemory, memory_from_row

__all__ = ["MemoryUpkeepRepo", "MergeRecord", "ScopeCounts"]

_ACTIVE = "superseded_by IS NULL AND deleted_at IS NULL"
_MERGE_COLUMNS = "id, scope, memory_ids, text, kind, reason, contradiction, status, result_id, created_at"
_ids = msgspec.json.Decoder(list[str])


class MergeRecord(msgspec.Struct, kw_only=True):
    id: str
    scope: str
    memory_ids: list[str]
    text: str
    kind: MemoryKind
    reason: str = ""
    contradiction: bool = False
    status: MergeStatus = "pending"
    result_id: str | None = None
    created_at: int = 0


class ScopeCounts(msgspec.Struct, kw_only=True):
    scope: str
    active: int = 0
    superseded: int = 0
    deleted: int = 0
    never_used: int = 0
    expirable: int = 0
    tokens: int = 0
    by_kind: dict[str, int] = {}
    oldest_at: int | None = None
    newest_at: int | None = None
    last_used_at: int | None = None


def _merge(row: tuple[Any, ...]) -> MergeRecord:
    return MergeRecord(id=row[0], scope=row[1], memory_ids=_ids.decode(row[2]), text=row[3], kind=row[4],
                       reason=row[5], contradiction=bool(row[6]), status=row[7], result_id=row[8],
                       created_at=row[9])


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _expirable_where(cutoff: int, max_uses: int) -> tuple[str, list[Any]]:
    """Active memories the model wrote, unused since ``cutoff`` (ms), used at most ``max_uses`` times."""
    return (f"{_ACTIVE} AND source_kind IN ('tool', 'encoder') AND use_count <= ?"
            " AND coalesce(last_used_at, created_at) < ?", [max_uses, cutoff])


class MemoryUpkeepRepo:
    def __init__(self, db: Database, memory: Callable[[], MemoryRepo], clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._memory = memory
        self._clock = clock

    # ---- statistics and expiry ------------------------------------------------------------

    def counts(self, scopes: Sequence[str] | None, expiry: tuple[int, int] | None) -> list[ScopeCounts]:
        """Per scope (every scope that has a row when ``scopes`` is None). ``expiry``:
        (cutoff ms, max uses) of the policy, None when it is off."""
        where, args = (f" WHERE scope IN ({_marks(len(scopes))})", list(scopes)) if scopes is not None else ("", [])
        out: dict[str, ScopeCounts] = {s: ScopeCounts(scope=s) for s in scopes or ()}
        with self._db.read() as conn:
            for scope, active, superseded, deleted, never, tokens, oldest, newest, used in fetch_all(conn, (
                "SELECT scope,"
                f" sum({_ACTIVE}), sum(superseded_by IS NOT NULL AND deleted_at IS NULL), sum(deleted_at IS NOT NULL),"
                f" sum({_ACTIVE} AND use_count = 0), sum(CASE WHEN {_ACTIVE} THEN tokens ELSE 0 END),"
                f" min(CASE WHEN {_ACTIVE} THEN created_at END), max(CASE WHEN {_ACTIVE} THEN created_at END),"
                f" max(last_used_at) FROM memories{where} GROUP BY scope ORDER BY scope"), args):
                out[scope] = ScopeCounts(scope=scope, active=active or 0, superseded=superseded or 0,
                                         deleted=deleted or 0, never_used=never or 0, tokens=tokens or 0,
                                         oldest_at=oldest, newest_at=newest, last_used_at=used)
            for scope, kind, n in fetch_all(conn, f"SELECT scope, kind, count(*) FROM memories{where}"
                                                  f"{' AND' if where else ' WHERE'} {_ACTIVE} GROUP BY scope, kind",
                                            args):
                out[scope].by_kind = {**out[scope].by_kind, kind: n}
            if expiry is not None:
                cond, extra = _expirable_where(*expiry)
                for scope, n in fetch_all(conn, f"SELECT scope, count(*) FROM memories{where}"
                                                f"{' AND' if where else ' WHERE'} {cond} GROUP BY scope",
                                          [*args, *extra]):
                    out[scope].expirable = n
        return sorted(out.values(), key=lambda c: c.scope)

    def pending_counts(self) -> tuple[int, int]:
        """(open encoder proposals, open consolidation proposals)."""
        with self._db.read() as conn:
            proposals = fetch_all(conn, "SELECT count(*) FROM memory_proposals WHERE status = 'pending'")[0][0]
            merges = fetch_all(conn, "SELECT count(*) FROM memory_merges WHERE status = 'pending'")[0][0]
        return int(proposals), int(merges)

    def expire(self, cutoff: int, max_uses: int, scopes: Sequence[str] | None) -> list[MemoryRecord]:
        """Soft-delete what the policy expires now; the rows as they were (their scope and rowid)."""
        cond, args = _expirable_where(cutoff, max_uses)
        if scopes is not None:
            if not scopes:
                return []
            cond += f" AND scope IN ({_marks(len(scopes))})"
            args += list(scopes)
        with self._db.write() as conn:
            rows = [memory_from_row(r) for r in fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {cond}", args)]
            now = self._clock()
            for i in range(0, len(rows), 500):
                part = [r.rowid for r in rows[i : i + 500]]
                conn.execute(f"UPDATE memories SET deleted_at = ?, updated_at = ? WHERE rowid IN ({_marks(len(part))})",
                             [now, now, *part])
        return rows

    # ---- reading ------------------------------------------------------------------------------

    def active(self, scope: str, limit: int) -> list[MemoryRecord]:
        """The newest ``limit`` active memories of ``scope``, oldest first."""
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE scope = ? AND {_ACTIVE}"
                                   " ORDER BY created_at DESC, rowid DESC LIMIT ?", (scope, limit))
        return [memory_from_row(r) for r in reversed(rows)]

    def rows(self, scopes: Sequence[str] | None, *, history: bool) -> list[MemoryRecord]:
        """Every row (``history``) or the active ones, by scope then age."""
        where: list[str] = [] if history else [_ACTIVE]
        args: list[Any] = []
        if scopes is not None:
            where.append(f"scope IN ({_marks(len(scopes))})")
            args.extend(scopes)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories{clause} ORDER BY scope, created_at, rowid", args)
        return [memory_from_row(r) for r in rows]

    # ---- merging --------------------------------------------------------------------------------

    def merge(self, memory_ids: Sequence[str], new: NewMemory | None) -> tuple[MemoryRecord, list[MemoryRecord]]:
        """Make ``memory_ids`` one version chain ending in ``new`` (None: in the newest of
        them): (the active memory it ends in, the ones superseded now). BAD_STATE when one of
        them is no longer active or they are not of one scope."""
        with self._db.write() as conn:
            records: list[MemoryRecord] = []
            for memory_id in dict.fromkeys(memory_ids):
                rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (memory_id,))
                if not rows:
                    raise NotFound(f"memory {memory_id!r} not found", data={"memoryId": memory_id})
                records.append(memory_from_row(rows[0]))
            changed = [r.id for r in records if not r.active]
            if changed or len({r.scope for r in records}) != 1 or len(records) < 2:
                raise StoreError(
                    "these memories changed meanwhile (no longer all active, of one scope): nothing merged",
                    code=ErrorCode.BAD_STATE, data={"memoryIds": changed},
                )
            records.sort(key=lambda r: (r.created_at, r.rowid))
            now = self._clock()
            for older, newer in zip(records, records[1:]):
                root = self._root(conn, newer)
                conn.execute("UPDATE memories SET superseded_by = ?, updated_at = ? WHERE rowid = ?",
                             (root.id, now, older.rowid))
                conn.execute("UPDATE memories SET supersedes = ? WHERE rowid = ?", (older.id, root.rowid))
            last = records[-1]
            superseded = records[:-1]
            if new is not None and new.norm_hash != last.norm_hash:
                result, old = self._memory().supersede(last.id, new)
                superseded.append(old)
            else:
                result = last
            return result, superseded

    def _root(self, conn: Any, record: MemoryRecord) -> MemoryRecord:
        current = record
        seen = {record.id}
        while current.supersedes and len(seen) < 10_000:
            rows = fetch_all(conn, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (current.supersedes,))
            if not rows or rows[0][1] in seen:
                break
            current = memory_from_row(rows[0])
            seen.add(current.id)
        return current

    # ---- consolidation proposals ------------------------------------------------------------------

    def add_merge(self, merge: MergeRecord) -> MergeRecord:
        merge = msgspec.structs.replace(merge, id=merge.id or new_id(), created_at=merge.created_at or self._clock())
        with self._db.write() as conn:
            conn.execute(
                f"INSERT INTO memory_merges({_MERGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (merge.id, merge.scope, msgspec.json.encode(merge.memory_ids).decode(), merge.text, merge.kind,
                 merge.reason, int(merge.contradiction), merge.status, merge.result_id, merge.created_at),
            )
        return merge

    def get_merge(self, merge_id: str) -> MergeRecord:
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_MERGE_COLUMNS} FROM memory_merges WHERE id = ?", (merge_id,))
        if not rows:
            raise NotFound(f"consolidation proposal {merge_id!r} not found", data={"proposalId": merge_id})
        return _merge(rows[0])

    def pending_merges(self, scope: str | None, limit: int) -> list[MergeRecord]:
        where, args = ("status = 'pending' AND scope = ?", [scope]) if scope is not None else ("status = 'pending'", [])
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_MERGE_COLUMNS} FROM memory_merges WHERE {where}"
                                   " ORDER BY created_at, id LIMIT ?", [*args, limit])
        return [_merge(r) for r in rows]

    def decide_merge(self, merge_id: str, status: MergeStatus, *, text: str | None = None,
                     result_id: str | None = None) -> bool:
        """``pending`` -> ``status``; False when it was decided already."""
        with self._db.write() as conn:
            conn.execute(
                "UPDATE memory_merges SET status = ?, text = coalesce(?, text), result_id = ?, decided_at = ?"
                " WHERE id = ? AND status = 'pending'",
                (status, text, result_id, self._clock(), merge_id),
            )
            return bool(conn.changes())

    def pending_with(self, memory_ids: Sequence[str]) -> bool:
        """An open proposal names one of these memories already."""
        with self._db.read() as conn:
            rows = fetch_all(conn, "SELECT memory_ids FROM memory_merges WHERE status = 'pending'")
        wanted = set(memory_ids)
        return any(wanted & set(_ids.decode(r[0])) for r in rows)
