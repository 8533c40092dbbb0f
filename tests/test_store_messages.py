"""Messages: the tree, branch switching, chat:messages:get options, streaming writes, fork,
export -> import, and bad references (another session's message)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from protocol.errors import ErrorCode
from protocol.messages import MessageQueryOptions
from protocol.sessions import CreateSessionOptions
from protocol.types import (
    ImagePart,
    MessageTreeNode,
    MessageV2,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolUsePart,
    Usage,
)
from sidecar.errors import InvalidParams, NotFound, StoreError
from sidecar.store import Store
from test_store_support import FakeClock, count, db_digest, open_store


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Store:
    s = open_store(tmp_path, clock)
    yield s
    s.close()


class Conv:
    """A session with branches:

        u1 - a1 - u2 - a2
           \\- a1b - u3        (a1b: a regenerated sibling of a1, newer)
    """

    def __init__(self, store: Store) -> None:
        self.sid = store.sessions.create(CreateSessionOptions(title="conv", tags=["k"])).id
        add = store.messages.append
        self.u1 = add(self.sid, role="user", text_content="你好 hello")
        self.a1 = add(self.sid, role="assistant", text_content="first answer",
                      parts=[ThinkingPart(text="hmm"), TextPart(text="first answer")],
                      usage=Usage(input_tokens=3, output_tokens=4), model_id="m1")
        self.u2 = add(self.sid, role="user", text_content="follow up")
        self.a2 = add(self.sid, role="assistant", text_content="second answer",
                      tool_calls=[ToolCall(id="c1", name="search", arguments='{"q":1}')],
                      parts=[ToolUsePart(id="c1", name="search", input={"q": 1}),
                             ImagePart(mime_type="image/png", url="file:///x.png")])
        self.a1b = add(self.sid, role="assistant", text_content="regenerated answer",
                       parent_id=self.u1.id)
        self.u3 = add(self.sid, role="user", text_content="on the new branch")

    def ids(self, messages: list[MessageV2]) -> list[str]:
        return [m.id for m in messages]


def test_active_branch_follows_appends(store: Store) -> None:
    c = Conv(store)
    assert c.ids(store.messages.query(c.sid)) == [c.u1.id, c.a1b.id, c.u3.id]
    assert c.ids(store.messages.path(c.sid)) == [c.u1.id, c.a1b.id, c.u3.id]
    assert c.ids(store.messages.path(c.sid, c.a2.id)) == [c.u1.id, c.a1.id, c.u2.id, c.a2.id]
    s = store.sessions.get(c.sid)
    assert s.active_leaf_id == c.u3.id and s.message_count == 6
    # make_active=False keeps the branch; parent_id=None starts a new root.
    side = store.messages.append(c.sid, role="assistant", text_content="side", parent_id=c.u2.id,
                                make_active=False)
    assert store.sessions.get(c.sid).active_leaf_id == c.u3.id
    root2 = store.messages.append(c.sid, role="system", text_content="new root", parent_id=None)
    assert root2.parent_id is None and store.messages.path(c.sid) == [root2]
    assert side.parent_id == c.u2.id


def test_parts_and_json_columns_round_trip(store: Store) -> None:
    c = Conv(store)
    a1 = store.messages.get(c.a1.id)
    assert a1 == c.a1 and a1.content_type == "multipart"
    assert a1.parts == [ThinkingPart(text="hmm"), TextPart(text="first answer")]
    assert a1.usage == Usage(input_tokens=3, output_tokens=4)
    a2 = store.messages.get(c.a2.id)
    assert a2.tool_calls == [ToolCall(id="c1", name="search", arguments='{"q":1}')]
    assert a2.parts == c.a2.parts
    assert store.messages.get(c.u1.id).content_type == "text"


def test_tree_siblings_in_creation_order_and_active_path_marked(store: Store) -> None:
    c = Conv(store)
    roots = store.messages.tree(c.sid)
    assert [n.message.id for n in roots] == [c.u1.id]
    u1 = roots[0]
    assert [n.message.id for n in u1.children] == [c.a1.id, c.a1b.id]
    a1, a1b = u1.children
    assert [n.message.id for n in a1.children] == [c.u2.id]
    assert [n.message.id for n in a1.children[0].children] == [c.a2.id]
    assert [n.message.id for n in a1b.children] == [c.u3.id]

    def active(nodes: list[MessageTreeNode]) -> set[str]:
        out: set[str] = set()
        for n in nodes:
            if n.is_active:
                out.add(n.message.id)
            out |= active(n.children)
        return out

    assert active(roots) == {c.u1.id, c.a1b.id, c.u3.id}
    store.messages.select_branch(c.sid, c.a2.id)
    assert active(store.messages.tree(c.sid)) == {c.u1.id, c.a1.id, c.u2.id, c.a2.id}
    empty = store.sessions.create(CreateSessionOptions()).id
    assert store.messages.tree(empty) == [] and store.messages.query(empty) == []


def test_select_branch(store: Store) -> None:
    c = Conv(store)
    path = store.messages.select_branch(c.sid, c.a2.id)
    assert c.ids(path) == [c.u1.id, c.a1.id, c.u2.id, c.a2.id]
    assert c.ids(store.messages.query(c.sid)) == c.ids(path)
    assert store.sessions.get(c.sid).active_leaf_id == c.a2.id
    # A non-leaf selects the newest leaf below it.
    assert c.ids(store.messages.select_branch(c.sid, c.a1b.id)) == [c.u1.id, c.a1b.id, c.u3.id]
    assert c.ids(store.messages.select_branch(c.sid, c.a1.id))[-1] == c.a2.id
    newer = store.messages.append(c.sid, role="assistant", text_content="x", parent_id=c.u2.id,
                                 make_active=False)
    assert c.ids(store.messages.select_branch(c.sid, c.u1.id))[-1] == newer.id
    # Appending after a switch continues the selected branch.
    store.messages.select_branch(c.sid, c.u3.id)
    nxt = store.messages.append(c.sid, role="assistant", text_content="continues")
    assert nxt.parent_id == c.u3.id


def test_get_messages_options(store: Store) -> None:
    c = Conv(store)
    get = lambda **kw: c.ids(store.messages.query(c.sid, MessageQueryOptions(**kw)))  # noqa: E731
    assert get(leaf_id=c.a2.id) == [c.u1.id, c.a1.id, c.u2.id, c.a2.id]
    assert get(leaf_id=c.u2.id) == [c.u1.id, c.a1.id, c.u2.id]
    assert get(leaf_id=c.a2.id, limit=2) == [c.u2.id, c.a2.id]
    assert get(leaf_id=c.a2.id, before=c.u2.id) == [c.u1.id, c.a1.id]
    assert get(leaf_id=c.a2.id, before=c.u2.id, limit=1) == [c.a1.id]
    assert get(limit=1) == [c.u3.id]
    assert get(limit=10_000) == [c.u1.id, c.a1b.id, c.u3.id]
    every = [c.u1.id, c.a1.id, c.u2.id, c.a2.id, c.a1b.id, c.u3.id]
    assert get(all_branches=True) == every
    assert get(all_branches=True, limit=2) == every[-2:]
    assert get(all_branches=True, before=c.a1b.id) == every[:4]


def test_get_messages_bad_options(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        c = Conv(store)
        other = Conv(store)
        before = db_digest(store)
        for opts, exc, field in (
            (MessageQueryOptions(limit=0), InvalidParams, "options.limit"),
            (MessageQueryOptions(limit=10_001), InvalidParams, "options.limit"),
            (MessageQueryOptions(before=c.a2.id), InvalidParams, "options.before"),  # not on path
            (MessageQueryOptions(leaf_id=other.a1.id), NotFound, "not in session"),
            (MessageQueryOptions(before=other.a1.id), NotFound, "not in session"),
            (MessageQueryOptions(leaf_id="nope"), NotFound, "nope"),
        ):
            with pytest.raises(exc, match=field):
                store.messages.query(c.sid, opts)
        assert db_digest(store) == before
    finally:
        store.close()


def test_message_from_another_session_is_refused_everywhere(store: Store) -> None:
    c = Conv(store)
    other = Conv(store)
    before = db_digest(store)
    for call in (
        lambda: store.sessions.fork(c.sid, other.a1.id),
        lambda: store.messages.select_branch(c.sid, other.a1.id),
        lambda: store.messages.path(c.sid, other.a1.id),
        lambda: store.messages.append(c.sid, role="user", text_content="x", parent_id=other.u1.id),
    ):
        with pytest.raises(NotFound, match="is not in session"):
            call()
    assert db_digest(store) == before


def test_bad_append_arguments_change_nothing(store: Store) -> None:
    c = Conv(store)
    before = db_digest(store)
    for kw, field in (
        ({"role": "bot"}, "role"),
        ({"role": "user", "status": "done"}, "status"),
        ({"role": "user", "content_type": "html"}, "contentType"),
        ({"role": "user", "parts": "text"}, "parts"),
        ({"role": "user", "text_content": 5}, "textContent"),
    ):
        with pytest.raises(InvalidParams, match=field):
            store.messages.append(c.sid, **kw)  # type: ignore[arg-type]
    assert db_digest(store) == before


def test_streaming_writes(store: Store, clock: FakeClock) -> None:
    c = Conv(store)
    m = store.messages.append(c.sid, role="assistant", status="streaming", text_content="",
                             model_id="m", seq=1)
    assert store.sessions.get(c.sid).message_count == 7
    store.messages.update_partial(m.id, text_content="部分", parts=[TextPart(text="部分")], seq=5)
    got = store.messages.query(c.sid)[-1]
    assert (got.id, got.status, got.text_content, got.seq) == (m.id, "streaming", "部分", 5)
    assert got.parts == [TextPart(text="部分")]
    done = store.messages.finish(
        m.id, status="completed", text_content="完整回答", parts=None,
        usage=Usage(input_tokens=1, output_tokens=2), latency_ms=42, seq=9,
    )
    assert (done.status, done.text_content, done.usage, done.latency_ms, done.seq, done.model_id) == (
        "completed", "完整回答", Usage(input_tokens=1, output_tokens=2), 42, 9, "m")
    assert store.messages.get(m.id) == done
    # A finished message cannot be updated or finished again.
    before = db_digest(store)
    with pytest.raises(StoreError) as err:
        store.messages.update_partial(m.id, text_content="late", parts=None)
    assert err.value.code == ErrorCode.BAD_STATE
    with pytest.raises(StoreError):
        store.messages.finish(m.id, status="completed", text_content="again", parts=None)
    with pytest.raises(InvalidParams, match="status"):
        store.messages.finish(m.id, status="streaming", text_content="x", parts=None)
    with pytest.raises(InvalidParams, match="status"):
        store.messages.update_partial(m.id, text_content="x", parts=None, status="completed")
    assert db_digest(store) == before
    # error/aborted keep their partial content.
    e = store.messages.append(c.sid, role="assistant", status="pending")
    e_done = store.messages.finish(e.id, status="error", text_content="半截", parts=None, error="boom")
    assert (e_done.status, e_done.error, e_done.text_content) == ("error", "boom", "半截")


def test_fork_copies_the_path(store: Store) -> None:
    c = Conv(store)
    original = store.sessions.export(c.sid)
    forked = store.sessions.fork(c.sid, c.a2.id)
    assert forked.id != c.sid and forked.title == "conv (fork)" and forked.tags == ["k"]
    copies = store.messages.query(forked.id)
    assert len(copies) == 4 and forked.message_count == 4
    assert forked.active_leaf_id == copies[-1].id
    assert forked.last_message_at == c.a2.created_at
    src = [c.u1, c.a1, c.u2, c.a2]
    assert not ({m.id for m in copies} & {m.id for m in original.messages})
    assert copies[0].parent_id is None
    for i in range(1, 4):
        assert copies[i].parent_id == copies[i - 1].id
    for copy, orig in zip(copies, src, strict=True):
        assert copy.session_id == forked.id
        strip = dict(id="", session_id="", parent_id=None)
        assert msgspec.structs.replace(copy, **strip) == msgspec.structs.replace(orig, **strip)
    # The original is untouched, and the copies are searchable in their own session.
    assert store.sessions.export(c.sid) == original
    hits = {r.session_id for r in store.search.messages("second answer")}
    assert hits == {c.sid, forked.id}
    # Fork of a message in the middle copies only root -> it.
    mid = store.sessions.fork(c.sid, c.a1b.id)
    assert [m.text_content for m in store.messages.query(mid.id)] == ["你好 hello", "regenerated answer"]


def test_fork_of_a_streaming_message_is_aborted_copy(store: Store) -> None:
    c = Conv(store)
    m = store.messages.append(c.sid, role="assistant", status="streaming", text_content="half")
    forked = store.sessions.fork(c.sid, m.id)
    last = store.messages.query(forked.id)[-1]
    assert (last.status, last.text_content) == ("aborted", "half")
    assert store.messages.get(m.id).status == "streaming"


def test_export_import_reproduces_the_session(tmp_path: Path, store: Store) -> None:
    c = Conv(store)
    store.messages.select_branch(c.sid, c.a2.id)
    store.sessions.add_usage(c.sid, Usage(input_tokens=6, output_tokens=4), 0.01)
    exported = store.sessions.export(c.sid)
    assert len(exported.messages) == 6 and exported.format == "chat-sidecar.session"
    wire = msgspec.json.encode(exported)

    # Into a fresh database: identical export, identical tree and search.
    other = open_store(tmp_path / "other")
    try:
        doc = msgspec.json.decode(wire, type=type(exported))
        imported = other.sessions.import_(doc.session, doc.messages)
        assert imported == exported.session
        assert other.sessions.export(c.sid) == exported
        assert other.messages.tree(c.sid) == store.messages.tree(c.sid)
        assert [r.message_id for r in other.search.messages("regenerated")] == [c.a1b.id]
        # Again without replace: refused, nothing changed.
        before = db_digest(other)
        with pytest.raises(StoreError) as err:
            other.sessions.import_(doc.session, doc.messages)
        assert err.value.code == ErrorCode.BAD_STATE
        assert db_digest(other) == before
        # With replace: same result.
        assert other.sessions.import_(doc.session, doc.messages, replace=True) == exported.session
        assert other.sessions.export(c.sid) == exported
        assert count(other, "SELECT count(*) FROM search_docs") == 6
    finally:
        other.close()

    # Same database: delete then import.
    store.sessions.delete(c.sid)
    store.sessions.import_(exported.session, exported.messages)
    assert store.sessions.export(c.sid) == exported


def test_import_validation(store: Store) -> None:
    c = Conv(store)
    doc = store.sessions.export(c.sid)
    replace = msgspec.structs.replace
    store.sessions.delete(c.sid)
    before = db_digest(store)
    msgs = doc.messages
    cases = [
        (replace(doc.session, id=""), msgs, "session.id"),
        (doc.session, [*msgs, msgs[0]], "appears twice"),
        (doc.session, [replace(msgs[0], session_id="x"), *msgs[1:]], "sessionId"),
        (doc.session, [*msgs[:-1], replace(msgs[-1], parent_id="ghost")], "parentId"),
        (doc.session, [replace(msgs[0], parent_id=msgs[1].id), *msgs[1:]], "cycle"),
        (doc.session, [replace(msgs[0], role="bot"), *msgs[1:]], "role"),
        (replace(doc.session, active_leaf_id="ghost"), msgs, "activeLeafId"),
        (replace(doc.session, tags=["a", 1]), msgs, "tags"),
    ]
    for session, messages, field in cases:
        with pytest.raises(InvalidParams, match=field):
            store.sessions.import_(session, messages)
    assert db_digest(store) == before
    # A message id used by another session is refused.
    keep = Conv(store)
    clash = replace(doc.session, id="new-session", active_leaf_id=None)
    with pytest.raises(StoreError, match="already exists"):
        store.sessions.import_(clash, [replace(keep.u1, session_id="new-session")])
    # Counters are recomputed from the messages; in-flight rows arrive aborted.
    lying = replace(doc.session, message_count=99, last_message_at=1)
    streaming = [*msgs[:-1], replace(msgs[-1], status="streaming")]
    s = store.sessions.import_(lying, streaming)
    assert s.message_count == 6 and s.last_message_at == max(m.created_at for m in msgs)
    assert store.messages.get(msgs[-1].id).status == "aborted"


def test_delete_branch_moves_active_leaf(store: Store) -> None:
    c = Conv(store)
    assert store.messages.delete_branch(c.a1b.id) == 2
    s = store.sessions.get(c.sid)
    assert s.active_leaf_id == c.a2.id and s.message_count == 4
    assert store.messages.delete_branch(c.u1.id) == 4
    s = store.sessions.get(c.sid)
    assert (s.active_leaf_id, s.message_count, s.last_message_at) == (None, 0, None)
    assert store.messages.query(c.sid) == []


def test_content_type_is_multipart_whenever_streamed_parts_are_stored(store: Store) -> None:
    c = Conv(store)
    m = store.messages.append(c.sid, role="assistant", status="pending")
    assert store.messages.get(m.id).content_type == "text"
    store.messages.update_partial(m.id, text_content="部分", parts=None)
    assert store.messages.get(m.id).content_type == "text"  # no parts, nothing changes
    store.messages.update_partial(m.id, text_content="hi", parts=[ThinkingPart(text="hmm"), TextPart(text="hi")])
    got = store.messages.get(m.id)
    assert (got.content_type, got.parts) == ("multipart", [ThinkingPart(text="hmm"), TextPart(text="hi")])
    # An empty parts list is stored as no parts, as finish_message does.
    e = store.messages.append(c.sid, role="assistant", status="streaming")
    store.messages.update_partial(e.id, text_content="x", parts=[])
    assert (store.messages.get(e.id).content_type, store.messages.get(e.id).parts) == ("text", None)
