"""Importing server conversations, inside the caller's transaction (SyncRepo.import_new,
import_update and import_batch call these).

Must stay true (see sync.py): an import writes the session, its messages, their search
index, the message map and the link together; a server message index is imported at most
once per account; the tree is add-only (new server messages are appended under the local
copy of the newest server message before them); only a message that came from the server
and was not edited here is rewritten.
"""

from __future__ import annotations

import logging

import apsw
import msgspec

from protocol.types import MessageV2, SessionV2
from sidecar.store import message_table, session_table
from sidecar.store import search as message_search
from sidecar.store.ids import new_id
from sidecar.store.rows import searchable_text, to_json
from sidecar.store.settings import DEFAULT_MODEL_KEY, DEFAULT_PROVIDER_KEY, setting
from sidecar.store.sync_records import (
    LINK_COLUMNS,
    ConversationUpdate,
    NewConversation,
    PulledMessage,
    UpdateOutcome,
    link_from_row,
)
from sidecar.store.transfer import import_session

__all__ = ["import_new", "import_update"]

log = logging.getLogger("sidecar.store.sync")


def import_new(conn: apsw.Connection, item: NewConversation) -> SessionV2:
    """See ``SyncRepo.import_new``."""
    _, foreign = _known_indexes(
        conn, item.account_key, item.conversation_id, [p.server_index for p in item.messages]
    )
    messages = [p for p in item.messages if p.server_index not in foreign]
    provider = item.session.provider_id or setting(conn, DEFAULT_PROVIDER_KEY) or ""
    model = item.session.model_id or setting(conn, DEFAULT_MODEL_KEY) or ""
    stored_messages: list[MessageV2] = []
    parent: str | None = None
    for pulled in messages:
        mid = new_id()
        stored_messages.append(
            msgspec.structs.replace(pulled.message, id=mid, session_id=item.session.id, parent_id=parent)
        )
        parent = mid
    stored = import_session(
        conn,
        msgspec.structs.replace(
            item.session, provider_id=provider, model_id=model,
            active_leaf_id=stored_messages[-1].id if stored_messages else None,
        ),
        stored_messages,
        replace=False,
    )
    _map_messages(conn, item.account_key, item.conversation_id, item.session.id, messages, stored_messages)
    indexes = [p.server_index for p in messages]
    conn.execute(
        "INSERT INTO sync_links (account_key, conversation_id, session_id, agent_id, state, server_modified,"
        " server_topic, local_title, pulled_index, open_index, local_synced_at, reported_local,"
        " sandbox_session_id, pulled_at, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'linked', ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)"
        " ON CONFLICT(account_key, conversation_id) DO UPDATE SET session_id = excluded.session_id,"
        " agent_id = excluded.agent_id, state = 'linked', server_modified = excluded.server_modified,"
        " server_topic = excluded.server_topic, local_title = excluded.local_title,"
        " pulled_index = excluded.pulled_index, open_index = excluded.open_index,"
        " local_synced_at = excluded.local_synced_at, reported_local = 0,"
        " sandbox_session_id = excluded.sandbox_session_id, pulled_at = excluded.pulled_at,"
        " updated_at = excluded.updated_at",
        (
            item.account_key, item.conversation_id, item.session.id, item.agent_id, item.server_modified, item.server_topic,
            stored.title, max(indexes, default=None),
            min((p.server_index for p in messages if not p.finished), default=None),
            stored.updated_at, item.sandbox_session_id, item.now, item.now, item.now,
        ),
    )
    return stored


