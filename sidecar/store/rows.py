"""Row <-> Struct mapping for ``sessions_v2`` and ``messages_v2``.

Owns: the column lists every SELECT uses, turning a row tuple into SessionV2/MessageV2 and
the JSON columns into typed values (and back).
Must stay true: JSON columns hold the wire (camelCase) encoding of their protocol types, so
an export is the stored data verbatim. A JSON column that cannot be served (it does not
decode, or nests deeper than ``stored_json.STORED_JSON_DEPTH``: a value stored before params were bounded,
or written by an agent, that would fail to encode again) costs its row that field, never
the caller its answer: ``session_from_row``/``message_from_row`` log it naming the row and
column and serve the row without it (the stored text stays as it is). ``decode_parts`` is
the strict form (a StoreError naming the row) for code that rewrites what it read;
``parts_or_none`` its lenient form for work over many rows (crash recovery, re-indexing).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from protocol.types import (
    CodePart,
    ContentPart,
    MessageDelivery,
    MessageV2,
    SessionV2,
    TextPart,
    ToolCall,
    Usage,
    UsageTotals,
)
from sidecar.errors import StoreError
from sidecar.store.stored_json import decode_column, lenient_json

__all__ = [
    "decode_usage_by_kind",
    "SESSION_COLUMNS",
    "MESSAGE_COLUMNS",
    "session_from_row",
    "message_from_row",
    "to_json",
    "decode_parts",
    "parts_or_none",
    "searchable_text",
    "session_values",
    "message_values",
    "SessionRow",
    "MessageRow",
]

SESSION_COLUMNS = (
    "id, title, summary, provider_id, model_id, system_prompt, mode, acp_session_id, tags,"
    " folder, is_pinned, is_archived, message_count, total_tokens, total_cost, channel_id,"
    " channel_meta, created_at, updated_at, last_message_at, active_leaf_id, workspace_dir,"
    " usage_by_kind, summary_source"
)
MESSAGE_COLUMNS = (
    "id, session_id, parent_id, role, content_type, text_content, parts, tool_calls,"
    " tool_call_id, tool_name, model_id, usage, latency_ms, acp_message_id, acp_parts, status,"
    " error, created_at, updated_at, seq, delivery, suggestions, edited_at"
)

log = logging.getLogger(__name__)

SessionRow = tuple[Any, ...]
MessageRow = tuple[Any, ...]

_encoder = msgspec.json.Encoder()
_dec_tags = msgspec.json.Decoder(list[str])
_dec_meta = msgspec.json.Decoder(dict[str, Any])
_dec_parts = msgspec.json.Decoder(list[ContentPart])
_dec_calls = msgspec.json.Decoder(list[ToolCall])
_dec_usage = msgspec.json.Decoder(Usage)
_dec_any_list = msgspec.json.Decoder(list[Any])
_dec_delivery = msgspec.json.Decoder(MessageDelivery)
_dec_usage_by_kind = msgspec.json.Decoder(dict[str, UsageTotals])


def to_json(value: Any) -> str | None:
    """The JSON text stored for a value (None stays NULL)."""
    if value is None:
        return None
    return _encoder.encode(value).decode()


def decode_parts(raw: str | None, row_id: str) -> list[ContentPart] | None:
    return decode_column(_dec_parts, raw, "parts", row_id)  # type: ignore[no-any-return]


def parts_or_none(raw: str | None, row_id: str) -> list[ContentPart] | None:
    """``decode_parts``, but a row that does not decode is logged and read as no parts
    (its text_content still counts)."""
    try:
        return decode_parts(raw, row_id)
    except StoreError as exc:
        log.warning("%s; using its text only", exc.message)
        return None


def decode_usage_by_kind(raw: str | None, row_id: str) -> dict[str, UsageTotals]:
    """The strict form (for read-modify-write: a value that does not decode is a StoreError)."""
    return decode_column(_dec_usage_by_kind, raw, "usage_by_kind", row_id) or {}


def session_from_row(r: SessionRow) -> SessionV2:
    sid = r[0]
    return SessionV2(
        id=sid,
        title=r[1],
        summary=r[2],
        provider_id=r[3],
        model_id=r[4],
        system_prompt=r[5],
        mode=r[6],
        acp_session_id=r[7],
        tags=lenient_json(_dec_tags, r[8], "tags", sid) or [],
        folder=r[9],
        is_pinned=bool(r[10]),
        is_archived=bool(r[11]),
        message_count=r[12] or 0,
        total_tokens=r[13] or 0,
        total_cost=float(r[14] or 0.0),
        channel_id=r[15],
        channel_meta=lenient_json(_dec_meta, r[16], "channel_meta", sid),
        created_at=r[17],
        updated_at=r[18],
        last_message_at=r[19],
        active_leaf_id=r[20],
        workspace_dir=r[21],
        usage_by_kind=lenient_json(_dec_usage_by_kind, r[22], "usage_by_kind", sid) or {},
        summary_source=r[23] if r[23] in ("user", "ai") else None,
    )


def session_values(s: SessionV2) -> tuple[Any, ...]:
    """Values for an INSERT with SESSION_COLUMNS."""
    return (
        s.id,
        s.title,
        s.summary,
        s.provider_id,
        s.model_id,
        s.system_prompt,
        s.mode,
        s.acp_session_id,
        to_json(s.tags),
        s.folder,
        int(s.is_pinned),
        int(s.is_archived),
        s.message_count,
        s.total_tokens,
        s.total_cost,
        s.channel_id,
        to_json(s.channel_meta),
        s.created_at,
        s.updated_at,
        s.last_message_at,
        s.active_leaf_id,
        s.workspace_dir,
        to_json(s.usage_by_kind) if s.usage_by_kind else None,
        s.summary_source,
    )


def message_from_row(r: MessageRow, *, acp_parts: bool = True) -> MessageV2:
    """``acp_parts=False`` leaves the raw ACP log out (not even decoded)."""
    mid = r[0]
    return MessageV2(
        id=mid,
        session_id=r[1],
        parent_id=r[2],
        role=r[3],
        content_type=r[4],
        text_content=r[5],
        parts=lenient_json(_dec_parts, r[6], "parts", mid),
        tool_calls=lenient_json(_dec_calls, r[7], "tool_calls", mid),
        tool_call_id=r[8],
        tool_name=r[9],
        model_id=r[10],
        usage=lenient_json(_dec_usage, r[11], "usage", mid),
        latency_ms=r[12],
        acp_message_id=r[13],
        acp_parts=lenient_json(_dec_any_list, r[14], "acp_parts", mid) if acp_parts else None,
        status=r[15] or "completed",
        error=r[16],
        created_at=r[17],
        updated_at=r[18],
        seq=r[19],
        delivery=None if r[20] is None else _delivery_or_none(r[20], mid),
        suggestions=None if r[21] is None else lenient_json(_dec_tags, r[21], "suggestions", mid),
        edited_at=r[22],
    )


def _delivery_or_none(raw: str, row_id: str) -> MessageDelivery | None:
    """The delivery summary of an IM reply; one that does not decode (written by a newer
    build) is read as none: it is a record of the delivery, never needed to read the message."""
    try:
        return _dec_delivery.decode(raw)
    except msgspec.DecodeError as exc:
        log.warning("stored delivery of %s is not valid: %s", row_id, exc)
        return None


def message_values(m: MessageV2) -> tuple[Any, ...]:
    """Values for an INSERT with MESSAGE_COLUMNS."""
    return (
        m.id,
        m.session_id,
        m.parent_id,
        m.role,
        m.content_type,
        m.text_content,
        to_json(m.parts),
        to_json(m.tool_calls),
        m.tool_call_id,
        m.tool_name,
        m.model_id,
        to_json(m.usage),
        m.latency_ms,
        m.acp_message_id,
        to_json(m.acp_parts),
        m.status,
        m.error,
        m.created_at,
        m.updated_at,
        m.seq,
        to_json(m.delivery),
        to_json(m.suggestions),
        m.edited_at,
    )


def searchable_text(text_content: str | None, parts: list[ContentPart] | None) -> str:
    """The text of a message that search covers: its text plus its text and code parts."""
    chunks: list[str] = [text_content] if text_content else []
    for p in parts or ():
        if isinstance(p, TextPart) and p.text:
            chunks.append(p.text)
        elif isinstance(p, CodePart) and p.code:
            chunks.append(p.code)
    return "\n".join(chunks)
