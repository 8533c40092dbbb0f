"""fs/read_text_file and fs/write_text_file, served inside one session's working directory.

An agent's path must be absolute (ACP's rule) and pass the project's confinement rule
(``sidecar/confine.py``): after every symlink is resolved it lies inside the real path of
the session's working directory. ``..`` leading out, absolute paths elsewhere, symlinks
pointing out, NUL bytes and absurdly long paths are refused with INVALID_PARAMS and a
message naming the rule; a missing file is ACP's "resource not found" (AcpErrorCode.RESOURCE_NOT_FOUND, -32002:
these errors are answers to the agent, in ACP's numbering, not our protocol's).

The checked path is then opened with the confinement module's no-follow open
(``confine.open_nofollow``), for reading and for the write's temporary file: a symlink
swapped in at the name after the check is never followed (the open fails, the agent gets
INVALID_PARAMS), and size and kind come from the open file, not from the name.

Blocking file work runs in a worker thread (``anyio.to_thread``). Writes go to a
temporary file in the same directory, then replace the target (a rename replaces a
symlink at the name, it never writes through it), so a failed write never leaves a
half-written file; the new file gets the mode the target had (or, for a new file, what
``open`` gives any new file: 0o666 less the umask).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

import anyio.to_thread

from sidecar.acp.types import AcpErrorCode
from sidecar.confine import PathRefused, open_nofollow, resolve_in
from sidecar.errors import InvalidParams, SidecarError

MAX_READ_BYTES = 32 * 1024 * 1024


class FsRefused(InvalidParams):
    """The path breaks the confinement rule."""


def confine(root: str | os.PathLike[str], path: str) -> Path:
    """The real path of ``path`` if it lies inside ``root``; FsRefused otherwise."""
    if not isinstance(path, str) or not path:
        raise FsRefused("invalid params: path must be a non-empty string - at `$.path`")
    if "\0" not in path and not os.path.isabs(path):
        raise FsRefused("invalid params: path must be absolute - at `$.path`")
    try:
        return resolve_in(os.fspath(root), path, relative=False, what="the session's working directory")
    except PathRefused as exc:
        raise FsRefused(f"invalid params: {exc} - at `$.path`") from None


def _swapped(path: str) -> FsRefused:
    return FsRefused(
        f"invalid params: path {path!r} became a symbolic link while it was opened (not followed) - at `$.path`"
    )


def _read(root: str, path: str, line: int | None, limit: int | None) -> str:
    target = confine(root, path)
    try:
        fd = open_nofollow(target)
    except FileNotFoundError:
        raise SidecarError(f"resource not found: {path}", code=AcpErrorCode.RESOURCE_NOT_FOUND) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _swapped(path) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):  # a directory, a FIFO, a device: not a text file
            raise SidecarError(f"resource not found: {path}", code=AcpErrorCode.RESOURCE_NOT_FOUND)
        if info.st_size > MAX_READ_BYTES:
            raise InvalidParams(f"invalid params: {path} is {info.st_size} bytes, over the {MAX_READ_BYTES} byte limit")
        data = handle.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:  # it grew after the fstat
        raise InvalidParams(f"invalid params: {path} is over the {MAX_READ_BYTES} byte limit")
    text = data.decode("utf-8", "replace")
    if line is None and limit is None:
        return text
    if line is not None and line < 1:
        raise InvalidParams("invalid params: line must be >= 1 - at `$.line`")
    if limit is not None and limit < 0:
        raise InvalidParams("invalid params: limit must be >= 0 - at `$.limit`")
    lines = text.splitlines(keepends=True)
    start = (line or 1) - 1
    end = None if limit is None else start + limit
    return "".join(lines[start:end])


def _write(root: str, path: str, content: str) -> None:
    target = confine(root, path)
    if target.is_dir():
        raise InvalidParams(f"invalid params: {path} is a directory - at `$.path`")
    target.parent.mkdir(parents=True, exist_ok=True)
    target = confine(root, path)  # again: the folders on the way are real now, and still inside
    try:
        info = os.lstat(target)
        mode = None if stat.S_ISLNK(info.st_mode) else stat.S_IMODE(info.st_mode)
    except FileNotFoundError:
        mode = None
    tmp = target.parent / f".acp-write-{secrets.token_hex(8)}"
    try:
        fd = open_nofollow(tmp, write=True, exclusive=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _swapped(path) from None
        raise
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            if mode is not None:  # the target's own mode, set before any content is there
                if hasattr(os, "fchmod"):
                    os.fchmod(handle.fileno(), mode)
                else:  # Windows (only the read-only bit)
                    os.chmod(tmp, mode)
            handle.write(content)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


async def read_text_file(root: str, path: str, line: int | None = None, limit: int | None = None) -> str:
    try:
        return await anyio.to_thread.run_sync(_read, root, path, line, limit)
    except OSError as exc:
        raise SidecarError(f"cannot read {path}: {exc.strerror or exc}") from exc


async def write_text_file(root: str, path: str, content: str) -> None:
    try:
        await anyio.to_thread.run_sync(_write, root, path, content)
    except OSError as exc:
        raise SidecarError(f"cannot write {path}: {exc.strerror or exc}") from exc
