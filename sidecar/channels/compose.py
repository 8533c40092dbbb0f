"""A reply's content -> the platform messages (ReplyChunks) that carry it.

Owns: rendering the reply's Markdown for the channel's dialect (render.py), making its
mentions inert unless the channel allows them (mentions.py: ``allowMentions`` off, the
default), splitting it at the channel's limits (split.py) into text chunks, or for
``slack_blocks`` into section blocks grouped into messages (at most ``maxBlocks`` sections
and ``maxMessageSize`` characters each), and the images and files that go as separate
items after the text: images of the Markdown that the dialect cannot show inline, and the
reply's own image/file parts (only ``file://`` URIs inside the attachments directory, never
another local path, and http(s) URLs).

Blocking (it may check files): call ``compose`` through ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

from protocol.channels import (
    ChannelConfig,
    ReplyBlocksChunk,
    ReplyChunk,
    ReplyFileChunk,
    ReplyImageChunk,
    ReplyTextChunk,
    SlackSectionBlock,
    SlackText,
)
from protocol.types import ContentPart, FilePart, ImagePart, TextPart
from sidecar.channels.dialects import DIALECTS
from sidecar.channels.mentions import neutralize_rendered
from sidecar.channels.render import Rendered, render_markdown
from sidecar.channels.split import Measure, SplitChunk, split_lines
from sidecar.store.attachments import AttachmentStore

__all__ = ["compose", "text_chunks", "media_chunks", "reply_text", "EMPTY_REPLY"]

EMPTY_REPLY = "(empty reply)"
NAME_MENTION_PLATFORMS = frozenset({"telegram"})
"""Platforms where a plain ``@username`` in a bot's message notifies that user."""
_SECTION_GAP = "\n\n"


def reply_text(text_content: str | None, parts: list[ContentPart] | None) -> str:
    """The visible text of a reply (its text parts when the column is empty)."""
    if text_content:
        return text_content
    return "".join(p.text for p in parts or [] if isinstance(p, TextPart))


def text_chunks(text: str, config: ChannelConfig) -> tuple[list[ReplyChunk], Rendered]:
    """The text of a reply as platform messages (no media), and what the renderer found."""
    dialect = DIALECTS[config.dialect]
    rendered = render_markdown(text, dialect)
    if not config.allow_mentions:
        neutralize_rendered(rendered, names=config.platform in NAME_MENTION_PLATFORMS)
    limits = config.limits
    assert limits.max_message_size is not None and limits.size_unit is not None
    if config.dialect != "slack_blocks":
        pieces = split_lines(rendered.lines, limits.max_message_size, Measure(limits.size_unit))
        return [ReplyTextChunk(text=p.text, format=config.dialect) for p in pieces], rendered
    assert limits.max_section_chars is not None and limits.max_blocks is not None
    sections = split_lines(rendered.lines, min(limits.max_section_chars, limits.max_message_size), Measure("chars"))
    return _slack_messages(sections, limits.max_message_size, limits.max_blocks), rendered


def _slack_messages(sections: list[SplitChunk], max_chars: int, max_blocks: int) -> list[ReplyChunk]:
    out: list[ReplyChunk] = []
    group: list[str] = []
    size = 0
    for section in sections:
        text = section.text
        grown = size + len(text) + (len(_SECTION_GAP) if group else 0)
        if group and (len(group) >= max_blocks or grown > max_chars):
            out.append(_blocks(group))
            group, size = [], 0
            grown = len(text)
        group.append(text)
        size = grown
    if group:
        out.append(_blocks(group))
    return out


def _blocks(texts: list[str]) -> ReplyBlocksChunk:
    return ReplyBlocksChunk(
        text=_SECTION_GAP.join(texts),
        blocks=[SlackSectionBlock(text=SlackText(text=t)) for t in texts],
    )


def compose(
    text: str,
    parts: list[ContentPart] | None,
    config: ChannelConfig,
    attachments: AttachmentStore,
) -> list[ReplyChunk]:
    """Every platform message of a finished reply: its text, then its images and files."""
    chunks, rendered = text_chunks(text, config) if text.strip() else ([], Rendered())
    chunks.extend(media_chunks(rendered, parts, attachments))
    if not chunks:
        chunks, _ = text_chunks(EMPTY_REPLY, config)
    return chunks


def media_chunks(rendered: Rendered, parts: list[ContentPart] | None, attachments: AttachmentStore) -> list[ReplyChunk]:
    """The images (of the Markdown, when the dialect cannot show them inline) and the
    reply's image and file parts, each a message of its own, without repeats."""
    chunks: list[ReplyChunk] = []
    seen: set[str] = set()
    for media in rendered.media:
        if media.url not in seen:
            seen.add(media.url)
            chunks.append(ReplyImageChunk(url=media.url, alt=media.alt))
    for part in parts or []:
        if isinstance(part, ImagePart) and part.url and _allowed(part.url, attachments) and part.url not in seen:
            seen.add(part.url)
            chunks.append(ReplyImageChunk(url=part.url, mime_type=part.mime_type))
        elif isinstance(part, FilePart) and _allowed(part.uri, attachments) and part.uri not in seen:
            seen.add(part.uri)
            chunks.append(ReplyFileChunk(uri=part.uri, name=part.name, mime_type=part.mime_type))
    return chunks


def _allowed(uri: str, attachments: AttachmentStore) -> bool:
    lowered = uri.lower()
    if lowered.startswith(("http://", "https://")):
        return True
    return lowered.startswith("file:") and attachments.local_path(uri) is not None
