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
- plain: no markup; links become footnotes ("text [1]" and "[1] url" at the end), bullets
  "•", quotes "> ", code blocks keep their fences (readable, and they keep code apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.channels import ChannelDialect

__all__ = ["Dialect", "DIALECTS", "slack_escape"]


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _same(text: str) -> str:
    return text


@dataclass(frozen=True, slots=True)
class Dialect:
    name: ChannelDialect
    bold: tuple[str, str] | None
    italic: tuple[str, str] | None
    strike: tuple[str, str] | None
    code: tuple[str, str] | None
    heading: Literal["hashes", "bold", "text"]
    link: Literal["markdown", "slack", "footnote"]
    image: Literal["inline", "media"]
    table: Literal["markdown", "text"]
    bullet: str
    hr: str
    fence_language: bool
    slack: bool = False

    def escape(self, text: str) -> str:
        return slack_escape(text) if self.slack else _same(text)

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
        fence_language=False, slack=True,
    ),
    "slack_blocks": Dialect(
        name="slack_blocks", bold=("*", "*"), italic=("_", "_"), strike=("~", "~"), code=("`", "`"),
        heading="bold", link="slack", image="media", table="text", bullet="• ", hr="───────────",
        fence_language=False, slack=True,
    ),
    "plain": Dialect(
        name="plain", bold=None, italic=None, strike=None, code=None, heading="text", link="footnote",
        image="media", table="text", bullet="• ", hr="──────────", fence_language=False,
    ),
}