def import_update(conn: apsw.Connection, item: ConversationUpdate) -> UpdateOutcome:
    """See ``SyncRepo.import_update`` (inside the caller's transaction)."""
    row = conn.execute(
        f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.conversation_id = ?",
        (item.account_key, item.conversation_id),
    ).fetchone()
    if row is None:
        return UpdateOutcome(state="unlinked")
    link = link_from_row(row)
    if link.state != "linked":
        return UpdateOutcome(state="unlinked")
    if not link.session_exists:
        return UpdateOutcome(state="local_deleted")
    session_id = link.session_id
    before = session_table.get(conn, session_id)
    locally_changed = before.updated_at > (link.local_synced_at or -1)
    known, foreign = _known_indexes(conn, item.account_key, item.conversation_id, [p.server_index for p in item.messages])
    fresh = [p for p in item.messages if p.server_index not in known and p.server_index not in foreign]
    added = _append_branch(conn, item.account_key, item.conversation_id, session_id, fresh, before)
    changed_count, kept_edits = _rewrite(
        conn, item.account_key, item.conversation_id, [p for p in item.messages if p.server_index in known], item.now
    )
    title_applied = False
    topic_snapshot = item.server_topic
    title_snapshot = link.local_title
    if item.apply_title is not None:
        if before.title == item.expected_title:
            if item.apply_title != before.title:
                conn.execute("UPDATE sessions_v2 SET title = ? WHERE id = ?", (item.apply_title, session_id))
            title_applied = True
            title_snapshot = item.apply_title
        else:
            topic_snapshot = link.server_topic
    if added or changed_count or kept_edits:
        session_table.recount(conn, session_id)
    # Local clock only: a server time ahead of ours would hide later local edits.
    updated_at = before.updated_at
    if added or changed_count or kept_edits or title_applied:
        updated_at = max(before.updated_at, min(item.server_modified or item.now, item.now))
        if title_applied:
            updated_at = max(updated_at, item.now)
        session_table.touch(conn, session_id, updated_at)
    stats = conn.execute(
        "SELECT max(server_index), min(CASE WHEN finished = 0 THEN server_index END)"
        " FROM sync_messages WHERE account_key = ? AND conversation_id = ?",
        (item.account_key, item.conversation_id),
    ).fetchall()[0]
    conn.execute(
        "UPDATE sync_links SET server_modified = ?, server_topic = ?, local_title = ?,"
        " pulled_index = ?, open_index = ?, local_synced_at = ?, sandbox_session_id = coalesce(?,"
        " sandbox_session_id), pulled_at = ?, updated_at = ? WHERE account_key = ? AND conversation_id = ?",
        (
            item.server_modified, topic_snapshot, title_snapshot, stats[0], stats[1],
            link.local_synced_at if locally_changed else updated_at,
            item.sandbox_session_id, item.now, item.now, item.account_key, item.conversation_id,
        ),
    )
    session = session_table.get(conn, session_id)
    branched = added > 0 and session.active_leaf_id is not None and not _is_server_message(
        conn, session.active_leaf_id
    )
    return UpdateOutcome(
        state="updated", added=added, changed=changed_count, kept_edits=kept_edits, branched=branched,
        title_applied=title_applied, session=session,
    )





def _is_server_message(conn: apsw.Connection, message_id: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM sync_messages WHERE message_id = ?", (message_id,)).fetchall())


def _known_indexes(
    conn: apsw.Connection, account_key: str, conversation_id: int, indexes: list[int]
) -> tuple[set[int], set[int]]:
    """Of ``indexes``: those this conversation holds already, and those another one holds
    (a server that reuses an index must not touch another session's message)."""
    mine: set[int] = set()
    foreign: set[int] = set()
    for start in range(0, len(indexes), 500):
        chunk = indexes[start : start + 500]
        for index, owner in conn.execute(
            f"SELECT server_index, conversation_id FROM sync_messages WHERE account_key = ?"
            f" AND server_index IN ({','.join('?' * len(chunk))})",
            [account_key, *chunk],
        ):
            (mine if owner == conversation_id else foreign).add(index)
    if foreign:
        log.warning(
            "conversation %s: %d server message indexes belong to another conversation; not imported",
            conversation_id, len(foreign),
        )
    return mine, foreign


def _map_messages(
    conn: apsw.Connection, account_key: str, conversation_id: int, session_id: str,
    pulled: list[PulledMessage], stored: list[MessageV2],
) -> None:
    conn.executemany(
        "INSERT INTO sync_messages (message_id, session_id, account_key, conversation_id, server_index, server_id,"
        " digest, finished) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (m.id, session_id, account_key, conversation_id, p.server_index, p.server_id, p.digest, int(p.finished))
            for p, m in zip(pulled, stored, strict=True)
        ],
    )


