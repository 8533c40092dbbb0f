"""Store: the database of one data dir, and its repositories (one attribute each).

Owns: opening (the data dir made private, migrations, crash recovery, the data dir
lock), closing, and which repositories exist. Every repository is an attribute built here on the one Database:

    sessions    Sessions       sessions_v2, tags, counters (below)
    messages    Messages       messages_v2, the message tree, streaming and final rows (below)
    search      Search         full-text search of messages (below)
    settings    Settings       the key/value settings (below)
    secrets     SecretsRepo    secrets at rest: settling the key, re-sealing (secrets.py)
    providers   ProviderRepo   provider:* configuration, keys sealed (sidecar/store/providers.py)
    acp         AcpRepo        ACP agent sessions per reply, raw ACP columns (acp.py)
    tools       ToolStore      tool loop runs and calls, approvals, policies, audit, MCP (tools.py)
    assistants  AssistantRepo  assistant profiles and the default one (assistants.py)
    context     ContextRepo    rolling summaries, session context settings, token counts (context.py)
    channels    ChannelRepo    IM channels: configs, chat links, the inbox, deliveries (channels.py)
    knowledge   KnowledgeRepo  knowledge bases, documents, chunks, vectors, chunk FTS (knowledge.py)
    sync        SyncRepo       Qiming server: the account (token sealed), links, message map (sync.py)
    citations   Citations      the citations of replies (citations.py; read onto MessageV2 below)
    files       FileRepo       files on disk owned by sessions and messages, the deletion journal (files.py)
    memory      MemoryRepo     long-term memories, their vectors and FTS, encoder proposals (memory.py)
    souls       SoulRepo       every version of every Soul.md (memory.py)
    tasks       TaskRepo       scheduled tasks and their runs (tasks.py)
    memory_upkeep MemoryUpkeepRepo memory statistics, expiry, merges, consolidation proposals (memory_upkeep.py)
    skills      SkillProposalRepo the skills the model proposed (skills.py)

Those of the features around a chat (providers, assistants, context, channels, knowledge,
sync, memory, souls, tasks, memory_upkeep, skills) are built at their first use (``_Repository``), so opening the store
and the first session list do not import them; the others are built at open. A new
repository takes the Database in its constructor and is attached here; nothing
outside the store package sees the Database. Each repository method is one transaction
(``Database.write`` or ``Database.read``); ``Store.transaction()`` joins several calls, of
any repositories, into one. Sessions, Messages, Search and Settings compose the stateless
table helpers (SessionRepo, MessageStore, MessageSearch, SettingsRepo); validation runs
before anything is written, and any error rolls the whole call back, so a failed call
leaves the database as it was.

Thread-safe (see ``db.Database``): any thread may call any method; writes are serialized,
reads run on pooled reader connections. Async code reaches the Store only through
``AsyncStore`` (async_store.py), which runs the calls in worker threads.

Conventions:
- Timestamps come from ``clock`` (ms); ids from ``ids.new_id`` (UUIDv7).
- A session's provider/model default to the settings default_provider_id/default_model_id,
  or '' ("unset") when none is configured.
- ``messages.append(parent_id=ACTIVE_LEAF)`` (the default) appends below the active leaf;
  ``parent_id=None`` starts a new root.
- ``content_type`` is stored as 'multipart' whenever parts are stored.
- One process per data dir: opening a Store runs crash recovery, which turns every row
  still 'pending'/'streaming' into 'aborted' (a second process opening the same dir would
  abort the first one's in-flight replies), so a Store holds ``dirlock.DirLock`` from open
  to close and a second Store on the same dir fails with StoreError ("another
  chat-sidecar is using <dir>") before touching the database.
- ``messages.delete_branch`` removes a message and its subtree, ``messages.delete_message``
  one message (its children move up to its parent), with counters, search index and
  active leaf kept true; the files and agent sessions only the deleted rows used are
  journaled by the same transaction (files.py, acp.py): call ``StorageService.release()``
  (sidecar/engine/storage.py) after it. On the wire: ``chat:messages:delete``
  (SessionService.delete_messages, which also stops a reply the delete reaches).
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar, cast, overload

import msgspec

from protocol import limits
from protocol.messages import MessageQueryOptions, SearchOptions
from protocol.sessions import CreateSessionOptions, SessionFilter, SessionListResult, SessionUpdates
from protocol.types import (
    ContentPart,
    MessageTreeNode,
    MessageV2,
    SearchResult,
    SessionExport,
    SessionV2,
    TextPart,
    ToolCall,
    Usage,
)
from protocol.errors import ErrorCode
from sidecar.errors import InvalidParams, NotFound, StoreError
from sidecar.store import transfer
from sidecar.store.citations import Citations, CitationRows
from sidecar.store.checks import (
    CONTENT_TYPES,
    FINAL_STATUSES,
    MODES,
    ROLES,
    STATUSES,
    check_choice,
    check_range,
    check_tags,
    check_text,
    check_workspace_dir,
)
from sidecar import datadir
from sidecar.store.db import DB_FILENAME, Database
from sidecar.store.files import MANAGED_DIRS, FileRepo, data_dir_of, record_message_files
from sidecar.store.dirlock import LOCK_FILENAME, DirLock
from sidecar.store.ids import new_id, now_ms
from sidecar.store.messages import MessageStore
from sidecar.store.migrations import migrate, schema_is_current
from sidecar.store.acp import AcpRepo
from sidecar.store.rows import SESSION_COLUMNS, parts_or_none, searchable_text, session_from_row, to_json
from sidecar.store.search import MessageSearch
from sidecar.store.secrets import SecretsRepo, Sealer
from sidecar.secrets.box import SecretBox
from sidecar.secrets.keys import KEY_FILE
from sidecar.store.sessions import SessionRepo
from sidecar.store.tools import ToolStore
from sidecar.store.settings import DEFAULT_MODEL_KEY, DEFAULT_PROVIDER_KEY, SettingsRepo

if TYPE_CHECKING:
    from sidecar.store.assistants import AssistantRepo
    from sidecar.store.channels import ChannelRepo
    from sidecar.store.context import ContextRepo
    from sidecar.store.knowledge import KnowledgeRepo
    from sidecar.store.memory import MemoryRepo, SoulRepo
    from sidecar.store.providers import ProviderRepo
    from sidecar.store.sync import SyncRepo
    from sidecar.store.tasks import TaskRepo
    from sidecar.store.memory_upkeep import MemoryUpkeepRepo
    from sidecar.store.skills import SkillProposalRepo

__all__ = ["Store", "Sessions", "Messages", "Search", "Settings", "ACTIVE_LEAF", "MAX_MESSAGES_LIMIT", "Deleted"]

MAX_MESSAGES_LIMIT = limits.MAX_MESSAGES_PAGE
_USAGE_KIND = re.compile(r"^(reply|side:[a-z0-9_.-]{1,48})$")


class Deleted(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Messages.delete`` removed, and the session's active leaf afterwards."""

    ids: list[str]
    active_leaf_id: str | None


