"""Property tests of the reply splitter: for any Markdown and every dialect and unit,
every chunk is within the limit, code fences balance in every chunk, nothing is lost,
duplicated or reordered (apart from the reopened fences and repeated table headers the
splitter adds, and whitespace at the cuts), and words are not cut."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from sidecar.channels.dialects import DIALECTS
from sidecar.channels.render import render_markdown
from sidecar.channels.split import Measure, split_lines

UNITS = ("chars", "utf8_bytes", "json_bytes")
LATIN = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "omicron"]
CJK = ["你好", "世界", "分割", "测试", "飞书", "钉钉", "消息", "会话", "模型", "回复"]
_md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_CLOSE = re.compile(r"^[ >]*\s*(`{3,}|~{3,})\s*$")


def size(text: str, unit: str) -> int:
    if unit == "chars":
        return len(text)
    if unit == "utf8_bytes":
        return len(text.encode("utf-8", "surrogatepass"))
    return len(msgspec.json.encode(text))


def fences_balanced(chunk: str) -> bool:
    """Every fenced code block markdown-it finds in the chunk is closed inside it."""
    lines = chunk.split("\n")
    for token in _md.parse(chunk):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        if end - 1 <= start or end > len(lines):
            return False
        m = _CLOSE.match(lines[end - 1])
        if not m or m.group(1)[0] != token.markup[0] or len(m.group(1)) < len(token.markup):
            return False
    return True


def squash(text: str) -> str:
    return "".join(text.split())


words = st.sampled_from(LATIN)
sentence = st.lists(words, min_size=1, max_size=30).map(lambda w: " ".join(w) + ".")
cjk_sentence = st.lists(st.sampled_from(CJK), min_size=1, max_size=12).map(lambda w: "".join(w) + "。")
paragraph = st.lists(st.one_of(sentence, cjk_sentence), min_size=1, max_size=12).map(" ".join)
styled = st.builds(
    lambda a, b, c: f"{a} **{b}** [{c}](https://example.com/{c}) `{b}` {a}", words, words, words
)
code_line = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=60),
    st.just("```"),
    st.just("~~~"),
    st.builds(lambda n: "`" * n, st.integers(3, 12)),
)
fence = st.builds(
    lambda lang, lines, closed: f"```{lang}\n" + "\n".join(lines) + ("\n```" if closed else ""),
    st.sampled_from(["", "python", "js", "sh"]),
    st.lists(code_line, max_size=40),
    st.booleans(),
)
table = st.builds(
    lambda cols, rows: "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    + "\n".join("| " + " | ".join(r[: len(cols)] + [""] * (len(cols) - len(r))) + " |" for r in rows),
    st.lists(words, min_size=1, max_size=4),
    st.lists(st.lists(st.one_of(words, st.sampled_from(CJK)), min_size=1, max_size=4), max_size=40),
)
bullets = st.lists(st.one_of(sentence, styled), min_size=1, max_size=8).map(lambda xs: "\n".join("- " + x for x in xs))
quote = st.lists(st.one_of(sentence, cjk_sentence), min_size=1, max_size=6).map(lambda xs: "\n".join("> " + x for x in xs))
nested = st.builds(lambda s, f: f"- {s}\n\n  " + f.replace("\n", "\n  "), sentence, fence)
heading = st.builds(lambda n, s: "#" * n + " " + s, st.integers(1, 6), sentence)
block = st.one_of(paragraph, styled, fence, table, bullets, quote, nested, heading, st.text(max_size=200))
document = st.lists(block, min_size=1, max_size=12).map("\n\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    doc=document,
    dialect=st.sampled_from(sorted(DIALECTS)),
    unit=st.sampled_from(UNITS),
    limit=st.integers(256, 2000),
)
def test_chunks_fit_balance_and_keep_every_character(doc: str, dialect: str, unit: str, limit: int) -> None:
    rendered = render_markdown(doc, DIALECTS[dialect])
    whole = "\n".join(line.text for line in rendered.lines)
    chunks = split_lines(rendered.lines, limit, Measure(unit))
    kept = []
    for chunk in chunks:
        assert size(chunk.text, unit) <= limit, (size(chunk.text, unit), limit)
        assert chunk.text.strip()
        assert fences_balanced(chunk.text), chunk.text
        kept.append("\n".join(t for t, synthetic in zip(chunk.lines, chunk.synthetic) if not synthetic))
    assert squash("".join(kept)) == squash(whole)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    paragraphs=st.lists(st.lists(st.one_of(sentence, cjk_sentence), min_size=1, max_size=40).map(" ".join), min_size=1, max_size=6),
    unit=st.sampled_from(UNITS),
    limit=st.integers(256, 1200),
)
def test_words_and_cjk_phrases_are_never_cut(paragraphs: list[str], unit: str, limit: int) -> None:
    """Every sentence is shorter than half a chunk, so no cut falls inside a Latin word and
    every cut in Chinese text falls after punctuation."""
    rendered = render_markdown("\n\n".join(paragraphs), DIALECTS["plain"])
    chunks = split_lines(rendered.lines, limit, Measure(unit))
    vocabulary = set(LATIN)
    for chunk in chunks:
        for token in chunk.text.split():
            token = token.rstrip(".")
            if token and token[0].isascii():
                assert token in vocabulary, token
    for before, after in zip(chunks, chunks[1:]):
        tail, head = before.text.rstrip(), after.text.lstrip()
        if tail and not tail[-1].isascii():
            assert tail[-1] == "。", (tail[-10:], head[:10])
        if head and not head[0].isascii():
            assert tail.endswith(("。", ".")), (tail[-10:], head[:10])


@pytest.mark.parametrize("unit", UNITS)
def test_a_single_huge_word_is_cut_hard_but_within_the_limit(unit: str) -> None:
    rendered = render_markdown("x" * 5000 + " " + "😀" * 700, DIALECTS["plain"])
    chunks = split_lines(rendered.lines, 300, Measure(unit))
    assert all(size(c.text, unit) <= 300 for c in chunks)
    assert squash("".join(c.text for c in chunks)) == "x" * 5000 + "😀" * 700


def test_grapheme_clusters_are_not_split() -> None:
    family = "👨\u200d👩\u200d👧\u200d👦"
    flag = "🇨🇳"
    text = (family + flag + "e\u0301") * 200
    rendered = render_markdown(text, DIALECTS["plain"])
    for unit in UNITS:
        for chunk in split_lines(rendered.lines, 256, Measure(unit)):
            assert not chunk.text.startswith(("\u200d", "\u0301")), unit
            assert not chunk.text.endswith("\u200d"), unit
            assert chunk.text.count("🇨") == chunk.text.count("🇳")
