"""The store gateway's read lane: reads never queue behind writes, see committed state only,
and cannot write.

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
from protocol.types import SessionV2
from sidecar.engine.sessions import SessionService
from sidecar.store import AsyncStore, Store
from sidecar.store.db import ReadLaneWrite

pytestmark = pytest.mark.anyio

BOUND_S = 10


class _Quiet:
    async def __call__(self, method: str, params: Any) -> None:
        return None


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
        sessions = [
            await store.run(lambda s, i=i: s.sessions.create(CreateSessionOptions(title=f"s{i}"))) for i in range(5)
        ]
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