class _Default(enum.Enum):
    ACTIVE_LEAF = "active-leaf"


ACTIVE_LEAF: Final = _Default.ACTIVE_LEAF
"""Default ``parent_id`` of Messages.append: the session's active leaf."""


class Sessions:
    """``sessions_v2`` (and its tags and counters): one transaction per call."""

    def __init__(self, db: Database, clock: Callable[[], int]) -> None:
        self._db = db
        self._clock = clock


    def create(self, opts: CreateSessionOptions) -> SessionV2:
        if not isinstance(opts, CreateSessionOptions):
            raise InvalidParams("params must be CreateSessionOptions")
        check_choice("mode", opts.mode, MODES)
        tags = check_tags("tags", opts.tags) if opts.tags is not None else []
        title = check_text("title", opts.title)
        if title is not None and not title.strip():
            title = None
        for field, value in (
            ("providerId", opts.provider_id),
            ("modelId", opts.model_id),
            ("systemPrompt", opts.system_prompt),
            ("folder", opts.folder),
            ("channelId", opts.channel_id),
        ):
            check_text(field, value)
        if opts.channel_meta is not None and not isinstance(opts.channel_meta, dict):
            raise InvalidParams("channelMeta must be an object")
        workspace_dir = check_workspace_dir("workspaceDir", opts.workspace_dir)
        with self._db.write() as conn:
            now = self._clock()
            provider = opts.provider_id
            if provider is None:
                provider = SettingsRepo.get(conn, DEFAULT_PROVIDER_KEY) or ""
            model = opts.model_id
            if model is None:
                model = SettingsRepo.get(conn, DEFAULT_MODEL_KEY) or ""
            session = SessionV2(
                id=new_id(),
                title=title or "New Chat",
                provider_id=provider,
                model_id=model,
                system_prompt=opts.system_prompt or None,
                mode=opts.mode,
                tags=tags,
                folder=opts.folder or None,
                channel_id=opts.channel_id or None,
                channel_meta=opts.channel_meta or None,
                workspace_dir=workspace_dir or None,
                created_at=now,
                updated_at=now,
            )
            SessionRepo.insert(conn, session)
        return session

    def get(self, session_id: str) -> SessionV2:
        with self._db.read() as conn:
            return SessionRepo.get(conn, session_id)

    def exists(self, session_id: str) -> bool:
        with self._db.read() as conn:
            return SessionRepo.exists(conn, session_id)

    def query(self, flt: SessionFilter) -> SessionListResult:
        if not isinstance(flt, SessionFilter):
            raise InvalidParams("params must be a SessionFilter")
        with self._db.read() as conn:
            return SessionRepo.list(conn, flt)

    def update(self, session_id: str, updates: SessionUpdates) -> SessionV2:
        """Change the given fields (a field left out, UNSET, keeps its value; None clears it
        to its default). "" also clears summary, systemPrompt, folder and channelId; {}
        clears channelMeta; [] clears tags; an empty title is invalid."""
        with self._db.write() as conn:
            SessionRepo.update(conn, session_id, updates, self._clock())
            return SessionRepo.get(conn, session_id)

    def delete(self, session_id: str) -> None:
        with self._db.write() as conn:
            SessionRepo.delete(conn, session_id)

    def mark_title_attempted(self, session_id: str) -> None:
        """A title was asked for (whatever came of it): the start-up pass leaves it alone."""
        with self._db.write() as conn:
            conn.execute("UPDATE sessions_v2 SET title_attempted = 1 WHERE id = ?", (session_id,))

    def titles_due(self, default_titles: list[str], limit: int, max_age_ms: int = 7 * 86_400_000) -> list[tuple[SessionV2, str]]:
        """Sessions with a default title whose first exchange completed (created in the last
        ``max_age_ms``) and whose title was never asked for: (session, its first reply id),
        newest first."""
        marks = ", ".join("?" * len(default_titles))
        columns = ", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {columns}, (SELECT a.id FROM messages_v2 u JOIN messages_v2 a ON a.parent_id = u.id"
                "   WHERE u.session_id = s.id AND u.parent_id IS NULL AND u.role = 'user'"
                "   AND a.role = 'assistant' AND a.status = 'completed' ORDER BY a.created_at, a.id LIMIT 1)"
                f" AS reply FROM sessions_v2 s WHERE s.title_attempted = 0 AND s.title IN ({marks})"
                " AND s.created_at >= ? AND s.message_count >= 2 ORDER BY s.updated_at DESC",
                [*default_titles, self._clock() - max_age_ms],
            ).fetchall()
        due = [(session_from_row(r[:-1]), str(r[-1])) for r in rows if r[-1] is not None]
        return due[:limit]

    def archive(self, session_id: str, archived: bool = True) -> None:
        with self._db.write() as conn:
            SessionRepo.set_flag(conn, session_id, "is_archived", archived, self._clock())

    def pin(self, session_id: str, pinned: bool) -> None:
        with self._db.write() as conn:
            SessionRepo.set_flag(conn, session_id, "is_pinned", pinned, self._clock())

    def fork(self, session_id: str, message_id: str) -> SessionV2:
        with self._db.write() as conn:
            return transfer.fork_session(conn, session_id, message_id, self._clock())

    def export(self, session_id: str, progress: transfer.Progress | None = None) -> SessionExport:
        """``progress(done, total)`` is called as messages are read (every 1000)."""
        with self._db.read() as conn:
            return transfer.export_session(conn, session_id, progress)

    def import_(
        self,
        session: SessionV2,
        messages: list[MessageV2],
        replace: bool = False,
        progress: transfer.Progress | None = None,
        *,
        trust_workspace: bool = False,
    ) -> SessionV2:
        """Store an exported session; its ``workspaceDir`` only with ``trust_workspace`` (and
        only an existing directory), see transfer.py. ``progress(done, total)`` is called as
        messages are stored (every 1000)."""
        with self._db.write() as conn:
            return transfer.import_session(
                conn, session, messages, replace=replace, progress=progress, trust_workspace=trust_workspace,
            )

    def set_summary(self, session_id: str, text: str, source: str, *, keep_users: bool) -> SessionV2 | None:
        """Write the session's summary as ``source`` wrote it ('user' | 'ai'); with
        ``keep_users`` a summary the sidecar did not write stays (None is returned)."""
        with self._db.write() as conn:
            if not SessionRepo.set_summary(conn, session_id, text, source, self._clock(), keep_users=keep_users):
                return None
            return SessionRepo.get(conn, session_id)

    def add_usage(self, session_id: str, usage: Usage | None, cost: float, *, kind: str = "reply") -> SessionV2:
        """Attribute one model call's usage and cost to the session: its totals and its
        ``usageByKind[kind]``. ``kind`` is ``reply`` (the reply lifecycle, every ending)
        or ``side:<what>`` for a side call made for the session (``side:title``,
        ``side:summary``, ``side:ocr``, ``side:suggestions``, ``side:memory``,
        ``side:embedding``...). The one call for any feature that spends tokens for a
        session; returns the session as stored."""
        if not _USAGE_KIND.match(kind):
            raise InvalidParams(f"usage kind {kind!r} must be 'reply' or 'side:<name>'")
        if usage is not None and not isinstance(usage, Usage):
            raise InvalidParams("usage must be a Usage")
        if usage is not None:
            for field in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
                value = getattr(usage, field)
                if value is not None:
                    check_range(field, value, 0, 2**62)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < 1e12:
            raise InvalidParams("cost must be a non-negative number")
        with self._db.write() as conn:
            SessionRepo.add_usage(conn, session_id, usage, float(cost), kind)
            return SessionRepo.get(conn, session_id)


