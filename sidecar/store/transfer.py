"""Copying sessions: fork (a path into a new session), export and import (all branches).

Owns: the rules for copies. Must stay true:
- fork: new ids for the session and every copied message, parent links remapped, content
  (text, parts, tool calls, usage, timestamps) copied verbatim; the original is untouched.
  A copied message that was still pending/streaming becomes 'aborted' (no generation will
  ever finish the copy). Citations are copied with their messages.
- import: the document is validated whole (ids, sessions, parent links, no cycles, enums,
  citations) before anything is written; counters are recomputed from the messages, so they are true
  even for a hand-edited document; import(export(s)) reproduces s. An imported
  ``workspaceDir`` is dropped unless the caller trusts it (``trust_workspace``) and it is
  an existing directory: the workspace tools of a session read it without asking, so a
  file must not choose it. ``replace`` deletes the old session in the same transaction
  (its files and agent sessions are journaled for removal like a delete's).
- copies and imports own the data-dir files their messages reference (files.py), so a
  file shared with the original stays until the last of them is gone.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable

import apsw
import msgspec

from protocol.errors import ErrorCode
from protocol.types import FINAL_MESSAGE_STATUSES, MessageV2, SessionExport, SessionV2
from sidecar.errors import InvalidParams, StoreError
from sidecar.store.checks import (
    CONTENT_TYPES,
    MODES,
    ROLES,
    STATUSES,
    check_choice,
    check_tags,
    check_workspace_dir,
)
from sidecar.store.citations import CitationRows
from sidecar.store.citations import check_import as check_citations
from sidecar.store.ids import new_id
from sidecar.store import message_table
from sidecar.store.rows import MESSAGE_COLUMNS, message_from_row, searchable_text
from sidecar.store import search as message_search
from sidecar.store import session_table

__all__ = ["fork_session", "export_session", "import_session", "MAX_IMPORT_MESSAGES"]

MAX_IMPORT_MESSAGES = 200_000
_ALL_MESSAGES = f"SELECT {MESSAGE_COLUMNS} FROM messages_v2 WHERE session_id = ? ORDER BY created_at, id"


def _index_docs(messages: list[MessageV2]) -> list[tuple[str, str, str, str]]:
    return [
        (m.id, m.session_id, m.role, searchable_text(m.text_content, m.parts))
        for m in messages
        if m.status in FINAL_MESSAGE_STATUSES
    ]


def fork_session(conn: apsw.Connection, session_id: str, message_id: str, now: int) -> SessionV2:
    src = session_table.get(conn, session_id)
    message_table.get_in_session(conn, session_id, message_id)
    path = message_table.path(conn, session_id, message_id)
    new_session_id = new_id()
    id_map: dict[str, str] = {}
    copies: list[MessageV2] = []
    for m in path:
        new_mid = new_id()
        id_map[m.id] = new_mid
        status = m.status if m.status in FINAL_MESSAGE_STATUSES else "aborted"
        copies.append(
            MessageV2(
                id=new_mid,
                session_id=new_session_id,
                parent_id=None if m.parent_id is None else id_map[m.parent_id],
                role=m.role,
                content_type=m.content_type,
                text_content=m.text_content,
                parts=m.parts,
                tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id,
                tool_name=m.tool_name,
                model_id=m.model_id,
                usage=m.usage,
                latency_ms=m.latency_ms,
                acp_message_id=m.acp_message_id,
                acp_parts=m.acp_parts,
                status=status,
                error=m.error,
                created_at=m.created_at,
                updated_at=m.updated_at,
                seq=m.seq,
                suggestions=m.suggestions,
                edited_at=m.edited_at,
            )
        )
    forked = SessionV2(
        id=new_session_id,
        title=f"{src.title} (fork)",
        summary=src.summary,
        summary_source=src.summary_source,
        provider_id=src.provider_id,
        model_id=src.model_id,
        system_prompt=src.system_prompt,
        mode=src.mode,
        workspace_dir=src.workspace_dir,
        tags=list(src.tags),
        folder=src.folder,
        message_count=len(copies),
        created_at=now,
        updated_at=now,
        last_message_at=max((c.created_at for c in copies), default=None),
        active_leaf_id=copies[-1].id if copies else None,
    )
    session_table.insert(conn, forked)
    message_table.insert_many(conn, copies)  # the copies own the files too
    CitationRows.copy(conn, id_map, new_session_id, session_id)
    message_search.index(conn, _index_docs(copies), fresh=True)
    return forked


Progress = Callable[[int, int], None]
"""``progress(done, total)``: messages handled so far of all (called from the store's thread)."""
PROGRESS_STEP = 1000


def export_session(conn: apsw.Connection, session_id: str, progress: Progress | None = None) -> SessionExport:
    session = session_table.get(conn, session_id)
    if progress is None:
        return SessionExport(session=session, messages=CitationRows.attach(conn, message_table.all_messages(conn, session_id)))
    counted = conn.execute("SELECT count(*) FROM messages_v2 WHERE session_id = ?", (session_id,)).fetchall()[0][0]
    total = counted if isinstance(counted, int) else 0
    progress(0, total)
    messages = []
    for row in conn.execute(_ALL_MESSAGES, (session_id,)):
        messages.append(message_from_row(row))
        if len(messages) % PROGRESS_STEP == 0:
            progress(len(messages), total)
    progress(len(messages), total)
    return SessionExport(session=session, messages=CitationRows.attach(conn, messages))


def _trusted_workspace(session: SessionV2, trust: bool) -> str | None:
    """The imported ``workspaceDir`` if the caller trusts it and it is a directory, else None."""
    if session.workspace_dir is None or not trust:
        return None
    try:
        checked = check_workspace_dir("session.workspaceDir", session.workspace_dir)
    except InvalidParams:
        return None  # not an absolute path: not a directory that exists either
    if not checked or not Path(checked).is_dir():
        return None
    return checked


def _validate_import(session: SessionV2, messages: list[MessageV2]) -> list[MessageV2]:
    if not isinstance(session, SessionV2):
        raise InvalidParams("session must be a SessionV2 object")
    if not isinstance(messages, list) or not all(isinstance(m, MessageV2) for m in messages):
        raise InvalidParams("messages must be a list of MessageV2 objects")
    if not session.id.strip():
        raise InvalidParams("session.id must not be empty")
    if len(messages) > MAX_IMPORT_MESSAGES:
        raise InvalidParams(f"messages: at most {MAX_IMPORT_MESSAGES} messages per import")
    check_choice("session.mode", session.mode, MODES)
    check_tags("session.tags", session.tags)
    by_id: dict[str, MessageV2] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not m.id.strip():
            raise InvalidParams(f"{where}.id must not be empty")
        if m.id in by_id:
            raise InvalidParams(f"{where}.id {m.id!r} appears twice")
        if m.session_id != session.id:
            raise InvalidParams(f"{where}.sessionId {m.session_id!r} is not session.id {session.id!r}")
        check_choice(f"{where}.role", m.role, ROLES)
        check_choice(f"{where}.status", m.status, STATUSES)
        check_choice(f"{where}.contentType", m.content_type, CONTENT_TYPES)
        by_id[m.id] = m
    for i, m in enumerate(messages):
        if m.parent_id is not None and m.parent_id not in by_id:
            raise InvalidParams(f"messages[{i}].parentId {m.parent_id!r} is not a message of the import")
    # Every walk up must reach a root: colour nodes known to reach one.
    rooted: set[str] = set()
    for m in messages:
        trail: list[str] = []
        on_trail: set[str] = set()
        cur: MessageV2 | None = m
        while cur is not None and cur.id not in rooted:
            if cur.id in on_trail:
                raise InvalidParams(f"messages: parent links form a cycle through {cur.id!r}")
            trail.append(cur.id)
            on_trail.add(cur.id)
            cur = None if cur.parent_id is None else by_id[cur.parent_id]
        rooted.update(trail)
    if session.active_leaf_id is not None and session.active_leaf_id not in by_id:
        raise InvalidParams("session.activeLeafId is not a message of the import")
    check_citations(messages)
    # Nothing will ever finish an imported in-flight message.
    return [
        m if m.status in FINAL_MESSAGE_STATUSES else _with_status(m, "aborted") for m in messages
    ]


def _with_status(m: MessageV2, status: str) -> MessageV2:
    return msgspec.structs.replace(m, status=status)


def import_session(
    conn: apsw.Connection,
    session: SessionV2,
    messages: list[MessageV2],
    *,
    replace: bool,
    trust_workspace: bool = False,
    progress: Progress | None = None,
) -> SessionV2:
    messages = _validate_import(session, messages)
    workspace_dir = _trusted_workspace(session, trust_workspace)
    if session_table.exists(conn, session.id):
        if not replace:
            raise StoreError(
                f"session {session.id!r} already exists (import with replace to overwrite it)",
                code=ErrorCode.BAD_STATE,
                data={"sessionId": session.id},
            )
        session_table.delete(conn, session.id)
    if messages:
        # Message ids are global keys: an id used by another session cannot be imported.
        ids = [m.id for m in messages]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            taken = conn.execute(
                f"SELECT id FROM messages_v2 WHERE id IN ({','.join('?' * len(chunk))}) LIMIT 1",
                chunk,
            ).fetchall()
            if taken:
                raise StoreError(
                    f"message id {taken[0][0]!r} already exists in another session",
                    code=ErrorCode.BAD_STATE,
                    data={"messageId": taken[0][0]},
                )
    if progress is not None:  # refused before this point: no progress at all
        progress(0, len(messages))
    stored = msgspec.structs.replace(
        session,
        tags=check_tags("session.tags", session.tags),
        message_count=len(messages),
        last_message_at=max((m.created_at for m in messages), default=None),
        active_leaf_id=session.active_leaf_id,
        workspace_dir=workspace_dir,
    )
    session_table.insert(conn, stored)
    if messages:
        for start in range(0, len(messages), PROGRESS_STEP):
            message_table.insert_many(conn, messages[start : start + PROGRESS_STEP])
            if progress is not None:
                progress(min(start + PROGRESS_STEP, len(messages)), len(messages))
        for m in messages:
            if m.citations:
                CitationRows.insert(conn, m.id, stored.id, m.citations)
        if stored.active_leaf_id is None:
            leaf = message_table.newest_leaf(conn, stored.id)
            session_table.set_active_leaf(conn, stored.id, leaf)
            stored = msgspec.structs.replace(stored, active_leaf_id=leaf)
        message_search.index(conn, _index_docs(messages), fresh=True)
    return stored
