"""TaskRepo: the ``tasks`` and ``task_runs`` tables (migration ``m_tasks``).

A task row holds its definition (``spec``: TaskSpec as JSON) and its scheduling state
(``enabled``, ``next_run_at``); a run row is one run of a task, from ``queued`` to a final
status. Computing schedules is not this module's business (sidecar/tasks/schedule.py):
callers pass the next time in.

Must stay true:
- a time of a task's schedule is run at most once: ``claim`` inserts its run and moves
  ``next_run_at`` in one transaction, only while ``next_run_at`` is still the time claimed,
  and the unique index on (task, scheduled_for) refuses a second row for it;
- a task has at most one open run (``queued``, ``running``, ``paused``): ``claim`` and
  ``add_manual`` look for one and insert in the same write transaction (the one writer,
  ``BEGIN IMMEDIATE``): a claimed time finds one and is recorded ``skipped``
  (OVERLAP_ERROR), a manual run is not added;
- a run's final status is written once (``finish`` only changes a run still open);
- deleting a task deletes its runs (ON DELETE CASCADE).

Synchronous: ``Store.tasks`` through ``AsyncStore.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from protocol.sessions import CreateSessionOptions
from protocol.tasks import MissedPolicy, TaskDelivery, TaskKind, TaskRun, TaskSchedule
from sidecar.errors import NotFound
from sidecar.store.db import Database, fetch_all
from sidecar.store.ids import new_id, now_ms

__all__ = ["TaskRepo", "TaskSpec", "TaskRecord", "OPEN_STATUSES", "FINAL_STATUSES", "OVERLAP_ERROR"]

OPEN_STATUSES = ("queued", "running", "paused")
FINAL_STATUSES = ("completed", "error", "aborted", "skipped", "interrupted")
OVERLAP_ERROR = "its previous run was still going"
"""The error of a time skipped because the task had a run open (a task never overlaps itself)."""
_OPEN_IN = ", ".join("?" * len(OPEN_STATUSES))
_RUN_COLUMNS = (
    "id, task_id, trigger, scheduled_for, status, session_id, message_id, error, delivery_error, created_at,"
    " started_at, finished_at"
)
_TASK_COLUMNS = "id, spec, enabled, next_run_at, created_at, updated_at"


class TaskSpec(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """A task's definition as stored (the wire fields of task:create but ``enabled``)."""

    name: str
    schedule: TaskSchedule
    kind: TaskKind = "prompt"
    prompt: str | None = None
    session_id: str | None = None
    new_session: CreateSessionOptions | None = None
    assistant_id: str | None = None
    scope: str | None = None
    deliver: TaskDelivery | None = None
    missed: MissedPolicy = "run_once"


class TaskRecord(msgspec.Struct, kw_only=True):
    id: str
    spec: TaskSpec
    enabled: bool
    next_run_at: int | None
    created_at: int
    updated_at: int


_spec = msgspec.json.Decoder(TaskSpec)
_encode = msgspec.json.Encoder()


def _task(row: tuple[Any, ...]) -> TaskRecord:
    return TaskRecord(id=row[0], spec=_spec.decode(row[1]), enabled=bool(row[2]), next_run_at=row[3],
                      created_at=row[4], updated_at=row[5])


def _run(row: tuple[Any, ...]) -> TaskRun:
    return TaskRun(
        id=row[0], task_id=row[1], trigger=row[2], scheduled_for=row[3], status=row[4], session_id=row[5],
        message_id=row[6], error=row[7], delivery_error=row[8], created_at=row[9], started_at=row[10],
        finished_at=row[11],
    )


