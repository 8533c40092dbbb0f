"""Full-text search: Chinese 2/3-char words, English case, mixed queries, FTS syntax as text,
snippets, ranking, filters, and the index following the message lifecycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import SearchOptions
from protocol.sessions import CreateSessionOptions
from protocol.types import DateRange, TextPart
from sidecar.errors import InvalidParams
from sidecar.store import Store
from sidecar.store import fts
from test_store_support import FakeClock, count, db_digest, open_store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = open_store(tmp_path)
    yield s
    s.close()


def _ids(results: list) -> set[str]:
    return {r.message_id for r in results}


def _session(store: Store, title: str = "chat") -> str:
    return store.sessions.create(CreateSessionOptions(title=title)).id


def test_two_char_chinese_word_inside_a_sentence(store: Store) -> None:
    sid = _session(store)
    hit = store.messages.append(sid, role="user", text_content="我们今天讨论全文搜索功能")
    store.messages.append(sid, role="assistant", text_content="好的，我们先看索引的结构")
    results = store.search.messages("搜索")
    assert _ids(results) == {hit.id}
    assert results[0].snippet == "我们今天讨论全文<mark>搜索</mark>功能"
    assert results[0].session_id == sid and results[0].session_title == "chat"
    assert results[0].role == "user" and results[0].created_at == hit.created_at


def test_three_and_four_char_words_and_single_chars(store: Store) -> None:
    sid = _session(store)
    a = store.messages.append(sid, role="user", text_content="我们的数据库很快")
    b = store.messages.append(sid, role="user", text_content="全文搜索需要分词")
    assert _ids(store.search.messages("数据库")) == {a.id}
    assert _ids(store.search.messages("全文搜索")) == {b.id}
    # A single character matches anywhere in a run, including its last character.
    assert _ids(store.search.messages("快")) == {a.id}
    assert _ids(store.search.messages("数")) == {a.id}
    # Characters that occur but not next to each other are not a match (phrase of bigrams).
    assert _ids(store.search.messages("数快")) == set()
    assert _ids(store.search.messages("搜分")) == set()


def test_english_word_regardless_of_case(store: Store) -> None:
    sid = _session(store)
    m = store.messages.append(sid, role="assistant", text_content="Use Python for scripting.")
    for q in ("python", "PYTHON", "Python", "pYtHoN"):
        results = store.search.messages(q)
        assert _ids(results) == {m.id}, q
    assert "<mark>Python</mark>" in store.search.messages("PYTHON")[0].snippet
    # Whole words: a prefix is not a word match.
    assert store.search.messages("pyth") == []


def test_mixed_cjk_and_latin_query(store: Store) -> None:
    sid = _session(store)
    both = store.messages.append(sid, role="user", text_content="这是一个Python教程，适合初学者")
    only_py = store.messages.append(sid, role="user", text_content="Python is fun")
    only_zh = store.messages.append(sid, role="user", text_content="一个很好的教程")
    assert _ids(store.search.messages("Python 教程")) == {both.id}
    assert _ids(store.search.messages("python教程")) == {both.id}
    assert _ids(store.search.messages("教程")) == {both.id, only_zh.id}
    assert _ids(store.search.messages("python")) == {both.id, only_py.id}
    snip = store.search.messages("Python 教程")[0].snippet
    assert "<mark>Python</mark>" in snip and "<mark>教程</mark>" in snip


def test_absent_words_find_nothing(store: Store) -> None:
    sid = _session(store)
    store.messages.append(sid, role="user", text_content="我们今天讨论全文搜索功能 with English")
    for q in ("数据", "javascript", "搜索 javascript", "功效", "englishman"):
        assert store.search.messages(q) == [], q


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"unbalanced',
        'say "hello',
        "*",
        "hel*",
        "NEAR(python rust)",
        "NEAR(python rust, 2)",
        "-python",
        "python -rust",
        "python OR rust",
        "python AND",
        "NOT python",
        "(((",
        "python)",
        "body: python",
        "{body sid}: python",
        "^python",
        "python + rust",
        "'; DROP TABLE messages_v2; --",
        "\x00",
        "搜索\"）（*",
        "",
        "   ",
    ],
)
def test_fts_syntax_in_user_input_is_plain_text(store: Store, query: str) -> None:
    sid = _session(store)
    py = store.messages.append(sid, role="user", text_content="python and rust, say hello")
    store.messages.append(sid, role="user", text_content="全文搜索")
    before = db_digest(store)
    results = store.search.messages(query)  # never an FTS syntax error
    pieces = fts.parse_query(query)
    words = {p.text.casefold() for p in pieces if not p.cjk}
    if words and words <= {"python", "rust", "and", "say", "hello"}:
        # Operators are searched as words: every word must be in the message.
        assert _ids(results) == {py.id}, query
    elif words:
        assert py.id not in _ids(results), query
    assert db_digest(store) == before
    assert count(store, "SELECT count(*) FROM messages_v2") == 2


def test_operator_words_are_searched_as_words(store: Store) -> None:
    sid = _session(store)
    a = store.messages.append(sid, role="user", text_content="python or rust")
    b = store.messages.append(sid, role="user", text_content="python rust")
    # "OR" is not an operator: it is a word that must appear.
    assert _ids(store.search.messages("python OR rust")) == {a.id}
    # "-" does not exclude.
    assert _ids(store.search.messages("python -rust")) == {a.id, b.id}
    # NEAR is a word too.
    assert store.search.messages("NEAR(python rust)") == []


def test_query_too_long_is_invalid(store: Store) -> None:
    with pytest.raises(InvalidParams, match="longer than"):
        store.search.messages("x" * (fts.MAX_QUERY_CHARS + 1))


def test_snippet_escapes_html_and_cuts_long_text(store: Store) -> None:
    sid = _session(store)
    long = "前言" * 100 + " <b>Python</b> & co " + "结尾" * 100
    store.messages.append(sid, role="user", text_content=long)
    snip = store.search.messages("python")[0].snippet
    assert "<mark>Python</mark>" in snip
    assert "&lt;b&gt;" in snip and "&amp;" in snip and "<b>" not in snip
    assert snip.startswith("…") and snip.endswith("…")
    assert len(snip) < 150
    # Hits in text parts are found and highlighted too.
    m = store.messages.append(
        sid, role="assistant", parts=[TextPart(text="多部件消息里的关键词")]
    )
    res = store.search.messages("关键词")
    assert _ids(res) == {m.id} and "<mark>关键词</mark>" in res[0].snippet


def test_ranking_prefers_more_relevant_messages(store: Store) -> None:
    sid = _session(store)
    weak = store.messages.append(sid, role="user", text_content="database " + "filler words here " * 20)
    strong = store.messages.append(sid, role="user", text_content="database database database")
    for i in range(10):
        store.messages.append(sid, role="user", text_content=f"unrelated message {i}")
    results = store.search.messages("database")
    assert [r.message_id for r in results] == [strong.id, weak.id]
    assert results[0].score > results[1].score > 0


def test_filters_and_paging(tmp_path: Path) -> None:
    clock = FakeClock()
    store = open_store(tmp_path, clock)
    try:
        s1 = _session(store, "one")
        s2 = _session(store, "two")
        u1 = store.messages.append(s1, role="user", text_content="关键词 alpha")
        a1 = store.messages.append(s1, role="assistant", text_content="关键词 beta")
        clock.jump(10_000)
        u2 = store.messages.append(s2, role="user", text_content="关键词 gamma")
        q = "关键词"
        assert _ids(store.search.messages(q)) == {u1.id, a1.id, u2.id}
        assert _ids(store.search.messages(q, SearchOptions(session_id=s1))) == {u1.id, a1.id}
        assert _ids(store.search.messages(q, SearchOptions(session_id="nope"))) == set()
        assert _ids(store.search.messages(q, SearchOptions(role="user"))) == {u1.id, u2.id}
        assert _ids(
            store.search.messages(q, SearchOptions(role="assistant", session_id=s1))
        ) == {a1.id}
        window = DateRange(from_=u2.created_at - 5, to=u2.created_at + 5)
        assert _ids(store.search.messages(q, SearchOptions(date_range=window))) == {u2.id}
        store.sessions.archive(s2)
        assert _ids(store.search.messages(q, SearchOptions(include_archived=False))) == {u1.id, a1.id}
        assert _ids(store.search.messages(q, SearchOptions(include_archived=True))) == {u1.id, a1.id, u2.id}
        pages = [
            store.search.messages(q, SearchOptions(limit=1, offset=i)) for i in range(4)
        ]
        assert [len(p) for p in pages] == [1, 1, 1, 0]
        assert {p[0].message_id for p in pages[:3]} == {u1.id, a1.id, u2.id}
        filtered_pages = [
            store.search.messages(q, SearchOptions(limit=1, offset=i, include_archived=False))
            for i in range(3)
        ]
        assert [len(p) for p in filtered_pages] == [1, 1, 0]
    finally:
        store.close()


@pytest.mark.parametrize(
    "options, field",
    [
        (SearchOptions(limit=0), "options.limit"),
        (SearchOptions(limit=201), "options.limit"),
        (SearchOptions(offset=-1), "options.offset"),
        (SearchOptions(role="bot"), "options.role"),  # type: ignore[arg-type]
        (SearchOptions(date_range=DateRange(from_=10, to=1)), "options.dateRange"),
    ],
)
def test_bad_search_options(store: Store, options: SearchOptions, field: str) -> None:
    sid = _session(store)
    store.messages.append(sid, role="user", text_content="关键词")
    before = db_digest(store)
    with pytest.raises(InvalidParams, match=field.replace(".", r"\.")):
        store.search.messages("关键词", options)
    assert db_digest(store) == before


def test_index_follows_message_lifecycle(store: Store) -> None:
    sid = _session(store)
    m = store.messages.append(sid, role="assistant", status="streaming", text_content="")
    store.messages.update_partial(m.id, text_content="正在生成的回答 partial", parts=None, seq=3)
    # Partial content is not searchable: streaming updates never touch the index.
    assert store.search.messages("回答") == []
    assert count(store, "SELECT count(*) FROM search_docs") == 0
    store.messages.finish(m.id, status="completed", text_content="最终的回答 final", parts=None)
    assert _ids(store.search.messages("回答")) == {m.id}
    assert store.search.messages("partial") == []  # the index holds the final text only
    assert count(store, "SELECT count(*) FROM search_docs") == 1
    # Deleting removes the index rows (search_docs and the FTS row via the trigger).
    store.messages.delete_branch(m.id)
    assert store.search.messages("回答") == []
    assert count(store, "SELECT count(*) FROM search_docs") == 0
    assert count(store, "SELECT count(*) FROM messages_fts_docsize") == 0


def test_index_text_transformation() -> None:
    assert fts.index_text("我们讨论") == " 我们 们讨 讨论 论 "
    assert fts.index_text("a我b") == "a 我 b"
    assert fts.index_text("Hello 世界!") == "hello  世界 界 !"
    # folded (NFKC, case), digits set apart from letters
    assert fts.index_text("Ｗｉｎｄｏｗｓ１０ ＭＰ３") == "windows 10  mp 3 "
    pieces = fts.parse_query('"搜索" AND python* -x (NEAR')
    assert [(p.text, p.cjk) for p in pieces] == [
        ("搜索", True), ("and", False), ("python", False), ("x", False), ("near", False)
    ]
    assert fts.build_match(pieces) == '{body} : ("搜索" AND "and" AND "python" AND "x" AND "near")'
    assert fts.build_match(fts.parse_query("ｗｉｎ１０")) == '{body} : ("win 10")'
    assert fts.build_match(fts.parse_query("*** ((( ---")) is None
    assert fts.build_match(fts.parse_query("全文搜索")) == '{body} : ("全文 文搜 搜索")'


def test_snippet_marks_the_original_characters_of_a_folded_hit() -> None:
    def marked(text: str, query: str) -> str:
        return fts.snippet(text, fts.parse_query(query))

    assert marked("请在Ｗｉｎｄｏｗｓ１０上", "windows10") == "请在<mark>Ｗｉｎｄｏｗｓ１０</mark>上"
    assert marked("请在Ｗｉｎｄｏｗｓ１０上", "Windows") == "请在<mark>Ｗｉｎｄｏｗｓ</mark>１０上"
    assert marked("Windows 10, windows10x, mywindows", "WINDOWS10") == (
        "<mark>Windows 10</mark>, <mark>windows10</mark>x, mywindows"
    )
    # one character folding to several (ligature, ㎏), several composing to one (e + U+0301)
    assert marked("a ﬁle of 5㎏", "file kg") == "a <mark>ﬁle</mark> of 5<mark>㎏</mark>"
    assert marked("une e\u0301tude, CAFÉ", "étude café") == "une <mark>e\u0301tude</mark>, <mark>CAFÉ</mark>"
    # half-width katakana compose with their sound marks: the whole run is marked
    assert marked("ｶﾞｲﾄﾞ本", "ガイド") == "<mark>ｶﾞｲﾄﾞ</mark>本"
    assert marked("STRASSE und Straße", "straße") == "<mark>STRASSE</mark> und <mark>Straße</mark>"


def test_folding_is_nfkc_casefold_and_maps_back_to_the_text() -> None:
    import random
    import unicodedata

    rng = random.Random(7)
    # Latin with combining marks, CJK punctuation and kana, full-width forms, ligatures,
    # conjoining jamo (which NFKC composes across characters), Hangul syllables, numerals
    ranges = [(0x20, 0x250), (0x300, 0x370), (0x3000, 0x3100), (0x4E00, 0x4E40), (0xFF00, 0xFFF0),
              (0xFB00, 0xFB10), (0x1100, 0x1200), (0xAC00, 0xAC40), (0x2150, 0x2190)]
    pool = [chr(c) for lo, hi in ranges for c in range(lo, hi)]
    for _ in range(5000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 30)))
        folded, starts, ends = fts._fold_map(text)
        assert folded == fts.fold(text) == unicodedata.normalize("NFKC", text).casefold(), repr(text)
        if starts is not None and ends is not None:
            assert len(starts) == len(ends) == len(folded)
            assert all(0 <= a < b <= len(text) for a, b in zip(starts, ends)), repr(text)


def test_ranking_window_covers_the_newest_matches(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.store import search

    monkeypatch.setattr(search, "SEARCH_WINDOW", 3)
    sid = _session(store)
    oldest_best = store.messages.append(sid, role="user", text_content="apple apple apple apple")
    newer = [
        store.messages.append(sid, role="user", text_content=f"apple and {w} filler text")
        for w in ("one", "two", "three")
    ]
    # Four matches, window of three: the best bm25 match outside the newest three is not ranked.
    assert _ids(store.search.messages("apple", SearchOptions(limit=3))) == {m.id for m in newer}
    # A page beyond the window widens it, so paging still reaches every match.
    deep = store.search.messages("apple", SearchOptions(limit=2, offset=2))
    assert len(deep) == 2
    # Fewer matches than the window: all ranked, best first.
    monkeypatch.setattr(search, "SEARCH_WINDOW", 10)
    assert store.search.messages("apple")[0].message_id == oldest_best.id


def test_rarer_words_weigh_more_in_multi_word_queries(store: Store) -> None:
    sid = _session(store)
    for i in range(12):
        store.messages.append(sid, role="user", text_content=f"apple filler number {i}")
    rare_heavy = store.messages.append(sid, role="user", text_content="zebra zebra apple")
    common_heavy = store.messages.append(sid, role="user", text_content="zebra apple apple")
    results = store.search.messages("zebra apple")
    assert [r.message_id for r in results] == [rare_heavy.id, common_heavy.id]
    assert results[0].score > results[1].score


def test_filters_apply_before_the_ranking_window_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.store import search

    monkeypatch.setattr(search, "SEARCH_WINDOW", 5)
    clock = FakeClock()
    store = open_store(tmp_path, clock)
    try:
        old_sid = _session(store, "old")
        old = store.messages.append(old_sid, role="user", text_content="budget for 2023")
        clock.jump(10_000_000)
        live_sid = _session(store, "live")
        newer = [
            store.messages.append(live_sid, role="user", text_content=f"budget talk {i}")
            for i in range(8)
        ]
        store.sessions.archive(live_sid)
        # Eight newer matches fill the window (5, as the page is smaller); the old one is
        # still found by its filters.
        dated = SearchOptions(date_range=DateRange(from_=0, to=old.created_at), limit=2)
        assert _ids(store.search.messages("budget", dated)) == {old.id}
        not_archived = SearchOptions(include_archived=False, limit=2)
        assert _ids(store.search.messages("budget", not_archived)) == {old.id}
        in_session = SearchOptions(session_id=old_sid, limit=2)
        assert _ids(store.search.messages("budget", in_session)) == {old.id}
        # Without filters the window is still the newest five (the bounded common case).
        assert _ids(store.search.messages("budget", SearchOptions(limit=3))) <= {m.id for m in newer[-5:]}
        # Paging over filtered results reaches every match and stops.
        pages = [
            store.search.messages("budget", SearchOptions(session_id=live_sid, limit=3, offset=o))
            for o in (0, 3, 6, 9)
        ]
        assert [len(p) for p in pages] == [3, 3, 2, 0]
        assert {r.message_id for p in pages for r in p} == {m.id for m in newer}
    finally:
        store.close()


def test_a_row_with_unreadable_parts_does_not_fail_search_or_reindex(store: Store) -> None:
    import apsw

    from sidecar.store import search as message_search

    sid = _session(store)
    good = store.messages.append(sid, role="user", text_content="needle in good row")
    odd = store.messages.append(
        sid, role="assistant", text_content="needle in odd row", parts=[TextPart(text="needle part")]
    )
    raw = apsw.Connection(str(store.path))
    try:  # a part type written by a newer build
        raw.execute(
            "UPDATE messages_v2 SET parts = '[{\"type\":\"future_part\",\"x\":1}]' WHERE id = ?",
            (odd.id,),
        )
    finally:
        raw.close()
    results = store.search.messages("needle")
    assert _ids(results) == {good.id, odd.id}
    assert {r.message_id: r.snippet for r in results}[odd.id] == "<mark>needle</mark> in odd row"
    # The migration's full re-index reads every row the same way (text kept, parts skipped).
    with store._db.write() as conn:
        assert message_search.reindex_all(conn) == 2
    assert _ids(store.search.messages("odd")) == {odd.id}
