"""SessionRepo: the sessions repository (``sessions_v2``, its tags and counters).

Owns: creating sessions (their provider/model default to the settings
default_provider_id/default_model_id, or '' when none is configured), reading, listing,
updating, archiving, pinning, forking, export/import (transfer.py), summaries, usage.
Must stay true: each method is one transaction (``Database.write``/``read``); validation
runs before anything is written; a failed call leaves the database as it was. The SQL on
a connection lives in session_table.py, shared with the other repositories.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from protocol.sessions import CreateSessionOptions, SessionFilter, SessionListResult, SessionUpdates
from protocol.types import MessageV2, SessionExport, SessionV2, Usage
from sidecar.errors import InvalidParams
from sidecar.store import session_table, transfer
from sidecar.store.checks import MODES, check_choice, check_range, check_tags, check_text, check_workspace_dir
from sidecar.store.db import Database
from sidecar.store.ids import new_id
from sidecar.store.rows import SESSION_COLUMNS, session_from_row
from sidecar.store.settings import DEFAULT_MODEL_KEY, DEFAULT_PROVIDER_KEY, setting

__all__ = ["SessionRepo"]

_USAGE_KIND = re.compile(r"^(reply|side:[a-z0-9_.-]{1,48})$")


class SessionRepo:
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
                provider = setting(conn, DEFAULT_PROVIDER_KEY) or ""
            model = opts.model_id
            if model is None:
                model = setting(conn, DEFAULT_MODEL_KEY) or ""
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
            session_table.insert(conn, session)
        return session

    def get(self, session_id: str) -> SessionV2:
        with self._db.read() as conn:
            return session_table.get(conn, session_id)

    def exists(self, session_id: str) -> bool:
        with self._db.read() as conn:
            return session_table.exists(conn, session_id)

    def query(self, flt: SessionFilter) -> SessionListResult:
        if not isinstance(flt, SessionFilter):
            raise InvalidParams("params must be a SessionFilter")
        with self._db.read() as conn:
            return session_table.list_page(conn, flt)

    def update(self, session_id: str, updates: SessionUpdates) -> SessionV2:
        """Change the given fields (a field left out, UNSET, keeps its value; None clears it
        to its default). "" also clears summary, systemPrompt, folder and channelId; {}
        clears channelMeta; [] clears tags; an empty title is invalid."""
        with self._db.write() as conn:
            session_table.update(conn, session_id, updates, self._clock())
            return session_table.get(conn, session_id)

    def delete(self, session_id: str) -> None:
        with self._db.write() as conn:
            session_table.delete(conn, session_id)

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
            session_table.set_flag(conn, session_id, "is_archived", archived, self._clock())

    def pin(self, session_id: str, pinned: bool) -> None:
        with self._db.write() as conn:
            session_table.set_flag(conn, session_id, "is_pinned", pinned, self._clock())

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
            if not session_table.set_summary(conn, session_id, text, source, self._clock(), keep_users=keep_users):
                return None
            return session_table.get(conn, session_id)

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
            session_table.add_usage(conn, session_id, usage, float(cost), kind)
            return session_table.get(conn, session_id)

