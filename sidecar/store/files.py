"""FileRepo: which files on disk belong to which session or message, and the journal of
released files still to be removed.

Owns the tables ``owned_files`` and ``file_deletions`` (migration ``m_data_lifecycle``).
A row of ``owned_files`` says "this file belongs to this message (or, with no message, to
this session)": the bytes of an attachment, an image the output transform wrote, a tool
output spill file, an ACP session's default workspace directory. A file is named by
``(root, path)``: root ``""`` is the data dir (``path`` then lies in ``attachments/``,
``tool_outputs/`` or ``acp/``), any other root is the absolute path of a session's
workspace (only its ``tool_outputs/`` spill files are ever recorded there; the workspace
itself is the user's and is never owned).

Must stay true:
- ownership is written in the transaction of the row that references the file: every
  message stored (message_table.insert / insert_many, whoever calls them: a turn, a fork,
  an import, a sync) and every final or paused content (MessageRepo.finish / pause) owns the
  data-dir files its ``file://`` references name (``record_message_files``); a spill file
  is owned as soon as it exists, before the result that names it is stored;
- a file shared by several rows (a fork copies references, a generated image is stored
  once per content) is released only when the last row naming it goes: the trigger
  ``owned_files_released`` then journals it in ``file_deletions`` *in the same transaction*
  as the delete (of a session, a branch, an import that replaces one), so a crash never
  loses a deletion; owning it again takes it out of the journal;
- the journal is only emptied once the file is gone (sidecar/store/janitor.py does the
  disk side; sidecar/engine/storage.py runs it after each delete and at start-up).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Literal, cast

import apsw
import msgspec

from protocol.types import ContentPart, FilePart, ImagePart, MessageV2, TextPart, ToolResultPart
from sidecar.store.attachments import uri_to_path
from sidecar.store.db import Database
from sidecar.store.layout import MANAGED_DIRS
from sidecar.store.rows import parts_or_none

__all__ = [
    "FileRepo",
    "FileKind",
    "Deletion",
    "MANAGED_DIRS",
    "DATA_ROOT",
    "message_file_refs",
    "record_message_files",
    "record_messages_files",
    "data_dir_of",
    "backfill_owned_files",
]

log = logging.getLogger(__name__)

FileKind = Literal["attachment", "spill", "workspace"]
DATA_ROOT = ""
"""``root`` of a file in the data dir."""

_FILE_URI = re.compile(r"file://[^\s)\]\"'<>]+")
_SPILL_NOTE = re.compile(
    r"saved as tool_outputs/([A-Za-z0-9_-]{1,140}\.txt)\. Read it with (workspace_read_file|read_tool_output)"
)


class Deletion(msgspec.Struct, frozen=True, kw_only=True):
    """A released file waiting to be removed."""

    root: str
    path: str
    kind: str
    queued_at: int
    """ms; a file written again after this (its mtime) is kept: someone owns it anew."""


def _data_relative(data_dir: Path, local: str) -> str | None:
    """``local`` as a data-dir path ``attachments/<name>`` (the only folder a message's
    ``file://`` references are ever ours in), or None."""
    try:
        rel = PurePosixPath(Path(local).relative_to(data_dir).as_posix())
    except ValueError:
        return None
    if len(rel.parts) < 2 or rel.parts[0] != "attachments" or ".." in rel.parts:
        return None
    return rel.as_posix()


def message_file_refs(data_dir: Path, text: str | None, parts: Iterable[ContentPart] | None) -> set[str]:
    """The data-dir files a message references (``attachments/...``): image and file parts,
    and ``file://`` links in its text (the output transform puts generated images there)."""
    refs: set[str] = set()

    def add(uri: str | None) -> None:
        if not uri or not uri.startswith("file:"):
            return
        local = uri_to_path(uri)
        if local is None:
            return
        rel = _data_relative(data_dir, local)
        if rel is not None:
            refs.add(rel)

    def scan(body: str | None) -> None:
        if body and "file://" in body:
            for match in _FILE_URI.finditer(body):
                add(match.group(0))

    scan(text)
    for part in parts or ():
        if isinstance(part, ImagePart):
            add(part.url)
        elif isinstance(part, FilePart):
            add(part.uri)
        elif isinstance(part, TextPart):
            scan(part.text)
    return refs


_OWN = (
    "INSERT OR IGNORE INTO owned_files (session_id, message_id, root, path, kind, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)


@functools.lru_cache(maxsize=16)
def _data_dir_of(filename: str) -> Path:
    return Path(filename).resolve().parent


def data_dir_of(conn: apsw.Connection) -> Path:
    """The data dir of the database ``conn`` is open on (chat.db lies in it)."""
    return _data_dir_of(conn.filename)


def record_message_files(
    conn: apsw.Connection,
    data_dir: Path,
    session_id: str,
    message_id: str,
    text: str | None,
    parts: Iterable[ContentPart] | None,
    now: int,
) -> None:
    """Own the files ``message_id`` references (inside the caller's transaction)."""
    refs = message_file_refs(data_dir, text, parts)
    if refs:
        conn.executemany(_OWN, [(session_id, message_id, DATA_ROOT, rel, "attachment", now) for rel in sorted(refs)])


def record_messages_files(conn: apsw.Connection, data_dir: Path, messages: Iterable[MessageV2], now: int) -> None:
    rows = [
        (m.session_id, m.id, DATA_ROOT, rel, "attachment", now)
        for m in messages
        for rel in sorted(message_file_refs(data_dir, m.text_content, m.parts))
    ]
    if rows:
        conn.executemany(_OWN, rows)


class FileRepo:
    """``owned_files`` and ``file_deletions``: one transaction per call."""

    def __init__(self, db: Database, data_dir: Path, clock: Any) -> None:
        self._db = db
        self.data_dir = data_dir
        """The resolved data dir (references are compared against it)."""
        self._clock = clock

    def key(self, path: Path, workspace: Path | None = None) -> tuple[str, str] | None:
        """``(root, path)`` of a file we write: in the data dir, or under ``workspace``
        (whose root is recorded as given: the session's ``workspaceDir``)."""
        real = path.resolve()
        for root, base in ((DATA_ROOT, self.data_dir), (str(workspace) if workspace else None, workspace)):
            if root is None or base is None:
                continue
            try:
                rel = PurePosixPath(real.relative_to(base.resolve()).as_posix())
            except ValueError:
                continue
            if rel.parts and ".." not in rel.parts:
                return root, rel.as_posix()
        return None

    def own(
        self, session_id: str, message_id: str | None, path: Path, kind: FileKind, *, workspace: Path | None = None
    ) -> bool:
        """Record that ``path`` belongs to the message (or the session); False when the
        path is neither in the data dir nor under ``workspace``."""
        key = self.key(path, workspace)
        if key is None:
            return False
        with self._db.write() as conn:
            conn.execute(_OWN, (session_id, message_id, key[0], key[1], kind, self._clock()))
        return True

    def owned(self, root: str = DATA_ROOT) -> set[str]:
        with self._db.read() as conn:
            return {r[0] for r in conn.execute("SELECT DISTINCT path FROM owned_files WHERE root = ?", (root,))}

    def owners(self, root: str, path: str) -> set[str]:
        """The sessions owning the file ``(root, path)`` (through any of their messages)."""
        with self._db.read() as conn:
            return {
                r[0] for r in conn.execute(
                    "SELECT DISTINCT session_id FROM owned_files WHERE root = ? AND path = ?", (root, path)
                )
            }

    def of_session(self, session_id: str) -> list[tuple[str, str, str]]:
        """(root, path, kind) of everything the session owns (its messages' files too)."""
        with self._db.read() as conn:
            return [
                (r[0], r[1], r[2])
                for r in conn.execute(
                    "SELECT DISTINCT root, path, kind FROM owned_files WHERE session_id = ? ORDER BY root, path",
                    (session_id,),
                )
            ]

    # ---- the journal ------------------------------------------------------------------

    def release(self, remove: Callable[[Deletion], bool], *, limit: int = 200) -> tuple[int, int]:
        """Up to ``limit`` journal rows, each removed by ``remove`` (the disk side, quick:
        an unlink or a rename) while this holds the write lock, so no row can own the file
        again meanwhile; the rows it finished (True) leave the journal. Returns (rows
        looked at, rows finished)."""
        with self._db.write() as conn:
            rows = conn.execute(
                "SELECT root, path, kind, queued_at FROM file_deletions ORDER BY queued_at, root, path LIMIT ?",
                (limit,),
            ).fetchall()
            done: list[tuple[str, str]] = []
            for row in rows:
                root, path, kind, queued_at = str(row[0]), str(row[1]), str(row[2]), cast(int, row[3])
                owned = conn.execute(
                    "SELECT 1 FROM owned_files WHERE root = ? AND path = ? LIMIT 1", (root, path)
                ).fetchall()
                if owned or remove(Deletion(root=root, path=path, kind=kind, queued_at=queued_at)):
                    done.append((root, path))
            conn.executemany("DELETE FROM file_deletions WHERE root = ? AND path = ?", done)
        return len(rows), len(done)

    def sweep(self, candidates: Iterable[str], remove: Callable[[str], None]) -> int:
        """``remove`` each data-dir path that is still unowned (checked under the write
        lock, so a row committed since the scan keeps its file); returns how many."""
        removed = 0
        with self._db.write() as conn:
            inbox = self._inbox_refs(conn)
            for rel in candidates:
                if rel in inbox or conn.execute(
                    "SELECT 1 FROM owned_files WHERE root = '' AND path = ? LIMIT 1", (rel,)
                ).fetchall():
                    continue
                remove(rel)
                removed += 1
        return removed

    # ---- what else references data-dir files (read by the orphan sweep) -------------------

    def queued_inbox_refs(self) -> set[str]:
        """Data-dir files named by IM messages still waiting for their turn (their user
        message, which will own them, is not stored yet)."""
        with self._db.read() as conn:
            return self._inbox_refs(conn)

    def _inbox_refs(self, conn: apsw.Connection) -> set[str]:
        refs: set[str] = set()
        rows = conn.execute(
            "SELECT input FROM channel_inbox WHERE input IS NOT NULL AND session_id IS NOT NULL"
            " AND state IN ('queued', 'running') AND input LIKE '%file:%'"
        ).fetchall()
        for (raw,) in rows:
            for match in _FILE_URI.finditer(str(raw)):
                local = uri_to_path(match.group(0))
                rel = _data_relative(self.data_dir, local) if local is not None else None
                if rel is not None:
                    refs.add(rel)
        return refs

    def session_ids(self) -> set[str]:
        with self._db.read() as conn:
            return {r[0] for r in conn.execute("SELECT id FROM sessions_v2")}

    def workspace_dirs(self) -> list[str]:
        """Every session's own workspace directory (never removed, whatever lies around it)."""
        with self._db.read() as conn:
            return [r[0] for r in conn.execute(
                "SELECT DISTINCT workspace_dir FROM sessions_v2 WHERE workspace_dir IS NOT NULL"
            )]

    def has_deletions(self) -> bool:
        with self._db.read() as conn:
            return bool(conn.execute("SELECT 1 FROM file_deletions LIMIT 1").fetchall())


def backfill_owned_files(conn: apsw.Connection) -> None:
    """Ownership of the files an older build wrote (run once, by the migration): the
    ``file://`` references of every message, the spill files its tool results name, and
    the default workspace of every ACP session without one of its own."""
    if not conn.filename:
        return
    data_dir = data_dir_of(conn)
    rows: list[tuple[Any, ...]] = []
    for mid, sid, text, raw in conn.execute(
        "SELECT id, session_id, text_content, parts FROM messages_v2"
        " WHERE parts LIKE '%file:%' OR text_content LIKE '%file:%'"
    ):
        parts = parts_or_none(raw, mid)
        rows += [(sid, mid, DATA_ROOT, rel, "attachment", 0) for rel in sorted(message_file_refs(data_dir, text, parts))]
    workspaces: dict[str, str | None] = {
        str(sid): None if ws is None else str(ws)
        for sid, ws in conn.execute("SELECT id, workspace_dir FROM sessions_v2").fetchall()
    }
    for mid, sid, raw in conn.execute(
        "SELECT id, session_id, parts FROM messages_v2 WHERE parts LIKE '%saved as tool_outputs/%'"
    ):
        for part in parts_or_none(raw, mid) or ():
            if not isinstance(part, ToolResultPart):
                continue
            for match in _SPILL_NOTE.finditer(part.content):
                name, reader = match.group(1), match.group(2)
                workspace = workspaces.get(sid) if reader == "workspace_read_file" else None
                if reader == "workspace_read_file" and not workspace:
                    continue
                rows.append((sid, mid, str(workspace) if workspace else DATA_ROOT, f"tool_outputs/{name}", "spill", 0))
    rows += [
        (sid, None, DATA_ROOT, f"acp/{sid}", "workspace", 0)
        for (sid,) in conn.execute("SELECT id FROM sessions_v2 WHERE mode = 'acp' AND workspace_dir IS NULL")
    ]
    if rows:
        conn.executemany(_OWN, rows)
        log.info("recorded the ownership of %d stored files", len(rows))
