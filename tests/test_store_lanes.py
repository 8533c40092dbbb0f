"""The store gateway's lanes: reads never queue behind writes, see committed state only,
and cannot write; persistence writes are batched, fail alone, and are committed when they
return even if their caller was stopped, so a reply's final row and event come after them.

The run lane is filled with writes that hold the write lock (a transaction blocked on an
event, and more writes queued behind it, as 50 streaming replies persisting at once do);
the renderer's reads through SessionService must still be answered, from what was
committed before they began."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from protocol.messages import MessagesGetParams, MessagesSearchParams
from protocol.sessions import CreateSessionOptions, SessionFilter, SessionUpdates
from protocol.common import IdParams
from protocol.settings import ChatSettings
from protocol.types import MessageV2, SessionV2
from sidecar.engine.lifecycle import Completed, Ending, ReplyDriver, ReplyFeed, ReplyJob, ReplyLifecycle, ReplyServices
from sidecar.engine.sessions import SessionService
from sidecar.errors import StoreError
from sidecar.store import AsyncStore, Store
from sidecar.store.db import ReadLaneWrite

pytestmark = pytest.mark.anyio

BOUND_S = 10


class _Quiet:
    async def __call__(self, method: str, params: Any) -> None:
        return None


async def named_sessions(store: AsyncStore, count: int) -> list[SessionV2]:
    """Sessions titled s0, s1, ..."""

    def create(s: Store) -> list[SessionV2]:
        return [s.sessions.create(CreateSessionOptions(title=f"s{i}")) for i in range(count)]

    return await store.run(create)


@asynccontextmanager
async def blocked_writes(store: AsyncStore, session_id: str, queued: int) -> AsyncIterator[threading.Event]:
    """One write transaction open and waiting (it renamed the session, not yet committed),
    and ``queued`` more writes waiting for the write lock behind it: every run-lane slot is
    taken by a write. Set the event to let them commit."""
    release = threading.Event()
    holding = threading.Event()

    def hold(s: Store) -> None:
        with s.transaction():
            s.sessions.update(session_id, SessionUpdates(title="uncommitted"))
            holding.set()
            assert release.wait(BOUND_S), "the test never released the write"

    def later(s: Store) -> None:
        s.sessions.update(session_id, SessionUpdates(title="committed later"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.run, hold)
        with anyio.fail_after(BOUND_S):
            while not holding.is_set():
                await anyio.sleep(0.005)  # a thread's flag: nothing on the loop to wait on
        for _ in range(queued):
            tg.start_soon(store.run, later)
        try:
            yield release
        finally:
            release.set()


async def test_reads_are_answered_from_committed_state_while_writes_fill_the_run_lane(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:
        session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(title="before")))
        await store.run(lambda s: s.messages.append(session.id, role="user", text_content="a searchable zebra"))
        service = SessionService(store, _Quiet())
        async with blocked_writes(store, session.id, queued=8) as release:
            with anyio.fail_after(BOUND_S):  # on one shared lane these wait for the writes
                listed = await service.list_sessions(SessionFilter(limit=50))
                got = await service.get_session(IdParams(id=session.id))
                found = await service.search_messages(MessagesSearchParams(query="zebra"))
                messages = await service.get_messages(MessagesGetParams(session_id=session.id))
            assert [s.title for s in listed.sessions] == ["before"]  # not the open transaction's
            assert got.title == "before"
            assert [r.session_id for r in found] == [session.id]
            assert [m.text_content for m in messages] == ["a searchable zebra"]
            release.set()
        # every write has committed (the task group waited): a read now sees the last one
        after = await service.get_session(IdParams(id=session.id))
        assert after.title == "committed later"
    finally:
        await store.close()


async def test_a_write_in_the_read_lane_is_refused_before_it_waits_for_the_writer(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:
        session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(title="kept")))

        def rename(s: Store) -> SessionV2:
            return s.sessions.update(session.id, SessionUpdates(title="renamed"))

        def empty_transaction(s: Store) -> None:
            with s.transaction():
                pass

        async with blocked_writes(store, session.id, queued=0):
            with anyio.fail_after(BOUND_S):  # refused at once, not after the held write
                with pytest.raises(ReadLaneWrite):
                    await store.read(rename)
                with pytest.raises(ReadLaneWrite):
                    await store.read(empty_transaction)
        # the refused rename changed nothing (the held write committed its own title after
        # it); the lane still reads after a refusal
        assert (await store.read(lambda s: s.sessions.get(session.id))).title == "uncommitted"
    finally:
        await store.close()


async def test_many_reads_at_once_through_the_lane_all_answer(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:
        sessions = await named_sessions(store, 5)
        titles: list[str] = []

        async def one(session_id: str) -> None:
            titles.append((await store.read(lambda s: s.sessions.get(session_id))).title or "")

        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    for session in sessions:
                        tg.start_soon(one, session.id)
        assert sorted(titles) == sorted([f"s{i}" for i in range(5)] * 6)
    finally:
        await store.close()


# ---- persist: the batched writes of streaming replies --------------------------------------


async def test_persist_writes_batch_and_one_that_fails_fails_alone(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:
        sessions = await named_sessions(store, 6)
        seen: dict[str, str | None] = {}
        failures: list[str] = []

        def rename(session_id: str, fail: bool) -> Any:
            def write(s: Store) -> None:
                s.sessions.update(session_id, SessionUpdates(title="renamed"))
                if fail:  # after its own write: the savepoint must take it back
                    raise StoreError("database error: this one fails")

            return write

        async def one(session_id: str, fail: bool) -> None:
            try:
                await store.persist(rename(session_id, fail))
            except StoreError as exc:
                failures.append(exc.message)
            # returned: committed, so a read from now on sees it
            seen[session_id] = (await store.read(lambda s: s.sessions.get(session_id))).title

        async with blocked_writes(store, sessions[0].id, queued=0) as release:
            async with anyio.create_task_group() as tg:
                for i, session in enumerate(sessions[1:]):
                    tg.start_soon(one, session.id, i == 2)
                await anyio.sleep(0.05)  # let them all join the waiting batch
                assert seen == {}  # nothing returns before its write could commit
                release.set()
        failed = sessions[3].id
        assert failures == ["database error: this one fails"]
        assert seen == {s.id: ("s3" if s.id == failed else "renamed") for s in sessions[1:]}
    finally:
        await store.close()


async def test_a_failure_that_ends_the_whole_transaction_fails_every_write_of_the_batch(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:
        sessions = await named_sessions(store, 4)

        def lose_everything(s: Store) -> None:
            s.sessions.update(sessions[2].id, SessionUpdates(title="renamed"))
            s._db.writer.execute("ROLLBACK")  # noqa: SLF001  (what SQLite does on a full disk)
            raise StoreError("database error: disk full")

        errors: dict[int, str] = {}

        async def one(i: int) -> None:
            fn = lose_everything if i == 2 else (
                lambda s: s.sessions.update(sessions[i].id, SessionUpdates(title="renamed"))
            )
            try:
                await store.persist(fn)
            except StoreError as exc:
                errors[i] = type(exc).__name__

        async with blocked_writes(store, sessions[0].id, queued=0) as release:
            async with anyio.create_task_group() as tg:
                for i in (1, 2, 3):
                    tg.start_soon(one, i)
                await anyio.sleep(0.05)  # let them all join the waiting batch
                release.set()
        # 1 found no batch being written and went alone; 2 and 3 waited for it, together
        assert errors == {2: "TransactionLost", 3: "TransactionLost"}
        titles = [(await store.read(lambda s, x=x: s.sessions.get(x.id))).title for x in sessions[1:]]
        assert titles == ["renamed", "s2", "s3"]  # nothing of the lost batch stands, and it says so
        await store.persist(lambda s: s.sessions.update(sessions[1].id, SessionUpdates(title="later")))
        assert (await store.read(lambda s: s.sessions.get(sessions[1].id))).title == "later"
    finally:
        await store.close()


async def test_a_stopped_persist_has_committed_when_it_returns(tmp_path: Path) -> None:
    store = await AsyncStore.open(tmp_path)
    try:
        session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(title="before")))
        other = await store.run(lambda s: s.sessions.create(CreateSessionOptions(title="other")))
        returned = anyio.Event()

        async def stopped() -> None:
            with anyio.CancelScope() as scope:
                scope.cancel()  # stopped before its write could even start
                await store.persist(lambda s: s.sessions.update(session.id, SessionUpdates(title="written")))
            returned.set()

        async with blocked_writes(store, other.id, queued=0) as release:
            async with anyio.create_task_group() as tg:
                tg.start_soon(stopped)
                await anyio.sleep(0.05)
                assert not returned.is_set()  # it waits for its write, stopped or not
                release.set()
        assert (await store.read(lambda s: s.sessions.get(session.id))).title == "written"
    finally:
        await store.close()


class _SpyStore(AsyncStore):
    """Says when a persistence write is submitted."""

    submitted: anyio.Event

    async def persist(self, fn: Any) -> None:
        self.submitted.set()
        await super().persist(fn)


async def test_the_final_row_is_written_after_a_pending_partial_and_before_the_end_event(tmp_path: Path) -> None:
    base = await AsyncStore.open(tmp_path)
    store = _SpyStore(base.blocking)
    store.submitted = anyio.Event()
    try:
        session = await store.run(lambda s: s.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        blocker = await store.run(lambda s: s.sessions.create(CreateSessionOptions(title="blocker")))

        def rows(s: Store) -> MessageV2:
            with s.transaction():
                user = s.messages.append(session.id, role="user", text_content="hi")
                return s.messages.append(session.id, role="assistant", parent_id=user.id, status="pending")

        reply = await store.run(rows)
        at_end: list[MessageV2] = []
        sent: list[str] = []

        async def notify(method: str, params: Any) -> None:
            if method == "chat:stream":
                sent.append(type(params).__name__)
                if type(params).__name__ == "StreamEndEvent":  # the row as stored when it goes out
                    at_end.append(await store.read(lambda s: s.messages.get(reply.id)))

        pending = anyio.Event()
        go_on = anyio.Event()

        class Driver(ReplyDriver):
            doing = "testing"

            async def drive(self, feed: ReplyFeed) -> Ending:
                await feed.text("first ")
                await pending.wait()  # a partial write is waiting behind the held write lock
                await feed.text("last")
                go_on.set()
                return Completed("stop")

        job = ReplyJob(session=session, message_id=reply.id, parent_id=reply.parent_id or "", provider_id="p", model_id="m")
        services = ReplyServices(store=store, notify=notify, pricing=_NoPrice())
        settings = ChatSettings(delta_coalesce_ms=0, persist_interval_ms=20)
        async with blocked_writes(store, blocker.id, queued=0) as release:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ReplyLifecycle(job, services, settings).run, Driver())
                with anyio.fail_after(BOUND_S):
                    await store.submitted.wait()
                pending.set()
                with anyio.fail_after(BOUND_S):
                    await go_on.wait()
                await anyio.sleep(0.05)
                assert "StreamEndEvent" not in sent  # the ending waits for the pending write
                release.set()
        assert sent[-1] == "StreamEndEvent"
        assert [(m.status, m.text_content) for m in at_end] == [("completed", "first last")]
        stored = await store.read(lambda s: s.messages.get(reply.id))
        assert (stored.status, stored.text_content) == ("completed", "first last")
    finally:
        await base.close()


class _NoPrice:
    async def cost(self, provider_id: str, model_id: str, usage: Any) -> float:
        return 0.0
