"""The data dir is the user's alone: every directory the sidecar makes there is 0700 and
every file it writes there 0600 (POSIX), from the moment it exists. The one rule for the
modes of our own files; any layer writing under the data dir goes through it.

Owns:
- ``make_dirs(path)``: ``path`` and each missing parent, created 0700 (``os.makedirs``
  would give the parents the umask's mode; its walk otherwise);
- ``open_private(path, ...)`` / ``write_private(path, data)``: a file created 0600 by the
  ``open`` that creates it (no window in which it is readable by others), never through a
  symlink at its name; a file that already exists wider is narrowed before anything is
  written to it;
- ``create_db_file(path)``: the database file made empty and 0600 before SQLite opens it.
  SQLite creates its ``-wal``, ``-shm`` and ``-journal`` files itself, with the mode of the
  database file (os_unix.c ``findCreateFileMode``): so they are 0600 from creation too,
  without touching the process umask (which other threads share);
- ``tighten(data_dir, files=, folders=, filled=)``: at start, what an older version (or
  another program) left readable by others is narrowed, and the log says what: the data
  dir itself, the named ``files`` in it, the named ``folders`` and, in a ``filled`` folder
  that was wider, each of its files (a folder that is 0700 holds only files written 0600:
  the start costs a few stats, not a walk of every attachment). Symlinks are never
  followed or changed. The store names what is ours (sidecar/store/store.py).

Not here: files the model or an agent writes in a workspace (the user's folder, even
``<dataDir>/acp/<sessionId>``): they get what the umask gives, as with any program.
Windows: mode bits do not express who may read a file there; these functions create the
same files and leave access to the ACL the folder inherits (the user's profile, under
``%LOCALAPPDATA%``, is readable by the user, SYSTEM and Administrators only).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from sidecar.logging_setup import EarlyLogger

__all__ = ["DIR_MODE", "FILE_MODE", "make_dirs", "open_private", "write_private", "create_db_file", "tighten"]

log = EarlyLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_POSIX = os.name != "nt"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)

StrPath = str | os.PathLike[str]
"""A path as these functions take it (os.path, not pathlib: they run before the first answer)."""


def make_dirs(path: StrPath) -> None:
    """``path`` as a directory; the ones created here (it and missing parents) are 0700."""
    if os.path.isdir(path):
        return
    head, tail = os.path.split(path)
    if not tail:  # a trailing separator
        head, tail = os.path.split(head)
    if head and tail and not os.path.exists(head):
        make_dirs(head)
        if tail == os.curdir:  # "x/." is x, made just now
            return
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def open_private(path: StrPath, *, exclusive: bool = False, append: bool = False) -> int:
    """A write descriptor on ``path``, created 0600 (``exclusive``: it must not exist yet);
    truncated unless ``append``. OSError (ELOOP) when its last component is a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW
    flags |= os.O_EXCL if exclusive else (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    if _POSIX and not exclusive:
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:  # it existed, wider: narrow it first
                os.fchmod(fd, FILE_MODE)
        except OSError:
            os.close(fd)
            raise
    return fd


def write_private(path: StrPath, data: bytes, *, exclusive: bool = False) -> None:
    """``data`` as the whole content of ``path`` (a file 0600, see ``open_private``)."""
    with os.fdopen(open_private(path, exclusive=exclusive), "wb") as handle:
        handle.write(data)


def create_db_file(path: StrPath) -> None:
    """An empty 0600 file at ``path`` unless one exists (SQLite takes an empty file for an
    empty database, and gives its companion files the same mode)."""
    try:
        os.close(open_private(path, exclusive=True))
    except FileExistsError:
        pass


def tighten(data_dir: StrPath, *, files: Iterable[str], folders: Iterable[str], filled: Iterable[str]) -> list[str]:
    """Narrow what is readable by others: the data dir, ``files`` and ``folders`` in it, and
    the files of the ``filled`` folders (one level). Returns what was narrowed (relative
    names, "." for the dir itself), logged once as a warning. POSIX only."""
    if not _POSIX:
        return []
    root = os.path.realpath(data_dir)
    narrowed: list[str] = []
    if _narrow(root, DIR_MODE):
        narrowed.append(".")
    for name in files:
        if _narrow(os.path.join(root, name), FILE_MODE):
            narrowed.append(name)
    filled = set(filled)
    for name in (*folders, *filled):
        folder = os.path.join(root, name)
        if _narrow(folder, DIR_MODE):
            narrowed.append(name)
            # what an older version wrote in a folder it made readable is readable too
            if name in filled:
                narrowed += [f"{name}/{entry}" for entry in _narrow_files(folder)]
    if narrowed:
        shown = ", ".join(narrowed[:8]) + (f" and {len(narrowed) - 8} more" if len(narrowed) > 8 else "")
        log.warning(
            "the data dir %s was readable by other users: tightened %d entries to 0700/0600 (%s)",
            root, len(narrowed), shown,
        )
    return narrowed


def _narrow(path: str, mode: int) -> bool:
    """chmod ``path`` to ``mode`` when it grants anything to group or others (never
    through a symlink, never a kind of entry ``mode`` is not for)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    want_dir = mode == DIR_MODE
    if stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode) != want_dir:
        return False
    if not stat.S_IMODE(info.st_mode) & 0o077:
        return False
    try:
        os.chmod(path, mode)
    except PermissionError:  # not ours (another user's folder given as the data dir)
        log.error("%s is readable by other users and cannot be tightened (not owned by us)", path)
        return False
    return True


def _narrow_files(folder: str) -> list[str]:
    narrowed: list[str] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and _narrow(entry.path, FILE_MODE):
                narrowed.append(entry.name)
    return narrowed
