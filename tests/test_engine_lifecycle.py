"""ReplyLifecycle on its own: a scripted driver against a real store (in process).

Covers what the lifecycle owns whatever the driver: events and seq, the row from pending to
its final status, persistence while streaming, the overlay, usage, cost and the session's
counters, chat:session:updated, pausing and resuming, every ending under cancellation,
store failures at every step, and endings that run out of time."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pytest

from protocol.events import StreamToolCall
from protocol.sessions import CreateSessionOptions
from protocol.settings import ChatSettings
from protocol.types import DiffPart, MessageV2, SessionV2, StepStartPart, ToolUsePart, Usage
from sidecar.engine.lifecycle import runner as lifecycle_module
from sidecar.engine.lifecycle import (
    Aborted,
    Completed,
    Ending,
    Failed,
    Paused,
    ReplyDriver,
    ReplyFeed,
    ReplyJob,
    ReplyLifecycle,
    ReplyServices,
    StoreWrite,
)
from sidecar.engine.reply import ReplySnapshot
from sidecar.errors import SidecarError, StoreError
from sidecar.store import AsyncStore, Store
from sidecar.notify import Notifier

pytestmark = pytest.mark.anyio

FINALS = ("StreamEndEvent", "ErrorEvent", "AbortedEvent")
SETTINGS = ChatSettings(delta_coalesce_ms=0, persist_interval_ms=20)


# ---- the rig ----------------------------------------------------------------------------


class Recorder:
    """Every notification, awaitable by condition."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self._changed = anyio.Event()

    async def notify(self, method: str, params: Any) -> None:
        self.sent.append((method, params))
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def events(self) -> list[Any]:
        return [p for m, p in self.sent if m == "chat:stream"]

    def names(self) -> list[str]:
        return [type(e).__name__ for e in self.events]

    def updates(self) -> list[SessionV2]:
        return [p for m, p in self.sent if m == "chat:session:updated"]

    async def until(self, condition: Callable[[], bool]) -> None:
        with anyio.fail_after(10):
            while not condition():
                await self._changed.wait()


class Price:
    def __init__(self, cost: float = 0.25) -> None:
        self.value = cost
        self.calls = 0

    async def cost(self, provider_id: str, model_id: str, usage: Usage) -> float:
        self.calls += 1
        return self.value


class Rig(msgspec.Struct, kw_only=True):
    store: AsyncStore
    events: Recorder
    price: Price
    session: SessionV2
    services: ReplyServices

    async def reply_row(self) -> MessageV2:
        """A new pending reply under a new user message (as a turn stores them)."""

        def write(s: Store) -> MessageV2:
            with s.transaction():
                user = s.messages.append(self.session.id, role="user", text_content="hi")
                return s.messages.append(self.session.id, role="assistant", parent_id=user.id, status="pending")

        return await self.store.run(write)

    def job(self, reply: MessageV2, **kw: Any) -> ReplyJob:
        return ReplyJob(
            session=self.session, message_id=reply.id, parent_id=reply.parent_id or "", provider_id="p",
            model_id="m", **kw,
        )

    async def row(self, message_id: str) -> MessageV2:
        return await self.store.run(lambda s: s.messages.get(message_id))


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = await AsyncStore.open(tmp_path)
    try:
        session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        events = Recorder()
        price = Price()
        services = ReplyServices(store=store, notify=Notifier(events.notify), pricing=price)
        yield Rig(store=store, events=events, price=price, session=session, services=services)
    finally:
        await store.close()


Body = Callable[[ReplyFeed], Awaitable[Ending]]


class Script(ReplyDriver):
    """A driver whose content and hooks are given by the test; records the hooks it saw."""

    doing = "running a script"

    def __init__(
        self,
        body: Body,
        *,
        finalize: Callable[[ReplySnapshot], Awaitable[ReplySnapshot]] | None = None,
        close: Callable[[ReplyFeed], Awaitable[None]] | None = None,
        state: StoreWrite | None = None,
        final: StoreWrite | None = None,
    ) -> None:
        self._body = body
        self._finalize = finalize
        self._close = close
        self._state = state
        self._final = final
        self.hooks: list[str] = []

    async def drive(self, reply: ReplyFeed) -> Ending:
        return await self._body(reply)

    def persisted(self) -> StoreWrite | None:
        state, self._state = self._state, None
        return state

    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None:
        self.hooks.append(f"close:{type(ending).__name__}")
        if self._close is not None:
            await self._close(reply)

    async def finalize(self, snapshot: ReplySnapshot) -> ReplySnapshot:
        self.hooks.append("finalize")
        if self._finalize is not None:
            return await self._finalize(snapshot)
        return snapshot

    def final_write(self, outcome: str) -> StoreWrite | None:
        self.hooks.append(f"final_write:{outcome}")
        return self._final


