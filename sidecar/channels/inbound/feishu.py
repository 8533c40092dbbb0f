"""Feishu/Lark messages (``im.message.receive_v1``) -> text.

``raw`` is the event's ``message`` object (``message_type``, ``content`` as a JSON string or
object, ``mentions``) or its content alone. Message types:
- ``text``: ``{"text": "@_user_1 hi"}``; mentions are keys (``@_user_1``, ``@_all``) listed in
  ``mentions`` (``key``, ``id.open_id``/``user_id``, ``name``); hosts may also pass the
  send-side form ``<at user_id="ou_x">Name</at>`` (and ``<at id=all></at>``);
- ``post``: ``{"title", "content": [[element...]...]}``, possibly inside a locale
  (``zh_cn``, ``en_us``...); elements ``text`` (with ``style``), ``a``, ``at``, ``img``,
  ``media``, ``emotion``, ``code_block``, ``hr``, ``md``;
- ``interactive`` (a card): JSON 1.0/2.0 cards and the simplified received form; their
  visible text (titles, ``plain_text``/``lark_md``/``markdown`` contents) is read in order;
- ``image``, ``file``, ``audio``, ``media``, ``sticker``: a placeholder (the host passes the
  downloaded bytes as attachments).
"""

from __future__ import annotations

import re
from typing import Any

from protocol.channels import ChannelMention, ChannelMessageParams
from sidecar.channels.inbound.common import (
    MAX_WALK_DEPTH,
    Mentions,
    PlatformText,
    as_dict,
    as_list,
    as_str,
    decode_json_text,
    feishu_emoji,
)

__all__ = ["feishu_text"]

_AT_TAG = re.compile(
    r"""<at\s+(?:user_id|open_id|union_id|id|email)\s*=\s*["']?([^"'\s>]+)["']?\s*>([^<]*)</at>"""
)
_KEY = re.compile(r"@_user_\d+|@_all")
_LOCALES = ("zh_cn", "en_us", "ja_jp", "zh_hk", "zh_tw")
_SKIP_KEYS = frozenset({
    "tag", "href", "url", "img_key", "image_key", "file_key", "style", "color", "template", "config",
    "value", "behaviors", "multi_url", "icon", "element_id", "margin", "padding", "schema", "i18n_header",
    "text_align", "text_size", "type", "width", "weight", "flex_mode", "background_style",
})
_PLACEHOLDERS = {
    "image": "[image]", "file": "[file]", "audio": "[voice message]", "media": "[video]",
    "sticker": "[sticker]", "video": "[video]",
}


def feishu_text(params: ChannelMessageParams, mentions: Mentions) -> PlatformText:
    raw = as_dict(params.raw)
    message_type = as_str(raw.get("message_type")) or as_str(raw.get("msg_type"))
    content: Any = decode_json_text(raw.get("content")) if "content" in raw and message_type else raw
    for item in as_list(raw.get("mentions")):
        _add_raw_mention(item, mentions)
    if not message_type:
        message_type = {"rich": "post", "card": "interactive"}.get(params.msg_type, params.msg_type)
    text: str
    if not raw:
        text = params.text
    elif message_type == "text":
        text = as_str(as_dict(content).get("text")) or params.text
    elif message_type == "post":
        text = _post(as_dict(content), mentions)
    elif message_type in ("interactive", "card"):
        text = "\n".join(_card(content, mentions, 0)).strip()
    elif message_type in _PLACEHOLDERS:
        name = as_str(as_dict(content).get("file_name"))
        text = f"[file: {name}]" if name and message_type == "file" else _PLACEHOLDERS[message_type]
        if params.text:
            text = params.text
    else:
        text = params.text or as_str(as_dict(content).get("text"))
    return PlatformText(text=_mentions(text, mentions))


def _add_raw_mention(item: Any, mentions: Mentions) -> None:
    item = as_dict(item)
    ident = as_dict(item.get("id"))
    mention_id = as_str(ident.get("open_id")) or as_str(ident.get("user_id")) or as_str(item.get("id"))
    key = as_str(item.get("key")) or None
    if mention_id or key:
        mentions.add(ChannelMention(id=mention_id or key or "", name=as_str(item.get("name")) or None, key=key))