def _append_branch(
    conn: apsw.Connection, account_key: str, conversation_id: int, session_id: str,
    fresh: list[PulledMessage], before: SessionV2,
) -> int:
    """Chain ``fresh`` (server order) under the local copy of the newest server message
    before them; the active branch follows only if it was the server's branch."""
    if not fresh:
        return 0
    anchor = conn.execute(
        "SELECT message_id FROM sync_messages WHERE account_key = ? AND conversation_id = ? AND server_index < ?"
        " ORDER BY server_index DESC LIMIT 1",
        (account_key, conversation_id, fresh[0].server_index),
    ).fetchone()
    parent: str | None = None if anchor is None else anchor[0]
    old_server_leaf = conn.execute(
        "SELECT message_id FROM sync_messages WHERE account_key = ? AND conversation_id = ?"
        " ORDER BY server_index DESC LIMIT 1",
        (account_key, conversation_id),
    ).fetchone()
    stored: list[MessageV2] = []
    for pulled in fresh:
        mid = new_id()
        stored.append(msgspec.structs.replace(pulled.message, id=mid, session_id=session_id, parent_id=parent))
        parent = mid
    message_table.insert_many(conn, stored)
    _map_messages(conn, account_key, conversation_id, session_id, fresh, stored)
    message_search.index(
        conn,
        [(m.id, session_id, m.role, searchable_text(m.text_content, m.parts)) for m in stored],
        fresh=True,
    )
    active = before.active_leaf_id
    follows_server = active is None or (old_server_leaf is not None and active == old_server_leaf[0])
    if follows_server:
        session_table.set_active_leaf(conn, session_id, stored[-1].id)
    return len(stored)


def _rewrite(
    conn: apsw.Connection, account_key: str, conversation_id: int, changed: list[PulledMessage], now: int
) -> tuple[int, int]:
    """Known server messages whose mapped content changed (a reply that finished later):
    (rewritten, kept edits). A message edited here (``edited_at``) is never overwritten:
    the server's version becomes a sibling of it, which the server index maps from now on
    (later changes on the server go there), and the edit stays where it is, local only."""
    count = kept = 0
    for p in changed:
        row = conn.execute(
            "SELECT x.message_id, x.digest, m.session_id, m.role, m.edited_at, m.parent_id FROM sync_messages x"
            " JOIN messages_v2 m ON m.id = x.message_id"
            " WHERE x.account_key = ? AND x.server_index = ? AND x.conversation_id = ?",
            (account_key, p.server_index, conversation_id),
        ).fetchone()
        if row is None or row[1] == p.digest:
            continue
        message_id, _, session_id, role, edited_at, parent_id = row
        m = p.message
        if edited_at is not None:
            sibling = msgspec.structs.replace(m, id=new_id(), session_id=session_id, parent_id=parent_id)
            message_table.insert_many(conn, [sibling])
            conn.execute(
                "UPDATE sync_messages SET message_id = ?, digest = ?, finished = ? WHERE message_id = ?",
                (sibling.id, p.digest, int(p.finished), message_id),
            )
            message_search.index(
                conn, [(sibling.id, session_id, sibling.role, searchable_text(m.text_content, m.parts))], fresh=True,
            )
            kept += 1
            continue
        conn.execute(
            "UPDATE messages_v2 SET text_content = ?, parts = ?,"
            " content_type = CASE WHEN ? IS NOT NULL THEN 'multipart' ELSE 'text' END,"
            " status = ?, error = ?, updated_at = max(updated_at, ?) WHERE id = ?",
            (m.text_content, to_json(m.parts) if m.parts else None, to_json(m.parts) if m.parts else None,
             m.status, m.error, now, message_id),
        )
        conn.execute(
            "UPDATE sync_messages SET digest = ?, finished = ? WHERE message_id = ?",
            (p.digest, int(p.finished), message_id),
        )
        conn.execute("DELETE FROM search_docs WHERE message_id = ?", (message_id,))
        message_search.index(conn, [(message_id, session_id, role, searchable_text(m.text_content, m.parts))],
                            fresh=True)
        count += 1
    return count, kept
