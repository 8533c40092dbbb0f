"""Discord messages (gateway ``MESSAGE_CREATE``, a Message object) -> text.

``raw`` is the Message (``content``, ``mentions``, ``mention_everyone``, ``attachments``,
``sticker_items``, ``message_reference``, ``referenced_message``). Its ``content`` is Discord
Markdown already, kept as written, except the markup that stands for something:
``<@id>`` and ``<@!id>`` (a user; the name from ``mentions``: the member's nick, else the
global name, else the username; the bot's own mention taken out), ``<@&id>`` (a role),
``<#id>`` (a channel), ``</name:id>`` (a slash command), ``<:name:id>`` and ``<a:name:id>``
(custom emoji, as ``:name:``), ``<t:unix>`` and ``<t:unix:style>`` (a timestamp, as a UTC
date); ``@everyone`` and ``@here`` (or ``mention_everyone``) are an @all.
``referenced_message`` (a reply) is the quote; a reply to one of the bot's own messages
addresses the bot, as a mention does. Attachments and stickers become placeholder lines when
the host passes no attachments.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from protocol.channels import ChannelMention, ChannelMessageParams
from sidecar.channels.inbound.common import Mentions, PlatformText, as_dict, as_list, as_str

__all__ = ["discord_text", "discord_author_name"]

_MARKUP = re.compile(
    r"<@!?(?P<user>\d{1,25})>|<@&(?P<role>\d{1,25})>|<#(?P<channel>\d{1,25})>"
    r"|</(?P<command>[\w -]{1,100}):\d{1,25}>|<a?:(?P<emoji>\w{1,64}):\d{1,25}>"
    r"|<t:(?P<time>-?\d{1,13})(?::[tTdDfFR])?>"
)
_EVERYONE = re.compile(r"(?<![\w@])@(everyone|here)\b")


def discord_author_name(message: Any) -> str | None:
    data = as_dict(message)
    member = as_dict(data.get("member"))
    author = as_dict(data.get("author"))
    return (
        as_str(member.get("nick")) or as_str(author.get("global_name")) or as_str(author.get("username")) or None
    )


def _user_name(user: dict[str, Any]) -> str | None:
    member = as_dict(user.get("member"))
    return as_str(member.get("nick")) or as_str(user.get("global_name")) or as_str(user.get("username")) or None


def discord_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    message = as_dict(params.raw)
    for user in as_list(message.get("mentions")):
        u = as_dict(user)
        user_id = u.get("id")
        if isinstance(user_id, str) and user_id:
            mentions.add(ChannelMention(id=user_id, name=_user_name(u)))
    if message.get("mention_everyone") is True:
        mentions.all = True
    content = message.get("content")
    text = _markup(content if isinstance(content, str) else params.text, mentions)
    if not params.attachments:
        lines = [f"[attachment: {as_str(as_dict(a).get('filename')) or 'file'}]" for a in as_list(message.get("attachments"))]
        lines += [f"[sticker: {as_str(as_dict(s).get('name')) or 'sticker'}]" for s in as_list(message.get("sticker_items"))]
        if lines:
            text = "\n".join([*lines[:16], text.strip()]).strip()
    quote = sender = None
    referenced = as_dict(message.get("referenced_message"))
    if referenced:
        author = as_dict(referenced.get("author"))
        if as_str(author.get("id")) in mentions.bot_ids:
            mentions.bot = True  # a reply to the bot addresses it
        quoted = referenced.get("content")
        quote = _markup(quoted, Mentions([], list(mentions.bot_ids))) if isinstance(quoted, str) else None
        sender = discord_author_name(referenced)
    return PlatformText(text=text.strip(), quote=quote or None, quote_sender=sender)


def _markup(text: str, mentions: Mentions) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group("user"):
            return mentions.write(m.group("user"))
        if m.group("role"):
            return "@role"
        if m.group("channel"):
            return "#channel"
        if m.group("command"):
            return "/" + m.group("command")
        if m.group("emoji"):
            return f":{m.group('emoji')}:"
        try:
            stamp = dt.datetime.fromtimestamp(int(m.group("time")), tz=dt.timezone.utc)
        except (ValueError, OverflowError, OSError):
            return m.group(0)
        return stamp.strftime("%Y-%m-%d %H:%M UTC")

    text = _MARKUP.sub(sub, text)
    if _EVERYONE.search(text):
        mentions.all = True
    return text
