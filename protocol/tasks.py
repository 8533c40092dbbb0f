"""``task:*``: scheduled agent tasks (cron and one-shot jobs) and their runs.

A task is a job the sidecar runs by itself: at each time of its schedule (a 5-field cron
expression evaluated in a time zone, or one moment) it sends its ``prompt`` through the
normal chat pipeline, as ``chat:send`` does (the session's assistant, tools under their
policies: a tool call that waits for approval waits for the user as always), in the
session it continues (``sessionId``) or in a new session per run (``newSession``), and can
deliver the reply to an IM chat (``deliver``: sent as ``channel:reply`` like any channel
reply). Kind ``memory-consolidate`` runs ``memory:consolidate`` instead of a prompt.

Every run is recorded (``task:runs``): ``task_fired`` when it starts, ``task_finished``
when it ends (both carry the TaskRun). A time missed while the app was closed (or asleep)
is run once at the next start, or recorded as skipped, as the task's ``missed`` says,
never once per missed time. A task never overlaps itself: a time that comes while its
previous run is still going (paused for a tool included) is recorded as skipped. At most
``maxConcurrentRuns`` (``task:settings:*``) runs go at once; the others queue.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocol.common import EmptyParams, IdParams, MethodSpec, SuccessResult
from protocol.limits import Id, Int64, Offset, Title
from protocol.sessions import CreateSessionOptions
from protocol.types import Struct

__all__ = [
    "MAX_TASK_PROMPT_CHARS",
    "CronSchedule",
    "OnceSchedule",
    "TaskSchedule",
    "TaskKind",
    "MissedPolicy",
    "TaskDelivery",
    "TaskCreateParams",
    "TaskUpdateParams",
    "Task",
    "TaskListParams",
    "TaskListResult",
    "TaskRunStatus",
    "TaskTrigger",
    "TaskRun",
    "TaskRunsParams",
    "TaskRunsResult",
    "TaskSettings",
    "TaskSettingsUpdate",
]

MAX_TASK_PROMPT_CHARS = 32_000

CronExpression = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
ZoneName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Prompt = Annotated[str, msgspec.Meta(max_length=MAX_TASK_PROMPT_CHARS)]
TaskPageLimit = Annotated[int, msgspec.Meta(ge=1, le=500)]
ConcurrentRuns = Annotated[int, msgspec.Meta(ge=1, le=16)]


class CronSchedule(Struct, tag_field="kind", tag="cron", kw_only=True):
    """Every time a 5-field cron expression (minute hour day-of-month month day-of-week,
    as Debian cron reads it, names such as ``MON`` and ``JAN`` allowed) matches."""

    expression: CronExpression
    timezone: ZoneName | None = None
    """An IANA zone name (``Europe/Paris``); none: the ``timezone`` of ``task:settings``."""


class OnceSchedule(Struct, tag_field="kind", tag="once", kw_only=True):
    """One run at ``at`` (ms since the epoch); afterwards the task has no next run."""

    at: Int64


TaskSchedule = CronSchedule | OnceSchedule
TaskKind = Literal["prompt", "memory-consolidate"]
"""``prompt``: send ``prompt`` in a session; ``memory-consolidate``: ``memory:consolidate``
of ``scope`` (every scope when none) in the mode of the memory settings."""
MissedPolicy = Literal["run_once", "skip"]
"""What a time missed while the app was closed or asleep (more than a minute late) becomes:
one run at the next start (however many times were missed), or a skipped run."""


class TaskDelivery(Struct, kw_only=True):
    """Where a prompt task's reply goes besides its session: a chat of a configured channel."""

    channel: Id
    chat_id: Id
    thread_id: Id | None = None


class TaskCreateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    name: Title
    schedule: TaskSchedule
    kind: TaskKind = "prompt"
    prompt: Prompt | None = None
    """Required for kind ``prompt``: what is sent, as a user message."""
    session_id: Id | None = None
    """Continue this session at every run (excludes ``newSession``)."""
    new_session: CreateSessionOptions | None = None
    """Each run starts a new session with these options (default title: the task's name).
    Without ``sessionId`` and ``newSession`` each run starts a new session with defaults."""
    assistant_id: Id | None = None
    """The assistant of the sessions the task starts (default: the default assistant)."""
    scope: Id | None = None
    """Kind ``memory-consolidate``: ``global`` or an assistant's id; none: every scope."""
    deliver: TaskDelivery | None = None
    missed: MissedPolicy = "run_once"
    enabled: bool = True


class TaskUpdateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields given change (``null`` clears an optional one); a new schedule counts
    from now. A run in progress is not affected."""

    id: Id
    name: Title | UnsetType = UNSET
    schedule: TaskSchedule | UnsetType = UNSET
    prompt: Prompt | None | UnsetType = UNSET
    session_id: Id | None | UnsetType = UNSET
    new_session: CreateSessionOptions | None | UnsetType = UNSET
    assistant_id: Id | None | UnsetType = UNSET
    scope: Id | None | UnsetType = UNSET
    deliver: TaskDelivery | None | UnsetType = UNSET
    missed: MissedPolicy | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET


TaskRunStatus = Literal["queued", "running", "paused", "completed", "error", "aborted", "skipped", "interrupted"]
"""``queued``: waiting for a free slot; ``paused``: its reply waits for a tool approval;
``interrupted``: the app stopped before the run had sent anything."""
TaskTrigger = Literal["schedule", "missed", "manual"]


class TaskRun(Struct, omit_defaults=False, kw_only=True):
    id: str
    task_id: str
    trigger: TaskTrigger
    scheduled_for: Int64
    """The time of the schedule this run is for (``manual``: when it was asked for)."""
    status: TaskRunStatus
    session_id: str | None = None
    message_id: str | None = None
    """The reply (kind ``prompt``)."""
    error: str | None = None
    """Why it failed, was skipped or interrupted."""
    delivery_error: str | None = None
    """The reply could not be handed to its channel (the run's status is the reply's)."""
    created_at: Int64
    started_at: Int64 | None = None
    finished_at: Int64 | None = None


class Task(Struct, omit_defaults=False, kw_only=True):
    id: str
    name: str
    schedule: TaskSchedule
    schedule_text: str
    """The schedule in words (``At 09:00 every day``; for ``once``: the moment in ISO 8601)."""
    timezone: str
    """The zone the schedule is evaluated in."""
    kind: TaskKind
    prompt: str | None = None
    session_id: str | None = None
    new_session: CreateSessionOptions | None = None
    assistant_id: str | None = None
    scope: str | None = None
    deliver: TaskDelivery | None = None
    missed: MissedPolicy
    enabled: bool
    next_run_at: Int64 | None = None
    """None: disabled, or a one-shot task that ran."""
    last_run: TaskRun | None = None
    created_at: Int64
    updated_at: Int64


class TaskListParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """Oldest first."""

    enabled: bool | None = None
    limit: TaskPageLimit = 100
    offset: Offset = 0


class TaskListResult(Struct, omit_defaults=False, kw_only=True):
    tasks: list[Task]
    total: Int64


class TaskRunsParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """Newest first."""

    task_id: Id | None = None
    status: TaskRunStatus | None = None
    limit: TaskPageLimit = 50
    offset: Offset = 0


class TaskRunsResult(Struct, omit_defaults=False, kw_only=True):
    runs: list[TaskRun]
    total: Int64


class TaskSettings(Struct, omit_defaults=False, kw_only=True):
    max_concurrent_runs: ConcurrentRuns = 2
    """Runs going at once (a paused run holds its slot until its approval is answered)."""
    timezone: ZoneName = "UTC"
    """The host's IANA time zone: cron schedules without a zone of their own use it."""


class TaskSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    max_concurrent_runs: ConcurrentRuns | UnsetType = UNSET
    timezone: ZoneName | UnsetType = UNSET


METHODS: dict[str, MethodSpec] = {
    "task:create": MethodSpec(TaskCreateParams, Task, "Schedule a task (cron or one-shot)."),
    "task:list": MethodSpec(TaskListParams, TaskListResult, "Scheduled tasks, oldest first."),
    "task:get": MethodSpec(IdParams, Task, "One task with its next and last run."),
    "task:update": MethodSpec(TaskUpdateParams, Task, "Change a task (a new schedule counts from now)."),
    "task:delete": MethodSpec(IdParams, SuccessResult, "Delete a task and its runs; it never runs again."),
    "task:run": MethodSpec(IdParams, TaskRun, "Run a task now (BUSY while its previous run is going)."),
    "task:runs": MethodSpec(TaskRunsParams, TaskRunsResult, "Runs of one or every task, newest first."),
    "task:settings:get": MethodSpec(EmptyParams, TaskSettings, "The scheduler's settings."),
    "task:settings:update": MethodSpec(TaskSettingsUpdate, TaskSettings, "Change the scheduler's settings."),
}
"""The methods of this domain (see ``protocol.methods``)."""
