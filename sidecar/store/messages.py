"""MessageRepo: the messages repository (``messages_v2``, the message tree, streaming).

Owns: reading messages (one, a branch, a page, the tree), appending, streaming updates,
finishing and pausing replies, suggestions, the user's edit of a reply, deleting a
message or a branch, and crash recovery of rows left in flight.
Must stay true:
- Each method is one transaction; validation runs before anything is written.
- ``append(parent_id=ACTIVE_LEAF)`` (the default) appends below the active leaf;
  ``parent_id=None`` starts a new root. ``content_type`` is stored as 'multipart'
  whenever parts are stored.
- A message is indexed for search when it reaches a final status, and only then.
- Every message stored with content, and every final or paused content, owns the
  data-dir files it references (files.py).
- ``delete_branch`` removes a message and its subtree, ``delete_message`` one message (its
  children move up to its parent), with counters, search index and active leaf kept true;
  the files and agent sessions only the deleted rows used are journaled by the same
  transaction (files.py, acp.py): call ``StorageService.release()``
  (sidecar/engine/storage.py) after it.
The SQL on a connection lives in message_table.py (rows, tree walks) and session_table.py.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final, Literal, cast

import msgspec

from protocol import limits
from protocol.errors import ErrorCode
from protocol.messages import MessageQueryOptions
from protocol.types import FINAL_MESSAGE_STATUSES, ContentPart, MessageTreeNode, MessageV2, TextPart, ToolCall, Usage
from sidecar.errors import InvalidParams, NotFound, StoreError
from sidecar.store import message_table, recovery, session_table
from sidecar.store import search as message_search
from sidecar.store.checks import (
    CONTENT_TYPES,
    ROLES,
    STATUSES,
    check_choice,
    check_range,
    check_text,
)
from sidecar.store.citations import CitationRows
from sidecar.store.db import Database
from sidecar.store.files import data_dir_of, record_message_files
from sidecar.store.ids import new_id
from sidecar.store.rows import parts_or_none, searchable_text, to_json

__all__ = ["MessageRepo", "ACTIVE_LEAF", "MAX_MESSAGES_LIMIT", "Deleted", "edited_parts"]

MAX_MESSAGES_LIMIT = limits.MAX_MESSAGES_PAGE


class Deleted(msgspec.Struct, frozen=True, kw_only=True):
    """What ``MessageRepo.delete`` removed, and the session's active leaf afterwards."""

    ids: list[str]
    active_leaf_id: str | None


class _Default(enum.Enum):
    ACTIVE_LEAF = "active-leaf"


ACTIVE_LEAF: Final = _Default.ACTIVE_LEAF
"""Default ``parent_id`` of MessageRepo.append: the session's active leaf."""


