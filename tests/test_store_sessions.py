"""Sessions: create defaults, get/update/pin/archive/delete, every SessionFilter field, counters,
delete cascade, bad input (clear error, database unchanged)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from protocol.errors import ErrorCode
from protocol.sessions import CreateSessionOptions, SessionFilter, SessionUpdates
from protocol.types import DateRange, Usage, UsageTotals
from sidecar.errors import InvalidParams, NotFound
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


def _create(store: Store, **kw: object) -> str:
    return store.sessions.create(CreateSessionOptions(**kw)).id  # type: ignore[arg-type]


def test_create_uses_defaults_from_settings(store: Store) -> None:
    bare = store.sessions.create(CreateSessionOptions())
    assert (bare.title, bare.provider_id, bare.model_id, bare.mode) == ("New Chat", "", "", "direct")
    assert bare.tags == [] and bare.message_count == 0 and bare.active_leaf_id is None
    assert bare.created_at == bare.updated_at and bare.last_message_at is None
    store.settings.set("default_provider_id", "openai")
    store.settings.set("default_model_id", "gpt-4o")
    s = store.sessions.create(CreateSessionOptions(title="T", tags=["x", "y", "x"], folder="f"))
    assert (s.provider_id, s.model_id, s.tags, s.folder) == ("openai", "gpt-4o", ["x", "y"], "f")
    explicit = store.sessions.create(CreateSessionOptions(provider_id="p", model_id="m", mode="acp"))
    assert (explicit.provider_id, explicit.model_id, explicit.mode) == ("p", "m", "acp")
    assert store.sessions.get(s.id) == s
    store.settings.set("default_model_id", None)
    assert store.settings.get("default_model_id") is None
    assert store.sessions.create(CreateSessionOptions()).model_id == ""


def test_ids_are_time_ordered(store: Store) -> None:
    ids = [_create(store) for _ in range(50)]
    assert ids == sorted(ids) and len(set(ids)) == 50
    assert all(len(i) == 36 and i[14] == "7" for i in ids)


def test_update_only_given_fields_and_clearing(store: Store, clock: FakeClock) -> None:
    sid = _create(store, title="old", folder="f", system_prompt="p", tags=["a"])
    before = store.sessions.get(sid)
    s = store.sessions.update(sid, SessionUpdates(title="new", tags=["b", "c"]))
    assert (s.title, s.tags, s.folder, s.system_prompt) == ("new", ["b", "c"], "f", "p")
    assert s.updated_at > before.updated_at and s.created_at == before.created_at
    s = store.sessions.update(sid, SessionUpdates(folder="", system_prompt="", summary="sum"))
    assert (s.folder, s.system_prompt, s.summary) == (None, None, "sum")
    s = store.sessions.update(
        sid,
        SessionUpdates(
            is_pinned=True, is_archived=True, provider_id="p2", model_id="m2",
            channel_id="feishu", channel_meta={"chat": 1},
        ),
    )
    assert (s.is_pinned, s.is_archived, s.provider_id, s.model_id) == (True, True, "p2", "m2")
    assert (s.channel_id, s.channel_meta) == ("feishu", {"chat": 1})
    s = store.sessions.update(sid, SessionUpdates(channel_meta={}, tags=[]))
    assert s.channel_meta is None and s.tags == []
    assert count(store, "SELECT count(*) FROM session_tags WHERE session_id = ?", sid) == 0
    # Nothing given: nothing changes, not even updated_at.
    assert store.sessions.update(sid, SessionUpdates()) == s


def test_update_rejects_unknown_and_read_only_fields_at_decoding() -> None:
    for bad in (b'{"messageCount": 3}', b'{"id": "x"}', b'{"titel": "typo"}'):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=SessionUpdates)


def test_pin_archive(store: Store) -> None:
    sid = _create(store)
    store.sessions.pin(sid, True)
    store.sessions.archive(sid)
    s = store.sessions.get(sid)
    assert s.is_pinned and s.is_archived
    store.sessions.pin(sid, False)
    assert not store.sessions.get(sid).is_pinned


def _list(store: Store, **kw: object) -> tuple[list[str], int]:
    r = store.sessions.query(SessionFilter(**kw))  # type: ignore[arg-type]
    return [s.title for s in r.sessions], r.total


def test_list_every_filter_field(store: Store, clock: FakeClock) -> None:
    _create(store, title="Alpha project", folder="work", tags=["a", "b"])
    _create(store, title="beta notes", folder="work", tags=["a"])
    _create(store, title="Gamma", folder="home", tags=["b", "c"], channel_id="feishu")
    _create(store, title="delta 100% done_x", tags=["a", "b", "c"])
    e = _create(store, title="Epsilon")
    store.sessions.update(e, SessionUpdates(summary="mentions ALPHA in the summary"))
    # Default: newest first by updated_at.
    assert _list(store) == (["Epsilon", "delta 100% done_x", "Gamma", "beta notes", "Alpha project"], 5)
    # search: title and summary, case-insensitive, LIKE wildcards are literal.
    assert _list(store, search="alpha") == (["Epsilon", "Alpha project"], 2)
    assert _list(store, search="100%") == (["delta 100% done_x"], 1)
    assert _list(store, search="_x") == (["delta 100% done_x"], 1)
    assert _list(store, search="%") == (["delta 100% done_x"], 1)
    assert _list(store, folder="work") == (["beta notes", "Alpha project"], 2)
    # tags: every given tag must be there.
    assert _list(store, tags=["a"]) == (["delta 100% done_x", "beta notes", "Alpha project"], 3)
    assert _list(store, tags=["a", "b"]) == (["delta 100% done_x", "Alpha project"], 2)
    assert _list(store, tags=["a", "b", "c"]) == (["delta 100% done_x"], 1)
    assert _list(store, tags=["zzz"]) == ([], 0)
    assert _list(store, folder="work", tags=["b"]) == (["Alpha project"], 1)
    assert _list(store, channel_id="feishu") == (["Gamma"], 1)
    # isArchived / isPinned.
    gamma = store.sessions.query(SessionFilter(search="Gamma")).sessions[0].id
    store.sessions.archive(gamma)
    assert _list(store, is_archived=True) == (["Gamma"], 1)
    assert _list(store, is_archived=False)[1] == 4
    alpha = store.sessions.query(SessionFilter(search="Alpha project")).sessions[0].id
    store.sessions.pin(alpha, True)
    assert _list(store, is_pinned=True) == (["Alpha project"], 1)
    # Pinned first, whatever the sort.
    titles, total = _list(store)
    assert titles[0] == "Alpha project" and total == 5
    # limit/offset; total counts all matches.
    page1 = _list(store, limit=2)
    page2 = _list(store, limit=2, offset=2)
    page3 = _list(store, limit=2, offset=4)
    assert page1[1] == page2[1] == page3[1] == 5
    assert len(page1[0]) == 2 and len(page2[0]) == 2 and len(page3[0]) == 1
    assert page1[0] + page2[0] + page3[0] == titles
    assert _list(store, limit=2, offset=10) == ([], 5)


def test_list_sort_by_and_date_range(store: Store, clock: FakeClock) -> None:
    a = _create(store, title="A")
    clock.jump(1000)
    b = _create(store, title="B")
    clock.jump(1000)
    c = _create(store, title="C")
    clock.jump(1000)
    # Touch A (updated_at) and give B and C messages in the order C, B (last_message_at).
    store.sessions.update(a, SessionUpdates(summary="touched"))
    clock.jump(1000)
    store.messages.append(c, role="user", text_content="x")
    clock.jump(1000)
    store.messages.append(b, role="user", text_content="y")
    assert _list(store, sort_by="created_at")[0] == ["C", "B", "A"]
    assert _list(store, sort_by="updated_at")[0] == ["B", "C", "A"]
    # Sessions without messages (NULL last_message_at) come last.
    assert _list(store, sort_by="last_message_at")[0] == ["B", "C", "A"]
    sa, sb = store.sessions.get(a), store.sessions.get(b)
    # dateRange bounds (inclusive) the sort field.
    rng = DateRange(from_=sa.created_at, to=sb.created_at)
    assert _list(store, sort_by="created_at", date_range=rng) == (["B", "A"], 2)
    rng = DateRange(from_=sb.last_message_at, to=sb.last_message_at)
    assert _list(store, sort_by="last_message_at", date_range=rng) == (["B"], 1)


@pytest.mark.parametrize(
    "flt, field",
    [
        (SessionFilter(limit=0), "limit"),
        (SessionFilter(limit=501), "limit"),
        (SessionFilter(offset=-1), "offset"),
        (SessionFilter(sort_by="title"), "sortBy"),  # type: ignore[arg-type]
        (SessionFilter(tags="a"), "tags"),  # type: ignore[arg-type]
        (SessionFilter(tags=["a", 1]), "tags"),  # type: ignore[list-item]
        (SessionFilter(date_range=DateRange(from_=5, to=1)), "dateRange"),
        (SessionFilter(is_pinned="yes"), "isPinned"),  # type: ignore[arg-type]
    ],
)
def test_list_bad_filters(store: Store, flt: SessionFilter, field: str) -> None:
    _create(store, tags=["a"])
    before = db_digest(store)
    with pytest.raises(InvalidParams, match=field) as err:
        store.sessions.query(flt)
    assert err.value.code == ErrorCode.INVALID_PARAMS
    assert db_digest(store) == before


def test_wire_decoding_rejects_bad_filters() -> None:
    for bad in (b'{"sortBy": "title"}', b'{"tags": "a"}', b'{"tags": [1]}', b'{"limit": "5"}'):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=SessionFilter)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.sessions.get("missing"),
        lambda s: s.sessions.update("missing", SessionUpdates(title="x")),
        lambda s: s.sessions.delete("missing"),
        lambda s: s.sessions.archive("missing"),
        lambda s: s.sessions.pin("missing", True),
        lambda s: s.sessions.fork("missing", "m"),
        lambda s: s.sessions.export("missing"),
        lambda s: s.sessions.add_usage("missing", Usage(input_tokens=1), 0.1),
        lambda s: s.messages.append("missing", role="user", text_content="x"),
        lambda s: s.messages.query("missing"),
        lambda s: s.messages.tree("missing"),
        lambda s: s.messages.select_branch("missing", "m"),
        lambda s: s.messages.get("missing"),
        lambda s: s.messages.update_partial("missing", text_content="x", parts=None),
        lambda s: s.messages.finish("missing", status="completed", text_content="x", parts=None),
        lambda s: s.messages.delete_branch("missing"),
    ],
)
def test_unknown_ids_are_not_found_and_change_nothing(store: Store, call) -> None:  # type: ignore[no-untyped-def]
    sid = _create(store, tags=["a"])
    store.messages.append(sid, role="user", text_content="hello")
    before = db_digest(store)
    with pytest.raises(NotFound) as err:
        call(store)
    assert err.value.code == ErrorCode.NOT_FOUND and "missing" in err.value.message
    assert db_digest(store) == before


@pytest.mark.parametrize(
    "updates, field",
    [
        (SessionUpdates(title=""), "title"),
        (SessionUpdates(title="   "), "title"),
        (SessionUpdates(tags="a"), "tags"),  # type: ignore[arg-type]
        (SessionUpdates(tags=["a", 2]), "tags"),  # type: ignore[list-item]
        (SessionUpdates(tags=["ok", ""]), "tags"),
        (SessionUpdates(is_pinned=1), "isPinned"),  # type: ignore[arg-type]
        (SessionUpdates(summary=5), "summary"),  # type: ignore[arg-type]
        (SessionUpdates(channel_meta=[1]), "channelMeta"),  # type: ignore[arg-type]
    ],
)
def test_bad_updates_change_nothing(store: Store, updates: SessionUpdates, field: str) -> None:
    sid = _create(store, title="keep", tags=["a"])
    before = db_digest(store)
    with pytest.raises(InvalidParams, match=field):
        store.sessions.update(sid, updates)
    assert db_digest(store) == before


def test_bad_create_changes_nothing(store: Store) -> None:
    before = db_digest(store)
    for opts, field in (
        (CreateSessionOptions(tags=["a", 3]), "tags"),  # type: ignore[list-item]
        (CreateSessionOptions(mode="agent"), "mode"),  # type: ignore[arg-type]
        (CreateSessionOptions(folder=3), "folder"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidParams, match=field):
            store.sessions.create(opts)
    assert db_digest(store) == before


def test_counters_stay_true(store: Store, clock: FakeClock) -> None:
    sid = _create(store)
    m1 = store.messages.append(sid, role="user", text_content="1")
    m2 = store.messages.append(sid, role="assistant", text_content="2")
    alt = store.messages.append(sid, role="assistant", text_content="2b", parent_id=m1.id)
    m3 = store.messages.append(sid, role="user", text_content="3", parent_id=m2.id)
    s = store.sessions.get(sid)
    assert s.message_count == 4 and s.last_message_at == m3.created_at
    assert s.updated_at >= m3.created_at
    # Deleting a branch recounts.
    assert store.messages.delete_branch(m2.id) == 2
    s = store.sessions.get(sid)
    assert s.message_count == 2 and s.last_message_at == alt.created_at
    assert s.active_leaf_id == alt.id
    store.sessions.add_usage(sid, Usage(input_tokens=100, output_tokens=20), 0.5)
    s = store.sessions.add_usage(sid, Usage(input_tokens=20, output_tokens=10, cache_read_tokens=5), 0.25, kind="side:title")
    assert (s.total_tokens, s.total_cost) == (150, 0.75)
    assert s.usage_by_kind["reply"] == UsageTotals(input_tokens=100, output_tokens=20, cost=0.5, calls=1)
    assert s.usage_by_kind["side:title"] == UsageTotals(
        input_tokens=20, output_tokens=10, cache_read_tokens=5, cost=0.25, calls=1
    )
    # Everywhere: message_count equals the rows, last_message_at their newest created_at.
    bad = count(
        store,
        "SELECT count(*) FROM sessions_v2 s WHERE message_count !="
        " (SELECT count(*) FROM messages_v2 m WHERE m.session_id = s.id)"
        " OR last_message_at IS NOT (SELECT max(created_at) FROM messages_v2 m WHERE m.session_id = s.id)",
    )
    assert bad == 0
    with pytest.raises(InvalidParams):
        store.sessions.add_usage(sid, Usage(input_tokens=-1), 0.0)
    with pytest.raises(InvalidParams):
        store.sessions.add_usage(sid, None, 0.0, kind="titles")


def test_totals_saturate_at_the_stores_bound_instead_of_leaving_int64(store: Store) -> None:
    sid = _create(store)
    top = 2**62
    for _ in range(3):
        s = store.sessions.add_usage(sid, Usage(input_tokens=top, output_tokens=top, reasoning_tokens=top), 0.0)
    assert s.total_tokens == top
    assert s.usage_by_kind["reply"] == UsageTotals(input_tokens=top, output_tokens=top, reasoning_tokens=top, calls=3)
    assert store.sessions.get(sid).total_tokens == top  # read back as stored: an INTEGER, not a REAL


def test_delete_cascades_everywhere(store: Store) -> None:
    keep = _create(store, title="keep", tags=["t"])
    kept = store.messages.append(keep, role="user", text_content="保留的消息 keep")
    sid = _create(store, title="gone", tags=["t", "u"])
    root = store.messages.append(sid, role="user", text_content="要删除的消息 remove")
    store.messages.append(sid, role="assistant", text_content="回答 answer")
    store.messages.append(sid, role="assistant", text_content="另一个分支 branch", parent_id=root.id)
    store.messages.append(sid, role="assistant", status="streaming", text_content="partial")
    assert count(store, "SELECT count(*) FROM search_docs") == 4
    store.sessions.delete(sid)
    with pytest.raises(NotFound):
        store.sessions.get(sid)
    assert count(store, "SELECT count(*) FROM messages_v2 WHERE session_id = ?", sid) == 0
    assert count(store, "SELECT count(*) FROM session_tags WHERE session_id = ?", sid) == 0
    assert count(store, "SELECT count(*) FROM search_docs") == 1
    assert count(store, "SELECT count(*) FROM messages_fts_docsize") == 1
    assert count(store, "SELECT count(*) FROM search_docs d LEFT JOIN messages_v2 m"
                 " ON m.id = d.message_id WHERE m.id IS NULL") == 0
    assert store.search.messages("删除") == [] and store.search.messages("answer") == []
    assert [r.message_id for r in store.search.messages("keep")] == [kept.id]
    assert count(store, "SELECT count(*) FROM pragma_foreign_key_check") == 0
    assert store.sessions.get(keep).message_count == 1


@pytest.mark.parametrize("few", [0, 1, 2000])
def test_tag_filter_plans_agree(store: Store, clock: FakeClock, few: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tag filters take one of three query shapes (folder-driven, tag-index-driven, list
    order with early stop); every shape must give the same sessions, order and total."""
    from sidecar.store import session_table as sessions_mod

    monkeypatch.setattr(sessions_mod, "_FEW_MATCHES", few)
    expected: dict[tuple[str | None, tuple[str, ...]], list[str]] = {}
    for i in range(30):
        tags = [t for t, every in (("a", 2), ("b", 3), ("c", 5)) if i % every == 0]
        sid = _create(store, title=f"s{i:02}", folder="f" if i % 4 == 0 else None, tags=tags)
        if i % 7 == 0:
            store.sessions.pin(sid, True)
    newest_first = store.sessions.query(SessionFilter(limit=500)).sessions
    for folder in (None, "f"):
        for tags in (["a"], ["a", "b"], ["b", "c"], ["a", "b", "c"], ["zzz"]):
            want = [
                s.title for s in newest_first
                if set(tags) <= set(s.tags) and (folder is None or s.folder == folder)
            ]
            expected[(folder, tuple(tags))] = want
            for limit, offset in ((50, 0), (2, 0), (2, 3), (3, 100)):
                titles, total = _list(store, folder=folder, tags=tags, limit=limit, offset=offset)
                assert total == len(want), (folder, tags)
                assert titles == want[offset : offset + limit], (folder, tags, limit, offset)
    # Pinned sessions come first in every shape.
    titles, _ = _list(store, tags=["a"])
    pinned = {s.title for s in newest_first if s.is_pinned}
    assert titles[: len(pinned & set(titles))] == [t for t in titles if t in pinned]


