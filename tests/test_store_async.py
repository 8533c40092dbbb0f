"""AsyncStore and SessionService: calls off the event loop, concurrency, delete hooks,
the session-updated notification, and the tree's iterative JSON encoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from protocol.common import IdParams, SuccessResult
from protocol.messages import (
    MessageQueryOptions,
    MessagesGetParams,
    MessagesSearchParams,
    MessagesSelectParams,
    MessagesTreeParams,
)
from protocol.sessions import (
    CreateSessionOptions,
    SessionExportParams,
    SessionFilter,
    SessionForkParams,
    SessionImportParams,
    SessionPinParams,
    SessionUpdateParams,
    SessionUpdates,
)
from protocol.types import MessageTreeNode, MessageV2, SessionV2
from sidecar.engine.sessions import SessionService, encode_tree
from sidecar.errors import NotFound
from sidecar.store import AsyncStore
from sidecar.notify import Notifier


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def __call__(self, method: str, params: Any) -> None:
        self.sent.append((method, params))


@pytest.fixture
async def astore(tmp_path: Path) -> AsyncStore:
    s = await AsyncStore.open(tmp_path)
    yield s
    await s.close()


@pytest.mark.anyio
async def test_concurrent_writers_and_readers_keep_counters_true(astore: AsyncStore) -> None:
    sessions = [await astore.run(lambda db: db.sessions.create(CreateSessionOptions(title=f"s{i}"))) for i in range(4)]
    per_session = 25

    async def writer(s: SessionV2) -> None:
        for i in range(per_session):
            await astore.run(lambda db: db.messages.append(s.id, role="user", text_content=f"消息 {i}"))

    async def reader(s: SessionV2) -> None:
        for _ in range(per_session):
            msgs = await astore.run(lambda db: db.messages.query(s.id))
            # A reader sees a consistent branch: a chain root -> leaf.
            for prev, cur in zip(msgs, msgs[1:]):
                assert cur.parent_id == prev.id
            await astore.run(lambda db: db.search.messages("消息"))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(writer, s)
                tg.start_soon(reader, s)
    for s in sessions:
        got = await astore.run(lambda db: db.sessions.get(s.id))
        assert got.message_count == per_session
        assert len(await astore.run(lambda db: db.messages.query(s.id))) == per_session
    assert len(await astore.run(lambda db: db.search.messages("消息", None))) == 20  # default page


@pytest.mark.anyio
async def test_streaming_through_async_store(astore: AsyncStore) -> None:
    s = await astore.run(lambda db: db.sessions.create(CreateSessionOptions()))
    m = await astore.run(lambda db: db.messages.append(s.id, role="assistant", status="streaming"))
    await astore.run(lambda db: db.messages.update_partial(m.id, text_content="par", parts=None, seq=2))
    assert (await astore.run(lambda db: db.messages.get(m.id))).text_content == "par"
    done = await astore.run(lambda db: db.messages.finish(m.id, status="completed", text_content="full", parts=None))
    assert done.status == "completed"
    assert [x.id for x in await astore.run(lambda db: db.messages.path(s.id))] == [m.id]
    assert await astore.run(lambda db: db.messages.recover_interrupted()) == 0
    await astore.run(lambda db: db.settings.set("k", "v"))
    assert await astore.run(lambda db: db.settings.get("k")) == "v"


@pytest.mark.anyio
async def test_session_service_methods(astore: AsyncStore) -> None:
    notify = Recorder()
    svc = SessionService(astore, Notifier(notify))
    s = await svc.create_session(CreateSessionOptions(title="svc", tags=["a"]))
    assert (await svc.get_session(IdParams(id=s.id))).title == "svc"
    u = await svc.update_session(SessionUpdateParams(id=s.id, updates=SessionUpdates(folder="f")))
    assert u.folder == "f"
    assert await svc.pin_session(SessionPinParams(id=s.id, pinned=True)) == SuccessResult(success=True)
    assert await svc.archive_session(IdParams(id=s.id)) == SuccessResult(success=True)
    listed = await svc.list_sessions(SessionFilter(is_pinned=True, is_archived=True))
    assert [x.id for x in listed.sessions] == [s.id] and listed.total == 1
    u1 = await astore.run(lambda db: db.messages.append(s.id, role="user", text_content="全文搜索 question"))
    a1 = await astore.run(lambda db: db.messages.append(s.id, role="assistant", text_content="answer"))
    a2 = await astore.run(lambda db: db.messages.append(s.id, role="assistant", text_content="other", parent_id=u1.id))
    got = await svc.get_messages(MessagesGetParams(session_id=s.id, options=MessageQueryOptions(leaf_id=a1.id)))
    assert [m.id for m in got] == [u1.id, a1.id]
    selected = await svc.select_branch(MessagesSelectParams(session_id=s.id, leaf_id=a1.id))
    assert [m.id for m in selected] == [u1.id, a1.id]
    tree = await svc.get_tree(MessagesTreeParams(session_id=s.id))
    assert isinstance(tree, msgspec.Raw)
    decoded = msgspec.json.decode(tree, type=list[MessageTreeNode])
    assert decoded == await astore.run(lambda db: db.messages.tree(s.id))
    assert [c.message.id for c in decoded[0].children] == [a1.id, a2.id]
    hits = await svc.search_messages(MessagesSearchParams(query="搜索"))
    assert [h.message_id for h in hits] == [u1.id]
    forked = await svc.fork_session(SessionForkParams(id=s.id, message_id=a1.id))
    exported = await svc.export_session(SessionExportParams(id=forked.id))
    assert len(exported.messages) == 2
    await svc.delete_session(IdParams(id=forked.id))
    again = await svc.import_session(
        SessionImportParams(session=exported.session, messages=exported.messages)
    )
    assert again == exported.session
    published = await svc.publish(s.id)
    assert notify.sent == [("chat:session:updated", published)]


@pytest.mark.anyio
async def test_delete_hooks_run_before_the_delete(astore: AsyncStore) -> None:
    svc = SessionService(astore, Recorder())
    s = await svc.create_session(CreateSessionOptions())
    seen: list[tuple[str, bool]] = []

    async def hook(session_id: str, reason: str) -> None:
        # The session still exists while the hook runs (e.g. to stop its generation).
        await astore.run(lambda db: db.sessions.get(session_id))
        seen.append((session_id, True))

    svc.on_delete.append(hook)
    assert await svc.delete_session(IdParams(id=s.id)) == SuccessResult(success=True)
    assert seen == [(s.id, True)]
    with pytest.raises(NotFound):
        await svc.get_session(IdParams(id=s.id))
    # Unknown id: NotFound, and no hook runs.
    with pytest.raises(NotFound):
        await svc.delete_session(IdParams(id="missing"))
    assert len(seen) == 1


def _mk(i: int) -> MessageV2:
    return MessageV2(id=f"m{i}", session_id="s", role="user", text_content="<&>\"é中", created_at=i, updated_at=i)


def test_encode_tree_matches_msgspec_and_handles_any_depth() -> None:
    shallow = [
        MessageTreeNode(
            message=_mk(1),
            is_active=True,
            children=[
                MessageTreeNode(message=_mk(2)),
                MessageTreeNode(message=_mk(3), is_active=True, children=[MessageTreeNode(message=_mk(4))]),
            ],
        ),
        MessageTreeNode(message=_mk(5)),
    ]
    assert encode_tree(shallow) == msgspec.json.encode(shallow)
    assert encode_tree([]) == b"[]"
    node: MessageTreeNode | None = None
    depth = 5000  # far beyond msgspec's recursive limit (~450 levels)
    for i in range(depth):
        node = MessageTreeNode(message=_mk(i), children=[node] if node else [])
    assert node is not None
    with pytest.raises(RecursionError):
        msgspec.json.encode([node])
    data = encode_tree([node])
    assert data.count(b'"message":') == depth and data.startswith(b'[{"message":')
    assert data.endswith(b'"isActive":false}]')
