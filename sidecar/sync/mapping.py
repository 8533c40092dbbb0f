"""Server conversations and messages -> local sessions and MessageV2 (the seed's importSession).

Owns the mapping rules (pure functions, no I/O):
- roles: USER -> user, ASSISTANT -> assistant; anything else (SYSTEM, FUNCTION, which
  ``/message/list`` does not return anyway) is not imported;
- ``think`` -> a ThinkingPart before the text; a ``<think>…</think>`` block still in an
  ASSISTANT text (servers that did not extract it) is moved there the same way;
- attachments -> FileParts (``fileUrl``, ``mimeType``, ``fileName``); an
  ``<attachment>[json]</attachment>`` block still in a USER text is extracted and removed
  exactly as the server does (reference 2.3: only when it is valid JSON, otherwise the text
  stays as it is). Only http(s) addresses become file URIs: a server must never make the
  pipeline read a local ``file://`` path; any other attachment is kept as a text note
  (its name and type written by the rule for untrusted text, sidecar/untrusted.py);
- ``finished``/``finishReason`` -> status: ``ERROR`` -> error (the text is the error
  message), a reason naming a cancel/stop/interrupt -> aborted, ``finished: false`` ->
  aborted (the server was still writing it; a later pull replaces it), else completed;
- ISO dates -> epoch ms; a message without a readable time takes its predecessor's.
A message's ``digest`` covers everything mapped from it, so a pull can tell that a
message it already has changed on the server.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

import msgspec

from protocol.types import ContentPart, FilePart, FinalMessageStatus, MessageV2, TextPart, ThinkingPart
from sidecar.sync.wire import AttachmentDto, ChatMessageDto, ConversationRow, to_int, to_ms
from sidecar.untrusted import escape

__all__ = [
    "ServerMessage",
    "normalize_messages",
    "to_message",
    "conversation_title",
    "MAX_TITLE_CHARS",
]

MAX_TITLE_CHARS = 500

_ATTACHMENT = re.compile(r"<attachment>(.*?)</attachment>", re.S)
_ATTACHMENT_ALL = re.compile(r"<attachment>[\s\S]*?</attachment>")
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_THINK_ALL = re.compile(r"<think>[\s\S]*?</think>")
_ABORT_HINTS = ("cancel", "stop", "interrupt", "abort")
_attachments = msgspec.json.Decoder(list[AttachmentDto])
_encode = msgspec.json.Encoder().encode


class ServerMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One server message, normalized (what a local message is made from)."""

    index: int
    server_id: str | None
    role: Literal["user", "assistant"]
    text: str
    think: str | None
    files: tuple[FilePart, ...]
    notes: tuple[str, ...]
    status: FinalMessageStatus
    error: str | None
    created_at: int
    finished: bool
    digest: str

    def parts(self) -> list[ContentPart] | None:
        """Parts when there is more than text (thinking, files, notes), else None."""
        if not self.think and not self.files and not self.notes:
            return None
        parts: list[ContentPart] = []
        if self.think:
            parts.append(ThinkingPart(text=self.think))
        if self.text:
            parts.append(TextPart(text=self.text))
        parts.extend(TextPart(text=note) for note in self.notes)
        parts.extend(self.files)
        return parts


def normalize_messages(dtos: list[ChatMessageDto], fallback_time: int) -> list[ServerMessage]:
    """The importable messages of a page, in index order (duplicates of an index dropped)."""
    out: dict[int, ServerMessage] = {}
    last_time = fallback_time
    for dto in sorted(dtos, key=lambda d: to_int(d.index) or 0):
        message = _normalize(dto, last_time)
        if message is None:
            continue
        last_time = message.created_at
        out.setdefault(message.index, message)
    return list(out.values())


def _normalize(dto: ChatMessageDto, fallback_time: int) -> ServerMessage | None:
    index = to_int(dto.index)
    role_name = (dto.role or "").upper()
    if index is None or role_name not in ("USER", "ASSISTANT"):
        return None
    role: Literal["user", "assistant"] = "user" if role_name == "USER" else "assistant"
    text = dto.text or ""
    think = dto.think or None
    attachments = list(dto.attachments or [])
    if role == "user":
        found = _ATTACHMENT.search(text)
        if found:
            try:
                attachments.extend(_attachments.decode(found.group(1)))
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass  # the server's rule: text that is not a JSON list stays as it is
            else:
                text = _ATTACHMENT_ALL.sub("", text).strip()
    else:
        found = _THINK.search(text)
        if found:
            think = think or found.group(1).strip() or None
            text = _THINK_ALL.sub("", text).strip()
    files: list[FilePart] = []
    notes: list[str] = []
    for attachment in attachments:
        part, note = _file_part(attachment)
        if part is not None:
            files.append(part)
        elif note is not None:
            notes.append(note)
    finished = dto.finished is not False
    reason = (dto.finish_reason or "").strip()
    status: FinalMessageStatus = "completed"
    error: str | None = None
    if role == "assistant":
        if reason.upper() == "ERROR":
            status, error = "error", text or "the server reported an error"
        elif any(hint in reason.lower() for hint in _ABORT_HINTS) or not finished:
            status = "aborted"
    created = to_ms(dto.time)
    created = fallback_time if created is None else created
    server_id = None if dto.id is None else str(dto.id)
    digest = hashlib.sha1(
        _encode([role, text, think, [f.uri for f in files], notes, finished, reason, server_id])
    ).hexdigest()
    return ServerMessage(
        index=index, server_id=server_id, role=role, text=text, think=think, files=tuple(files),
        notes=tuple(notes), status=status, error=error, created_at=created, finished=finished, digest=digest,
    )


def _file_part(a: AttachmentDto) -> tuple[FilePart | None, str | None]:
    url = (a.file_url or "").strip()
    name = a.file_name or a.file_key or None
    if url.lower().startswith(("http://", "https://")):
        return FilePart(uri=url, mime_type=a.mime_type or None, name=name), None
    if not url and not name:
        return None, None
    # the server's names reach a prompt in this note: written as untrusted text
    label = f'"{escape(name or url)}"'
    return None, f"[attachment {label} ({escape(a.mime_type or 'unknown type')}): no web address to fetch it from]"


def to_message(sm: ServerMessage, *, message_id: str, session_id: str, parent_id: str | None) -> MessageV2:
    parts = sm.parts()
    return MessageV2(
        id=message_id,
        session_id=session_id,
        parent_id=parent_id,
        role=sm.role,
        content_type="multipart" if parts else "text",
        text_content=sm.text,
        parts=parts,
        status=sm.status,
        error=sm.error,
        created_at=sm.created_at,
        updated_at=sm.created_at,
    )


def conversation_title(dto: ConversationRow) -> str:
    topic = " ".join((dto.topic or "").split())
    if not topic:
        return "New Chat"
    return topic[:MAX_TITLE_CHARS]
