"""WeChat messages (personal or iLink bots: text only) -> text.

Mentions are ``@Name`` followed by U+2005 (a four-per-em space). A quoted reply arrives
inside the text as ``「Name：quoted」`` and a dashed line, then the reply; it is taken apart.
The classic WeChat emoji codes (``/::)``...) become their bracket names (``[微笑]``), the
form WeChat also uses in text.
"""

from __future__ import annotations

import re

from protocol.channels import ChannelMessageParams
from sidecar.channels.inbound.common import Mentions, PlatformText, resolve_plain_mentions

__all__ = ["wechat_text"]

_QUOTE = re.compile(r"^「(?P<name>[^：:」]{1,64})[：:](?P<text>.*?)」\s*\n\s*(?:- ){3,}-?\s*\n?", re.S)
_EMOJI = {
    "/::)": "[微笑]", "/::~": "[撇嘴]", "/::B": "[色]", "/::|": "[发呆]", "/::<": "[流泪]",
    "/::$": "[害羞]", "/::X": "[闭嘴]", "/::Z": "[睡]", "/::'(": "[大哭]", "/::-|": "[尴尬]",
    "/::@": "[发怒]", "/::P": "[调皮]", "/::D": "[呲牙]", "/::O": "[惊讶]", "/::(": "[难过]",
    "/:strong": "[强]", "/:weak": "[弱]", "/:ok": "[OK]", "/:rose": "[玫瑰]", "/:heart": "[爱心]",
}
_EMOJI_RE = re.compile("|".join(re.escape(k) for k in sorted(_EMOJI, key=len, reverse=True)))


def wechat_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    text = params.text
    quote = sender = None
    m = _QUOTE.match(text)
    if m:
        quote, sender = m.group("text").strip(), m.group("name").strip()
        text = text[m.end():]
    text = _EMOJI_RE.sub(lambda e: _EMOJI[e.group(0)], text)
    text = resolve_plain_mentions(text, mentions).replace("\u2005", " ")
    return PlatformText(text=text.strip(), quote=quote, quote_sender=sender)
