"""``chat:session:*``: create, list, get, update, delete, archive, pin, fork, export, import (seed 004 sections 5-6).

Structs that describe changes (SessionUpdates) forbid unknown fields, so a typo or a
read-only field is an invalid-params error, not a no-op.
"""

from __future__ import annotations

from typing import Literal

from msgspec import UNSET, UnsetType

from protocol.limits import Id, Int64, JsonObject, Offset, SearchText, SessionPageLimit, Title
from protocol.common import IdParams, MethodSpec, ProgressToken, SuccessResult
from protocol.types import DateRange, MessageV2, SessionExport, SessionMode, SessionV2, Struct

__all__ = [
    "CreateSessionOptions",
    "SessionSortBy",
    "SessionFilter",
    "SessionListResult",
    "SessionUpdates",
    "SessionUpdateParams",
    "SessionPinParams",
    "SessionForkParams",
    "SessionImportParams",
    "SessionExportParams",
]


class CreateSessionOptions(Struct, kw_only=True):
    """Params of ``chat:session:create``; omitted provider/model use the configured default."""

    title: Title | None = None
    provider_id: Id | None = None
    model_id: Id | None = None
    system_prompt: str | None = None
    mode: SessionMode = "direct"
    tags: list[str] | None = None
    folder: Title | None = None
    channel_id: Id | None = None
    channel_meta: JsonObject | None = None
    workspace_dir: str | None = None
    """Absolute path of the session's working directory (workspace tools, ACP ``cwd``)."""


SessionSortBy = Literal["updated_at", "created_at", "last_message_at"]


class SessionFilter(Struct, kw_only=True):
    """Params of ``chat:session:list``. Pinned sessions always come first."""

    search: SearchText | None = None
    """Substring match over title and summary (case-insensitive)."""
    folder: Title | None = None
    tags: list[str] | None = None
    """Every given tag must be on the session."""
    is_archived: bool | None = None
    is_pinned: bool | None = None
    channel_id: Id | None = None
    date_range: DateRange | None = None
    """Bounds (inclusive, ms) on the sort field."""
    limit: SessionPageLimit = 50
    """1..500."""
    offset: Offset = 0
    sort_by: SessionSortBy = "updated_at"


class SessionListResult(Struct, omit_defaults=False, kw_only=True):
    sessions: list[SessionV2]
    total: Int64
    """All matches, ignoring limit/offset."""


class SessionUpdates(Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields ``chat:session:update`` may change; anything else is invalid params. A
    field left out keeps its value; ``null`` clears it to the default (``title``: "New
    Chat"; ``tags``: none; ``isPinned``/``isArchived``: false; ``providerId``/``modelId``: the
    configured default; the others: none). ``""`` still clears a text field."""

    title: Title | None | UnsetType = UNSET
    summary: str | None | UnsetType = UNSET
    system_prompt: str | None | UnsetType = UNSET
    tags: list[str] | None | UnsetType = UNSET
    folder: Title | None | UnsetType = UNSET
    is_pinned: bool | None | UnsetType = UNSET
    is_archived: bool | None | UnsetType = UNSET
    provider_id: Id | None | UnsetType = UNSET
    model_id: Id | None | UnsetType = UNSET
    channel_id: Id | None | UnsetType = UNSET
    channel_meta: JsonObject | None | UnsetType = UNSET
    workspace_dir: str | None | UnsetType = UNSET
    """An absolute path."""


class SessionUpdateParams(Struct, kw_only=True):
    id: Id
    updates: SessionUpdates


class SessionPinParams(Struct, kw_only=True):
    id: Id
    pinned: bool


class SessionForkParams(Struct, kw_only=True):
    id: Id
    message_id: Id
    """The copy holds the path root -> this message."""


class SessionImportParams(Struct, kw_only=True):
    """``chat:session:import``: a SessionExport's session and messages (all branches)."""

    session: SessionV2
    messages: list[MessageV2]
    replace: bool = False
    """Overwrite a session with the same id; otherwise an existing id is BAD_STATE. The old
    session goes as with ``chat:session:delete`` (its running reply is aborted, paused
    replies and agent sessions are closed, its files removed)."""
    trust_workspace: bool = False
    """Keep the imported ``workspaceDir`` (only if it is an existing directory). Without it
    the value is dropped: the workspace tools read a session's workspace without asking."""
    progress_token: ProgressToken | None = None
    """Report progress as ``sidecar:progress`` under this token (done/total count messages)."""


class SessionExportParams(Struct, kw_only=True):
    """``chat:session:export``."""

    id: Id
    progress_token: ProgressToken | None = None
    """Report progress as ``sidecar:progress`` under this token (done/total count messages)."""


METHODS: dict[str, MethodSpec] = {
    "chat:session:create": MethodSpec(CreateSessionOptions, SessionV2, "Create a session."),
    "chat:session:list": MethodSpec(
        SessionFilter, SessionListResult, "List sessions matching a filter, pinned first."
    ),
    "chat:session:get": MethodSpec(IdParams, SessionV2, "One session by id."),
    "chat:session:update": MethodSpec(
        SessionUpdateParams, SessionV2, "Change title, tags, folder, prompt, model and similar fields."
    ),
    "chat:session:delete": MethodSpec(
        IdParams, SuccessResult, "Delete a session and everything under it."
    ),
    "chat:session:archive": MethodSpec(IdParams, SuccessResult, "Archive a session."),
    "chat:session:pin": MethodSpec(SessionPinParams, SuccessResult, "Pin or unpin a session."),
    "chat:session:fork": MethodSpec(
        SessionForkParams, SessionV2, "New session holding a copy of the path root -> messageId."
    ),
    "chat:session:export": MethodSpec(
        SessionExportParams, SessionExport, "A whole session with all branches as one JSON document."
    ),
    "chat:session:import": MethodSpec(
        SessionImportParams, SessionV2, "Store an exported session (all branches)."
    ),
    "chat:session:summarize": MethodSpec(
        IdParams, SessionV2, "Write the session's summary with a model call now (it replaces any summary)."
    ),
    "chat:session:title": MethodSpec(
        IdParams, SessionV2, "Name the session again with a model call now (it replaces the title)."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
