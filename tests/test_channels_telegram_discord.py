"""Telegram and Discord: the inbound adapters (Telegram entities in UTF-16 offsets, mentions,
bot commands, replies, media; Discord markup, replies, attachments), the two dialects (a
golden reply each) and, for any Markdown, Telegram MarkdownV2 chunks that Telegram's parser
accepts (checked by a validator written from the Bot API's "MarkdownV2 style" rules), within
4,096 UTF-16 units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from protocol.channels import ChannelConfig, ChannelConfigUpsertParams, ChannelMessageParams, ReplyTextChunk
from sidecar.channels.compose import compose, text_chunks
from sidecar.channels.inbound import adapt
from sidecar.channels.platforms import resolve_config
from sidecar.store.attachments import AttachmentStore
from test_channels_render import DOC, as_json
from test_channels_split_property import document

SPECIAL = set("_*[]()~`>#+-=|{}.!")


def config(platform: str, **fields: Any) -> ChannelConfig:
    return resolve_config(msgspec.convert({"id": "c", "platform": platform, **fields}, ChannelConfigUpsertParams), 0)


def message(platform: str, raw: dict[str, Any], *, group: bool = True, **fields: Any) -> ChannelMessageParams:
    return msgspec.convert(
        {
            "channel": "c", "chatId": "-100", "chatType": "group" if group else "private",
            "sender": {"id": "7", "name": "Alice"}, "timestamp": 1, "raw": raw, **fields,
        },
        ChannelMessageParams,
    )


class MarkdownV2Error(Exception):
    pass


def check_markdown_v2(text: str) -> None:
    """Raise MarkdownV2Error where Telegram's MarkdownV2 parser would refuse ``text``
    ("can't parse entities"): an unescaped special character outside the markup, an
    entity left open, a bad escape inside code, a quote marker not at a line start."""
    open_marks: list[str] = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 >= n or not 1 <= ord(text[i + 1]) <= 126:
                raise MarkdownV2Error(f"a backslash before {text[i + 1:i + 2]!r} at {i}")
            i += 2
            line_start = False
            continue
        if text.startswith("```", i):
            end = i + 3
            while end < n and text[end] != "\n":
                end += 1  # the language
            j = end
            while True:
                if j >= n:
                    raise MarkdownV2Error(f"a pre block opened at {i} is not closed")
                if text[j] == "\\":
                    if j + 1 >= n or text[j + 1] not in "`\\":
                        raise MarkdownV2Error(f"a bad escape in pre at {j}")
                    j += 2
                    continue
                if text.startswith("```", j):
                    break
                if text[j] == "`":
                    raise MarkdownV2Error(f"an unescaped backtick in pre at {j}")
                j += 1
            i = j + 3
            line_start = False
            continue
        if ch == "`":
            j = i + 1
            while True:
                if j >= n:
                    raise MarkdownV2Error(f"inline code opened at {i} is not closed")
                if text[j] == "\\":
                    if j + 1 >= n or text[j + 1] not in "`\\":
                        raise MarkdownV2Error(f"a bad escape in code at {j}")
                    j += 2
                    continue
                if text[j] == "`":
                    break
                j += 1
            i = j + 1
            line_start = False
            continue
        if ch == ">" and line_start:
            i += 1
            line_start = False
            continue
        if ch == "[":
            open_marks.append("[")
        elif ch == "]":
            if not open_marks or open_marks[-1] != "[" or text[i + 1:i + 2] != "(":
                raise MarkdownV2Error(f"an unescaped ] at {i}")
            open_marks.pop()
            j = i + 2
            while True:
                if j >= n:
                    raise MarkdownV2Error(f"a link URL opened at {i} is not closed")
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == ")":
                    break
                j += 1
            i = j + 1
            line_start = False
            continue
        elif ch in "*_~":
            mark = "__" if text.startswith("__", i) else ch
            if open_marks and open_marks[-1] == mark:
                open_marks.pop()
            elif mark in open_marks:
                raise MarkdownV2Error(f"{mark!r} closed across another entity at {i}")
            else:
                open_marks.append(mark)
            i += len(mark)
            line_start = False
            continue
        elif ch == "|" and text.startswith("||", i):
            if open_marks and open_marks[-1] == "||":
                open_marks.pop()
            else:
                open_marks.append("||")
            i += 2
            continue
        elif ch in SPECIAL:
            raise MarkdownV2Error(f"an unescaped {ch!r} at {i}: {text[max(0, i - 20):i + 20]!r}")
        line_start = ch == "\n"
        i += 1
    if open_marks:
        raise MarkdownV2Error(f"entities left open: {open_marks}")


def test_the_validator_catches_what_telegram_refuses() -> None:
    for bad in ("a.b", "1. x", "(x)", "*open", "`code", "```\nno end", "a > b", "[x](y", "\\q\\", "x - y"):
        with pytest.raises(MarkdownV2Error):
            check_markdown_v2(bad)
    check_markdown_v2("*a* _b_ ~c~ `d\\`` [e](https://x.y/\\)) \\> no\n> quote \\. \\(x\\)")


GOLDEN = {
    "telegram": [
        {'type': 'text', 'text': '*Release notes*\n\nThe *new* build is _faster_ and ~slower~ at [the docs](https://example.com/docs) for `x < y & z`\\.\nSee the chart chart and the paper\\[1\\]\\.\n\n• fixed the splitter\n• kept *tables* whole\n\n> quoted line one\n> quoted line two', 'format': 'telegram_md'},
        {'type': 'text', 'text': '*name* \\| *value*\nalpha \\| 1\nbeta \\| 2\ngamma \\| 3\ndelta \\| 4\n\n```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！\n\n\\[1\\] Smith et al\\., https://example\\.com/paper', 'format': 'telegram_md'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
    "discord": [
        {'type': 'text', 'text': '## Release notes\n\nThe **new** build is *faster* and ~~slower~~ at [the docs](https://example.com/docs) for `x < y & z`.\nSee the chart chart and the paper[1].\n\n- fixed the splitter\n- kept **tables** whole\n\n> quoted line one\n> quoted line two', 'format': 'discord_md'},
        {'type': 'text', 'text': '**name** | **value**\nalpha | 1\nbeta | 2\ngamma | 3\ndelta | 4\n\n```python\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nprint(add(3, 4))\n```\n\n中文段落：这是一个用来测试的句子。第二句也在这里！\n\n[1] Smith et al., https://example.com/paper', 'format': 'discord_md'},
        {'type': 'image', 'url': 'https://example.com/c.png', 'mimeType': None, 'alt': 'chart'},
    ],
}


@pytest.mark.parametrize("platform", sorted(GOLDEN))
def test_golden_reply(platform: str, tmp_path: Path) -> None:
    chunks = compose(DOC, None, config(platform, limits={"maxMessageSize": 256}), AttachmentStore(tmp_path))
    assert as_json(chunks) == GOLDEN[platform]
    if platform == "telegram":
        for chunk in chunks:
            if isinstance(chunk, ReplyTextChunk):
                check_markdown_v2(chunk.text)


def test_platform_defaults_and_utf16_limits() -> None:
    telegram, discord = config("telegram"), config("discord")
    assert (telegram.dialect, telegram.limits.max_message_size, telegram.limits.size_unit) == (
        "telegram_md", 4096, "utf16_units"
    )
    assert (discord.dialect, discord.limits.max_message_size, discord.limits.size_unit) == (
        "discord_md", 2000, "utf16_units"
    )
    assert telegram.can_edit and discord.can_edit
    assert (telegram.rate.chat_messages_per_minute, telegram.rate.group_messages_per_minute) == (60, 20)
    # an emoji outside the BMP is two UTF-16 units: 1,500 of them are 3,000 units
    chunks, _ = text_chunks("😀" * 1500, discord)
    assert len(chunks) == 2
    assert all(len(c.text.encode("utf-16-le")) // 2 <= 2000 for c in chunks if isinstance(c, ReplyTextChunk))


def test_telegram_mentions_of_people_notify_nobody_unless_allowed() -> None:
    chunks, _ = text_chunks("ask @alice or @everyone, mail bob@example.com", config("telegram"))
    text = chunks[0].text  # type: ignore[union-attr]
    assert "＠alice" in text and "＠everyone" in text and "bob@example" in text
    chunks, _ = text_chunks("ask @alice", config("telegram", allowMentions=True))
    assert "@alice" in chunks[0].text  # type: ignore[union-attr]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(doc=document, limit=st.integers(256, 4096))
@example(doc="- >0", limit=256)  # a quote in a list item: its '>' is not at a line start
def test_every_telegram_chunk_parses_as_markdown_v2(doc: str, limit: int) -> None:
    chunks, _ = text_chunks(doc, config("telegram", limits={"maxMessageSize": limit}))
    for chunk in chunks:
        assert isinstance(chunk, ReplyTextChunk)
        assert len(chunk.text.encode("utf-16-le", "surrogatepass")) // 2 <= limit
        check_markdown_v2(chunk.text)


# ---- inbound ---------------------------------------------------------------------------


def test_telegram_entities_mentions_commands_and_a_reply_to_the_bot() -> None:
    text = "@MyBot please /new@MyBot see 😀 this bold code @carol"
    raw = {
        "message_id": 5, "chat": {"id": -100, "type": "supergroup"}, "from": {"id": 7, "first_name": "Alice"},
        "text": text,
        "entities": [
            {"type": "mention", "offset": 0, "length": 6},
            {"type": "bot_command", "offset": 14, "length": 10},
            {"type": "bold", "offset": 37, "length": 4},  # after the emoji: UTF-16 offsets
            {"type": "code", "offset": 42, "length": 4},
            {"type": "mention", "offset": 47, "length": 6},
        ],
    }
    adapted = adapt(message("telegram", raw, text=text), config("telegram", botUserIds=["42", "MyBot"]))
    assert adapted.mentions_bot
    assert adapted.body == "please /new see 😀 this **bold** `code` @carol"

    reply = {
        "update_id": 9, "message": {
            "message_id": 6, "from": {"id": 7, "first_name": "Alice"}, "chat": {"id": -100, "type": "group"},
            "text": "and this?", "reply_to_message": {
                "message_id": 3, "from": {"id": 42, "is_bot": True, "first_name": "Helper"}, "text": "an earlier answer",
            },
        },
    }
    adapted = adapt(message("telegram", reply), config("telegram", botUserIds=["42"]))
    assert adapted.mentions_bot  # a reply to the bot addresses it
    assert adapted.turn.content == '> "Helper": an earlier answer\n\n"Alice": and this?'


def test_telegram_links_pre_blocks_and_media_placeholders() -> None:
    text = "see docs\nx = 1"
    raw = {
        "caption": text, "photo": [{"file_id": "a", "width": 90}, {"file_id": "b", "width": 800}],
        "caption_entities": [
            {"type": "text_link", "offset": 4, "length": 4, "url": "https://example.com/d"},
            {"type": "pre", "offset": 9, "length": 5, "language": "python"},
            {"type": "text_link", "offset": 0, "length": 3, "url": "javascript:alert(1)"},
        ],
    }
    adapted = adapt(message("telegram", raw, group=False), config("telegram"))
    assert adapted.body == "[photo]\nsee [docs](https://example.com/d)\n```python\nx = 1\n```"
    document = {"document": {"file_id": "d", "file_name": "report.pdf"}, "caption": "read it"}
    assert adapt(message("telegram", document, group=False), config("telegram")).body == "[document: report.pdf]\nread it"


@pytest.mark.parametrize("raw", [
    {"text": "hi", "entities": [{"type": "bold", "offset": 1, "length": 99}, {"type": "mention", "offset": "x"}]},
    {"text": "😀x", "entities": [{"type": "bold", "offset": 1, "length": 1}]},  # inside a surrogate pair
    {"text": 5, "entities": "nope", "reply_to_message": "nope", "photo": {"a": 1}},
    {"update_id": 1, "message": {"text": "ok", "entities": [None, 3, {"type": None}]}},
])
def test_malformed_telegram_payloads_never_raise(raw: dict[str, Any]) -> None:
    adapt(message("telegram", raw, text="fallback"), config("telegram"))


def test_discord_markup_mentions_and_a_reply() -> None:
    raw = {
        "id": "111", "channel_id": "222", "guild_id": "333", "author": {"id": "7", "username": "alice"},
        "content": "<@42> hi <@!55> and <@&9> in <#10> :) <:party:123> at <t:0:R> @everyone",
        "mentions": [{"id": "42", "username": "helper", "bot": True}, {"id": "55", "username": "bob", "member": {"nick": "Bobby"}}],
        "mention_everyone": True,
        "attachments": [{"id": "1", "filename": "a.png", "url": "https://cdn.example/a.png"}],
        "referenced_message": {"id": "100", "author": {"id": "42", "username": "helper"}, "content": "the <@55> answer"},
    }
    adapted = adapt(message("discord", raw), config("discord", botUserIds=["42"]))
    assert adapted.mentions_bot and adapted.mentions_all
    assert adapted.body == (
        "[attachment: a.png]\nhi @Bobby and @role in #channel :) :party: at 1970-01-01 00:00 UTC @everyone"
    )
    assert isinstance(adapted.turn.content, str)
    assert adapted.turn.content.startswith('> "helper": the @55 answer\n\n"Alice": [attachment: a.png]')


@pytest.mark.parametrize("raw", [
    {"content": None, "mentions": "x", "referenced_message": 3},
    {"content": "<t:99999999999999>", "mentions": [None, {"id": 5}], "attachments": [3]},
])
def test_malformed_discord_payloads_never_raise(raw: dict[str, Any]) -> None:
    adapt(message("discord", raw, text="fallback"), config("discord"))


@pytest.mark.parametrize("update", [
    {}, {"message": None}, {"message": {"chat": {"id": "x", "type": "private"}}},
    {"message": {"chat": {"id": 1, "type": "channel"}, "from": {"id": 2}}},
    {"message": {"chat": {"id": 1, "type": "group"}, "from": {"id": "2"}, "text": 5}},
    {"message": {"chat": {"id": 1, "type": "supergroup"}, "from": {"id": 2}, "date": "soon", "message_thread_id": "t",
                 "is_topic_message": True, "photo": "x"}},
])
def test_malformed_platform_updates_become_nothing_or_a_valid_message(update: dict[str, Any]) -> None:
    from sidecar.channels.connections import discord, slack, telegram

    for params in (
        telegram.to_params("c", update, []),
        discord.to_params("c", update.get("message") or {}, {}),
        slack.to_params("c", update.get("message") or {}, []),
    ):
        if params is not None:
            assert msgspec.convert(msgspec.to_builtins(params), ChannelMessageParams) == params
    good = telegram.to_params("c", {"message": {"message_id": 9, "chat": {"id": -5, "type": "supergroup", "title": "T"},
                                                "from": {"id": 2, "first_name": "Ann"}, "date": 3, "text": "hi",
                                                "message_thread_id": 44, "is_topic_message": True}}, [])
    assert good is not None and (good.chat_id, good.chat_type, good.thread_id, good.timestamp) == ("-5", "group", "44", 3000)
