"""Input adaptation per platform: mentions, @all, emoji codes, quoted replies, rich-text posts
and cards, Slack blocks -> a user turn that says who spoke; attachments -> parts; malformed
markup stays text and never raises."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from protocol.channels import ChannelConfigUpsertParams, ChannelMessageParams
from protocol.types import FilePart, ImagePart, TextPart
from sidecar.channels.inbound import adapt
from sidecar.channels.platforms import resolve_config
from sidecar.errors import InvalidParams


def run(platform: str, chat_type: str = "group", bot: tuple[str, ...] = ("BOT",), **fields: Any):  # type: ignore[no-untyped-def]
    config = resolve_config(
        msgspec.convert({"id": "c", "platform": platform, "botUserIds": list(bot)}, ChannelConfigUpsertParams), 0
    )
    params = msgspec.convert(
        {"channel": "c", "chatId": "chat", "chatType": chat_type, "sender": {"id": "u1", "name": "Alice"},
         "timestamp": 1, **fields},
        ChannelMessageParams,
    )
    return adapt(params, config)


def test_feishu_text_with_mention_keys_and_all() -> None:
    a = run(
        "feishu",
        text="@_user_1 ask @_user_2 about it @_all",
        mentions=[{"id": "BOT", "key": "@_user_1", "name": "Helper"}, {"id": "ou_b", "key": "@_user_2", "name": "Bob"}],
    )
    assert a.mentions_bot and a.mentions_all
    assert a.body == "ask @Bob about it @all"
    assert a.turn.content == '"Alice": ask @Bob about it @all'


def test_feishu_raw_message_object_with_its_own_mentions() -> None:
    raw = {
        "message_type": "text",
        "content": json.dumps({"text": "@_user_1 hi [微笑]"}),
        "mentions": [{"key": "@_user_1", "id": {"open_id": "BOT", "user_id": "x"}, "name": "Helper"}],
    }
    a = run("feishu", raw=raw)
    assert a.mentions_bot and a.body == "hi [微笑]"


def test_feishu_at_tags_and_malformed_ones() -> None:
    a = run("feishu", text='<at user_id="BOT">Helper</at> hello <at user_id="ou_c">Carol</at> and <at id=all></at>')
    assert a.mentions_bot and a.mentions_all and a.body == "hello @Carol and @all"
    broken = run("feishu", text='<at user_id="ou_c">Carol hi @_user_9 <at id=', mentions=[])
    assert not broken.mentions_bot
    assert broken.body == '<at user_id="ou_c">Carol hi @_user_9 <at id='


def test_feishu_post_rich_text() -> None:
    content = {
        "zh_cn": {
            "title": "周报",
            "content": [
                [{"tag": "at", "user_id": "BOT", "user_name": "Helper"}, {"tag": "text", "text": " 请看", "style": ["bold"]},
                 {"tag": "a", "text": "文档", "href": "https://doc.example"}],
                [{"tag": "img", "image_key": "img_1"}],
                [{"tag": "emotion", "emoji_type": "THUMBSUP"}, {"tag": "emotion", "emoji_type": "NEWTHING"}],
                [{"tag": "code_block", "language": "PYTHON", "text": "print(1)"}],
            ],
        }
    }
    a = run("feishu", raw={"message_type": "post", "content": json.dumps(content, ensure_ascii=False)})
    assert a.mentions_bot
    assert a.body == "**周报**\n** 请看**[文档](https://doc.example)\n[image]\n👍:NEWTHING:\n\n```python\nprint(1)\n```"


def test_feishu_card_text_in_order() -> None:
    card = {
        "schema": "2.0",
        "header": {"title": {"tag": "plain_text", "content": "Deploy"}},
        "body": {"elements": [
            {"tag": "markdown", "content": "**ok** on prod"},
            {"tag": "div", "text": {"tag": "lark_md", "content": "by <at id=BOT></at>"}},
            {"tag": "img", "img_key": "k"},
            {"tag": "column_set", "columns": [{"elements": [{"tag": "markdown", "content": "left"}]}]},
        ]},
    }
    a = run("feishu", chat_type="private", raw={"message_type": "interactive", "content": card})
    assert a.body == "Deploy\n**ok** on prod\nby\n[image]\nleft"
    assert a.turn.content == a.body  # private chat: no speaker prefix
    received = {"title": "Alert", "elements": [[{"tag": "text", "text": "disk full"}]]}
    assert run("feishu", raw={"message_type": "interactive", "content": received}).body == "**Alert**\ndisk full"


def test_slack_markup() -> None:
    a = run(
        "slack",
        text="<@BOT> ping <@U2|bob> in <#C1|general> <!here> see <https://x.example|the doc> &amp; :tada: :+1::skin-tone-3: :nope:",
    )
    assert a.mentions_bot and a.mentions_all
    assert a.body == "ping @bob in #general @here see [the doc](https://x.example) & 🎉 👍 :nope:"


def test_slack_rich_text_blocks() -> None:
    raw = {"text": "ignored when blocks exist", "blocks": [{"type": "rich_text", "elements": [
        {"type": "rich_text_section", "elements": [
            {"type": "user", "user_id": "BOT"}, {"type": "text", "text": " fix "},
            {"type": "text", "text": "this", "style": {"bold": True}}, {"type": "emoji", "name": "fire", "unicode": "1f525"},
            {"type": "link", "url": "https://l.example", "text": "log"}, {"type": "broadcast", "range": "channel"},
        ]},
        {"type": "rich_text_list", "style": "ordered", "elements": [
            {"type": "rich_text_section", "elements": [{"type": "text", "text": "one"}]},
            {"type": "rich_text_section", "elements": [{"type": "text", "text": "two"}]},
        ]},
        {"type": "rich_text_preformatted", "elements": [{"type": "text", "text": "x = 1"}]},
        {"type": "rich_text_quote", "elements": [{"type": "text", "text": "quoted"}]},
        {"type": "rich_text_section", "elements": [{"type": "emoji", "name": "bad", "unicode": "zzzz"}]},
    ]}]}
    a = run("slack", raw=raw)
    assert a.mentions_bot and a.mentions_all
    assert a.body == "fix **this**🔥[log](https://l.example)@channel\n1. one\n2. two\n```\nx = 1\n```\n> quoted\n:bad:"


def test_dingtalk_callback_bodies() -> None:
    a = run("dingtalk", raw={"msgtype": "text", "text": {"content": "@Helper 你好 @Bob"}, "isInAtList": True},
            mentions=[{"id": "BOT", "name": "Helper"}])
    assert a.mentions_bot and a.body == "你好 @Bob"
    rich = run("dingtalk", raw={"msgtype": "richText", "content": {"richText": [{"text": "看图"}, {"type": "picture", "downloadCode": "d"}]}})
    assert rich.body == "看图[image]" and not rich.mentions_bot
    voice = run("dingtalk", raw={"msgtype": "audio", "content": {"recognition": "语音转文字"}})
    assert voice.body == "语音转文字"
    everyone = run("dingtalk", text="@所有人 开会")
    assert everyone.mentions_all and not everyone.mentions_bot


def test_wecom_mixed_and_quote() -> None:
    raw = {"msgtype": "mixed", "mixed": {"msg_item": [
        {"msgtype": "text", "text": {"content": "@Helper 看这个"}}, {"msgtype": "image", "image": {"url": "u"}},
    ]}, "quote": {"msgtype": "text", "text": {"content": "原来的消息"}}}
    a = run("wecom", raw=raw, mentions=[{"id": "BOT", "name": "Helper"}])
    assert a.mentions_bot
    assert a.turn.content == '> 原来的消息\n\n"Alice": 看这个\n[image]'


def test_wechat_quote_mentions_and_emoji() -> None:
    text = "「Bob：上次的报价」\n- - - - - - - - - - - - - - -\n@Helper\u2005多少钱/::)"
    a = run("wechat", text=text, mentions=[{"id": "BOT", "name": "Helper"}])
    assert a.mentions_bot
    assert a.turn.content == '> "Bob": 上次的报价\n\n"Alice": 多少钱[微笑]'


def test_quoted_reply_from_the_host_is_written_first_and_bounded() -> None:
    a = run("plain", text="yes", replyTo={"messageId": "m0", "text": "x" * 2000, "senderName": "Bob"})
    content = a.turn.content
    assert isinstance(content, str) and content.startswith('> "Bob": xxx') and content.endswith('\n\n"Alice": yes')
    assert len(content.split("\n\n")[0]) < 520


def test_attachments_become_parts() -> None:
    a = run(
        "plain", chat_type="private", text="look",
        attachments=[
            {"kind": "image", "url": "https://img.example/a.jpg"},
            {"kind": "file", "url": "https://f.example/r.pdf", "name": "r.pdf"},
            {"kind": "image", "data": "aGVsbG8=", "name": "b.png"},
        ],
    )
    assert a.turn.content == [
        TextPart(text="look"),
        ImagePart(mime_type="image/jpeg", url="https://img.example/a.jpg"),
        FilePart(uri="https://f.example/r.pdf", mime_type="application/pdf", name="r.pdf"),
    ]
    assert a.turn.attachments is not None and a.turn.attachments[0].mime_type == "image/png"
    image_only = run("plain", attachments=[{"kind": "image", "url": "https://img.example/a.jpg"}])
    assert not image_only.empty and image_only.turn.content[0] == TextPart(text='"Alice":')  # type: ignore[index]


@pytest.mark.parametrize(
    "attachment",
    [{"kind": "image"}, {"kind": "image", "url": "file:///etc/passwd"}, {"kind": "file", "url": "https://a", "data": "AA=="}],
)
def test_unusable_attachments_are_invalid_params(attachment: dict[str, str]) -> None:
    with pytest.raises(InvalidParams, match="attachments"):
        run("plain", attachments=[attachment])


def test_the_bot_mentioned_only_by_id_and_empty_messages() -> None:
    a = run("plain", text="@Helper", mentions=[{"id": "x", "name": "Helper", "isSelf": True}])
    assert a.mentions_bot and a.empty


@pytest.mark.parametrize("platform", ["feishu", "lark", "dingtalk", "wecom", "wechat", "slack", "plain"])
@pytest.mark.parametrize(
    "raw",
    [
        {"message_type": "post", "content": "{not json"},
        {"message_type": "interactive", "content": [[[[{"tag": "text"}]]]]},
        {"msgtype": "richText", "content": {"richText": "nope"}},
        {"blocks": [{"type": "rich_text", "elements": [{"type": "rich_text_list", "indent": "x", "elements": 5}]}]},
        {"msgtype": "mixed", "mixed": {"msg_item": [None, 3, {"msgtype": "text", "text": None}]}},
        {"text": None, "content": {"text": 7}},
    ],
)
def test_malformed_raw_payloads_never_raise(platform: str, raw: dict[str, Any]) -> None:
    a = run(platform, text="fallback <@U1 [^", raw=raw)
    assert isinstance(a.body, str)


def test_bots_and_host_flagged_all_are_written_into_the_turn() -> None:
    a = run("plain", text="status?", sender={"id": "b2", "name": "Deploy", "isBot": True}, mentionAll=True)
    assert a.turn.content == '"Deploy" (bot): @all status?' and a.mentions_all and not a.mentions_bot


def test_a_quote_known_to_the_sidecar_is_used_when_the_host_gives_no_text() -> None:
    config = resolve_config(msgspec.convert({"id": "c", "platform": "plain"}, ChannelConfigUpsertParams), 0)
    params = msgspec.convert(
        {"channel": "c", "chatId": "chat", "chatType": "private", "sender": {"id": "u1"}, "timestamp": 1,
         "text": "and this?", "replyTo": {"messageId": "pm"}},
        ChannelMessageParams,
    )
    assert adapt(params, config, "the earlier answer").turn.content == "> the earlier answer\n\nand this?"