def says(text: str, ending: Ending = Completed("stop"), usage: Usage | None = None) -> Body:
    async def body(reply: ReplyFeed) -> Ending:
        await reply.text(text)
        if usage is not None:
            await reply.report_usage(usage)
        return ending

    return body


def assert_one_final_last(names: list[str]) -> None:
    finals = [n for n in names if n in FINALS]
    assert len(finals) == 1 and names[-1] == finals[0], names


def assert_seq(events: list[Any]) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


# ---- a scripted driver ----------------------------------------------------------------------


async def test_a_scripted_driver_streams_persists_and_ends_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()

        async def body(reply: ReplyFeed) -> Ending:
            await reply.thinking("let me ")
            await reply.thinking("see", signature="sig-1")
            await reply.text("Hello ")
            await reply.tool_call_started("c1", "edit")
            await reply.tool_call_arguments("c1", "edit", '{"path":')
            index = await reply.tool_use("c1", "edit", '{"path": "a.py"}')
            assert isinstance(reply.content.parts[index], ToolUsePart)
            diff = await reply.part(DiffPart(file_path="a.py", hunks=[]))
            reply.replace_part(diff, DiffPart(file_path="a.py", hunks=[{"oldStart": 1}]))
            await reply.tool_result("c1", "edited", False)
            await reply.part(StepStartPart(step_id="s1", title="Plan"))
            await reply.notice("heads up", "test_notice")
            await reply.text("world")
            await reply.report_usage(Usage(input_tokens=10, output_tokens=5), announce=True)
            return Completed("stop")

        driver = Script(
            body, state=lambda s: s.settings.set("driver-state", "partial"),
            final=lambda s: s.settings.set("driver-final", "done"),
        )
        job = r.job(reply_row)
        await ReplyLifecycle(job, r.services, SETTINGS).run(driver)

        names = r.events.names()
        assert names == [
            "StreamStartEvent", "ThinkingDeltaEvent", "ThinkingDeltaEvent", "TextDeltaEvent", "ToolCallStartEvent",
            "ToolCallDeltaEvent", "ToolResultEvent", "NoticeEvent", "TextDeltaEvent", "UsageEvent", "UsageEvent",
            "StreamEndEvent",
        ]
        assert_seq(r.events.events)
        assert job.outcome == "completed" and driver.hooks == ["finalize", "final_write:completed"]
        row = await r.row(reply_row.id)
        assert row.status == "completed" and row.text_content == "Hello world"
        assert [type(p).__name__ for p in row.parts or []] == [
            "ThinkingPart", "TextPart", "ToolUsePart", "DiffPart", "ToolResultPart", "StepStartPart", "TextPart",
        ]
        assert row.parts is not None and row.parts[0].signature == "sig-1"  # type: ignore[union-attr]
        assert row.parts[3].hunks == [{"oldStart": 1}]  # type: ignore[union-attr]
        assert row.tool_calls is not None and [c.id for c in row.tool_calls] == ["c1"]
        assert row.seq == r.events.events[-1].seq and row.model_id == "m" and row.latency_ms is not None
        assert row.usage == Usage(input_tokens=10, output_tokens=5)
        # the driver's own state went with the row (persisted + final_write)
        assert await r.store.run(lambda s: (s.settings.get("driver-state"), s.settings.get("driver-final"))) == (
            "partial", "done",
        )
        session = await r.store.run(lambda s: s.sessions.get(r.session.id))
        assert session.total_tokens == 15 and session.total_cost == 0.25 and r.price.calls == 1
        assert r.events.updates() == [session]  # after the final event, with the counters
        assert r.events.sent[-1][0] == "chat:session:updated"