def _mentions(text: str, mentions: Mentions) -> str:
    text = _AT_TAG.sub(lambda m: mentions.write(m.group(1), m.group(2).strip() or None), text)

    def key(m: re.Match[str]) -> str:
        if m.group(0) == "@_all":
            return mentions.write("all")
        known = mentions.by_key.get(m.group(0))
        return mentions.write(known.id, known.name) if known is not None else m.group(0)

    return _KEY.sub(key, text)


def _post(content: dict[str, Any], mentions: Mentions) -> str:
    body = content
    if "content" not in body:
        body = next((as_dict(content[k]) for k in _LOCALES if k in content), {})
        if not body:
            body = next((as_dict(v) for v in content.values() if isinstance(v, dict) and "content" in v), {})
    lines: list[str] = []
    title = as_str(body.get("title")).strip()
    if title:
        lines.append(f"**{title}**")
    for paragraph in as_list(body.get("content")):
        lines.append("".join(_element(e, mentions) for e in as_list(paragraph)))
    return "\n".join(lines).strip()


def _styled(text: str, style: list[Any]) -> str:
    if not text.strip():
        return text
    if "bold" in style:
        text = f"**{text}**"
    if "italic" in style:
        text = f"*{text}*"
    if "lineThrough" in style:
        text = f"~~{text}~~"
    return text


def _element(element: Any, mentions: Mentions) -> str:
    e = as_dict(element)
    tag = as_str(e.get("tag"))
    if tag == "text":
        return _styled(as_str(e.get("text")), as_list(e.get("style")))
    if tag == "a":
        text, href = as_str(e.get("text")), as_str(e.get("href"))
        return f"[{text}]({href})" if href and text and text != href else href or text
    if tag == "at":
        return mentions.write(as_str(e.get("user_id")) or as_str(e.get("open_id")) or None, as_str(e.get("user_name")) or None)
    if tag == "img":
        return "[image]"
    if tag == "media":
        return "[video]"
    if tag == "emotion":
        return feishu_emoji(as_str(e.get("emoji_type")))
    if tag == "code_block":
        language = as_str(e.get("language")).lower()
        return f"\n```{language}\n{as_str(e.get('text')).rstrip()}\n```\n"
    if tag == "hr":
        return "\n---\n"
    if tag == "md":
        return as_str(e.get("text"))
    return as_str(e.get("text"))


def _card(node: Any, mentions: Mentions, depth: int) -> list[str]:
    """The visible text of a card, in document order."""
    if depth > MAX_WALK_DEPTH:
        return []
    if isinstance(node, list):
        out: list[str] = []
        for item in node:
            if isinstance(item, list):  # a received card's paragraph of post elements
                line = "".join(_element(e, mentions) for e in item)
                if line.strip():
                    out.append(line)
            else:
                out.extend(_card(item, mentions, depth + 1))
        return out
    if not isinstance(node, dict):
        return []
    tag = as_str(node.get("tag"))
    if tag in ("plain_text", "lark_md", "markdown"):
        content = as_str(node.get("content")) or as_str(node.get("text"))
        return [_mentions(content, mentions)] if content.strip() else []
    if tag in ("img", "image"):
        return ["[image]"]
    if tag == "hr":
        return ["---"]
    if tag in ("text", "a", "at", "emotion", "code_block", "md") and not any(
        isinstance(node.get(k), (dict, list)) for k in ("elements", "content")
    ):
        line = _element(node, mentions)
        return [line] if line.strip() else []
    out = []
    for key, value in node.items():
        if key in _SKIP_KEYS:
            continue
        if key == "title" and isinstance(value, str):
            if value.strip():
                out.append(f"**{value.strip()}**")
            continue
        if key in ("content", "text") and isinstance(value, str):
            if value.strip():
                out.append(_mentions(value, mentions))
            continue
        if isinstance(value, (dict, list)):
            out.extend(_card(value, mentions, depth + 1))
    return out
