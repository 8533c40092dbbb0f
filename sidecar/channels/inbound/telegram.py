"""Telegram messages (Bot API ``Message``) -> text.

``raw`` is the ``Message`` object (or an ``Update`` holding one as ``message``,
``edited_message``, ``channel_post`` or ``business_message``). Read from it:
- ``text`` with ``entities``, or ``caption`` with ``caption_entities`` (a photo or a
  document); entity offsets and lengths are in UTF-16 code units. Formatting entities become
  Markdown (bold, italic, strikethrough, code, pre with its language, text links,
  blockquotes); ``mention`` (``@username``) and ``text_mention`` (a user without a username)
  are mentions, the bot's (its username or id in ``botUserIds``) taken out;
  ``bot_command`` ``/cmd@ourbot`` addresses the bot and reads ``/cmd``;
- ``reply_to_message`` (its text, or the ``quote`` the user selected of it) is the quote;
  a reply to one of the bot's own messages addresses the bot, as a mention does;
- ``photo``, ``document``, ``voice``, ``audio``, ``video``, ``sticker``: a placeholder line
  when the host passes no attachments (``[photo]``, ``[document: report.pdf]``, the
  sticker's emoji).
``message_thread_id`` (a forum topic) is the host's ``threadId``; the adapter does not need it.
"""

from __future__ import annotations

from typing import Any

from protocol.channels import ChannelMention, ChannelMessageParams
from sidecar.channels.inbound.common import Mentions, PlatformText, as_dict, as_list, as_str

__all__ = ["telegram_text", "telegram_message", "display_name", "is_bot_name"]

_WRAP = {
    "bold": ("**", "**"),
    "italic": ("*", "*"),
    "strikethrough": ("~~", "~~"),
    "code": ("`", "`"),
}
_UPDATE_KEYS = ("message", "edited_message", "channel_post", "edited_channel_post", "business_message")
MAX_ENTITIES = 1_000


def telegram_message(raw: Any) -> dict[str, Any]:
    """The Message inside ``raw`` (an Update or the Message itself)."""
    data = as_dict(raw)
    if "update_id" in data:
        for key in _UPDATE_KEYS:
            if isinstance(data.get(key), dict):
                return as_dict(data[key])
    return data


def display_name(user: Any) -> str | None:
    u = as_dict(user)
    name = " ".join(p for p in (as_str(u.get("first_name")), as_str(u.get("last_name"))) if p).strip()
    return name or as_str(u.get("username")) or as_str(u.get("title")) or None


def is_bot_name(username: str, bot_ids: set[str]) -> bool:
    wanted = username.lstrip("@").lower()
    return bool(wanted) and any(b.lstrip("@").lower() == wanted for b in bot_ids)


def _from_bot(message: dict[str, Any], mentions: Mentions) -> bool:
    sender = as_dict(message.get("from"))
    user_id = sender.get("id")
    if isinstance(user_id, int) and str(user_id) in mentions.bot_ids:
        return True
    return is_bot_name(as_str(sender.get("username")), mentions.bot_ids)


def telegram_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    message = telegram_message(params.raw)
    if "text" in message or "caption" in message:
        text = _entities_to_markdown(
            as_str(message.get("text") or message.get("caption")),
            as_list(message.get("entities") or message.get("caption_entities")),
            mentions,
        )
    else:
        text = params.text
    if not params.attachments:
        placeholder = _placeholder(message)
        if placeholder:
            text = f"{placeholder}\n{text}".strip()
    reply = as_dict(message.get("reply_to_message"))
    quote = sender = None
    if reply:
        if _from_bot(reply, mentions):
            mentions.bot = True  # a reply to the bot addresses it
        selected = as_dict(message.get("quote"))
        if as_str(selected.get("text")):
            quote = as_str(selected.get("text"))
        else:
            quote = as_str(reply.get("text") or reply.get("caption")) or _placeholder(reply)
        sender = display_name(reply.get("from")) or display_name(reply.get("sender_chat"))
    return PlatformText(text=text.strip(), quote=quote or None, quote_sender=sender)