async def test_the_overlay_and_the_stored_row_follow_the_events(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        go_on = anyio.Event()

        async def body(reply: ReplyFeed) -> Ending:
            for word in ("one ", "two ", "three"):
                await reply.text(word)
            await go_on.wait()
            return Completed("length")

        lifecycle = ReplyLifecycle(r.job(reply_row), r.services, SETTINGS)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lifecycle.run, Script(body))
            await r.events.until(lambda: len(r.events.events) == 4)
            stored = await r.row(reply_row.id)
            live = lifecycle.overlay(stored)
            assert live.status == "streaming" and live.text_content == "one two three" and live.seq == 4
            with anyio.fail_after(10):  # the persistence tick writes streaming with that content
                while (stored := await r.row(reply_row.id)).status != "streaming" or stored.seq != 4:
                    await anyio.sleep(0.01)
            assert stored.text_content == "one two three"
            go_on.set()
        assert r.events.events[-1].finish_reason == "length"
        assert (await r.row(reply_row.id)).status == "completed"


async def test_a_paused_reply_resumes_with_its_content_usage_and_seq(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()

        async def first(reply: ReplyFeed) -> Ending:
            await reply.text("need approval")
            await reply.tool_use("c1", "guarded", "{}")
            await reply.report_usage(Usage(input_tokens=100, output_tokens=10))
            await reply.approval_required(StreamToolCall(id="c1", name="guarded", arguments="{}"))
            return Paused()

        driver = Script(first)
        job = r.job(reply_row)
        await ReplyLifecycle(job, r.services, SETTINGS).run(driver)
        assert job.outcome == "paused" and driver.hooks == ["final_write:paused"]
        assert r.events.names() == ["StreamStartEvent", "TextDeltaEvent", "ToolApprovalRequiredEvent"]
        assert r.events.updates() == []  # not ended: nothing changed for the session list
        paused = await r.row(reply_row.id)
        assert paused.status == "paused" and paused.seq == 3 and paused.text_content == "need approval"
        assert paused.usage == Usage(input_tokens=100, output_tokens=10)

        message = await r.store.run(lambda s: s.tools.reopen_message(reply_row.id))
        assert message is not None

        async def second(reply: ReplyFeed) -> Ending:
            assert [c.id for c in reply.content.unanswered_calls()] == ["c1"]
            await reply.tool_result("c1", "ok", False)
            base = reply.content.usage
            assert base is not None
            await reply.report_usage(Usage(input_tokens=base.input_tokens + 50, output_tokens=base.output_tokens + 5))
            await reply.text(" - done")
            return Completed("stop")

        resumed = r.job(reply_row, resume=message)
        await ReplyLifecycle(resumed, r.services, SETTINGS).run(Script(second))
        names = r.events.names()
        assert names.count("StreamStartEvent") == 1
        assert_seq(r.events.events)
        assert_one_final_last(names)
        done = await r.row(reply_row.id)
        assert done.status == "completed" and done.text_content == "need approval - done"
        assert done.usage == Usage(input_tokens=150, output_tokens=15) and done.seq == len(r.events.events)


# ---- every ending under cancellation ----------------------------------------------------------


async def test_a_stop_while_driving_ends_aborted_closes_open_work_and_re_raises(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        streaming = anyio.Event()

        async def body(reply: ReplyFeed) -> Ending:
            await reply.text("partial")
            streaming.set()
            await anyio.sleep_forever()
            raise AssertionError("not reached")

        driver = Script(body)
        job = r.job(reply_row)
        cancelled = False
        with anyio.fail_after(10):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        nonlocal cancelled
                        try:
                            await ReplyLifecycle(job, r.services, SETTINGS).run(driver)
                        except anyio.get_cancelled_exc_class():
                            cancelled = True
                            raise

                    tg.start_soon(run)
                    await streaming.wait()
                    job.abort_reason = "aborted by the user"
                    scope.cancel()
        assert cancelled and job.outcome == "aborted" and driver.hooks == ["close:Aborted", "final_write:aborted"]
        assert_one_final_last(r.events.names())
        assert r.events.events[-1].reason == "aborted by the user"
        row = await r.row(reply_row.id)
        assert row.status == "aborted" and row.text_content == "partial"
        assert len(r.events.updates()) == 1


ENDINGS: list[tuple[Ending, str, str | None]] = [
    (Completed("stop"), "completed", "StreamEndEvent"),
    (Failed(SidecarError("the provider failed")), "error", "ErrorEvent"),
    (Aborted("the agent cancelled the turn"), "aborted", "AbortedEvent"),
    (Paused(), "paused", None),
]


@pytest.mark.parametrize("ending, status, final", ENDINGS, ids=[e[1] for e in ENDINGS])
async def test_every_ending_completes_when_a_stop_arrives_during_it(
    tmp_path: Path, ending: Ending, status: str, final: str | None
) -> None:
    """The stop arrives while the ending's row is being written (the worker thread is held):
    the ending is shielded, so the row and the final event still come, exactly once."""
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        entered = threading.Event()
        release = threading.Event()
        repo = r.store.blocking.messages
        name = "pause" if status == "paused" else "finish"
        original = getattr(repo, name)

        def held(*args: Any, **kw: Any) -> Any:
            entered.set()
            if not release.wait(10):
                raise AssertionError("never released")
            return original(*args, **kw)

        setattr(repo, name, held)
        job = r.job(reply_row)
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await ReplyLifecycle(job, r.services, SETTINGS).run(Script(says("text", ending)))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.to_thread.run_sync(entered.wait)
                scope.cancel()  # the stop, while the row is being written: it must wait for it
                release.set()
        assert scope.cancel_called and job.outcome == status
        names = r.events.names()
        if final is None:
            assert not any(n in FINALS for n in names)
        else:
            assert_one_final_last(names)
            assert names[-1] == final
        row = await r.row(reply_row.id)
        assert row.status == status and row.text_content == "text"


# ---- store failures at every step -----------------------------------------------------------


def failing(times: int | None = None) -> Callable[..., Any]:
    """A repository method that raises StoreError (``times`` times, then calls through)."""
    calls = {"n": 0}

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(*args: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if times is None or calls["n"] <= times:
                raise StoreError("database is locked")
            return original(*args, **kw)

        return method

    return wrap


STEPS = [
    # (repository, method, times, ending, expected status, expected final event)
    ("messages", "update_partial", 3, Completed("stop"), "completed", "StreamEndEvent"),
    ("messages", "finish", 1, Completed("stop"), "error", "ErrorEvent"),
    ("messages", "finish", None, Completed("stop"), "open", "ErrorEvent"),
    ("messages", "finish", None, Aborted("x"), "open", "AbortedEvent"),
    ("sessions", "add_usage", None, Completed("stop"), "completed", "StreamEndEvent"),
    ("sessions", "get", None, Completed("stop"), "completed", "StreamEndEvent"),
    ("messages", "pause", None, Paused(), "error", "ErrorEvent"),
    ("settings", "set", None, Completed("stop"), "error", "ErrorEvent"),
    ("settings", "set", None, Failed(SidecarError("boom")), "error", "ErrorEvent"),
]


@pytest.mark.parametrize(
    "repo, method, times, ending, status, final", STEPS,
    ids=[f"{s[0]}.{s[1]}-{s[2]}-{type(s[3]).__name__}" for s in STEPS],
)
async def test_store_failures_at_every_step(
    tmp_path: Path, repo: str, method: str, times: int | None, ending: Ending, status: str, final: str
) -> None:
    """Whatever store call fails, the reply gets exactly one final event, keeps its text when
    a row can be written, and never hangs; a row that cannot be written is left open (pending
    or streaming) for restart recovery. (``settings.set`` is the driver's own final write.)"""
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        counted = method != "get"  # without usage or cost the final hop reads the session back
        if not counted:
            r.price.value = 0.0
        target = getattr(r.store.blocking, repo)
        setattr(target, method, failing(times)(getattr(target, method)))

        async def body(reply: ReplyFeed) -> Ending:
            await reply.text("kept ")
            if method == "update_partial":  # let the persistence ticks fail, then succeed
                with anyio.fail_after(10):
                    while (await r.row(reply_row.id)).status != "streaming":
                        await anyio.sleep(0.01)
            await reply.text("text")
            if counted:
                await reply.report_usage(Usage(input_tokens=1, output_tokens=1))
            return ending

        driver = Script(body, final=lambda s: s.settings.set("driver", "final"))
        job = r.job(reply_row)
        with anyio.fail_after(20):
            await ReplyLifecycle(job, r.services, SETTINGS).run(driver)
        names = r.events.names()
        assert_one_final_last(names)
        assert names[-1] == final
        row = await r.row(reply_row.id)
        if status == "open":
            assert row.status in ("pending", "streaming")
        else:
            assert row.status == status and row.text_content == "kept text"
        if (repo, method) == ("sessions", "add_usage"):
            session = await r.store.run(lambda s: s.sessions.get(r.session.id))
            assert session.total_tokens == 0 and r.events.updates() == [session]  # counters missed, list updated
        if (repo, method) == ("sessions", "get"):
            assert r.events.updates() == []  # the session could not be read: nothing to publish
        if isinstance(ending, Paused):  # fell back to error: the driver's open work was closed
            assert "close:Failed" in driver.hooks


# ---- endings that run out of time -------------------------------------------------------------


async def test_an_ending_that_runs_out_of_time_falls_back_to_error_with_the_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle_module, "FINALIZE_TIMEOUT_S", 0.3)

    async def hang(snapshot: ReplySnapshot) -> ReplySnapshot:
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        driver = Script(says("almost done"), finalize=hang)
        job = r.job(reply_row)
        with anyio.fail_after(10):
            await ReplyLifecycle(job, r.services, SETTINGS).run(driver)
        assert job.outcome == "error" and driver.hooks[:2] == ["finalize", "close:Failed"]
        assert_one_final_last(r.events.names())
        assert r.events.events[-1].error == "internal error while ending the reply"
        row = await r.row(reply_row.id)
        assert row.status == "error" and row.text_content == "almost done"


async def test_a_fallback_that_runs_out_of_time_still_sends_one_final_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle_module, "FINALIZE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(lifecycle_module, "FALLBACK_TIMEOUT_S", 0.3)

    async def hang_snapshot(snapshot: ReplySnapshot) -> ReplySnapshot:
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    async def hang(reply: ReplyFeed) -> None:
        await anyio.sleep_forever()

    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        job = r.job(reply_row)
        with anyio.fail_after(10):
            await ReplyLifecycle(job, r.services, SETTINGS).run(Script(says("stuck"), finalize=hang_snapshot, close=hang))
        assert job.outcome == "error"
        assert_one_final_last(r.events.names())
        assert r.events.names()[-1] == "ErrorEvent"


# ---- failures of the driver itself ------------------------------------------------------------


async def test_a_bug_in_the_driver_ends_the_reply_as_an_internal_error(tmp_path: Path) -> None:
    async def body(reply: ReplyFeed) -> Ending:
        await reply.text("before the bug")
        raise KeyError("oops")

    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        driver = Script(body)
        job = r.job(reply_row)
        await ReplyLifecycle(job, r.services, SETTINGS).run(driver)
        assert driver.hooks == ["close:Failed", "final_write:error"]
        assert r.events.events[-1].error == "internal error while running a script: KeyError"
        assert r.events.events[-1].code is None  # internal: no application code on the wire
        row = await r.row(reply_row.id)
        assert row.status == "error" and row.text_content == "before the bug"
        assert row.error == "internal error while running a script: KeyError"


async def test_a_failure_that_left_nothing_open_skips_the_close_hook_and_keeps_its_code(tmp_path: Path) -> None:
    from protocol.errors import ErrorCode

    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        failure = SidecarError("rate limited", code=ErrorCode.PROVIDER_ERROR)
        driver = Script(says("some", Failed(failure, close_open=False)))
        await ReplyLifecycle(r.job(reply_row), r.services, SETTINGS).run(driver)
        assert driver.hooks == ["final_write:error"]
        last = r.events.events[-1]
        assert type(last).__name__ == "ErrorEvent" and last.code == int(ErrorCode.PROVIDER_ERROR)
        assert (await r.row(reply_row.id)).error == "rate limited"


async def test_no_session_update_when_the_job_does_not_publish(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        reply_row = await r.reply_row()
        job = r.job(reply_row, publish=False)
        await ReplyLifecycle(job, r.services, SETTINGS).run(Script(says("quiet")))
        assert job.outcome == "completed" and r.events.updates() == []
        assert job.ended_session is not None and job.ended_session.id == r.session.id


def test_a_whole_ending_fits_in_the_time_a_stop_waits() -> None:
    from sidecar.engine.chat import STOP_TIMEOUT_S

    ending = (
        lifecycle_module.FINALIZE_TIMEOUT_S + lifecycle_module.FALLBACK_TIMEOUT_S
        + lifecycle_module.LAST_EVENT_TIMEOUT_S + lifecycle_module.PUBLISH_TIMEOUT_S
    )
    assert ending < STOP_TIMEOUT_S
