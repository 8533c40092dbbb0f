"""The records of Qiming server sync (the rows of migration ``m_qiming_sync``'s tables as
SyncRepo reads them, and what the sync layer hands it to write).

Must stay true: a record is what one row (or one import) holds; no database access here.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from protocol.types import FINAL_MESSAGE_STATUSES, MessageStatus, MessageV2, SessionV2

__all__ = [
    "AccountRow",
    "SyncLink",
    "PulledMessage",
    "NewConversation",
    "ConversationUpdate",
    "UpdateOutcome",
    "PushCandidate",
    "OPEN_STATUSES",
    "LINK_COLUMNS",
    "link_from_row",
]

OPEN_STATUSES: tuple[str, ...] = tuple(sorted(set(get_args(MessageStatus)) - FINAL_MESSAGE_STATUSES))
"""Every status but the final ones (pending, paused, streaming): a session with a message in
one of these is never pushed (its reply is not final)."""

LINK_COLUMNS = (
    "l.account_key, l.conversation_id, l.session_id, l.agent_id, l.state, l.server_modified,"
    " l.server_topic, l.local_title, l.pulled_index, l.open_index, l.local_synced_at,"
    " l.reported_local, l.sandbox_session_id,"
    " EXISTS (SELECT 1 FROM sessions_v2 s WHERE s.id = l.session_id)"
)


class AccountRow(msgspec.Struct, frozen=True, kw_only=True):
    service_url: str
    account_key: str
    token_expires_at: int | None
    user: str | None
    """JSON of the user as the sync layer stored it."""
    config: str
    """JSON of the account configuration (agent, capabilities, timeouts)."""
    state: str
    last_sync_at: int | None
    last_result: str | None
    has_token: bool


class SyncLink(msgspec.Struct, frozen=True, kw_only=True):
    account_key: str
    conversation_id: int
    session_id: str
    agent_id: int | None
    state: str
    server_modified: int | None
    server_topic: str | None
    local_title: str | None
    pulled_index: int | None
    open_index: int | None
    local_synced_at: int | None
    reported_local: int
    sandbox_session_id: str | None
    session_exists: bool


class PulledMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A server message to store: the local message (its id, session and parent are set
    by the repo) and what identifies it on the server."""

    message: MessageV2
    server_index: int
    server_id: str | None
    digest: str
    finished: bool


class NewConversation(msgspec.Struct, frozen=True, kw_only=True):
    """A server conversation to import as a new session."""

    account_key: str
    conversation_id: int
    agent_id: int | None
    session: SessionV2
    messages: list[PulledMessage]
    server_modified: int | None
    server_topic: str | None
    sandbox_session_id: str | None
    now: int


class ConversationUpdate(msgspec.Struct, frozen=True, kw_only=True):
    """What a pull saw of a linked conversation: its messages (new and known) and metadata."""

    account_key: str
    conversation_id: int
    messages: list[PulledMessage]
    server_modified: int | None
    server_topic: str | None
    apply_title: str | None
    expected_title: str | None
    sandbox_session_id: str | None
    now: int


class UpdateOutcome(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    """``updated`` | ``local_deleted`` (the session went away meanwhile) | ``unlinked``."""
    added: int = 0
    changed: int = 0
    branched: bool = False
    """New server messages were added beside local ones (the local branch stays active)."""
    kept_edits: int = 0
    """Replies edited here that the server changed since: the server's text was added as a
    sibling of each (the edit stays, and so does the active branch)."""
    title_applied: bool = False
    session: SessionV2 | None = None


class PushCandidate(msgspec.Struct, frozen=True, kw_only=True):
    session: SessionV2 | None
    """None for a local deletion (the session is gone)."""
    link: SyncLink | None
    """None for a session never synced."""
    local_only: int
    """Messages of the session that are not on the server."""
    first_user_text: str | None


def link_from_row(row: tuple[Any, ...]) -> SyncLink:
    return SyncLink(
        account_key=row[0], conversation_id=row[1], session_id=row[2], agent_id=row[3], state=row[4],
        server_modified=row[5], server_topic=row[6], local_title=row[7], pulled_index=row[8],
        open_index=row[9], local_synced_at=row[10], reported_local=row[11], sandbox_session_id=row[12],
        session_exists=bool(row[13]),
    )
