"""The Markdown dialect of each IM platform: which constructs it renders, and how.

Owns: ``DIALECTS``, one ``Dialect`` per ``ChannelDialect``. The renderer (render.py) asks a
Dialect how to write each construct; nothing else knows a platform's syntax.

What the platforms render (their documented Markdown subsets):
- feishu_card: Feishu/Lark card JSON 2.0 rich text: bold, italic, strikethrough, links,
  inline code, code blocks with a language, lists, quotes, tables, rules. Large headings are
  discouraged: headings become bold lines. Images need an uploaded image key, so they are
  sent as separate items.
- feishu_post: the ``md`` element of a post message: as the card, without tables (tables
  become rows of text).
- dingtalk_md: DingTalk robot Markdown: headings, bold, italic, links, images (inline, by
  URL), lists, quotes; code blocks and tables are kept as Markdown. It stays Markdown: it is
  never turned into plain text.
- wecom_md: WeCom robot Markdown: headings, bold, links, inline code, quotes; no italic or
  strikethrough (their text is kept), no tables (rows of text), no images (separate items).
- slack_mrkdwn / slack_blocks: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>``,
  inline code and code blocks (no language), quotes, bullets as "•"; ``&``, ``<``, ``>``
  escaped everywhere; tables become rows of text.
- telegram_md: Telegram MarkdownV2 (the Bot API's "Formatting options"): ``*bold*``,
  ``_italic_``, ``~strike~``, ``[label](url)``, inline code and ``` blocks with a language,
  ``>`` quotes; headings become bold lines, tables rows of text, images separate items.
  Escaping: in text every one of ``_ * [ ] ( ) ~ ` > # + - = | { } . !`` and the backslash
  gets a backslash; inside code and pre only the backtick and the backslash; inside a link's
  ``(...)`` only ``)`` and the backslash. Fences are always three backticks (backticks inside are escaped instead).
- discord_md: Discord Markdown: ``**bold**``, ``*italic*``, ``~~strike~~``, masked links,
  inline code and code blocks with a language, quotes, lists, headings ``#`` to ``###``
  (deeper ones as ``###``); no tables (rows of text), images as separate items.
- plain: no markup; links become footnotes ("text [1]" and "[1] url" at the end), bullets
  "•", quotes "> ", code blocks keep their fences (readable, and they keep code apart).

Every character the renderer writes itself (list numbers, table separators, footnote
markers) goes through ``escape`` too, so a dialect with escaping rules gets them everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from protocol.channels import ChannelDialect

__all__ = ["Dialect", "DIALECTS", "slack_escape", "telegram_escape", "telegram_escape_code", "telegram_escape_url"]


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_TELEGRAM_SPECIAL = re.compile(r"([_*\[\]()~`>#+\-=|{}.!\\])")
_TELEGRAM_CODE = re.compile(r"([`\\])")
_TELEGRAM_URL = re.compile(r"([)\\])")


def telegram_escape(text: str) -> str:
    """MarkdownV2 text: every special character (and the backslash) escaped."""
    return _TELEGRAM_SPECIAL.sub(r"\\\1", text)


def telegram_escape_code(text: str) -> str:
    """MarkdownV2 inside code and pre: backticks and backslashes escaped."""
    return _TELEGRAM_CODE.sub(r"\\\1", text)


def telegram_escape_url(url: str) -> str:
    """MarkdownV2 inside a link's (...): ``)`` and backslashes escaped."""
    return _TELEGRAM_URL.sub(r"\\\1", url)


def _same(text: str) -> str:
    return text


Escape = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class Dialect:
    name: ChannelDialect
    bold: tuple[str, str] | None
    italic: tuple[str, str] | None
    strike: tuple[str, str] | None
    code: tuple[str, str] | None
    heading: Literal["hashes", "bold", "text"]
    link: Literal["markdown", "slack", "footnote", "telegram"]
    image: Literal["inline", "media"]
    table: Literal["markdown", "text"]
    bullet: str
    hr: str
    fence_language: bool
    slack: bool = False
    escape: Escape = _same
    """Text (and what the renderer writes itself)."""
    escape_code: Escape = _same
    """Inside inline code and code blocks."""
    fixed_fence: bool = False
    """Fences are always three backticks (the dialect escapes backticks in code instead)."""
    max_heading: int = 6
    nested_quotes: bool = True
    """False: a quote inside a quote is written at the outer quote's level, and a quote in
    a list item as its text (Telegram's blockquotes cannot nest, and its ``>`` is a quote
    only at the start of a line: anywhere else it would have to be escaped)."""

    def wrap(self, style: tuple[str, str] | None, inner: str) -> str:
        if style is None or not inner.strip():
            return inner
        return f"{style[0]}{inner}{style[1]}"


DIALECTS: dict[str, Dialect] = {
    "feishu_card": Dialect(
        name="feishu_card", bold=("**", "**"), italic=("*", "*"), strike=("~~", "~~"), code=("`", "`"),
        heading="bold", link="markdown", image="media", table="markdown",
        bullet="- ", hr="---", fence_language=True,
    ),
    "feishu_post": Dialect(
        name="feishu_post", bold=("**", "**"), italic=("*", "*"), strike=("~~", "~~"), code=("`", "`"),
        heading="bold", link="markdown", image="media", table="text",
        bullet="- ", hr="---", fence_language=True,
    ),
    "dingtalk_md": Dialect(
        name="dingtalk_md", bold=("**", "**"), italic=("*", "*"), strike=None, code=("`", "`"),
        heading="hashes", link="markdown", image="inline", table="markdown", bullet="- ", hr="---",
        fence_language=True,
    ),
    "wecom_md": Dialect(
        name="wecom_md", bold=("**", "**"), italic=None, strike=None, code=("`", "`"), heading="hashes",
        link="markdown", image="media", table="text", bullet="- ", hr="---", fence_language=False,
    ),
    "slack_mrkdwn": Dialect(
        name="slack_mrkdwn", bold=("*", "*"), italic=("_", "_"), strike=("~", "~"), code=("`", "`"),
        heading="bold", link="slack", image="media", table="text", bullet="• ", hr="───────────",
        fence_language=False, slack=True, escape=slack_escape, escape_code=slack_escape,
    ),
    "slack_blocks": Dialect(
        name="slack_blocks", bold=("*", "*"), italic=("_", "_"), strike=("~", "~"), code=("`", "`"),
        heading="bold", link="slack", image="media", table="text", bullet="• ", hr="───────────",
        fence_language=False, slack=True, escape=slack_escape, escape_code=slack_escape,
    ),
    "telegram_md": Dialect(
        name="telegram_md", bold=("*", "*"), italic=("_", "_"), strike=("~", "~"), code=("`", "`"),
        heading="bold", link="telegram", image="media", table="text", bullet="• ", hr="──────────",
        fence_language=True, escape=telegram_escape, escape_code=telegram_escape_code, fixed_fence=True,
        nested_quotes=False,
    ),
    "discord_md": Dialect(
        name="discord_md", bold=("**", "**"), italic=("*", "*"), strike=("~~", "~~"), code=("`", "`"),
        heading="hashes", link="markdown", image="media", table="text", bullet="- ", hr="──────────",
        fence_language=True, max_heading=3,
    ),
    "plain": Dialect(
        name="plain", bold=None, italic=None, strike=None, code=None, heading="text", link="footnote",
        image="media", table="text", bullet="• ", hr="──────────", fence_language=False,
    ),
}