class MessageRepo:
    """``messages_v2``, the message tree and streaming updates: one transaction per call.
    Every message stored with content, and every final or paused content, owns the data-dir
    files it references (files.py)."""

    def __init__(self, db: Database, clock: Callable[[], int]) -> None:
        self._db = db
        self._clock = clock


    def get(self, message_id: str) -> MessageV2:
        with self._db.read() as conn:
            return CitationRows.attach(conn, [message_table.get(conn, message_id)])[0]

    def path(self, session_id: str, leaf_id: str | None = None) -> list[MessageV2]:
        """Root -> ``leaf_id`` (default: the active leaf); [] for a session without messages."""
        with self._db.read() as conn:
            return self._path(conn, session_id, leaf_id)

    def query(
        self, session_id: str, options: MessageQueryOptions | None = None
    ) -> list[MessageV2]:
        """Messages of a branch (``options``); ``acpParts`` only with ``includeAcpParts``
        (a streaming ACP reply's come from its chunks, see acp.py)."""
        o = options if options is not None else MessageQueryOptions()
        if not isinstance(o, MessageQueryOptions):
            raise InvalidParams("options must be MessageQueryOptions")
        limit = None
        if o.limit is not None:
            limit = check_range("options.limit", o.limit, 1, MAX_MESSAGES_LIMIT)
        acp = o.include_acp_parts
        with self._db.read() as conn:
            messages = self._query(conn, session_id, o, limit, acp)
            if acp:
                messages = [_with_live_acp_parts(conn, m) for m in messages]
        return messages

    def _query(
        self, conn: Any, session_id: str, o: MessageQueryOptions, limit: int | None, acp: bool
    ) -> list[MessageV2]:
        if o.all_branches:
            session_table.require(conn, session_id)
            messages = message_table.all_messages(conn, session_id, acp_parts=acp)
            if o.before is not None:
                message_table.get_in_session(conn, session_id, o.before)
                cut = next(i for i, m in enumerate(messages) if m.id == o.before)
                messages = messages[:cut]
            return CitationRows.attach(conn, messages[-limit:] if limit is not None else messages)
        leaf = self._leaf(conn, session_id, o.leaf_id)
        if leaf is None:
            return []
        if o.before is not None:
            before = message_table.get_in_session(conn, session_id, o.before)
            if o.before not in message_table.ancestor_ids(conn, session_id, leaf):
                raise InvalidParams(
                    f"options.before {o.before!r} is not on the selected branch"
                )
            if before.parent_id is None:
                return []
            leaf = before.parent_id
        return CitationRows.attach(conn, message_table.path(conn, session_id, leaf, limit, acp_parts=acp))

    def tree(self, session_id: str) -> list[MessageTreeNode]:
        """Every message as a forest; siblings in creation order, the active path marked."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,)
            ).fetchall()
            if not rows:
                session_table.require(conn, session_id)
            messages = CitationRows.attach(conn, message_table.all_messages(conn, session_id, acp_parts=False))
            leaf = rows[0][0]
            if leaf is None or not any(m.id == leaf for m in messages):
                leaf = message_table.newest_leaf(conn, session_id)
        by_id = {m.id: m for m in messages}
        active: set[str] = set()
        while leaf is not None and leaf not in active and leaf in by_id:
            active.add(leaf)
            leaf = by_id[leaf].parent_id
        nodes = {m.id: MessageTreeNode(message=m, is_active=m.id in active) for m in messages}
        roots: list[MessageTreeNode] = []
        for m in messages:  # creation order, so children lists come out in creation order
            parent = nodes.get(m.parent_id) if m.parent_id is not None else None
            (parent.children if parent is not None else roots).append(nodes[m.id])
        return roots

    def select_branch(self, session_id: str, leaf_id: str) -> list[MessageV2]:
        """Make root -> the newest leaf below ``leaf_id`` the active branch; returns it."""
        with self._db.write() as conn:
            session_table.require(conn, session_id)
            message_table.get_in_session(conn, session_id, leaf_id)
            leaf = message_table.newest_leaf(conn, session_id, below=leaf_id) or leaf_id
            session_table.set_active_leaf(conn, session_id, leaf)
            return CitationRows.attach(conn, message_table.path(conn, session_id, leaf, acp_parts=False))

    def append(
        self,
        session_id: str,
        *,
        role: str,
        parent_id: str | None | Literal[_Default.ACTIVE_LEAF] = ACTIVE_LEAF,
        content_type: str = "text",
        text_content: str | None = None,
        parts: list[ContentPart] | None = None,
        tool_calls: list[ToolCall] | None = None,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        model_id: str | None = None,
        status: str = "completed",
        error: str | None = None,
        usage: Usage | None = None,
        latency_ms: int | None = None,
        acp_message_id: str | None = None,
        acp_parts: list[Any] | None = None,
        make_active: bool = True,
        seq: int | None = None,
    ) -> MessageV2:
        """Store a new message; counters follow, a final message is indexed for search."""
        role_ = check_choice("role", role, ROLES)
        status_ = check_choice("status", status, STATUSES)
        content_type_ = check_choice("contentType", content_type, CONTENT_TYPES)
        check_text("textContent", text_content)
        _check_list("parts", parts)
        _check_list("toolCalls", tool_calls)
        _check_list("acpParts", acp_parts)
        with self._db.write() as conn:
            rows = conn.execute(
                "SELECT active_leaf_id, last_message_at FROM sessions_v2 WHERE id = ?",
                (session_id,),
            ).fetchall()
            if not rows:
                session_table.require(conn, session_id)
            active_leaf, last_at = cast("str | None", rows[0][0]), cast("int | None", rows[0][1])
            if parent_id is ACTIVE_LEAF:
                parent = active_leaf
            elif parent_id is None:
                parent = None
            else:
                parent = message_table.get_in_session(conn, session_id, parent_id).id
            now = self._clock()
            # Never before the newest message: creation order must match time order.
            created = max(now, last_at or now)
            message = MessageV2(
                id=new_id(),
                session_id=session_id,
                parent_id=parent,
                role=role_,
                content_type="multipart" if parts else content_type_,
                text_content=text_content,
                parts=parts,
                tool_calls=tool_calls,
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                model_id=model_id,
                usage=usage,
                latency_ms=latency_ms,
                acp_message_id=acp_message_id,
                acp_parts=acp_parts,
                status=status_,
                error=error,
                created_at=created,
                updated_at=created,
                seq=seq,
            )
            message_table.insert(conn, message)
            session_table.after_append(
                conn, session_id, created, message.id if make_active else None, now
            )
            if status in FINAL_MESSAGE_STATUSES:
                message_search.index(
                    conn,
                    [(message.id, session_id, role, searchable_text(text_content, parts))],
                    fresh=True,
                )
        return message

    def update_partial(
        self,
        message_id: str,
        *,
        text_content: str | None,
        parts: list[ContentPart] | None,
        status: str = "streaming",
        seq: int | None = None,
    ) -> None:
        """Flush a streaming message's partial content: one UPDATE, no index, no counters."""
        check_choice("status", status, frozenset({"pending", "streaming"}))
        _check_list("parts", parts)
        with self._db.write() as conn:
            message_table.update_partial(
                conn,
                message_id,
                text_content=text_content,
                parts=to_json(parts) if parts else None,
                status=status,
                seq=seq,
                now=self._clock(),
            )

    def finish(
        self,
        message_id: str,
        *,
        status: str,
        text_content: str | None,
        parts: list[ContentPart] | None,
        tool_calls: list[ToolCall] | None = None,
        usage: Usage | None = None,
        latency_ms: int | None = None,
        model_id: str | None = None,
        error: str | None = None,
        seq: int | None = None,
    ) -> MessageV2:
        """Final content and status of a pending/streaming message; indexes it for search.
        None for tool_calls/usage/latency_ms/model_id/error/seq keeps the stored value."""
        check_choice("status", status, FINAL_MESSAGE_STATUSES)
        _check_list("parts", parts)
        _check_list("toolCalls", tool_calls)
        with self._db.write() as conn:
            now = self._clock()
            message_table.finish(
                conn,
                message_id,
                status=status,
                text_content=text_content,
                parts=to_json(parts) if parts else None,
                tool_calls=to_json(tool_calls),
                usage=to_json(usage),
                latency_ms=latency_ms,
                model_id=model_id,
                error=error,
                seq=seq,
                now=now,
            )
            message = message_table.get(conn, message_id)
            record_message_files(conn, data_dir_of(conn), message.session_id, message_id, text_content, parts, now)
            session_table.touch(conn, message.session_id, now)
            message_search.index(
                conn,
                [(message.id, message.session_id, message.role,
                  searchable_text(message.text_content, message.parts))],
            )
        return message

    def pause(
        self,
        message_id: str,
        *,
        text_content: str | None,
        parts: list[ContentPart] | None,
        tool_calls: list[ToolCall] | None,
        seq: int,
        usage: Usage | None = None,
    ) -> None:
        """A streaming reply waits for something outside it (tool approvals): its content,
        usage so far and seq, status ``paused``. Not indexed: it is not final. Whoever paused
        it records why in the same transaction (``Store.transaction``)."""
        _check_list("parts", parts)
        _check_list("toolCalls", tool_calls)
        with self._db.write() as conn:
            conn.execute(
                "UPDATE messages_v2 SET status = 'paused', text_content = ?, parts = ?,"
                " content_type = CASE WHEN ? IS NOT NULL THEN 'multipart' ELSE content_type END,"
                " tool_calls = ?, seq = ?, usage = COALESCE(?, usage), updated_at = ?"
                " WHERE id = ? AND status IN ('pending', 'streaming')",
                (text_content, to_json(parts) if parts else None, to_json(parts) if parts else None,
                 to_json(tool_calls), seq, to_json(usage) if usage is not None else None, self._clock(),
                 message_id),
            )
            if conn.changes() == 0:
                raise NotFound(f"message {message_id!r} is not being generated")
            if parts:
                session_id = str(conn.execute("SELECT session_id FROM messages_v2 WHERE id = ?", (message_id,)).fetchall()[0][0])
                record_message_files(conn, data_dir_of(conn), session_id, message_id, text_content, parts, self._clock())

    def set_suggestions(self, message_id: str, suggestions: list[str]) -> MessageV2:
        """Store the follow-up questions proposed for a finished reply."""
        if not isinstance(suggestions, list) or not all(isinstance(q, str) for q in suggestions):
            raise InvalidParams("suggestions must be a list of strings")
        with self._db.write() as conn:
            conn.execute(
                "UPDATE messages_v2 SET suggestions = ? WHERE id = ? AND status IN ('completed')",
                (to_json(suggestions), message_id),
            )
            if conn.changes() == 0:
                message_table.get(conn, message_id)  # NotFound, else it is no longer completed
                raise StoreError(
                    f"message {message_id!r} is not a completed reply", code=ErrorCode.BAD_STATE,
                    data={"messageId": message_id},
                )
            return message_table.get(conn, message_id)

    def edit_text(self, session_id: str, message_id: str, content: str) -> MessageV2:
        """The user's correction of a finished assistant reply: its text parts become one text
        part with ``content`` (where the last text part was; thinking, tool calls and images
        stay in order), ``edited_at`` is set, the search index follows."""
        check_text("content", content, optional=False)
        if not content.strip():
            raise InvalidParams("invalid params: content must not be empty - at `$.content`")
        with self._db.write() as conn:
            message = message_table.get_in_session(conn, session_id, message_id)
            if message.role != "assistant":
                raise InvalidParams("invalid params: messageId must be an assistant message - at `$.messageId`")
            if message.status not in FINAL_MESSAGE_STATUSES:
                raise StoreError(
                    f"message {message_id!r} is {message.status}: only a finished reply can be edited",
                    code=ErrorCode.BAD_STATE, data={"messageId": message_id, "status": message.status},
                )
            parts = edited_parts(message.parts, content)
            now = self._clock()
            conn.execute(
                "UPDATE messages_v2 SET text_content = ?, parts = ?,"
                " content_type = CASE WHEN ? IS NOT NULL THEN 'multipart' ELSE 'text' END,"
                " edited_at = ?, updated_at = ? WHERE id = ?",
                (content, to_json(parts), to_json(parts), now, now, message_id),
            )
            session_table.touch(conn, session_id, now)
            edited = message_table.get(conn, message_id)
            message_search.index(
                conn, [(edited.id, session_id, edited.role, searchable_text(edited.text_content, edited.parts))]
            )
            return edited

    def subtree_ids(self, session_id: str, message_id: str) -> list[str]:
        """Ids of ``message_id`` (which must be in the session) and everything below it."""
        with self._db.read() as conn:
            message_table.get_in_session(conn, session_id, message_id)
            return message_table.subtree_ids(conn, message_id)

    def delete_ids(self, session_id: str, message_id: str, mode: Literal["message", "branch"]) -> list[str]:
        """Ids ``delete(session_id, message_id, mode)`` would remove (message_table.delete_ids)."""
        with self._db.read() as conn:
            return message_table.delete_ids(conn, message_table.get_in_session(conn, session_id, message_id), mode)

    def delete_branch(self, message_id: str, *, session_id: str | None = None) -> int:
        """Delete a message and everything below it; returns how many messages went.
        ``session_id``: the message must belong to it (NotFound otherwise).

        Counters are recomputed, the search index, citations, tool runs and agent turns of
        the rows go with them (ON DELETE CASCADE), their files are journaled (files.py);
        the active leaf moves as ``_move_active_leaf`` says when it was inside the branch."""
        with self._db.write() as conn:
            root = self._in_session(conn, session_id, message_id)
            return len(self._delete(conn, root, "branch").ids)

    def delete_message(self, session_id: str, message_id: str) -> int:
        """Delete one message of the session; its children move up to its parent (they
        become roots when it was a root). A root user message takes its replies with it
        (message_table.delete_ids). Returns how many messages went.

        ``parent_id`` has no foreign key: the children are re-parented first, then the row
        goes, in one transaction, with the guarantees of ``delete_branch`` (counters, the
        search index and what cascades, files journaled, touch). The active leaf moves only
        when it was this message (``_move_active_leaf``); a leaf below it stays, its path
        now skips the message."""
        with self._db.write() as conn:
            message = message_table.get_in_session(conn, session_id, message_id)
            return len(self._delete(conn, message, "message").ids)

    def delete(self, session_id: str, message_id: str, mode: Literal["message", "branch"]) -> Deleted:
        """``delete_message`` (mode ``message``) or ``delete_branch`` (mode ``branch``) of a
        message of the session: the ids removed and the active leaf afterwards."""
        check_choice("mode", mode, frozenset(("message", "branch")))
        with self._db.write() as conn:
            return self._delete(conn, message_table.get_in_session(conn, session_id, message_id), mode)

    def recover_interrupted(self) -> int:
        """Rows left 'pending'/'streaming' by a dead process become 'aborted' (content kept,
        then indexed like any finished message). Returns how many."""
        with self._db.write() as conn:
            rows = conn.execute(
                "UPDATE messages_v2 SET status = 'aborted', updated_at = ?,"
                " content_type = CASE WHEN parts IS NOT NULL THEN 'multipart' ELSE content_type END"
                f" WHERE {recovery.LIVE_MESSAGE}"
                " RETURNING id, session_id, role, text_content, parts",
                (self._clock(),),
            ).fetchall()
            message_search.index(
                conn,
                [(str(mid), str(sid), str(role), searchable_text(cast("str | None", text), parts_or_none(cast("str | None", parts), str(mid))))
                 for mid, sid, role, text, parts in rows],
            )
        return len(rows)


    # ---- internals ------------------------------------------------------------------


    def _delete(self, conn: Any, target: MessageV2, mode: Literal["message", "branch"]) -> Deleted:
        sid = target.session_id
        active = self._active_leaf(conn, sid)
        ids = message_table.delete_ids(conn, target, mode)
        if mode == "message":  # what is left below the removed rows moves up to the target's parent
            conn.executemany(
                "UPDATE messages_v2 SET parent_id = ? WHERE parent_id = ? AND session_id = ?",
                [(target.parent_id, gone, sid) for gone in reversed(ids)],
            )
        conn.executemany("DELETE FROM messages_v2 WHERE id = ?", [(i,) for i in ids])
        session_table.recount(conn, sid)
        if active is None or active in set(ids):
            active = self._move_active_leaf(conn, target)
        session_table.touch(conn, sid, self._clock())
        return Deleted(ids=ids, active_leaf_id=active)

    def _in_session(self, conn: Any, session_id: str | None, message_id: str) -> MessageV2:
        if session_id is None:
            return message_table.get(conn, message_id)
        return message_table.get_in_session(conn, session_id, message_id)

    def _active_leaf(self, conn: Any, session_id: str) -> str | None:
        rows = conn.execute("SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,)).fetchall()
        return None if not rows or rows[0][0] is None else str(rows[0][0])

    def _move_active_leaf(self, conn: Any, removed: MessageV2) -> str | None:
        """The active leaf after ``removed`` (already deleted) took it: the newest leaf below
        the nearest surviving sibling of ``removed`` (the newest sibling created before it,
        else the oldest created after it; the roots are the siblings of a root; after
        ``delete_message`` its former children are siblings too), else its parent (then a
        leaf itself), else none (the session is empty)."""
        sid = removed.session_id
        before = conn.execute(
            "SELECT id FROM messages_v2 WHERE session_id = ?1 AND parent_id IS ?2"
            " AND (created_at, id) < (?3, ?4) ORDER BY created_at DESC, id DESC LIMIT 1",
            (sid, removed.parent_id, removed.created_at, removed.id),
        ).fetchall()
        after = before or conn.execute(
            "SELECT id FROM messages_v2 WHERE session_id = ?1 AND parent_id IS ?2"
            " AND (created_at, id) > (?3, ?4) ORDER BY created_at, id LIMIT 1",
            (sid, removed.parent_id, removed.created_at, removed.id),
        ).fetchall()
        leaf: str | None = None
        if after:
            leaf = message_table.newest_leaf(conn, sid, below=str(after[0][0]))
        elif removed.parent_id is not None:
            leaf = message_table.newest_leaf(conn, sid, below=removed.parent_id)
        if leaf is None:  # a dangling parent link: any leaf rather than a missing one
            leaf = message_table.newest_leaf(conn, sid)
        session_table.set_active_leaf(conn, sid, leaf)
        return leaf

    def _leaf(self, conn: Any, session_id: str, leaf_id: str | None) -> str | None:
        """The given leaf (checked to be in the session), else the active leaf, else the
        newest leaf; None for a session without messages. NotFound for unknown sessions."""
        if leaf_id is not None:
            return message_table.get_in_session(conn, session_id, leaf_id).id
        rows = conn.execute(
            "SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,)
        ).fetchall()
        if not rows:
            session_table.require(conn, session_id)
        leaf = rows[0][0]
        if leaf is not None and conn.execute(
            "SELECT 1 FROM messages_v2 WHERE id = ? AND session_id = ?", (leaf, session_id)
        ).fetchall():
            return str(leaf)
        return message_table.newest_leaf(conn, session_id)

    def _path(self, conn: Any, session_id: str, leaf_id: str | None) -> list[MessageV2]:
        leaf = self._leaf(conn, session_id, leaf_id)
        return [] if leaf is None else message_table.path(conn, session_id, leaf)


def _with_live_acp_parts(conn: Any, m: MessageV2) -> MessageV2:
    """A streaming ACP reply's raw updates so far come from its chunks (acp.py)."""
    if m.status not in ("pending", "streaming"):
        return m
    bodies = [r[0] for r in conn.execute(
        "SELECT body FROM acp_raw_chunks WHERE message_id = ? ORDER BY first", (m.id,)
    )]
    if not bodies:
        return m
    items = [b[1:-1].strip() for b in bodies]
    raw = "[" + ",".join(i for i in items if i) + "]"
    return msgspec.structs.replace(m, acp_parts=(m.acp_parts or []) + msgspec.json.decode(raw))
def edited_parts(parts: list[ContentPart] | None, content: str) -> list[ContentPart] | None:
    """``parts`` with their text replaced by ``content`` (None: a text-only message)."""
    if not parts:
        return None
    last_text = max((i for i, p in enumerate(parts) if isinstance(p, TextPart)), default=None)
    out: list[ContentPart] = []
    for i, part in enumerate(parts):
        if isinstance(part, TextPart):
            if i == last_text and content:
                out.append(TextPart(text=content))
            continue
        out.append(part)
    if last_text is None and content:
        out.append(TextPart(text=content))
    return out if any(not isinstance(p, TextPart) for p in out) else None


def _check_list(field: str, value: Any) -> None:
    if value is not None and not isinstance(value, list):
        raise InvalidParams(f"{field} must be a list")

