"""What every platform adapter shares: mention resolution, emoji codes, the adapter result.

Owns: ``Mentions`` (which mention is the bot, how a mention is written in the user turn),
``PlatformText`` (what an adapter returns), ``slack_emoji``/``feishu_emoji`` and the
``@name`` handling of platforms that write mentions as plain text (DingTalk, WeCom, WeChat,
plain hosts). Must stay true: an adapter never raises on malformed markup: what it cannot
read stays in the text as it came.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from protocol.channels import ChannelMention
from sidecar.untrusted import escape

__all__ = [
    "Mentions",
    "PlatformText",
    "slack_emoji",
    "feishu_emoji",
    "resolve_plain_mentions",
    "decode_json_text",
    "as_dict",
    "as_list",
    "as_str",
    "MAX_WALK_DEPTH",
]

MAX_WALK_DEPTH = 32
_ALL_WORDS = ("@all", "@所有人", "@everyone", "@here", "@channel")


@dataclass(slots=True)
class PlatformText:
    text: str
    quote: str | None = None
    """The quoted message's text, when the platform puts it inside the message itself."""
    quote_sender: str | None = None


class Mentions:
    """The mentions of one message; records whether the bot and @all were mentioned."""

    def __init__(self, mentions: list[ChannelMention], bot_ids: list[str]) -> None:
        self.items = list(mentions)
        self.bot_ids = set(bot_ids)
        self.by_key = {m.key: m for m in self.items if m.key}
        self.by_id = {m.id: m for m in self.items}
        self.bot = any(self.is_self(m) for m in self.items)
        self.all = False

    def is_self(self, mention: ChannelMention) -> bool:
        return mention.is_self or mention.id in self.bot_ids

    def add(self, mention: ChannelMention) -> None:
        """A mention found in the platform payload (not in the host's list)."""
        if mention.id in self.by_id:
            return
        self.items.append(mention)
        self.by_id[mention.id] = mention
        if mention.key:
            self.by_key.setdefault(mention.key, mention)
        self.bot = self.bot or self.is_self(mention)

    def write(self, mention_id: str | None, name: str | None = None) -> str:
        """How a mention reads in the user turn: "" for the bot (it is being addressed, which
        the turn says anyway), ``@name`` for anyone else, ``@all`` for everyone. The name (an
        entry of the mention list, or a mention tag's label) is another person's display
        name: it is written as untrusted text (sidecar/untrusted.py), on one line."""
        if mention_id in ("all", "@all", "everyone"):
            self.all = True
            return "@all"
        known = self.by_id.get(mention_id or "")
        if known is not None and self.is_self(known) or (mention_id in self.bot_ids):
            self.bot = True
            return ""
        label = name or (known.name if known else None) or mention_id or "someone"
        return "@" + escape(label.lstrip("@"))


def resolve_plain_mentions(text: str, mentions: Mentions) -> str:
    """Platforms that write mentions as ``@Name`` text: the bot's mention is taken out, keys
    (``@_user_1``) become ``@Name``, and @all words are noticed."""
    for mention in mentions.items:
        if mention.key and mention.key in text:
            text = text.replace(mention.key, mentions.write(mention.id, mention.name))
    for mention in mentions.items:
        if mentions.is_self(mention) and mention.name:
            text = re.sub(re.escape("@" + mention.name.lstrip("@")) + r"[ \t\u2005\u00a0]?", "", text)
    lowered = text.lower()
    if any(word in lowered for word in _ALL_WORDS):
        mentions.all = True
    return text


def decode_json_text(value: Any) -> Any:
    """Feishu gives ``content`` as a JSON string; anything that does not decode stays as is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        import msgspec

        try:
            return msgspec.json.decode(value)
        except (msgspec.DecodeError, RecursionError):
            return value
    return value


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


_SLACK_EMOJI = {
    "smile": "😄", "slightly_smiling_face": "🙂", "grinning": "😀", "joy": "😂", "laughing": "😆",
    "wink": "😉", "heart": "❤️", "+1": "👍", "thumbsup": "👍", "-1": "👎", "thumbsdown": "👎",
    "ok_hand": "👌", "pray": "🙏", "tada": "🎉", "fire": "🔥", "eyes": "👀", "white_check_mark": "✅",
    "heavy_check_mark": "✔️", "x": "❌", "warning": "⚠️", "rocket": "🚀", "thinking_face": "🤔",
    "wave": "👋", "clap": "👏", "100": "💯", "sob": "😭", "cry": "😢", "sweat_smile": "😅",
    "raised_hands": "🙌", "muscle": "💪", "star": "⭐", "sparkles": "✨", "bulb": "💡",
    "question": "❓", "exclamation": "❗", "smiley": "😃", "confused": "😕", "see_no_evil": "🙈",
}
_SLACK_CODE = re.compile(r":([a-z0-9_+'-]{1,64}):(?::skin-tone-[2-6]:)?")

_FEISHU_EMOJI = {
    "SMILE": "😊", "LAUGH": "😄", "THUMBSUP": "👍", "OK": "👌", "HEART": "❤️", "CLAP": "👏",
    "APPLAUSE": "👏", "FIRE": "🔥", "DONE": "✅", "THANKS": "🙏", "PARTY": "🎉", "CRY": "😢",
    "WAVE": "👋", "JIAYI": "+1", "MUSCLE": "💪", "FINGERHEART": "🫰", "SURPRISED": "😮",
    "THINKING": "🤔", "WINK": "😉", "LOVE": "😍", "ROSE": "🌹", "BEER": "🍺", "CAKE": "🎂",
    "GIFT": "🎁", "CHECK": "✅", "CROSSMARK": "❌", "ERROR": "❌", "SOB": "😭", "SHY": "😳",
}


def slack_emoji(text: str) -> str:
    """``:tada:`` -> 🎉 for the common shortcodes; unknown ones stay as written."""
    return _SLACK_CODE.sub(lambda m: _SLACK_EMOJI.get(m.group(1), m.group(0)), text)


def feishu_emoji(emoji_type: str) -> str:
    """A Feishu ``emotion`` element: its emoji, or ``:TYPE:`` (Feishu's own text form)."""
    return _FEISHU_EMOJI.get(emoji_type.upper(), f":{emoji_type}:") if emoji_type else ""
