"""Files a knowledge base may read: confined to the roots the host allowed, read bounded.

``confine(path, roots)`` applies the project's one confinement rule (``resolve_in`` of
``sidecar/tools/workspace.py``) to an absolute path: the root it lies under lexically
(as given, or the root's real path) gives the relative path, which ``resolve_in`` checks
(no ``..``, length limits, the real path with every symlink resolved inside the real root).
``read_bounded`` opens the confined path without following a symlink at its last
component (``open_spill``'s O_NOFOLLOW | O_NONBLOCK, so a FIFO cannot hang it), refuses
anything but a regular file, and reads at most ``limit`` + 1 bytes in blocks, hashing as it
goes.

Must stay true: an empty list of roots allows no file at all; every refusal is an
InvalidParams naming the path and the rule (the path is the caller's own input).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path, PurePath

import msgspec

from sidecar.errors import InvalidParams
from sidecar.tools.base import ToolError
from sidecar.tools.spill import open_spill
from sidecar.tools.workspace import MAX_PATH_CHARS, resolve_in

__all__ = ["confine", "read_bounded", "ReadResult", "BLOCK_BYTES", "normalize_root"]

BLOCK_BYTES = 1024 * 1024


class ReadResult(msgspec.Struct, kw_only=True):
    path: str
    size: int
    """The file's size as fstat saw it."""
    data: bytes | None
    """None when the file is larger than the limit (only its size is known)."""
    sha256: str | None


def normalize_root(root: str) -> str:
    """An allowed root as stored: absolute, normalized, its real path when it exists."""
    if not isinstance(root, str) or not root or "\x00" in root or len(root) > MAX_PATH_CHARS:
        raise InvalidParams("invalid params: allowedRoots must be absolute directory paths - at `$.allowedRoots`")
    if not os.path.isabs(root):
        raise InvalidParams(f"invalid params: allowed root {root!r} is not absolute - at `$.allowedRoots`")
    return os.path.realpath(root) if os.path.exists(root) else os.path.normpath(root)


def confine(path: str, roots: list[str]) -> Path:
    """The real path of ``path`` when it lies inside one of ``roots``; InvalidParams otherwise."""
    if not isinstance(path, str) or not path:
        raise InvalidParams("invalid params: path must be a non-empty string - at `$.path`")
    if "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise InvalidParams("invalid params: path contains a NUL character or is too long - at `$.path`")
    if not roots:
        raise InvalidParams(
            "invalid params: no folder is allowed for knowledge files (kb:settings:update allowedRoots); "
            "add the document as name + text instead - at `$.path`"
        )
    if not os.path.isabs(path):
        raise InvalidParams(f"invalid params: path {path!r} must be absolute - at `$.path`")
    last: ToolError | None = None
    for root in roots:
        for base in dict.fromkeys((root, os.path.realpath(root))):
            try:
                relative = PurePath(path).relative_to(base)
            except ValueError:
                continue
            try:
                return resolve_in(Path(base), relative.as_posix() or ".")
            except ToolError as exc:
                last = exc
    if last is not None:
        why = str(last).replace("the workspace", "the allowed folder").replace("workspace", "allowed folder")
        raise InvalidParams(f"invalid params: {why} - at `$.path`")
    raise InvalidParams(f"invalid params: path {path!r} is not inside an allowed folder - at `$.path`")


def read_bounded(real: Path, limit: int) -> ReadResult:
    """Read a confined regular file (at most ``limit`` bytes; see the module docstring)."""
    try:
        fd = open_spill(real, write=False)
    except FileNotFoundError:
        raise InvalidParams(f"invalid params: no file {str(real)!r} - at `$.path`") from None
    except OSError as exc:
        raise InvalidParams(f"invalid params: {str(real)!r} cannot be opened: {exc.strerror} - at `$.path`") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidParams(f"invalid params: {str(real)!r} is not a regular file - at `$.path`")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            return ReadResult(path=str(real), size=info.st_size, data=None, sha256=None)
        digest = hashlib.sha256()
        buffer = bytearray()
        while True:
            block = f.read(BLOCK_BYTES)
            if not block:
                break
            buffer += block
            digest.update(block)
            if len(buffer) > limit:  # it grew after fstat
                return ReadResult(path=str(real), size=len(buffer), data=None, sha256=None)
    return ReadResult(path=str(real), size=len(buffer), data=bytes(buffer), sha256=digest.hexdigest())