class Messages:
    """``messages_v2``, the message tree and streaming updates: one transaction per call.
    Every message stored with content, and every final or paused content, owns the data-dir
    files it references (files.py)."""

    def __init__(self, db: Database, clock: Callable[[], int]) -> None:
        self._db = db
        self._clock = clock


    def get(self, message_id: str) -> MessageV2:
        with self._db.read() as conn:
            return CitationRows.attach(conn, [MessageStore.get(conn, message_id)])[0]

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
            SessionRepo.require(conn, session_id)
            messages = MessageStore.all(conn, session_id, acp_parts=acp)
            if o.before is not None:
                MessageStore.get_in_session(conn, session_id, o.before)
                cut = next(i for i, m in enumerate(messages) if m.id == o.before)
                messages = messages[:cut]
            return CitationRows.attach(conn, messages[-limit:] if limit is not None else messages)
        leaf = self._leaf(conn, session_id, o.leaf_id)
        if leaf is None:
            return []
        if o.before is not None:
            before = MessageStore.get_in_session(conn, session_id, o.before)
            if o.before not in MessageStore.ancestor_ids(conn, session_id, leaf):
                raise InvalidParams(
                    f"options.before {o.before!r} is not on the selected branch"
                )
            if before.parent_id is None:
                return []
            leaf = before.parent_id
        return CitationRows.attach(conn, MessageStore.path(conn, session_id, leaf, limit, acp_parts=acp))

    def tree(self, session_id: str) -> list[MessageTreeNode]:
        """Every message as a forest; siblings in creation order, the active path marked."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,)
            ).fetchall()
            if not rows:
                SessionRepo.require(conn, session_id)
            messages = CitationRows.attach(conn, MessageStore.all(conn, session_id, acp_parts=False))
            leaf = rows[0][0]
            if leaf is None or not any(m.id == leaf for m in messages):
                leaf = MessageStore.newest_leaf(conn, session_id)
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
            SessionRepo.require(conn, session_id)
            MessageStore.get_in_session(conn, session_id, leaf_id)
            leaf = MessageStore.newest_leaf(conn, session_id, below=leaf_id) or leaf_id
            SessionRepo.set_active_leaf(conn, session_id, leaf)
            return CitationRows.attach(conn, MessageStore.path(conn, session_id, leaf, acp_parts=False))

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
        check_choice("role", role, ROLES)
        check_choice("status", status, STATUSES)
        check_choice("contentType", content_type, CONTENT_TYPES)
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
                SessionRepo.require(conn, session_id)
            active_leaf, last_at = cast("str | None", rows[0][0]), cast("int | None", rows[0][1])
            if parent_id is ACTIVE_LEAF:
                parent = active_leaf
            elif parent_id is None:
                parent = None
            else:
                parent = MessageStore.get_in_session(conn, session_id, parent_id).id
            now = self._clock()
            # Never before the newest message: creation order must match time order.
            created = max(now, last_at or now)
            message = MessageV2(
                id=new_id(),
                session_id=session_id,
                parent_id=parent,
                role=role,  # type: ignore[arg-type]
                content_type="multipart" if parts else content_type,  # type: ignore[arg-type]
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
                status=status,  # type: ignore[arg-type]
                error=error,
                created_at=created,
                updated_at=created,
                seq=seq,
            )
            MessageStore.insert(conn, message)
            SessionRepo.after_append(
                conn, session_id, created, message.id if make_active else None, now
            )
            if status in FINAL_STATUSES:
                MessageSearch.index(
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
            MessageStore.update_partial(
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
        check_choice("status", status, FINAL_STATUSES)
        _check_list("parts", parts)
        _check_list("toolCalls", tool_calls)
        with self._db.write() as conn:
            now = self._clock()
            MessageStore.finish(
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
            message = MessageStore.get(conn, message_id)
            record_message_files(conn, data_dir_of(conn), message.session_id, message_id, text_content, parts, now)
            SessionRepo.touch(conn, message.session_id, now)
            MessageSearch.index(
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
                MessageStore.get(conn, message_id)  # NotFound, else it is no longer completed
                raise StoreError(
                    f"message {message_id!r} is not a completed reply", code=ErrorCode.BAD_STATE,
                    data={"messageId": message_id},
                )
            return MessageStore.get(conn, message_id)

    def edit_text(self, session_id: str, message_id: str, content: str) -> MessageV2:
        """The user's correction of a finished assistant reply: its text parts become one text
        part with ``content`` (where the last text part was; thinking, tool calls and images
        stay in order), ``edited_at`` is set, the search index follows."""
        check_text("content", content, optional=False)
        if not content.strip():
            raise InvalidParams("invalid params: content must not be empty - at `$.content`")
        with self._db.write() as conn:
            message = MessageStore.get_in_session(conn, session_id, message_id)
            if message.role != "assistant":
                raise InvalidParams("invalid params: messageId must be an assistant message - at `$.messageId`")
            if message.status not in FINAL_STATUSES:
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
            SessionRepo.touch(conn, session_id, now)
            edited = MessageStore.get(conn, message_id)
            MessageSearch.index(
                conn, [(edited.id, session_id, edited.role, searchable_text(edited.text_content, edited.parts))]
            )
            return edited

    def subtree_ids(self, session_id: str, message_id: str) -> list[str]:
        """Ids of ``message_id`` (which must be in the session) and everything below it."""
        with self._db.read() as conn:
            MessageStore.get_in_session(conn, session_id, message_id)
            return MessageStore.subtree_ids(conn, message_id)

    def delete_ids(self, session_id: str, message_id: str, mode: Literal["message", "branch"]) -> list[str]:
        """Ids ``delete(session_id, message_id, mode)`` would remove (MessageStore.delete_ids)."""
        with self._db.read() as conn:
            return MessageStore.delete_ids(conn, MessageStore.get_in_session(conn, session_id, message_id), mode)

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
        (MessageStore.delete_ids). Returns how many messages went.

        ``parent_id`` has no foreign key: the children are re-parented first, then the row
        goes, in one transaction, with the guarantees of ``delete_branch`` (counters, the
        search index and what cascades, files journaled, touch). The active leaf moves only
        when it was this message (``_move_active_leaf``); a leaf below it stays, its path
        now skips the message."""
        with self._db.write() as conn:
            message = MessageStore.get_in_session(conn, session_id, message_id)
            return len(self._delete(conn, message, "message").ids)

    def delete(self, session_id: str, message_id: str, mode: Literal["message", "branch"]) -> Deleted:
        """``delete_message`` (mode ``message``) or ``delete_branch`` (mode ``branch``) of a
        message of the session: the ids removed and the active leaf afterwards."""
        check_choice("mode", mode, frozenset(("message", "branch")))
        with self._db.write() as conn:
            return self._delete(conn, MessageStore.get_in_session(conn, session_id, message_id), mode)

    def recover_interrupted(self) -> int:
        """Rows left 'pending'/'streaming' by a dead process become 'aborted' (content kept,
        then indexed like any finished message). Returns how many."""
        with self._db.write() as conn:
            rows = conn.execute(
                "UPDATE messages_v2 SET status = 'aborted', updated_at = ?,"
                " content_type = CASE WHEN parts IS NOT NULL THEN 'multipart' ELSE content_type END"
                " WHERE status IN ('pending', 'streaming')"
                " RETURNING id, session_id, role, text_content, parts",
                (self._clock(),),
            ).fetchall()
            MessageSearch.index(
                conn,
                [(str(mid), str(sid), str(role), searchable_text(cast("str | None", text), parts_or_none(cast("str | None", parts), str(mid))))
                 for mid, sid, role, text, parts in rows],
            )
        return len(rows)


    # ---- internals ------------------------------------------------------------------


    def _delete(self, conn: Any, target: MessageV2, mode: Literal["message", "branch"]) -> Deleted:
        sid = target.session_id
        active = self._active_leaf(conn, sid)
        ids = MessageStore.delete_ids(conn, target, mode)
        if mode == "message":  # what is left below the removed rows moves up to the target's parent
            conn.executemany(
                "UPDATE messages_v2 SET parent_id = ? WHERE parent_id = ? AND session_id = ?",
                [(target.parent_id, gone, sid) for gone in reversed(ids)],
            )
        conn.executemany("DELETE FROM messages_v2 WHERE id = ?", [(i,) for i in ids])
        SessionRepo.recount(conn, sid)
        if active is None or active in set(ids):
            active = self._move_active_leaf(conn, target)
        SessionRepo.touch(conn, sid, self._clock())
        return Deleted(ids=ids, active_leaf_id=active)

    def _in_session(self, conn: Any, session_id: str | None, message_id: str) -> MessageV2:
        if session_id is None:
            return MessageStore.get(conn, message_id)
        return MessageStore.get_in_session(conn, session_id, message_id)

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
            leaf = MessageStore.newest_leaf(conn, sid, below=str(after[0][0]))
        elif removed.parent_id is not None:
            leaf = MessageStore.newest_leaf(conn, sid, below=removed.parent_id)
        if leaf is None:  # a dangling parent link: any leaf rather than a missing one
            leaf = MessageStore.newest_leaf(conn, sid)
        SessionRepo.set_active_leaf(conn, sid, leaf)
        return leaf

    def _leaf(self, conn: Any, session_id: str, leaf_id: str | None) -> str | None:
        """The given leaf (checked to be in the session), else the active leaf, else the
        newest leaf; None for a session without messages. NotFound for unknown sessions."""
        if leaf_id is not None:
            return MessageStore.get_in_session(conn, session_id, leaf_id).id
        rows = conn.execute(
            "SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,)
        ).fetchall()
        if not rows:
            SessionRepo.require(conn, session_id)
        leaf = rows[0][0]
        if leaf is not None and conn.execute(
            "SELECT 1 FROM messages_v2 WHERE id = ? AND session_id = ?", (leaf, session_id)
        ).fetchall():
            return str(leaf)
        return MessageStore.newest_leaf(conn, session_id)

    def _path(self, conn: Any, session_id: str, leaf_id: str | None) -> list[MessageV2]:
        leaf = self._leaf(conn, session_id, leaf_id)
        return [] if leaf is None else MessageStore.path(conn, session_id, leaf)


