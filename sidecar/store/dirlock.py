"""DirLock: the exclusive lock that makes a data dir belong to one process.

Owns ``<data dir>/chat-sidecar.lock``. Opening a Store runs crash recovery, which turns
every 'pending'/'streaming' row into 'aborted'; a second process on the same dir would
abort the first one's live replies. So a Store takes this lock first and a second one
fails at once with a clear StoreError instead.
Must stay true:
- the lock is an OS lock on an open descriptor (``fcntl.flock`` on POSIX,
  ``msvcrt.locking`` on Windows): it goes away with the process, however it ends, so a
  crash never leaves a stale lock behind (the file itself may stay; it means nothing);
- the descriptor is not inherited by child processes (Python's default), so a tool
  command left running cannot keep the dir locked after we exit;
- two Stores in one process on the same dir conflict too (flock is per open file);
- the lock file is created 0600 (sidecar/datadir.py).
"""

from __future__ import annotations

import errno
import os
import sys

from sidecar.datadir import FILE_MODE, StrPath
from sidecar.errors import StoreError

__all__ = ["DirLock", "LOCK_FILENAME"]

LOCK_FILENAME = "chat-sidecar.lock"


class DirLock:
    """Held from construction until ``release()``; raises StoreError if another holder exists."""

    def __init__(self, data_dir: StrPath) -> None:
        self.path = os.path.join(data_dir, LOCK_FILENAME)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}: {exc.strerror or exc}") from exc
        try:
            _lock(fd)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"another chat-sidecar is using {data_dir} (it holds {self.path}); "
                "one process per data dir"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {self.path}: {exc.strerror or exc}") from exc
        self._fd: int | None = fd

    def release(self) -> None:
        """Idempotent. Closing the descriptor releases the lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


if sys.platform == "win32":  # (sys.platform, not os.name: the type checker narrows on it)
    import msvcrt

    def _lock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            # One byte at offset 0 (locking past the end of an empty file is allowed).
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            # A byte locked by another handle is EACCES (or EDEADLOCK) on Windows.
            if exc.errno in (errno.EACCES, errno.EDEADLOCK):
                raise BlockingIOError(*exc.args) from exc
            raise

else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
