"""Deleting messages in the store: one message (its children re-parented) or a branch, with
counters, the search index, the active leaf, files journaled, and the rolling summary that
covered a deleted message (SessionService.delete_messages) dropped with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.messages import MessagesDeleteParams, SearchOptions
from protocol.sessions import CreateSessionOptions
from protocol.types import FilePart, MessageV2
from sidecar.engine.sessions import SessionService
from sidecar.errors import NotFound, SidecarError
from sidecar.store import AsyncStore, Store
from test_context_rolling import World, texts
from test_store_support import FakeClock, count, open_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = open_store(tmp_path, FakeClock())
    yield s
    s.close()


class Tree:
    """u1 - a1 - u2 - a2
           \\- a1b - u3 - a3      (a1b: a newer sibling of a1, on the active branch)"""

    def __init__(self, store: Store) -> None:
        self.sid = store.sessions.create(CreateSessionOptions(title="t")).id
        add = store.messages.append
        self.u1 = add(self.sid, role="user", text_content="root question")
        self.a1 = add(self.sid, role="assistant", text_content="first answer alpha")
        self.u2 = add(self.sid, role="user", text_content="follow up")
        self.a2 = add(self.sid, role="assistant", text_content="second answer")
        self.a1b = add(self.sid, role="assistant", text_content="regenerated bravo", parent_id=self.u1.id)
        self.u3 = add(self.sid, role="user", text_content="on the new branch")
        self.a3 = add(self.sid, role="assistant", text_content="third answer charlie")


def parent(store: Store, m: MessageV2) -> str | None:
    return store.messages.get(m.id).parent_id


def found(store: Store, word: str, sid: str) -> list[str]:
    return [r.message_id for r in store.search.messages(word, SearchOptions(session_id=sid))]


def test_delete_message_reparents_its_children_and_keeps_the_active_leaf_below_it(store: Store) -> None:
    t = Tree(store)
    assert found(store, "bravo", t.sid) == [t.a1b.id]
    assert store.messages.delete_message(t.sid, t.a1b.id) == 1
    s = store.sessions.get(t.sid)
    assert s.message_count == 6 and s.active_leaf_id == t.a3.id
    assert parent(store, t.u3) == t.u1.id and parent(store, t.a3) == t.u3.id
    assert [m.id for m in store.messages.query(t.sid)] == [t.u1.id, t.u3.id, t.a3.id]
    assert found(store, "bravo", t.sid) == []
    assert found(store, "charlie", t.sid) == [t.a3.id]


def test_delete_message_of_the_active_leaf_moves_to_the_nearest_sibling_else_the_parent(store: Store) -> None:
    t = Tree(store)
    store.messages.delete_message(t.sid, t.a3.id)  # no sibling: the parent, now a leaf
    assert store.sessions.get(t.sid).active_leaf_id == t.u3.id
    store.messages.delete_message(t.sid, t.u3.id)
    assert store.sessions.get(t.sid).active_leaf_id == t.a1b.id
    store.messages.delete_message(t.sid, t.a1b.id)  # the older sibling a1's newest leaf
    s = store.sessions.get(t.sid)
    assert (s.active_leaf_id, s.message_count) == (t.a2.id, 4)


def test_the_nearest_sibling_is_the_newest_older_one_else_the_oldest_newer_one(store: Store) -> None:
    sid = store.sessions.create(CreateSessionOptions()).id
    u = store.messages.append(sid, role="user", text_content="q")
    r1 = store.messages.append(sid, role="assistant", text_content="1", parent_id=u.id)
    r2 = store.messages.append(sid, role="assistant", text_content="2", parent_id=u.id)
    r3 = store.messages.append(sid, role="assistant", text_content="3", parent_id=u.id)
    store.messages.select_branch(sid, r2.id)
    store.messages.delete_message(sid, r2.id)
    assert store.sessions.get(sid).active_leaf_id == r1.id
    store.messages.delete_branch(r1.id, session_id=sid)
    assert store.sessions.get(sid).active_leaf_id == r3.id


def test_deleting_the_root_question_takes_its_replies_and_makes_the_next_questions_roots(store: Store) -> None:
    t = Tree(store)
    assert store.messages.delete_ids(t.sid, t.u1.id, "message") == [t.u1.id, *sorted([t.a1.id, t.a1b.id])]
    assert store.messages.delete_message(t.sid, t.u1.id) == 3
    assert parent(store, t.u2) is None and parent(store, t.u3) is None
    s = store.sessions.get(t.sid)
    assert (s.message_count, s.active_leaf_id) == (4, t.a3.id)
    assert [n.message.id for n in store.messages.tree(t.sid)] == [t.u2.id, t.u3.id]
    assert [m.id for m in store.messages.query(t.sid)] == [t.u3.id, t.a3.id]
    assert store.messages.delete_ids(t.sid, t.u2.id, "message") == [t.u2.id, t.a2.id]  # a root question now


def test_delete_branch_of_the_root_empties_the_session(store: Store) -> None:
    t = Tree(store)
    assert store.messages.delete_branch(t.u1.id, session_id=t.sid) == 7
    s = store.sessions.get(t.sid)
    assert (s.message_count, s.active_leaf_id, s.last_message_at) == (0, None, None)
    assert count(store, "SELECT count(*) FROM search_docs") == 0


def test_another_sessions_message_is_not_found_and_nothing_changes(store: Store) -> None:
    t = Tree(store)
    other = store.sessions.create(CreateSessionOptions()).id
    for action in (
        lambda: store.messages.delete_message(other, t.a1.id),
        lambda: store.messages.delete_branch(t.a1.id, session_id=other),
        lambda: store.messages.subtree_ids(other, t.a1.id),
        lambda: store.messages.delete_message(t.sid, "missing"),
    ):
        with pytest.raises(NotFound):
            action()
    assert store.sessions.get(t.sid).message_count == 7


def test_a_deleted_messages_file_is_journaled_and_a_surviving_owner_keeps_it(store: Store) -> None:
    root = store.data_dir / "attachments"
    root.mkdir(exist_ok=True)
    (root / "only.bin").write_bytes(b"x")
    (root / "shared.bin").write_bytes(b"y")
    sid = store.sessions.create(CreateSessionOptions()).id
    only, shared = (root / "only.bin").as_uri(), (root / "shared.bin").as_uri()
    keep = store.messages.append(sid, role="user", parts=[FilePart(uri=shared, name="s")])
    gone = store.messages.append(sid, role="user", parts=[FilePart(uri=only, name="o"), FilePart(uri=shared, name="s")])
    store.messages.delete_message(sid, gone.id)
    assert count(store, "SELECT count(*) FROM file_deletions") == 1
    assert count(store, "SELECT count(*) FROM file_deletions WHERE path = 'attachments/only.bin'") == 1
    assert {p for _, p, _ in store.files.of_session(sid)} == {"attachments/shared.bin"}
    assert store.messages.get(keep.id).parts is not None


async def test_a_summary_covering_a_deleted_message_is_dropped_and_others_kept(tmp_path: Path) -> None:
    astore = AsyncStore(Store(tmp_path / "d", clock=FakeClock()))
    try:
        svc = SessionService(astore, _Quiet())
        store = astore.blocking
        t = Tree(store)
        covered = [t.u1.id, t.a1b.id]

        def summarize() -> None:
            store.context.put_summary(t.sid, text="s", covered_ids=covered, tokens=1, model_id=None, now=1)

        summarize()
        # a message after the covered prefix: the summary stays
        r = await svc.delete_messages(MessagesDeleteParams(session_id=t.sid, message_id=t.a3.id, mode="message"))
        assert (r.deleted, r.active_leaf_id) == (1, t.u3.id)
        assert store.context.get_summary(t.sid) is not None
        # another branch (a1's) holds no covered message: kept
        await svc.delete_messages(MessagesDeleteParams(session_id=t.sid, message_id=t.a2.id, mode="branch"))
        assert store.context.get_summary(t.sid) is not None
        # a covered one, mode message (its child moves up: the walk would still meet u1)
        await svc.delete_messages(MessagesDeleteParams(session_id=t.sid, message_id=t.a1b.id, mode="message"))
        assert store.context.get_summary(t.sid) is None
        covered = [t.u1.id, t.u3.id]
        summarize()
        r = await svc.delete_messages(MessagesDeleteParams(session_id=t.sid, message_id=t.u3.id, mode="branch"))
        assert store.context.get_summary(t.sid) is None and r.deleted == 1
    finally:
        astore.blocking.close()


async def test_a_server_session_refuses_and_keeps_its_messages(tmp_path: Path) -> None:
    astore = AsyncStore(Store(tmp_path / "d", clock=FakeClock()))
    try:
        svc = SessionService(astore, _Quiet())
        store = astore.blocking
        sid = store.sessions.create(CreateSessionOptions(mode="server")).id
        m = store.messages.append(sid, role="user", text_content="hi")
        hooks: list[str] = []

        async def hook(session_id: str, reason: str, below: str | None = None) -> None:
            hooks.append(session_id)

        svc.on_delete.append(hook)
        with pytest.raises(SidecarError) as err:
            await svc.delete_messages(MessagesDeleteParams(session_id=sid, message_id=m.id, mode="message"))
        assert err.value.code == -32003 and "server" in err.value.message
        assert hooks == [] and store.sessions.get(sid).message_count == 1
    finally:
        astore.blocking.close()


class _Quiet:
    async def __call__(self, method: str, params: Any) -> None:
        return None


async def test_after_deleting_a_summarized_message_the_next_request_neither_uses_nor_quotes_it(tmp_path: Path) -> None:
    w = World(tmp_path, threshold=1000)
    msgs = w.chain(20)
    await w.build(msgs[-1].id)
    old = w.builder.context._repo.get_summary(w.session.id)
    assert old is not None and old.covered_count > 2
    assert (await w.build(msgs[-1].id))[1].window.summary is not None  # valid, and verified once
    svc = SessionService(AsyncStore(w.store), _Quiet())
    # one covered message, mode message: its child moves up, the walk from the leaf would
    # still meet the last covered id; the summary that quoted it must not be used again
    await svc.delete_messages(MessagesDeleteParams(session_id=w.session.id, message_id=msgs[1].id, mode="message"))
    calls = len(w.model.calls)
    request, info = await w.build(msgs[-1].id)
    used = info.window.summary
    assert used is None or (used.text, used.updated_at) != (old.text, old.updated_at)
    assert "m1 word" not in "\n".join(texts(request))
    if len(w.model.calls) > calls:  # a new summary was written: from what is left only
        assert "m1 word" not in w.model.prompt()
        ids = w.builder.context._repo.summary_ids(w.session.id)
        assert ids is not None and msgs[1].id not in ids
    w.store.close()