def test_tag_lists_are_capped_with_invalid_params(store: Store) -> None:
    from sidecar.store.checks import MAX_TAG_CHARS, MAX_TAGS

    many = [f"t{i}-" + "x" * (MAX_TAG_CHARS - 6) for i in range(MAX_TAGS)]
    sid = _create(store, title="full", tags=many)  # the cap itself is fine everywhere
    for folder in (None, "f"):
        assert _list(store, tags=many, folder=folder) == ((["full"], 1) if folder is None else ([], 0))
    before = db_digest(store)
    for call in (
        lambda: store.sessions.query(SessionFilter(tags=[f"t{i}" for i in range(MAX_TAGS + 1)])),
        lambda: store.sessions.query(SessionFilter(tags=[f"t{i}" for i in range(10_000)])),
        lambda: store.sessions.query(SessionFilter(tags=["x" * (MAX_TAG_CHARS + 1)])),
        lambda: _create(store, tags=[f"t{i}" for i in range(MAX_TAGS + 1)]),
        lambda: store.sessions.update(sid, SessionUpdates(tags=["y" * (MAX_TAG_CHARS + 1)])),
    ):
        with pytest.raises(InvalidParams, match="tags") as err:
            call()
        assert err.value.code == ErrorCode.INVALID_PARAMS
    assert db_digest(store) == before
