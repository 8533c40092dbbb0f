"""DingTalk robot messages (the stream/HTTP callback body) -> text.

``raw`` is the callback body: ``msgtype`` ``text`` (``text.content``), ``richText``
(``content.richText``: text runs and pictures), ``picture``, ``file`` (``content.fileName``),
``audio`` (``content.recognition``, DingTalk's transcript), ``video``. ``isInAtList: true``
says the bot was mentioned; ``atUsers`` lists the others. Mentions are ``@Name`` text.
"""

from __future__ import annotations

from protocol.channels import ChannelMention, ChannelMessageParams
from sidecar.channels.inbound.common import (
    Mentions,
    PlatformText,
    as_dict,
    as_list,
    as_str,
    resolve_plain_mentions,
)

__all__ = ["dingtalk_text"]


def dingtalk_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    raw = as_dict(params.raw)
    if raw.get("isInAtList") is True:
        mentions.bot = True
    for user in as_list(raw.get("atUsers")):
        user_id = as_str(as_dict(user).get("dingtalkId")) or as_str(as_dict(user).get("staffId"))
        if user_id:
            mentions.add(ChannelMention(id=user_id))
    kind = as_str(raw.get("msgtype"))
    content = as_dict(raw.get("content"))
    if kind == "text":
        text = as_str(as_dict(raw.get("text")).get("content")) or params.text
    elif kind == "richText":
        pieces = []
        for item in as_list(content.get("richText")):
            item = as_dict(item)
            if "text" in item:
                pieces.append(as_str(item.get("text")))
            elif as_str(item.get("type")) == "picture" or "downloadCode" in item or "pictureDownloadCode" in item:
                pieces.append("[image]")
        text = "".join(pieces) or params.text
    elif kind == "audio":
        text = as_str(content.get("recognition")) or params.text or "[voice message]"
    elif kind == "picture":
        text = params.text or "[image]"
    elif kind == "file":
        name = as_str(content.get("fileName"))
        text = params.text or (f"[file: {name}]" if name else "[file]")
    elif kind == "video":
        text = params.text or "[video]"
    else:
        text = params.text
    return PlatformText(text=resolve_plain_mentions(text, mentions).strip())