def _placeholder(message: dict[str, Any]) -> str:
    if message.get("photo"):
        return "[photo]"
    document = as_dict(message.get("document"))
    if document:
        name = as_str(document.get("file_name"))
        return f"[document: {name}]" if name else "[document]"
    if message.get("voice"):
        return "[voice message]"
    if message.get("audio"):
        return "[audio]"
    if message.get("video") or message.get("video_note"):
        return "[video]"
    sticker = as_dict(message.get("sticker"))
    if sticker:
        return as_str(sticker.get("emoji")) or "[sticker]"
    return ""


def _offsets(text: str) -> dict[int, int]:
    """UTF-16 offset -> index into ``text``, at every code point boundary."""
    out: dict[int, int] = {}
    units = 0
    for index, ch in enumerate(text):
        out[units] = index
        units += 2 if ord(ch) > 0xFFFF else 1
    out[units] = len(text)
    return out


def _entities_to_markdown(text: str, entities: list[Any], mentions: Mentions) -> str:
    at = _offsets(text)
    opens: dict[int, list[tuple[int, str]]] = {}
    closes: dict[int, list[tuple[int, str]]] = {}
    replaced: list[tuple[int, int, str]] = []
    for raw in entities[:MAX_ENTITIES]:
        entity = as_dict(raw)
        offset, length = entity.get("offset"), entity.get("length")
        if not isinstance(offset, int) or not isinstance(length, int) or length <= 0:
            continue
        start, end = at.get(offset), at.get(offset + length)
        if start is None or end is None:
            continue  # not on a character boundary: malformed, left as text
        kind = as_str(entity.get("type"))
        piece = text[start:end]
        if kind in _WRAP:
            _wrap(opens, closes, start, end, *_WRAP[kind])
        elif kind == "pre":
            language = as_str(entity.get("language"))
            language = language if language.replace("-", "").replace("+", "").isalnum() else ""
            _wrap(opens, closes, start, end, f"```{language}\n", "\n```")
        elif kind == "text_link":
            url = as_str(entity.get("url"))
            if url.lower().startswith(("http://", "https://")):
                _wrap(opens, closes, start, end, "[", f"]({url.replace(')', '%29')})")
        elif kind == "blockquote" or kind == "expandable_blockquote":
            replaced.append((start, end, "\n".join("> " + line for line in piece.split("\n"))))
        elif kind == "mention":
            replaced.append((start, end, _mention(piece, mentions)))
        elif kind == "text_mention":
            user = as_dict(entity.get("user"))
            user_id = user.get("id")
            if isinstance(user_id, int):
                mention = ChannelMention(id=str(user_id), name=display_name(user) or piece.lstrip("@"))
                mentions.add(mention)
                replaced.append((start, end, mentions.write(mention.id, mention.name)))
        elif kind == "bot_command" and "@" in piece:
            command, _, bot = piece.partition("@")
            if is_bot_name(bot, mentions.bot_ids):
                mentions.bot = True
                replaced.append((start, end, command))
    return _assemble(text, opens, closes, _outermost(replaced))


def _mention(piece: str, mentions: Mentions) -> str:
    username = piece.lstrip("@")
    if is_bot_name(username, mentions.bot_ids):
        mentions.bot = True
        return ""
    return mentions.write(None, username)


def _wrap(
    opens: dict[int, list[tuple[int, str]]], closes: dict[int, list[tuple[int, str]]],
    start: int, end: int, before: str, after: str,
) -> None:
    opens.setdefault(start, []).append((end, before))
    closes.setdefault(end, []).append((start, after))


def _outermost(ranges: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for start, end, value in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if out and start < out[-1][1]:
            continue  # inside (or overlapping) a range already replaced
        out.append((start, end, value))
    return out


def _assemble(
    text: str, opens: dict[int, list[tuple[int, str]]], closes: dict[int, list[tuple[int, str]]],
    replaced: list[tuple[int, int, str]],
) -> str:
    out: list[str] = []
    replace_at = {start: (end, value) for start, end, value in replaced}
    index = 0
    while True:
        # inner entities close first, outer ones open first
        for _, marker in sorted(closes.get(index, ()), key=lambda c: -c[0]):
            out.append(marker)
        for _, marker in sorted(opens.get(index, ()), key=lambda o: -o[0]):
            out.append(marker)
        if index >= len(text):
            return "".join(out)
        if index in replace_at:
            end, value = replace_at[index]
            out.append(value)
            index = end  # markers strictly inside a replaced range go with its text
            continue
        out.append(text[index])
        index += 1
