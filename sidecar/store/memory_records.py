"""The records of the memory tables (memories, memory_proposals, soul_versions), their
wire form (protocol.memory), and how a row becomes one.

Must stay true: a record's enum-like fields carry the protocol's Literals; text read from
the database is narrowed here (flags are decoded as ``MemoryFlag``; a row whose flags do
not decode reads as having none), so the wire form needs no cast.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.memory import (
    Memory,
    MemoryFlag,
    MemoryKind,
    MemoryProposal,
    MemorySource,
    MemorySourceKind,
    MemoryStatus,
    ProposalAction,
    ProposalStatus,
    SoulSource,
    SoulVersion,
)

__all__ = [
    "MemoryRecord",
    "NewMemory",
    "ProposalRecord",
    "SoulRecord",
    "MEMORY_COLUMNS",
    "PROPOSAL_COLUMNS",
    "SOUL_COLUMNS",
    "memory_from_row",
    "proposal_from_row",
    "soul_from_row",
]

MEMORY_COLUMNS = (
    "rowid, id, scope, kind, text, task, outcome, context, topic_key, norm_hash, source_kind, session_id,"
    " message_id, tool_call_id, flags, supersedes, superseded_by, deleted_at, use_count, last_used_at, tokens,"
    " created_at, updated_at"
)
_flags_decoder = msgspec.json.Decoder(list[MemoryFlag])


def _flags(raw: Any) -> list[MemoryFlag]:
    try:
        return _flags_decoder.decode(raw) if raw else []
    except msgspec.DecodeError:
        return []


class NewMemory(msgspec.Struct, kw_only=True):
    """A version to write (the service computes hash, tokens and flags)."""

    scope: str
    kind: MemoryKind
    text: str
    task: str | None = None
    outcome: str | None = None
    context: str | None = None
    key: str | None = None
    norm_hash: str
    source_kind: MemorySourceKind
    session_id: str | None = None
    message_id: str | None = None
    tool_call_id: str | None = None
    flags: list[MemoryFlag] = []
    tokens: int = 0


class MemoryRecord(msgspec.Struct, kw_only=True):
    rowid: int
    id: str
    scope: str
    kind: MemoryKind
    text: str
    task: str | None
    outcome: str | None
    context: str | None
    key: str | None
    norm_hash: str
    source_kind: MemorySourceKind
    session_id: str | None
    message_id: str | None
    tool_call_id: str | None
    flags: list[MemoryFlag]
    supersedes: str | None
    superseded_by: str | None
    deleted_at: int | None
    use_count: int
    last_used_at: int | None
    tokens: int
    created_at: int
    updated_at: int
    models: list[str] = []

    @property
    def active(self) -> bool:
        return self.superseded_by is None and self.deleted_at is None

    @property
    def status(self) -> MemoryStatus:
        if self.deleted_at is not None:
            return "deleted"
        return "superseded" if self.superseded_by is not None else "active"

    def to_wire(self) -> Memory:
        return Memory(
            id=self.id, scope=self.scope, kind=self.kind, text=self.text,
            task=self.task, outcome=self.outcome, context=self.context, key=self.key,
            source=MemorySource(
                kind=self.source_kind,
                session_id=self.session_id, message_id=self.message_id, tool_call_id=self.tool_call_id,
            ),
            flags=list(self.flags),
            status=self.status,
            supersedes=self.supersedes, superseded_by=self.superseded_by, deleted_at=self.deleted_at,
            use_count=self.use_count, last_used_at=self.last_used_at, embedding_models=list(self.models),
            tokens=self.tokens, created_at=self.created_at, updated_at=self.updated_at,
        )


class ProposalRecord(msgspec.Struct, kw_only=True):
    id: str
    session_id: str
    message_id: str
    assistant_id: str
    scope: str
    kind: MemoryKind
    text: str
    task: str | None = None
    outcome: str | None = None
    context: str | None = None
    key: str | None = None
    action: ProposalAction
    supersedes: str | None = None
    reason: str = ""
    flags: list[MemoryFlag] = []
    status: ProposalStatus = "pending"
    created_at: int = 0

    def to_wire(self, supersedes_text: str | None = None) -> MemoryProposal:
        return MemoryProposal(
            id=self.id, session_id=self.session_id, message_id=self.message_id, assistant_id=self.assistant_id,
            scope=self.scope, kind=self.kind,
            text=self.text, task=self.task, outcome=self.outcome, context=self.context, key=self.key,
            action=self.action,
            supersedes=self.supersedes, supersedes_text=supersedes_text, reason=self.reason,
            flags=list(self.flags),
            status=self.status,
            created_at=self.created_at,
        )


class SoulRecord(msgspec.Struct, kw_only=True):
    scope: str
    version: int
    content: str
    source: SoulSource
    reason: str | None
    session_id: str | None
    message_id: str | None
    reverted_from: int | None
    created_at: int

    def to_wire(self) -> SoulVersion:
        return SoulVersion(
            version=self.version, content=self.content, bytes=len(self.content.encode("utf-8")),
            source=self.source,
            reason=self.reason, session_id=self.session_id, message_id=self.message_id,
            reverted_from=self.reverted_from, created_at=self.created_at,
        )


def memory_from_row(row: tuple[Any, ...]) -> MemoryRecord:
    (rowid, mid, scope, kind, text, task, outcome, context, key, nhash, skind, sid, msg, call, flags, sup,
     sup_by, deleted, uses, used_at, tokens, created, updated) = row
    flag_list = _flags(flags)
    return MemoryRecord(
        rowid=rowid, id=mid, scope=scope, kind=kind, text=text, task=task, outcome=outcome, context=context,
        key=key, norm_hash=nhash, source_kind=skind, session_id=sid, message_id=msg, tool_call_id=call,
        flags=flag_list, supersedes=sup, superseded_by=sup_by, deleted_at=deleted, use_count=uses,
        last_used_at=used_at, tokens=tokens, created_at=created, updated_at=updated,
    )



PROPOSAL_COLUMNS = (
    "id, session_id, message_id, assistant_id, scope, kind, text, task, outcome, context, topic_key, action,"
    " supersedes, reason, flags, status, created_at"
)


def proposal_from_row(row: tuple[Any, ...]) -> ProposalRecord:
    (pid, sid, mid, aid, scope, kind, text, task, outcome, context, key, action, sup, reason, flags, status,
     created) = row
    flag_list = _flags(flags)
    return ProposalRecord(
        id=pid, session_id=sid, message_id=mid, assistant_id=aid, scope=scope, kind=kind, text=text, task=task,
        outcome=outcome, context=context, key=key, action=action, supersedes=sup, reason=reason, flags=flag_list,
        status=status, created_at=created,
    )


SOUL_COLUMNS = "scope, version, content, source, reason, session_id, message_id, reverted_from, created_at"


def soul_from_row(row: tuple[Any, ...]) -> SoulRecord:
    scope, version, content, source, reason, sid, mid, reverted, created = row
    return SoulRecord(scope=scope, version=version, content=content, source=source, reason=reason,
                      session_id=sid, message_id=mid, reverted_from=reverted, created_at=created)