class TaskRepo:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._clock = clock

    # ---- tasks -----------------------------------------------------------------------

    def create(self, spec: TaskSpec, *, enabled: bool, next_run_at: int | None) -> TaskRecord:
        now = self._clock()
        task_id = new_id()
        with self._db.write() as conn:
            conn.execute(
                f"INSERT INTO tasks({_TASK_COLUMNS}, name, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (task_id, _encode.encode(spec).decode(), int(enabled), next_run_at, now, now, spec.name, spec.kind),
            )
            return self._get(conn, task_id)

    def replace(self, task_id: str, spec: TaskSpec, *, enabled: bool, next_run_at: int | None) -> TaskRecord:
        with self._db.write() as conn:
            self._get(conn, task_id)
            conn.execute(
                "UPDATE tasks SET spec = ?, name = ?, kind = ?, enabled = ?, next_run_at = ?, updated_at = ?"
                " WHERE id = ?",
                (_encode.encode(spec).decode(), spec.name, spec.kind, int(enabled), next_run_at, self._clock(),
                 task_id),
            )
            return self._get(conn, task_id)

    def get(self, task_id: str) -> TaskRecord:
        with self._db.read() as conn:
            return self._get(conn, task_id)

    def page(self, *, enabled: bool | None, limit: int, offset: int) -> tuple[list[TaskRecord], int]:
        where, args = ("WHERE enabled = ?", [int(enabled)]) if enabled is not None else ("", [])
        with self._db.read() as conn:
            total = fetch_all(conn, f"SELECT count(*) FROM tasks {where}", args)[0][0]
            rows = fetch_all(conn, f"SELECT {_TASK_COLUMNS} FROM tasks {where} ORDER BY created_at, id"
                                   " LIMIT ? OFFSET ?", [*args, limit, offset])
        return [_task(r) for r in rows], int(total)

    def all_enabled(self) -> list[TaskRecord]:
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_TASK_COLUMNS} FROM tasks WHERE enabled = 1 ORDER BY created_at, id")
        return [_task(r) for r in rows]

    def delete(self, task_id: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM tasks WHERE id = ?", (task_id,))
            if not conn.changes():
                raise NotFound(f"task {task_id!r} not found", data={"taskId": task_id})

    def due(self, now: int) -> list[TaskRecord]:
        """Enabled tasks whose next time is ``now`` or earlier, the earliest first."""
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_TASK_COLUMNS} FROM tasks WHERE enabled = 1 AND next_run_at IS NOT NULL"
                                   " AND next_run_at <= ? ORDER BY next_run_at, id", (now,))
        return [_task(r) for r in rows]

    def next_due(self) -> int | None:
        with self._db.read() as conn:
            rows = fetch_all(conn, "SELECT min(next_run_at) FROM tasks WHERE enabled = 1 AND next_run_at IS NOT NULL")
        return rows[0][0] if rows else None

    def set_next(self, task_id: str, next_run_at: int | None) -> None:
        with self._db.write() as conn:
            conn.execute("UPDATE tasks SET next_run_at = ? WHERE id = ?", (next_run_at, task_id))

    # ---- runs ------------------------------------------------------------------------

    def claim(
        self, task_id: str, scheduled_for: int, *, trigger: str, status: str, next_run_at: int | None,
        error: str | None = None,
    ) -> TaskRun | None:
        """Claim the time ``scheduled_for`` of a task: its run row (``status``) and the task's
        next time, in one transaction. None when it is no longer the task's next time (the
        task changed, was deleted or disabled) or that time has a run already. A run that
        would be open while the task has one open is recorded ``skipped`` (OVERLAP_ERROR)."""
        now = self._clock()
        with self._db.write() as conn:
            rows = fetch_all(conn, "SELECT next_run_at, enabled FROM tasks WHERE id = ?", (task_id,))
            if not rows or rows[0][0] != scheduled_for or not rows[0][1]:
                return None
            if status in OPEN_STATUSES and self._has_open(conn, task_id):
                status, error = "skipped", OVERLAP_ERROR
            conn.execute("UPDATE tasks SET next_run_at = ? WHERE id = ?", (next_run_at, task_id))
            run_id = new_id()
            finished = now if status in FINAL_STATUSES else None
            conn.execute(
                f"INSERT OR IGNORE INTO task_runs({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, NULL, ?, NULL, ?)",
                (run_id, task_id, trigger, scheduled_for, status, error, now, finished),
            )
            if not conn.changes():
                return None
            return self._run(conn, run_id)

    def add_manual(self, task_id: str) -> TaskRun | None:
        """A ``queued`` manual run; None (nothing written) while the task has a run open."""
        now = self._clock()
        with self._db.write() as conn:
            self._get(conn, task_id)
            if self._has_open(conn, task_id):
                return None
            run_id = new_id()
            conn.execute(
                f"INSERT INTO task_runs({_RUN_COLUMNS}) VALUES (?, ?, 'manual', ?, 'queued', NULL, NULL, NULL, NULL,"
                " ?, NULL, NULL)",
                (run_id, task_id, now, now),
            )
            return self._run(conn, run_id)

    def start_run(self, run_id: str) -> TaskRun | None:
        """``queued`` -> ``running`` (None when the run is gone or no longer queued)."""
        with self._db.write() as conn:
            conn.execute("UPDATE task_runs SET status = 'running', started_at = ? WHERE id = ? AND status = 'queued'",
                         (self._clock(), run_id))
            return self._run(conn, run_id) if conn.changes() else None

    def set_reply(self, run_id: str, session_id: str, message_id: str | None) -> TaskRun | None:
        with self._db.write() as conn:
            conn.execute("UPDATE task_runs SET session_id = ?, message_id = ? WHERE id = ?",
                         (session_id, message_id, run_id))
            return self._run(conn, run_id) if conn.changes() else None

    def set_status(self, run_id: str, status: str) -> TaskRun | None:
        """An open run's open status (``running`` <-> ``paused``)."""
        placeholders = ", ".join("?" * len(OPEN_STATUSES))
        with self._db.write() as conn:
            conn.execute(f"UPDATE task_runs SET status = ? WHERE id = ? AND status IN ({placeholders})",
                         (status, run_id, *OPEN_STATUSES))
            return self._run(conn, run_id) if conn.changes() else None

    def finish(
        self, run_id: str, status: str, *, error: str | None = None, delivery_error: str | None = None,
    ) -> TaskRun | None:
        """An open run's final status (None when it is gone or ended already)."""
        placeholders = ", ".join("?" * len(OPEN_STATUSES))
        with self._db.write() as conn:
            conn.execute(
                f"UPDATE task_runs SET status = ?, error = ?, delivery_error = ?, finished_at = ?"
                f" WHERE id = ? AND status IN ({placeholders})",
                (status, error, delivery_error, self._clock(), run_id, *OPEN_STATUSES),
            )
            return self._run(conn, run_id) if conn.changes() else None

    def open_runs(self, task_id: str | None = None) -> list[TaskRun]:
        placeholders = ", ".join("?" * len(OPEN_STATUSES))
        where, args = (" AND task_id = ?", [task_id]) if task_id is not None else ("", [])
        with self._db.read() as conn:
            rows = fetch_all(conn, f"SELECT {_RUN_COLUMNS} FROM task_runs WHERE status IN ({placeholders}){where}"
                                   " ORDER BY created_at, id", [*OPEN_STATUSES, *args])
        return [_run(r) for r in rows]

    def runs(self, *, task_id: str | None, status: str | None, limit: int, offset: int) -> tuple[list[TaskRun], int]:
        where: list[str] = []
        args: list[Any] = []
        if task_id is not None:
            where.append("task_id = ?")
            args.append(task_id)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self._db.read() as conn:
            total = fetch_all(conn, f"SELECT count(*) FROM task_runs{clause}", args)[0][0]
            rows = fetch_all(conn, f"SELECT {_RUN_COLUMNS} FROM task_runs{clause}"
                                   " ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?", [*args, limit, offset])
        return [_run(r) for r in rows], int(total)

    def last_runs(self, task_ids: list[str]) -> dict[str, TaskRun]:
        """The newest run of each task that has one."""
        out: dict[str, TaskRun] = {}
        with self._db.read() as conn:
            for task_id in task_ids:
                rows = fetch_all(conn, f"SELECT {_RUN_COLUMNS} FROM task_runs WHERE task_id = ?"
                                       " ORDER BY created_at DESC, id DESC LIMIT 1", (task_id,))
                if rows:
                    out[task_id] = _run(rows[0])
        return out

    # ---- internals ---------------------------------------------------------------------

    def _get(self, conn: Any, task_id: str) -> TaskRecord:
        rows = fetch_all(conn, f"SELECT {_TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,))
        if not rows:
            raise NotFound(f"task {task_id!r} not found", data={"taskId": task_id})
        return _task(rows[0])

    def _has_open(self, conn: Any, task_id: str) -> bool:
        return bool(fetch_all(conn, f"SELECT 1 FROM task_runs WHERE task_id = ? AND status IN ({_OPEN_IN}) LIMIT 1",
                              (task_id, *OPEN_STATUSES)))

    def _run(self, conn: Any, run_id: str) -> TaskRun:
        rows = fetch_all(conn, f"SELECT {_RUN_COLUMNS} FROM task_runs WHERE id = ?", (run_id,))
        if not rows:
            raise NotFound(f"task run {run_id!r} not found")
        return _run(rows[0])
