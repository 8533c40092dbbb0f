"""Outbound mentions: a reply cannot mention people unless its channel allows it.

Owns ``neutralize`` and ``neutralize_rendered``. A reply is model output: without
``allowMentions`` on its channel, nothing in it may make a platform notify someone. These
are written so that no platform reads them as a mention, yet they read the same:

- mention tags: Feishu/Lark ``<at user_id="...">``, ``<at id=all>`` (any ``<at ...>``),
  Slack and WeCom ``<@U123>``, Slack ``<!here>``, ``<!channel>``, ``<!everyone>``,
  ``<!subteam^...>`` (any ``<!`` before a letter): the ``<`` becomes a full-width ``＜``;
- broadcast words not inside a Latin word (``bob@here.example`` is an address):
  ``@all``, ``@_all``, ``@everyone``, ``@here``, ``@channel``, ``@所有人``, ``@全体成员``
  (also with a CJK character right before or after): the ``@`` becomes a
  full-width ``＠`` (DingTalk, WeCom and WeChat hosts, and Slack with ``link_names``,
  turn these words into mentions).
- on Telegram (``names``), where a bot's ``@username`` in a message notifies that user,
  every ``@`` before a letter, not inside a Latin word: the ``@`` becomes ``＠``.
Elsewhere a plain ``@name`` is left alone: no other platform notifies anyone for it unless
the host adds the person to the message's mention list itself (Discord's sends also say
``allowed_mentions: {parse: []}``).

The replacements keep the number of characters, so the renderer's atoms (ranges of a line
not to cut inside) stay valid; they run on the rendered lines, table headers and image
captions, after the Markdown is rendered (markup could otherwise assemble a tag, as
``<*at*`` does in a dialect without italics) and before the lines are split (so the sizes
are measured on what is sent).
"""

from __future__ import annotations

import re

from sidecar.channels.render import Rendered
from sidecar.channels.split import Table

__all__ = ["neutralize", "neutralize_rendered"]

_TAG = re.compile(r"<(?=\s*(?:at\b|@|![A-Za-z]))", re.IGNORECASE)
# after anything but a Latin letter or digit (Chinese text has no spaces around a mention)
_BROADCAST = re.compile(
    r"(?<![A-Za-z0-9_])@(?=(?:all|_all|everyone|here|channel)(?![A-Za-z0-9_])|所有人|全体成员)", re.IGNORECASE
)


_NAME = re.compile(r"(?<![A-Za-z0-9_])@(?=[A-Za-z])")


def neutralize(text: str, *, names: bool = False) -> str:
    """``text`` with every mention tag and broadcast word (with ``names``: every
    ``@username``) made inert (same length)."""
    if "<" not in text and "@" not in text:
        return text
    text = _BROADCAST.sub("＠", _TAG.sub("＜", text))
    return _NAME.sub("＠", text) if names else text


def neutralize_rendered(rendered: Rendered, *, names: bool = False) -> None:
    """Neutralize, in place, what a rendered reply sends as text."""
    tables: dict[int, Table] = {}
    for line in rendered.lines:
        line.text = neutralize(line.text, names=names)
        if line.table is not None:
            tables[id(line.table)] = line.table
    for table in tables.values():
        table.header = tuple(neutralize(h, names=names) for h in table.header)
    for media in rendered.media:
        if media.alt:
            media.alt = neutralize(media.alt, names=names)
