"""fs/read_text_file and fs/write_text_file, served inside one session's working directory.

An agent's path must be absolute (ACP's rule) and pass the project's confinement rule
(``sidecar/confine.py``): after every symlink is resolved it lies inside the real path of
the session's working directory. ``..`` leading out, absolute paths elsewhere, symlinks
pointing out, NUL bytes and absurdly long paths are refused with INVALID_PARAMS and a
message naming the rule; a missing file is ACP's "resource not found" (AcpErrorCode.RESOURCE_NOT_FOUND, -32002:
these errors are answers to the agent, in ACP's numbering, not our protocol's).

Blocking file work runs in a worker thread (``anyio.to_thread``). Writes go to a
temporary file in the same directory, then replace the target, so a failed write never
leaves a half-written file; the new file gets the mode the target had (or, for a new file,
what ``open`` would give it: 0o666 less the umask), not mkstemp's 0600.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import anyio.to_thread

from sidecar.acp.types import AcpErrorCode
from sidecar.confine import PathRefused, resolve_in
from sidecar.errors import InvalidParams, SidecarError

MAX_READ_BYTES = 32 * 1024 * 1024


def _read_umask() -> int:
    try:  # Linux says it without touching it
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for row in status:
                if row.startswith("Umask:"):
                    return int(row.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore, once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()


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


def _read(root: str, path: str, line: int | None, limit: int | None) -> str:
    target = confine(root, path)
    if not target.is_file():
        raise SidecarError(f"resource not found: {path}", code=AcpErrorCode.RESOURCE_NOT_FOUND)
    size = target.stat().st_size
    if size > MAX_READ_BYTES:
        raise InvalidParams(f"invalid params: {path} is {size} bytes, over the {MAX_READ_BYTES} byte limit")
    text = target.read_bytes().decode("utf-8", "replace")
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
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".acp-write-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
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
