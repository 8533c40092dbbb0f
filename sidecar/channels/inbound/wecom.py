"""WeCom (企业微信) robot messages (the decrypted callback JSON) -> text.

``raw`` is the callback body: ``msgtype`` ``text`` (``text.content``), ``mixed``
(``mixed.msg_item``: text and image items), ``voice`` (``voice.content``, WeCom's
transcript), ``image``, ``file``; a quoted reply comes as ``quote`` (``quote.text.content``).
Mentions are ``@Name`` text.
"""

from __future__ import annotations

from protocol.channels import ChannelMessageParams
from sidecar.channels.inbound.common import (
    Mentions,
    PlatformText,
    as_dict,
    as_list,
    as_str,
    resolve_plain_mentions,
)

__all__ = ["wecom_text"]


def wecom_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    raw = as_dict(params.raw)
    kind = as_str(raw.get("msgtype"))
    if kind == "text":
        text = as_str(as_dict(raw.get("text")).get("content")) or params.text
    elif kind == "mixed":
        pieces = []
        for item in as_list(as_dict(raw.get("mixed")).get("msg_item")):
            item = as_dict(item)
            if as_str(item.get("msgtype")) == "text":
                pieces.append(as_str(as_dict(item.get("text")).get("content")))
            elif as_str(item.get("msgtype")) == "image":
                pieces.append("[image]")
        text = "\n".join(p for p in pieces if p) or params.text
    elif kind == "voice":
        text = as_str(as_dict(raw.get("voice")).get("content")) or params.text or "[voice message]"
    elif kind in ("image", "file", "video"):
        text = params.text or f"[{kind}]"
    else:
        text = params.text
    quote = as_dict(raw.get("quote"))
    quoted = as_str(as_dict(quote.get("text")).get("content")) or None
    return PlatformText(text=resolve_plain_mentions(text, mentions).strip(), quote=quoted)
