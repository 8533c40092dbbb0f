"""The disk side of the data lifecycle: removing released files, finding orphans.

Blocking file I/O; the database side is sidecar/store/files.py, which calls ``detach``
while it holds the write lock (so a file is never removed while a row that owns it is
being committed). Only quick operations happen there: a file is unlinked, a directory is
renamed into ``acp/.trash-*``; the trash is emptied (``purge``) afterwards, outside the
database, and a trash folder a crash left behind is emptied by the next sweep.

What may be removed: in the data dir an entry of ``attachments/``, ``tool_outputs/`` or
``acp/``; in a session's workspace only a ``tool_outputs/<name>.txt`` spill file. The path
is resolved with the confinement rule (sidecar/confine.py: a folder on the way that is a
symlink leading out is refused); the entry itself is judged with lstat, never followed (a
symlink is removed as a link). A file written again after it was released (its mtime is
newer than its journal row) is kept: it has a new owner, or will be swept as an orphan.

``orphans``: entries of the managed folders that nothing owns any more (a crash between
writing a file and storing the row that owns it, files of an older build whose rows are
gone). Entries younger than the grace period are left alone (a file is written just
before the row that owns it is committed).

Must stay true: nothing outside the managed folders is ever removed, and no directory
that is (or contains) a session's own ``workspaceDir``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import msgspec

from sidecar.confine import inside
from sidecar.store.files import DATA_ROOT, MANAGED_DIRS, Deletion
from sidecar.store.ids import new_id

__all__ = ["Freed", "Detached", "detach", "detach_orphan", "purge", "orphans", "GC_GRACE_S", "TRASH_PREFIX"]

log = logging.getLogger(__name__)

GC_GRACE_S = 600.0
"""Orphans younger than this are kept (a file exists shortly before its owning row)."""
TRASH_PREFIX = ".trash-"
_SPILL_NAME = re.compile(r"^tool_outputs/[A-Za-z0-9_-]{1,140}\.txt$")


class Freed(msgspec.Struct, kw_only=True):
    files: int = 0
    bytes: int = 0

    def add(self, other: Freed) -> None:
        self.files += other.files
        self.bytes += other.bytes


class Detached(msgspec.Struct, kw_only=True):
    """What removing one entry did: ``freed`` now, a ``trash`` folder to purge, and whether
    its journal row is finished (False: keep it and try again later)."""

    freed: Freed = msgspec.field(default_factory=Freed)
    trash: Path | None = None
    done: bool = True


def _target(data_dir: Path, root: str, rel: str, kind: str) -> Path | None:
    """The path a journal row may remove, or None when it is not ours to remove."""
    pure = PurePosixPath(rel)
    parts = pure.parts
    if len(parts) != 2 or ".." in parts or pure.is_absolute() or parts[1].startswith(TRASH_PREFIX):
        return None
    if root == DATA_ROOT:
        if parts[0] not in MANAGED_DIRS or (kind == "workspace") != (parts[0] == "acp"):
            return None
        base = data_dir
    else:
        if kind != "spill" or not _SPILL_NAME.match(rel):
            return None
        base = Path(root)
    folder = inside(base, base / parts[0])  # a symlinked folder that leads out is refused
    if folder is None:
        return None
    return folder / parts[1]


def _holds_workspace(path: Path, workspaces: list[str]) -> bool:
    real = os.path.realpath(path)
    for workspace in workspaces:
        try:
            ws = os.path.realpath(workspace)
            if ws == real or os.path.commonpath([real, ws]) == real:
                return True
        except (OSError, ValueError):
            continue
    return False


def _unlink_or_trash(path: Path, st: os.stat_result) -> Detached:
    if stat.S_ISDIR(st.st_mode):
        trash = path.parent / f"{TRASH_PREFIX}{new_id()}"
        path.rename(trash)
        return Detached(trash=trash)
    path.unlink()
    return Detached(freed=Freed(files=1, bytes=st.st_size if stat.S_ISREG(st.st_mode) else 0))


def detach(data_dir: Path, deletion: Deletion, workspaces: list[str]) -> Detached:
    """Remove one journaled entry (a directory goes to the trash)."""
    path = _target(data_dir, deletion.root, deletion.path, deletion.kind)
    if path is None:
        log.warning("not removing %r in %r: it is not an entry the sidecar writes",
                    deletion.path, deletion.root or "the data dir")
        return Detached()
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Detached()
    except OSError as exc:
        log.warning("cannot look at %s to remove it (kept for the next try): %s", path, exc)
        return Detached(done=False)
    is_dir = stat.S_ISDIR(st.st_mode)
    if is_dir != (deletion.kind == "workspace"):
        log.warning("not removing %s: it is not the kind of entry that was recorded", path)
        return Detached()
    if not is_dir and st.st_mtime_ns // 1_000_000 > deletion.queued_at:
        return Detached()  # written again after its release: someone else's now
    if is_dir and _holds_workspace(path, workspaces):
        log.warning("not removing %s: a session uses it (or a folder in it) as its workspace", path)
        return Detached()
    try:
        return _unlink_or_trash(path, st)
    except FileNotFoundError:
        return Detached()
    except OSError as exc:
        log.warning("could not remove %s (kept for the next try): %s", path, exc)
        return Detached(done=False)


def detach_orphan(data_dir: Path, rel: str) -> Detached:
    """Remove one entry ``orphans`` found (it was checked to be unowned meanwhile)."""
    path = data_dir / rel
    try:
        st = path.lstat()
        return _unlink_or_trash(path, st)
    except FileNotFoundError:
        return Detached()
    except OSError as exc:
        log.warning("could not remove the orphan %s: %s", path, exc)
        return Detached()


def purge(trash: Path) -> Freed:
    """Empty a trash folder; what it held."""
    files = size = 0
    for dirpath, _, names in os.walk(trash, followlinks=False):
        for name in names:
            try:
                entry = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            files += 1
            size += entry.st_size if stat.S_ISREG(entry.st_mode) else 0
    try:
        shutil.rmtree(trash)  # never follows symlinks inside (fd-based where available)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not empty %s (the next sweep tries again): %s", trash, exc)
    return Freed(files=files, bytes=size)


def orphans(
    data_dir: Path,
    owned: set[str],
    session_ids: set[str],
    workspaces: list[str],
    *,
    grace_s: float = GC_GRACE_S,
    now: float | None = None,
) -> Iterator[tuple[str, bool]]:
    """``(path relative to the data dir, is a trash folder)`` of every unowned entry."""
    cutoff = (time.time() if now is None else now) - grace_s
    for folder in MANAGED_DIRS:
        base = data_dir / folder
        try:
            if base.is_symlink() or not base.is_dir():
                continue
            entries = list(os.scandir(base))
        except OSError:
            continue
        for entry in entries:
            rel = f"{folder}/{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if entry.name.startswith(TRASH_PREFIX):
                if is_dir:
                    yield rel, True  # a delete's trash a crash left behind
                continue
            if rel in owned or st.st_mtime > cutoff:
                continue
            if folder == "acp":
                if not is_dir or entry.name in session_ids:
                    continue
            elif is_dir:
                continue  # the sidecar writes files there, never folders
            if is_dir and _holds_workspace(Path(entry.path), workspaces):
                continue
            yield rel, False