class Search:
    """Full-text search of messages (the index is written by Messages)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def messages(
        self, query: str, options: SearchOptions | None = None
    ) -> list[SearchResult]:
        o = options if options is not None else SearchOptions()
        if not isinstance(o, SearchOptions):
            raise InvalidParams("options must be SearchOptions")
        with self._db.read() as conn:
            return MessageSearch.search(conn, query, o)


class Settings:
    """The ``settings`` key/value table."""

    def __init__(self, db: Database) -> None:
        self._db = db


    def get(self, key: str) -> str | None:
        with self._db.read() as conn:
            return SettingsRepo.get(conn, key)

    def set(self, key: str, value: str | None) -> None:
        check_text("key", key, optional=False)
        check_text("value", value)
        with self._db.write() as conn:
            SettingsRepo.set(conn, key, value)


R = TypeVar("R")


class _Repository(Generic[R]):
    """A repository of the Store built at its first use (under the Store's lock, once): the
    ones opening the store and the first session list need nothing of are not imported by
    them. A non-data descriptor: once built it is a plain instance attribute."""

    def __init__(self, build: Callable[[Store], R]) -> None:
        self._build = build
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, store: None, owner: type) -> _Repository[R]: ...
    @overload
    def __get__(self, store: Store, owner: type) -> R: ...
    def __get__(self, store: Store | None, owner: type) -> R | _Repository[R]:
        if store is None:
            return self
        with store._repos_lock:
            if self._name not in store.__dict__:
                store.__dict__[self._name] = self._build(store)
            return cast(R, store.__dict__[self._name])


def _assistants(store: Store) -> AssistantRepo:
    from sidecar.store.assistants import AssistantRepo

    return AssistantRepo(store._db)


def _context(store: Store) -> ContextRepo:
    from sidecar.store.context import ContextRepo

    return ContextRepo(store._db)


def _channels(store: Store) -> ChannelRepo:
    from sidecar.store.channels import ChannelRepo

    return ChannelRepo(store._db, store._clock, store._sealer)


def _knowledge(store: Store) -> KnowledgeRepo:
    from sidecar.store.knowledge import KnowledgeRepo

    return KnowledgeRepo(store._db, store._clock)


def _sync(store: Store) -> SyncRepo:
    from sidecar.store.sync import SyncRepo

    return SyncRepo(store._db, store._sealer)


def _memory(store: Store) -> MemoryRepo:
    from sidecar.store.memory import MemoryRepo

    return MemoryRepo(store._db, store._clock)


def _souls(store: Store) -> SoulRepo:
    from sidecar.store.memory import SoulRepo

    return SoulRepo(store._db, store._clock)


def _tasks(store: Store) -> TaskRepo:
    from sidecar.store.tasks import TaskRepo

    return TaskRepo(store._db, store._clock)


def _memory_upkeep(store: Store) -> MemoryUpkeepRepo:
    from sidecar.store.memory_upkeep import MemoryUpkeepRepo

    # the MemoryRepo is looked up at use, not here: this runs under the lock its lookup takes
    return MemoryUpkeepRepo(store._db, lambda: store.memory, store._clock)


def _skills(store: Store) -> SkillProposalRepo:
    from sidecar.store.skills import SkillProposalRepo

    return SkillProposalRepo(store._db, store._clock)


def _providers(store: Store) -> ProviderRepo:
    from sidecar.store.providers import ProviderRepo

    return ProviderRepo(store._db, store._sealer)


def _private_data_dir(path: Path) -> None:
    """The data dir, made (0700) or narrowed: what the store writes in it is the user's
    alone (sidecar/datadir.py); these are the names of what is ours there."""
    datadir.make_dirs(path)
    datadir.tighten(
        path,
        files=[DB_FILENAME, *(DB_FILENAME + s for s in ("-wal", "-shm", "-journal")), LOCK_FILENAME, KEY_FILE],
        folders=(*MANAGED_DIRS, "skills"),  # skills/: the managed skill folders (sidecar/skills)
        filled=("attachments", "tool_outputs"),
    )


class Store:
    """The database of one data dir. Open = migrate + recover interrupted messages.

    Its repositories are attributes; those of the features around a chat (providers,
    assistants, context, channels, knowledge, sync, memory, souls) are built at first use."""

    providers = _Repository(_providers)
    assistants = _Repository(_assistants)
    context = _Repository(_context)
    channels = _Repository(_channels)
    knowledge = _Repository(_knowledge)
    sync = _Repository(_sync)
    memory = _Repository(_memory)
    souls = _Repository(_souls)
    tasks = _Repository(_tasks)
    memory_upkeep = _Repository(_memory_upkeep)
    skills = _Repository(_skills)

    def __init__(
        self,
        data_dir: str | Path,
        *,
        clock: Callable[[], int] = now_ms,
        readers: int = 2,
        secrets: SecretBox | None = None,
        migrate_schema: bool = True,
    ) -> None:
        """``secrets`` seals the stored secrets (default: a box with the data dir's key file).
        ``migrate_schema=False``: open only a database already at the current schema version
        (StoreError otherwise, nothing changed)."""
        path = Path(data_dir)
        try:
            _private_data_dir(path)
        except OSError as exc:
            raise StoreError(f"cannot create the data dir {path}: {exc}") from exc
        self._lock = DirLock(path)
        self.path = path / DB_FILENAME
        self._clock = clock
        try:
            self._db = Database(self.path, readers=readers)
        except BaseException:
            self._lock.release()
            raise
        db = self._db
        self.data_dir = path.resolve()
        self.sessions = Sessions(db, clock)
        self.messages = Messages(db, clock)
        self.search = Search(db)
        self.settings = Settings(db)
        self._sealer = sealer = Sealer(secrets if secrets is not None else SecretBox(path, use_keychain=False))
        self._repos_lock = threading.Lock()
        self.secrets = SecretsRepo(db, sealer, path)
        self.acp = AcpRepo(db)
        self.tools = ToolStore(db, clock, sealer)
        self.citations = Citations(db)
        self.files = FileRepo(db, self.data_dir, clock)
        try:
            if not migrate_schema and not schema_is_current(db):
                raise StoreError("the database needs a schema migration")
            self.schema_version = migrate(db)
            self.recovered = self.messages.recover_interrupted()
            self.acp.join_left_chunks()
        except BaseException:
            self._db.close()
            self._lock.release()
            raise

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Several repository calls as one write transaction (they join it; all or nothing)."""
        with self._db.write():
            yield

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Repository calls that fail alone inside a transaction (db.py ``savepoint``)."""
        with self._db.savepoint():
            yield

    def close(self) -> None:
        try:
            self._db.close()
        finally:
            self._lock.release()


def open_store(
    data_dir: str | Path,
    *,
    clock: Callable[[], int] = now_ms,
    readers: int = 2,
    secrets: SecretBox | None = None,
    migrate_schema: bool = True,
) -> Store:
    """The Store as the process opens it: ``Store(...)``, then the tool calls left running
    by a dead process get their "cancelled" result, before anything reads their messages."""
    store = Store(data_dir, clock=clock, readers=readers, secrets=secrets, migrate_schema=migrate_schema)
    try:
        store.tools.complete_interrupted()
    except BaseException:
        store.close()
        raise
    return store


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

