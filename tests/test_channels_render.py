"""Golden tests of the per-platform renderer and splitter: one reply rendered for every
dialect (exact chunks), the split rules on long tables and code (header repeated, fence
closed and reopened, within byte/char/JSON limits), and what is never written as a link
or sent as media."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from protocol.channels import ChannelConfig, ChannelConfigUpsertParams, ReplyTextChunk
from protocol.types import FilePart, ImagePart
from sidecar.channels.compose import compose, text_chunks
from sidecar.channels.dialects import DIALECTS
from sidecar.channels.platforms import resolve_config
from sidecar.channels.render import extract_footnotes, render_markdown
from sidecar.store.attachments import AttachmentStore

DOC = """## Release notes

The **new** build is *faster* and ~~slower~~ at [the docs](https://example.com/docs) for `x < y & z`.
See the chart ![chart](https://example.com/c.png) and the paper[^1].

- fixed the splitter
- kept **tables** whole

> quoted line one
> quoted line two

| name | value |
|------|-------|
| alpha | 1 |
| beta | 2 |
| gamma | 3 |
| delta | 4 |

```python
def add(a, b):
    return a + b

print(add(1, 2))
print(add(3, 4))
```

中文段落：这是一个用来测试的句子。第二句也在这里！

[^1]: Smith et al., https://example.com/paper
"""

PLATFORM_OF = {
    "feishu_card": "feishu", "feishu_post": "feishu", "dingtalk_md": "dingtalk", "wecom_md": "wecom",
    "slack_blocks": "slack", "slack_mrkdwn": "slack", "plain": "wechat",
}


def config(dialect: str, **limits: int) -> ChannelConfig:
    params = msgspec.convert(
        {"id": "c", "platform": PLATFORM_OF[dialect], "dialect": dialect, "limits": limits}, ChannelConfigUpsertParams
    )
    return resolve_config(params, 0)


def as_json(chunks: list) -> list:  # type: ignore[type-arg]
    return [msgspec.json.decode(msgspec.json.encode(c)) for c in chunks]


GOLDEN = {
    'feishu_card': [
        {'type': 'text', 'text': '**Release notes**\n\nThe **new** build is *faster* and ~~slower~~ at [the docs](https://example.com/docs) for `x < y & z`.\nSee the chart chart and the paper[1].\n\n- fixed the splitter\n- kept **tables** whole\n\n> quoted line one\n> quoted line two', 'format': 'feishu_card'},
        {'type': 'text', 'text': '| name | value |\n| --- | --- |\n| alpha | 1 |\n| beta | 2 |\n| gamma | 3 |\n| delta | 4 |\n\n```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```', 'format': 'feishu_card'},
        {'type': 'text', 'text': '中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] Smith et al., https://example.com/paper', 'format': 'feishu_card'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
    'feishu_post': [
        {'type': 'text', 'text': '**Release notes**\n\nThe **new** build is *faster* and ~~slower~~ at [the docs](https://example.com/docs) for `x < y & z`.\nSee the chart chart and the paper[1].\n\n- fixed the splitter\n- kept **tables** whole\n\n> quoted line one\n> quoted line two', 'format': 'feishu_post'},
        {'type': 'text', 'text': '**name** | **value**\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4\n\n```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！', 'format': 'feishu_post'},
        {'type': 'text', 'text': '[1] Smith et al., https://example.com/paper', 'format': 'feishu_post'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
    'dingtalk_md': [
        {'type': 'text', 'text': '## Release notes\n\nThe **new** build is *faster* and slower at [the docs](https://example.com/docs) for `x < y & z`.\nSee the chart ![chart](https://example.com/c.png) and the paper[1].\n\n- fixed the splitter\n- kept **tables** whole', 'format': 'dingtalk_md'},
        {'type': 'text', 'text': '> quoted line one\n> quoted line two\n\n| name | value |\n| --- | --- |\n| alpha | 1 |\n| beta | 2 |\n| gamma | 3 |\n| delta | 4 |\n\n```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```', 'format': 'dingtalk_md'},
        {'type': 'text', 'text': '中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] Smith et al., https://example.com/paper', 'format': 'dingtalk_md'},
    ],
    'wecom_md': [
        {'type': 'text', 'text': '## Release notes\n\nThe **new** build is faster and slower at [the docs](https://example.com/docs) for `x < y & z`.\nSee the chart chart and the paper[1].\n\n- fixed the splitter\n- kept **tables** whole\n\n> quoted line one\n> quoted line two', 'format': 'wecom_md'},
        {'type': 'text', 'text': '**name** | **value**\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4\n\n```\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！', 'format': 'wecom_md'},
        {'type': 'text', 'text': '[1] Smith et al., https://example.com/paper', 'format': 'wecom_md'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
    'slack_blocks': [
        {'type': 'blocks', 'text': '*Release notes*\n\nThe *new* build is _faster_ and ~slower~ at <https://example.com/docs|the docs> for `x &lt; y &amp; z`.\nSee the chart chart and the paper[1].\n\n• fixed the splitter\n• kept *tables* whole\n\n> quoted line one\n> quoted line two\n\n*name* | *value*\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4\n\n```\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] Smith et al., https://example.com/paper', 'blocks': [{'type': 'section', 'text': {'type': 'mrkdwn', 'text': '*Release notes*\n\nThe *new* build is _faster_ and ~slower~ at <https://example.com/docs|the docs> for `x &lt; y &amp; z`.\nSee the chart chart and the paper[1].\n\n• fixed the splitter\n• kept *tables* whole\n\n> quoted line one\n> quoted line two'}}, {'type': 'section', 'text': {'type': 'mrkdwn', 'text': '*name* | *value*\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4\n\n```\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] Smith et al., https://example.com/paper'}}]},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
    'slack_mrkdwn': [
        {'type': 'text', 'text': '*Release notes*\n\nThe *new* build is _faster_ and ~slower~ at <https://example.com/docs|the docs> for `x &lt; y &amp; z`.\nSee the chart chart and the paper[1].\n\n• fixed the splitter\n• kept *tables* whole\n\n> quoted line one\n> quoted line two', 'format': 'slack_mrkdwn'},
        {'type': 'text', 'text': '*name* | *value*\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4\n\n```\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] Smith et al., https://example.com/paper', 'format': 'slack_mrkdwn'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
    'plain': [
        {'type': 'text', 'text': 'Release notes\n\nThe new build is faster and slower at the docs [1] for x < y & z.\nSee the chart chart and the paper[2].\n\n• fixed the splitter\n• kept tables whole\n\n> quoted line one\n> quoted line two\n\nname | value\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4', 'format': 'plain'},
        {'type': 'text', 'text': '```\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] https://example.com/docs\n[2] Smith et al., https://example.com/paper', 'format': 'plain'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
}


@pytest.mark.parametrize("dialect", sorted(GOLDEN))
def test_golden_reply_per_dialect(dialect: str, tmp_path: Path) -> None:
    limits = {"maxMessageSize": 600, "maxSectionChars": 256, "maxBlocks": 2} if dialect == "slack_blocks" else {"maxMessageSize": 256}
    chunks = compose(DOC, None, config(dialect, **limits), AttachmentStore(tmp_path))
    assert as_json(chunks) == GOLDEN[dialect]


def test_dingtalk_stays_markdown() -> None:
    chunks, _ = text_chunks("# Title\n\n**bold** [link](https://x.y) ![pic](https://x.y/p.png)\n\n- a\n- b", config("dingtalk_md"))
    (chunk,) = chunks
    assert isinstance(chunk, ReplyTextChunk) and chunk.format == "dingtalk_md"
    assert chunk.text == "# Title\n\n**bold** [link](https://x.y) ![pic](https://x.y/p.png)\n\n- a\n- b"


def long_table(rows: int) -> str:
    return "| key | value |\n|---|---|\n" + "\n".join(f"| row{i} | value number {i} |" for i in range(rows))


def long_code(lines: int) -> str:
    return "```python\n" + "\n".join(f"print('line {i}')  # {i * i}" for i in range(lines)) + "\n```"


@pytest.mark.parametrize(
    ("dialect", "limits", "header"),
    [
        ("dingtalk_md", {"maxMessageSize": 300}, ["| key | value |", "| --- | --- |"]),
        ("feishu_card", {"maxMessageSize": 300}, ["| key | value |", "| --- | --- |"]),
        ("wecom_md", {"maxMessageSize": 300}, ["**key** | **value**"]),
        ("plain", {"maxMessageSize": 300}, ["key | value"]),
        ("slack_blocks", {"maxMessageSize": 1000, "maxSectionChars": 300, "maxBlocks": 50}, ["*key* | *value*"]),
    ],
)
def test_a_long_table_repeats_its_header_in_every_chunk(dialect: str, limits: dict, header: list[str]) -> None:  # type: ignore[type-arg]
    cfg = config(dialect, **limits)
    chunks, _ = text_chunks(long_table(60), cfg)
    texts = [t for c in chunks for t in ([b.text.text for b in c.blocks] if hasattr(c, "blocks") else [c.text])]
    assert len(texts) > 3
    rows = []
    for text in texts:
        lines = text.split("\n")
        assert lines[: len(header)] == header, text
        rows.extend(lines[len(header):])
    assert [r.split("row")[1].split(" ")[0] for r in rows] == [str(i) for i in range(60)]


@pytest.mark.parametrize(
    ("dialect", "limits", "opener"),
    [
        ("dingtalk_md", {"maxMessageSize": 300}, "```python"),
        ("feishu_post", {"maxMessageSize": 300}, "```python"),
        ("wecom_md", {"maxMessageSize": 300}, "```"),
        ("slack_mrkdwn", {"maxMessageSize": 300}, "```"),
        ("plain", {"maxMessageSize": 300}, "```"),
    ],
)
def test_long_code_is_closed_and_reopened_at_every_cut(dialect: str, limits: dict, opener: str) -> None:  # type: ignore[type-arg]
    cfg = config(dialect, **limits)
    chunks, _ = text_chunks("Intro line.\n\n" + long_code(40), cfg)
    texts = [c.text for c in chunks]
    assert texts[0].startswith("Intro line.")
    code_lines = []
    for text in texts:
        lines = text.split("\n")
        if lines[0] == "Intro line.":
            lines = lines[2:]
        assert lines[0] == opener and lines[-1] == "```", text
        code_lines.extend(lines[1:-1])
    assert code_lines == [f"print('line {i}')  # {i * i}" for i in range(40)]


def test_wecom_limit_is_in_utf8_bytes() -> None:
    cfg = config("wecom_md")
    assert cfg.limits.max_message_size == 4096 and cfg.limits.size_unit == "utf8_bytes"
    chunks, _ = text_chunks("这是一个测试句子，包含中文。" * 800, cfg)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk.text.encode()) <= 4096
        assert chunk.text.endswith("。")


def test_slack_defaults_and_block_limits() -> None:
    cfg = config("slack_blocks", maxMessageSize=40_000)
    assert (cfg.limits.max_message_size, cfg.limits.max_section_chars, cfg.limits.max_blocks) == (40_000, 3_000, 50)
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 40 for i in range(200))
    chunks, _ = text_chunks(text, cfg)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk.blocks) <= 50
        assert all(len(b.text.text) <= 3000 for b in chunk.blocks)
        assert all(b.type == "section" and b.text.type == "mrkdwn" for b in chunk.blocks)
        assert len(chunk.text) <= 40_000
    joined = "".join(b.text.text for c in chunks for b in c.blocks)
    assert "".join(joined.split()) == "".join(text.split())


def test_feishu_limits_are_json_bytes_of_the_request() -> None:
    assert config("feishu_card", maxMessageSize=28_000).limits.size_unit == "json_bytes"
    plain = resolve_config(msgspec.convert({"id": "c", "platform": "feishu", "dialect": "plain"}, ChannelConfigUpsertParams), 0)
    assert plain.limits.max_message_size == 148_000
    cfg = config("feishu_card", maxMessageSize=1000)
    text = 'quote " and backslash \\ and newline\n' * 200
    chunks, _ = text_chunks(text, cfg)
    assert all(len(msgspec.json.encode(c.text)) <= 1000 for c in chunks)


def test_unsafe_links_and_images_are_text_only(tmp_path: Path) -> None:
    md = "[click](javascript:alert(1)) ![x](file:///etc/passwd) ![y](data:image/png;base64,AAAA) <https://ok.example>"
    for dialect in DIALECTS:
        rendered = render_markdown(md, DIALECTS[dialect])
        text = "\n".join(line.text for line in rendered.lines)
        assert "javascript:" not in text and "/etc/passwd" not in text and "data:" not in text
        assert rendered.media == []
    store = AttachmentStore(tmp_path)
    inside = store.root / "pic.png"
    store.root.mkdir(parents=True)
    inside.write_bytes(b"png")
    parts = [
        ImagePart(mime_type="image/png", url="file:///etc/passwd"),
        FilePart(uri=(tmp_path / "secret.txt").as_uri(), name="secret.txt"),
        ImagePart(mime_type="image/png", url=inside.as_uri()),
        FilePart(uri="https://files.example/report.pdf", name="report.pdf", mime_type="application/pdf"),
    ]
    chunks = as_json(compose("Here.", parts, config("plain"), store))
    assert chunks[1:] == [
        {"type": "image", "url": inside.as_uri(), "mimeType": "image/png", "alt": None},
        {"type": "file", "uri": "https://files.example/report.pdf", "name": "report.pdf", "mimeType": "application/pdf"},
    ]


def test_citations_become_numbered_footnotes() -> None:
    body, notes = extract_footnotes("Claim[^a] and more[^b].\n\n[^a]: First source\n[^b]: Second\n    continued\n\n```\n[^c]: in code\n```")
    assert notes == {"a": "First source", "b": "Second continued"}
    assert "[^c]: in code" in body
    rendered = render_markdown("Claim[^a], [site](https://s.example), again[^a].\n\n[^a]: Source A", DIALECTS["plain"])
    lines = [line.text for line in rendered.lines]
    assert lines[0] == "Claim[1], site [2], again[1]."
    assert lines[-2:] == ["[1] Source A", "[2] https://s.example"]


def test_an_unclosed_fence_is_closed_and_fence_lookalikes_are_defused() -> None:
    rendered = render_markdown("text\n\n```js\nlet a = 1\n", DIALECTS["feishu_card"])
    assert [line.text for line in rendered.lines] == ["text", "", "```js", "let a = 1", "```"]
    rendered = render_markdown("`````\n```\ninner\n````\n`````", DIALECTS["plain"])
    texts = [line.text for line in rendered.lines]
    assert texts == ["`````", "```", "inner", "````", "`````"]  # the marker outgrows the lines inside
    rendered = render_markdown("\\```not a fence", DIALECTS["dingtalk_md"])
    assert rendered.lines[0].text == "\u200b```not a fence"
