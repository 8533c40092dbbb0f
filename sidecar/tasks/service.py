"""TaskService: the ``task:*`` methods and the scheduler that runs the tasks.

The scheduler is one loop in the service's task group (the App's, cancelled on exit): it
claims every task whose next time has come (TaskRepo.claim: the run row and the task's
next time in one transaction, so a time runs at most once), then sleeps until the next
time of any task, or until a task or a setting changes. For each claimed time:
- the task's previous run is still going (paused for a tool included): a ``skipped`` run
  (a task never overlaps itself);
- the time is more than LATE_MS old (the app was closed or asleep): the task's ``missed``
  policy: one run (trigger ``missed``), or a ``skipped`` run; the next time is computed from
  now, so however many times were missed this happens once;
- else a ``queued`` run, started as soon as one of ``maxConcurrentRuns`` slots is free
  (TaskRunner runs it).
``task:run`` queues a manual run the same way (BUSY while the task has a run going).
Starting a run is one step per task: the busy check, the run's row and the in-memory
marker (``_active``) are made under the task's guard (``_guards``, taken before the first
await), and the store adds an open row only while the task has none (TaskRepo), so two
``task:run`` requests, or one and a scheduled time, never start two runs of a task.

At start (``start``): runs a previous process left open are settled first: a run whose
reply was sent is followed again to its end (a reply paused for a tool survives restarts),
one that had sent nothing is ``interrupted``; then the loop starts (missed times are
handled by its first pass).

The clock is sidecar/tasks/clock.py's: the wall clock, or the test clock (``--test-clock``)
moved by ``set_test_clock`` (``sidecar:test:clock``), which answers once the scheduler
has handled every time up to the new one.

Must stay true: the loop never dies of a bad task or a database error (logged, retried
after RETRY_S); bad input is INVALID_PARAMS naming the field and writes nothing; deleting
a task stops its future runs at once (its run in progress, if any, stops being followed;
the reply itself goes on in its session); a task never has two runs going (the guard
above, and the store's rule as the last word).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.errors import ErrorCode
from protocol.memory import GLOBAL_SCOPE
from protocol.tasks import (
    Task,
    TaskCreateParams,
    TaskListParams,
    TaskListResult,
    TaskRun,
    TaskRunsParams,
    TaskRunsResult,
    TaskSettings,
    TaskSettingsUpdate,
    TaskUpdateParams,
)
from sidecar.engine.sessions import check_new_session
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar.locks import KeyedLocks
from sidecar.store.async_store import AsyncStore
from sidecar.store.checks import check_workspace_dir
from sidecar.store.store import Store
from sidecar.store.tasks import OVERLAP_ERROR, TaskRecord, TaskSpec
from sidecar.tasks import schedule as sched
from sidecar.tasks.clock import Clock, ManualClock, WallClock
from sidecar.tasks.runner import TaskRunner
from sidecar.notify import Notifier
from protocol.notifications import TASK_FINISHED

if TYPE_CHECKING:
    from protocol.sessions import CreateSessionOptions
    from protocol.tasks import TaskDelivery
    from protocol.types import MessageV2
    from sidecar.channels.service import ChannelService
    from sidecar.engine.events import EventHub
    from sidecar.tasks.runner import Consolidate, TaskChat

__all__ = ["TaskService", "LATE_MS", "SETTINGS_KEY", "open_tasks"]

log = logging.getLogger(__name__)

LATE_MS = 60_000
"""A time handled later than this is a missed one (the ``missed`` policy decides)."""
RETRY_S = 5.0
SETTINGS_KEY = "tasks.settings"
TEST_CLOCK_WAIT_S = 10.0
_settings_decoder = msgspec.json.Decoder(TaskSettings)


def _bad(field: str, why: str) -> InvalidParams:
    return InvalidParams(f"invalid params: {field} {why} - at `$.{field}`")


class TaskService:
    def __init__(self, *, store: AsyncStore, notify: Notifier, runner: TaskRunner, clock: Clock) -> None:
        self._store = store
        self._notify = notify
        self.runner = runner
        self.clock = clock
        self.settings = TaskSettings()
        self._limiter = anyio.CapacityLimiter(self.settings.max_concurrent_runs)
        self._tg: anyio.abc.TaskGroup | None = None
        self._active: dict[str, tuple[str, anyio.CancelScope]] = {}
        """task id -> (its run going in this process, the scope following it)."""
        self._guards = KeyedLocks()
        """Held per task while a run of it is being started or settled (check, row, marker)."""
        self._wake = anyio.Event()
        self._handled_until = -1
        """The clock time of the last finished pass of the loop."""
        self._passed = anyio.Event()

    # ---- lifetime -------------------------------------------------------------------------

    async def load(self) -> None:
        raw = await self._store.run(lambda s: s.settings.get(SETTINGS_KEY))
        if raw:
            try:
                self.settings = _settings_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("the stored task settings are unreadable; using the defaults")
        self._limiter.total_tokens = self.settings.max_concurrent_runs

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._tg = task_group
        task_group.start_soon(self._main)

    async def _main(self) -> None:
        await self._settle_left_open()
        await self._loop()

    async def _settle_left_open(self) -> None:
        try:
            runs = await self._store.run(lambda s: s.tasks.open_runs())
            for run in runs:
                async with self._guards.hold(run.task_id):
                    if run.task_id in self._active:  # started by this process meanwhile
                        continue
                    task = await self._store.run(lambda s: s.tasks.get(run.task_id))
                    if run.message_id is not None and run.session_id is not None:
                        self._follow(run, task, resume=True)
                    else:
                        await self.runner.finish(run.id, "interrupted", error="the app stopped before the run started")
        except SidecarError as exc:
            log.warning("the runs left open by the previous process could not be settled: %s", exc.message)

    async def _loop(self) -> None:
        while True:
            wake = self._wake = anyio.Event()
            now = self.clock.now_ms()
            try:
                for task in await self._store.run(lambda s: s.tasks.due(now)):
                    await self._fire(task, now)
                next_due = await self._store.run(lambda s: s.tasks.next_due())
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:
                log.exception("the scheduler's pass failed; retrying in %gs", RETRY_S)
                with anyio.move_on_after(RETRY_S):
                    await wake.wait()
                continue
            self._handled_until = now
            self._passed.set()
            self._passed = anyio.Event()
            await self.clock.sleep_until(next_due, wake)

    def _changed(self) -> None:
        self._wake.set()

    # ---- firing -------------------------------------------------------------------------------

    async def _fire(self, task: TaskRecord, now: int) -> None:
        async with self._guards.hold(task.id):
            await self._fire_guarded(task, now)

    async def _fire_guarded(self, task: TaskRecord, now: int) -> None:
        scheduled_for = task.next_run_at
        assert scheduled_for is not None
        zone = sched.effective_zone(task.spec.schedule, self.settings.timezone)
        following = sched.next_time(task.spec.schedule, zone, max(now, scheduled_for))
        late = now - scheduled_for > LATE_MS
        trigger = "missed" if late else "schedule"
        busy = await self._busy(task.id)
        if busy or (late and task.spec.missed == "skip"):
            why = OVERLAP_ERROR if busy else "missed while the app was closed"
            run = await self._store.run(lambda s: s.tasks.claim(
                task.id, scheduled_for, trigger=trigger, status="skipped", next_run_at=following, error=why))
            if run is not None:
                log.info("task %s: the time %d was skipped (%s)", task.id, scheduled_for, why)
                await self._notify(TASK_FINISHED, run)
            return
        run = await self._store.run(lambda s: s.tasks.claim(
            task.id, scheduled_for, trigger=trigger, status="queued", next_run_at=following))
        if run is None:
            return
        if run.status == "skipped":  # the store found a run of the task open
            log.info("task %s: the time %d was skipped (%s)", task.id, scheduled_for, run.error)
            await self._notify(TASK_FINISHED, run)
            return
        log.info("task %s: run %s queued (%s)", task.id, run.id, trigger)
        self._follow(run, task, resume=False)

    def _follow(self, run: TaskRun, task: TaskRecord, *, resume: bool) -> None:
        assert self._tg is not None
        scope = anyio.CancelScope()
        self._active[task.id] = (run.id, scope)
        self._tg.start_soon(self._run, run, task, scope, resume)

    async def _run(self, run: TaskRun, task: TaskRecord, scope: anyio.CancelScope, resume: bool) -> None:
        try:
            with scope:
                async with self._limiter:
                    if resume:
                        await self.runner.resume(run, task)
                    else:
                        await self.runner.execute(run, task)
        finally:
            if self._active.get(task.id, (None,))[0] == run.id:
                del self._active[task.id]

    # ---- task:* ---------------------------------------------------------------------------------

    async def create_task(self, params: TaskCreateParams) -> Task:
        spec = TaskSpec(
            name=params.name, schedule=params.schedule, kind=params.kind, prompt=params.prompt,
            session_id=params.session_id, new_session=params.new_session, assistant_id=params.assistant_id,
            scope=params.scope, deliver=params.deliver, missed=params.missed,
        )
        spec = await self._checked(spec, schedule=True, new_session=True)
        next_run_at = self._next(spec) if params.enabled else None
        record = await self._store.run(lambda s: s.tasks.create(spec, enabled=params.enabled, next_run_at=next_run_at))
        self._changed()
        return await self._wire(record)

    async def update_task(self, params: TaskUpdateParams) -> Task:
        record = await self._store.run(lambda s: s.tasks.get(params.id))
        changes = {
            f: getattr(params, f) for f in
            ("name", "schedule", "prompt", "session_id", "new_session", "assistant_id", "scope", "deliver", "missed")
            if getattr(params, f) is not msgspec.UNSET
        }
        enabled = record.enabled if params.enabled is msgspec.UNSET else params.enabled
        # the schedule is checked when it changes or comes back on (a one-shot that ran keeps its moment)
        reschedule = "schedule" in changes or (enabled and not record.enabled)
        spec = await self._checked(msgspec.structs.replace(record.spec, **changes), schedule=reschedule,
                                   new_session="new_session" in changes)
        if not enabled:
            next_run_at = None
        elif reschedule:
            next_run_at = self._next(spec)
        else:
            next_run_at = record.next_run_at
        updated = await self._store.run(lambda s: s.tasks.replace(params.id, spec, enabled=enabled,
                                                                  next_run_at=next_run_at))
        self._changed()
        return await self._wire(updated)

    async def get_task(self, params: IdParams) -> Task:
        return await self._wire(await self._store.run(lambda s: s.tasks.get(params.id)))

    async def list_tasks(self, params: TaskListParams) -> TaskListResult:
        records, total = await self._store.run(
            lambda s: s.tasks.page(enabled=params.enabled, limit=params.limit, offset=params.offset))
        last = await self._store.run(lambda s: s.tasks.last_runs([r.id for r in records]))
        return TaskListResult(tasks=[self._to_wire(r, last.get(r.id)) for r in records], total=total)

    async def delete_task(self, params: IdParams) -> SuccessResult:
        await self._store.run(lambda s: s.tasks.delete(params.id))
        active = self._active.pop(params.id, None)
        if active is not None:
            active[1].cancel()
        self._changed()
        return SuccessResult()

    async def run_task(self, params: IdParams) -> TaskRun:
        async with self._guards.hold(params.id):  # before any await: one start at a time per task
            record = await self._store.run(lambda s: s.tasks.get(params.id))
            if await self._busy(record.id):
                raise _overlap(record)
            await self._checked(record.spec, schedule=False, new_session=False)  # its session or assistant may be gone
            run = await self._store.run(lambda s: s.tasks.add_manual(record.id))
            if run is None:  # the store's rule: an open run of the task exists
                raise _overlap(record)
            self._follow(run, record, resume=False)
        return run

    async def list_runs(self, params: TaskRunsParams) -> TaskRunsResult:
        if params.task_id is not None:
            task_id = params.task_id
            await self._store.run(lambda s: s.tasks.get(task_id))
        runs, total = await self._store.run(lambda s: s.tasks.runs(
            task_id=params.task_id, status=params.status, limit=params.limit, offset=params.offset))
        return TaskRunsResult(runs=runs, total=total)

    async def get_settings(self, params: EmptyParams) -> TaskSettings:
        return self.settings

    async def update_settings(self, params: TaskSettingsUpdate) -> TaskSettings:
        changes: dict[str, Any] = {}
        if params.timezone is not msgspec.UNSET:
            sched.zone(params.timezone, "timezone")
            changes["timezone"] = params.timezone
        if params.max_concurrent_runs is not msgspec.UNSET:
            changes["max_concurrent_runs"] = params.max_concurrent_runs
        settings = msgspec.structs.replace(self.settings, **changes)
        encoded = msgspec.json.encode(settings).decode()
        zone_changed = settings.timezone != self.settings.timezone

        def write(s: Store) -> None:
            with s.transaction():
                s.settings.set(SETTINGS_KEY, encoded)
                if zone_changed:  # the tasks without a zone of their own follow the host's
                    for record in s.tasks.all_enabled():
                        if sched.effective_zone(record.spec.schedule, settings.timezone) == settings.timezone:
                            s.tasks.set_next(record.id, sched.next_time(
                                record.spec.schedule, settings.timezone, self.clock.now_ms()))

        await self._store.run(write)
        self.settings = settings
        self._limiter.total_tokens = settings.max_concurrent_runs
        self._changed()
        return settings

    # ---- the test clock -------------------------------------------------------------------------

    async def set_test_clock(self, now_ms: int) -> int:
        """Move the test clock to ``now_ms`` and wait until every time up to it was handled."""
        clock = self.clock
        if not isinstance(clock, ManualClock):
            raise SidecarError("the test clock is off (start the sidecar with --test-clock)",
                               code=ErrorCode.BAD_STATE)
        if now_ms < clock.now_ms():
            raise _bad("now", "must not go back in time")
        clock.set(now_ms)
        self._changed()
        with anyio.fail_after(TEST_CLOCK_WAIT_S):
            while self._handled_until < now_ms:
                await self._passed.wait()
        return now_ms

    # ---- helpers ------------------------------------------------------------------------------------

    async def _busy(self, task_id: str) -> bool:
        """The task has a run that has not ended (this process's, or one left open)."""
        if task_id in self._active:
            return True
        return bool(await self._store.run(lambda s: s.tasks.open_runs(task_id)))

    def _next(self, spec: TaskSpec) -> int | None:
        zone = sched.effective_zone(spec.schedule, self.settings.timezone)
        return sched.next_time(spec.schedule, zone, self.clock.now_ms())

    async def _checked(self, spec: TaskSpec, *, schedule: bool, new_session: bool) -> TaskSpec:
        """``spec`` stripped and checked (INVALID_PARAMS naming the field, NOT_FOUND for a
        session, assistant or channel that does not exist); its schedule too with ``schedule``,
        its ``newSession`` options too with ``new_session`` (when they are written: a provider
        deleted later fails the run, as it fails any session's send)."""
        name = spec.name.strip()
        if not name:
            raise _bad("name", "must not be empty")
        if schedule:
            sched.check_schedule(spec.schedule, self.settings.timezone, self.clock.now_ms())
        prompt = spec.prompt.strip() if spec.prompt is not None else None
        if spec.kind == "prompt":
            if not prompt:
                raise _bad("prompt", "is required for a prompt task")
            if "\x00" in prompt:
                raise _bad("prompt", "must not contain NUL characters")
            if spec.scope is not None:
                raise _bad("scope", "is only for memory-consolidate tasks")
        else:
            if prompt is not None:
                raise _bad("prompt", "is only for prompt tasks")
            for field in ("session_id", "new_session", "assistant_id", "deliver"):
                if getattr(spec, field) is not None:
                    raise _bad(_camel(field), "is only for prompt tasks")
        if spec.session_id is not None and spec.new_session is not None:
            raise _bad("newSession", "and sessionId exclude each other")
        if spec.session_id is not None and spec.assistant_id is not None:
            raise _bad("assistantId", "is for the sessions the task starts; set the assistant of the session instead")
        options = spec.new_session if new_session else None
        if options is not None:  # the checks of chat:session:create
            if options.channel_id is not None:
                raise _bad("newSession.channelId", "is not for task sessions (use deliver)")
            check_workspace_dir("newSession.workspaceDir", options.workspace_dir)
        await self._check_refs(spec, options)
        return msgspec.structs.replace(spec, name=name, prompt=prompt)

    async def _check_refs(self, spec: TaskSpec, options: CreateSessionOptions | None) -> None:
        def check(s: Store) -> None:
            if options is not None:
                check_new_session(s, options, prefix="newSession.")
            if spec.session_id is not None:
                try:
                    s.sessions.get(spec.session_id)
                except NotFound:
                    raise NotFound(f"session {spec.session_id!r} not found - at `$.sessionId`") from None
            if spec.assistant_id is not None and not s.assistants.exists(spec.assistant_id):
                raise NotFound(f"assistant {spec.assistant_id!r} not found - at `$.assistantId`")
            if spec.scope is not None and spec.scope != GLOBAL_SCOPE and not s.assistants.exists(spec.scope):
                raise NotFound(f"assistant {spec.scope!r} not found (a scope is 'global' or an assistant id)"
                               " - at `$.scope`")
            if spec.deliver is not None:
                channel = spec.deliver.channel
                if not any(c.id == channel for c in s.channels.list_configs()):
                    raise NotFound(f"channel {channel!r} not found - at `$.deliver.channel`")

        await self._store.run(check)

    async def _wire(self, record: TaskRecord) -> Task:
        last = await self._store.run(lambda s: s.tasks.last_runs([record.id]))
        return self._to_wire(record, last.get(record.id))

    def _to_wire(self, record: TaskRecord, last: TaskRun | None) -> Task:
        spec = record.spec
        zone = sched.effective_zone(spec.schedule, self.settings.timezone)
        return Task(
            id=record.id, name=spec.name, schedule=spec.schedule, schedule_text=sched.describe(spec.schedule, zone),
            timezone=zone, kind=spec.kind, prompt=spec.prompt, session_id=spec.session_id,
            new_session=spec.new_session, assistant_id=spec.assistant_id, scope=spec.scope, deliver=spec.deliver,
            missed=spec.missed, enabled=record.enabled, next_run_at=record.next_run_at, last_run=last,
            created_at=record.created_at, updated_at=record.updated_at,
        )


def _overlap(record: TaskRecord) -> SidecarError:
    return SidecarError(f"task {record.spec.name!r} has a run going; it never overlaps itself",
                        code=ErrorCode.BUSY, data={"taskId": record.id})


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part.title() for part in rest)


async def open_tasks(
    stack: AsyncExitStack,
    *,
    store: AsyncStore,
    chat: TaskChat,
    events: EventHub,
    notify: Notifier,
    channels: ChannelService,
    consolidate: Consolidate,
    test_clock_ms: int | None,
) -> TaskService:
    """The App's TaskService: its scheduler runs in a task group entered on ``stack`` last,
    so it is cancelled first on exit (before the channels and the chat engine it uses close);
    the clock is the test clock when the config has one (``test_clock_ms``)."""

    async def deliver(to: TaskDelivery, message: MessageV2) -> None:
        await channels.deliver_reply(to.channel, to.chat_id, message, thread_id=to.thread_id)

    runner = TaskRunner(store=store, chat=chat, events=events, notify=notify, deliver=deliver, consolidate=consolidate)
    clock: Clock = ManualClock(test_clock_ms) if test_clock_ms is not None else WallClock()
    service = TaskService(store=store, notify=notify, runner=runner, clock=clock)
    await service.load()
    task_group = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(task_group.cancel_scope.cancel)
    service.start(task_group)
    return service
