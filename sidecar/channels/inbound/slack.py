"""Slack messages (Events API ``message`` / ``app_mention``) -> text.

``raw`` is the event. When it has ``rich_text`` blocks they are read (sections, lists,
quotes, preformatted code; inline text with styles, links, users, user groups, channels,
emoji, broadcasts, dates); otherwise its ``text`` (or the host's text) is read as Slack
markup: ``<@U123>`` / ``<@U123|name>``, ``<!here>`` / ``<!channel>`` / ``<!everyone>``,
``<#C123|general>``, ``<!subteam^S1|@team>``, ``<!date^...|fallback>``, ``<url|label>``,
``&amp; &lt; &gt;``, ``:shortcode:`` emoji.
"""

from __future__ import annotations

import re
from typing import Any

from protocol.channels import ChannelMessageParams
from sidecar.channels.inbound.common import (
    MAX_WALK_DEPTH,
    Mentions,
    PlatformText,
    as_dict,
    as_list,
    as_str,
    slack_emoji,
)

__all__ = ["slack_text"]

_ANGLE = re.compile(r"<([^<>|\s]{1,2000})(?:\|([^<>]{0,2000}))?>")


def slack_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    raw = as_dict(params.raw)
    blocks = [b for b in as_list(raw.get("blocks")) if as_dict(b).get("type") == "rich_text"]
    if blocks:
        text = "\n".join(_rich_text(b, mentions, 0) for b in blocks).strip()
    else:
        text = _markup(as_str(raw.get("text")) or params.text, mentions)
    return PlatformText(text=slack_emoji(text))


def _markup(text: str, mentions: Mentions) -> str:
    def angle(m: re.Match[str]) -> str:
        target, label = m.group(1), m.group(2)
        if target.startswith("@"):
            return mentions.write(target[1:], label)
        if target.startswith("#"):
            return "#" + (label or target[1:])
        if target in ("!here", "!channel", "!everyone"):
            mentions.write("all")
            return "@" + target[1:]
        if target.startswith("!subteam^"):
            return label or "@" + target.split("^", 1)[1]
        if target.startswith("!date^"):
            return label or ""
        if target.startswith("!"):
            return label or target[1:]
        url = target
        if label and label != url:
            return f"[{_unescape(label)}]({url})"
        return url.removeprefix("mailto:")

    return _unescape(_ANGLE.sub(angle, text))


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _rich_text(block: Any, mentions: Mentions, depth: int) -> str:
    if depth > MAX_WALK_DEPTH:
        return ""
    out: list[str] = []
    for element in as_list(as_dict(block).get("elements")):
        e = as_dict(element)
        kind = as_str(e.get("type"))
        if kind == "rich_text_section":
            out.append(_inline(as_list(e.get("elements")), mentions))
        elif kind == "rich_text_preformatted":
            out.append("```\n" + _inline(as_list(e.get("elements")), mentions).rstrip("\n") + "\n```")
        elif kind == "rich_text_quote":
            quoted = _inline(as_list(e.get("elements")), mentions)
            out.append("\n".join("> " + line for line in quoted.split("\n")))
        elif kind == "rich_text_list":
            ordered = as_str(e.get("style")) == "ordered"
            indent = "  " * min(int(e.get("indent") or 0) if isinstance(e.get("indent"), int) else 0, 8)
            for number, item in enumerate(as_list(e.get("elements")), 1):
                line = _rich_text({"elements": [item]}, mentions, depth + 1)
                out.append(f"{indent}{number}. {line}" if ordered else f"{indent}- {line}")
    return "\n".join(out)


def _inline(elements: list[Any], mentions: Mentions) -> str:
    parts: list[str] = []
    for element in elements:
        e = as_dict(element)
        kind = as_str(e.get("type"))
        if kind == "text":
            text = as_str(e.get("text"))
            style = as_dict(e.get("style"))
            if text.strip():
                if style.get("code"):
                    text = f"`{text}`"
                if style.get("bold"):
                    text = f"**{text}**"
                if style.get("italic"):
                    text = f"*{text}*"
                if style.get("strike"):
                    text = f"~~{text}~~"
            parts.append(text)
        elif kind == "link":
            url, label = as_str(e.get("url")), as_str(e.get("text"))
            parts.append(f"[{label}]({url})" if label and label != url else url)
        elif kind == "user":
            parts.append(mentions.write(as_str(e.get("user_id")) or None))
        elif kind == "usergroup":
            parts.append("@" + (as_str(e.get("usergroup_id")) or "group"))
        elif kind == "channel":
            parts.append("#" + as_str(e.get("channel_id")))
        elif kind == "emoji":
            name = as_str(e.get("name"))
            unicode = as_str(e.get("unicode"))
            try:
                parts.append("".join(chr(int(cp, 16)) for cp in unicode.split("-")) if unicode else slack_emoji(f":{name}:"))
            except (ValueError, OverflowError):
                parts.append(slack_emoji(f":{name}:"))
        elif kind == "broadcast":
            mentions.write("all")
            parts.append("@" + (as_str(e.get("range")) or "here"))
        elif kind == "date":
            parts.append(as_str(e.get("fallback")))
        else:
            parts.append(as_str(e.get("text")))
    return "".join(parts)
