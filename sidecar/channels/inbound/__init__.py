"""Input adaptation (seed 004 §4.1 PreProcessor 6): an IM message -> the user turn.

Owns: ``adapt``: the platform's markup (mentions, @all, emoji codes, quoted replies,
rich-text posts and cards, Slack blocks, Telegram entities, Discord markup) becomes clean text by the platform's adapter (one
module per platform), then the turn is written so that it says who spoke and what was
quoted:

    > "Bob": the quoted message          (a quoted reply, at most 500 characters of it)

    "Alice": the message text            (groups: the sender's display name first, in
                                          double quotes, " (bot)" after it for a bot;
                                          "@all" when the host saw one the text does not show)

The names and the quoted text were written by other people than the speaker, so they are
written by the rule for untrusted text (sidecar/untrusted.py): entity-escaped, on one line
(line breaks shown as ``\\n``). A name can therefore neither add a line to the turn nor
pose as a role (``"system": ...`` is a name), and the double quotes around it cannot occur
inside it. The message text itself is the speaker's own and stays as written (code,
tables). The system prompt of a channel's session explains this layout
(sidecar/pipeline/system.py ``CHANNEL_NOTE``).

The attachments become parts (``data``: stored in the data dir by the engine's
AttachmentStore; ``url``: an image/file part). Must stay true: any input the protocol
accepts adapts without raising, except attachments that are not usable (InvalidParams
naming the field).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from dataclasses import dataclass

from protocol.chat import Attachment, InputPart, UserInput
from protocol.channels import ChannelConfig, ChannelMessageParams
from protocol.types import FilePart, ImagePart, TextPart
from sidecar.channels.inbound.common import Mentions, PlatformText, resolve_plain_mentions
from sidecar.channels.inbound.dingtalk import dingtalk_text
from sidecar.channels.inbound.discord import discord_text
from sidecar.channels.inbound.feishu import feishu_text
from sidecar.channels.inbound.slack import slack_text
from sidecar.channels.inbound.telegram import telegram_text
from sidecar.channels.inbound.wechat import wechat_text
from sidecar.channels.inbound.wecom import wecom_text
from sidecar.errors import InvalidParams
from sidecar.untrusted import escape

__all__ = ["Adapted", "adapt", "QUOTE_CHARS"]

QUOTE_CHARS = 500
_DEFAULT_MIME = {"image": "image/png", "audio": "audio/mpeg", "video": "video/mp4", "file": "application/octet-stream"}


def _plain_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    return PlatformText(text=resolve_plain_mentions(params.text, mentions).strip())


_ADAPTERS: dict[str, Callable[[ChannelMessageParams, Mentions], PlatformText]] = {
    "feishu": feishu_text,
    "lark": feishu_text,
    "dingtalk": dingtalk_text,
    "wecom": wecom_text,
    "wechat": wechat_text,
    "slack": slack_text,
    "telegram": telegram_text,
    "discord": discord_text,
    "plain": _plain_text,
}


@dataclass(slots=True)
class Adapted:
    body: str
    """The clean text alone (commands such as ``/new`` are read from it)."""
    turn: UserInput
    """The user turn: speaker and quote written in, attachments as parts."""
    mentions_bot: bool
    mentions_all: bool
    keyword: bool = False
    """A group message containing the channel's trigger keyword."""

    @property
    def empty(self) -> bool:
        return not self.body.strip() and not _has_media(self.turn)


def _has_media(turn: UserInput) -> bool:
    if turn.attachments:
        return True
    return isinstance(turn.content, list) and any(not isinstance(p, TextPart) for p in turn.content)


def adapt(params: ChannelMessageParams, config: ChannelConfig, quoted: str | None = None) -> Adapted:
    """``quoted``: the text of the message ``replyTo.messageId`` names, when the host gave no
    text for it and the sidecar knows it (a message of this chat it received or sent)."""
    mentions = Mentions(params.mentions, config.bot_user_ids)
    platform = _ADAPTERS[config.platform](params, mentions)
    body = "\n".join(line.rstrip() for line in platform.text.split("\n")).strip()
    keyword = False
    if params.chat_type == "group" and config.trigger_keyword:
        body, keyword = _trigger(body, config.trigger_keyword)
    quote_text = params.reply_to.text if params.reply_to and params.reply_to.text else platform.quote or quoted
    quote_sender = (params.reply_to.sender_name if params.reply_to else None) or platform.quote_sender
    lines: list[str] = []
    if quote_text and quote_text.strip():
        lines.append(_quote_line(quote_sender, quote_text))
        lines.append("")
    said = body
    if params.mention_all and "@all" not in said.lower():
        said = f"@all {said}".strip()  # the host saw an @all the text does not show
    if params.chat_type == "group":
        speaker = _speaker(params)
        lines.append(f"{speaker}: {said}" if said else f"{speaker}:")
    else:
        lines.append(said)
    text = "\n".join(lines).strip()
    parts, attachments = _attachments(params)
    content: str | list[InputPart] = text
    if parts:
        content = [TextPart(text=text), *parts] if text else parts
    return Adapted(
        body=body,
        turn=UserInput(content=content, attachments=attachments or None),
        mentions_bot=mentions.bot,
        mentions_all=mentions.all or params.mention_all,
        keyword=keyword,
    )


def _trigger(body: str, keyword: str) -> tuple[str, bool]:
    """Whether ``body`` holds the trigger keyword (case-insensitive); a leading one is taken
    out with the punctuation after it ("bot, hi" reads "hi")."""
    wanted = keyword.casefold()
    if body[: len(keyword)].casefold() == wanted:
        return body[len(keyword):].lstrip(" \t,:;，：；、").strip(), True
    return body, wanted in body.casefold()


def _speaker(params: ChannelMessageParams) -> str:
    name = (params.sender.name or params.sender.id).strip() or params.sender.id
    label = f'"{escape(name)}"'
    return f"{label} (bot)" if params.sender.is_bot else label


def _quote_line(sender: str | None, text: str) -> str:
    quoted = text.strip()
    if len(quoted) > QUOTE_CHARS:
        quoted = quoted[:QUOTE_CHARS].rstrip() + "…"
    who = f'"{escape(sender.strip())}": ' if sender and sender.strip() else ""
    return f"> {who}{escape(quoted)}"


def _attachments(params: ChannelMessageParams) -> tuple[list[InputPart], list[Attachment]]:
    parts: list[InputPart] = []
    stored: list[Attachment] = []
    for index, att in enumerate(params.attachments):
        field = f"$.attachments[{index}]"
        if (att.data is None) == (att.url is None):
            raise InvalidParams(f"invalid params: an attachment needs exactly one of data and url - at `{field}`")
        guessed = mimetypes.guess_type(att.name or (att.url or "").split("?")[0])[0] if att.name or att.url else None
        mime = att.mime_type or guessed or _DEFAULT_MIME[att.kind]
        if att.data is not None:
            name = att.name or f"{att.kind}{mimetypes.guess_extension(mime) or ''}"
            if att.kind == "image" and not mime.startswith("image/"):
                mime = _DEFAULT_MIME["image"]
            stored.append(Attachment(name=name, data=att.data, mime_type=mime))
            continue
        url = att.url or ""
        if not url.lower().startswith(("http://", "https://")) or len(url) > 8192:
            raise InvalidParams(f"invalid params: url must be an http(s) URL - at `{field}.url`")
        if att.kind == "image":
            parts.append(ImagePart(mime_type=mime if mime.startswith("image/") else "image/png", url=url))
        else:
            parts.append(FilePart(uri=url, mime_type=mime, name=att.name))
    return parts, stored
