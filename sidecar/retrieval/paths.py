"""Files a knowledge base may read: confined to the roots the host allowed, read bounded.

``confine(path, roots)`` applies the project's one confinement rule
(``sidecar/confine.py``: ``resolve_in(root, path, relative=False, what=...)``) to an
absolute path, root by root: the real path, with every symlink resolved, must be a root's
real path or lie below it (a ``..`` that stays inside is fine, one that leads out is not).
``read_bounded`` opens the confined path with ``open_nofollow`` (a symlink planted at the
last component is never followed, a FIFO cannot hang the open), refuses anything but a
regular file, and reads at most ``limit`` + 1 bytes in blocks, hashing as it goes.

Must stay true: an empty list of roots allows no file at all; a relative path is refused
(the host names files by absolute path); every refusal is an InvalidParams naming the path
and the rule (the path is the caller's own input).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import msgspec

from sidecar.confine import MAX_PATH_CHARS, PathRefused, open_nofollow, resolve_in
from sidecar.errors import InvalidParams

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
    if not roots:
        raise InvalidParams(
            "invalid params: no folder is allowed for knowledge files (kb:settings:update allowedRoots); "
            "add the document as name + text instead - at `$.path`"
        )
    if "\x00" not in path and not os.path.isabs(path):
        raise InvalidParams(f"invalid params: path {path!r} must be absolute - at `$.path`")
    refused: PathRefused | None = None
    for root in roots:
        try:
            return resolve_in(root, path, relative=False, what="the allowed folders")
        except PathRefused as exc:
            refused = exc
    assert refused is not None
    raise InvalidParams(f"invalid params: {refused} - at `$.path`")


def read_bounded(real: Path, limit: int) -> ReadResult:
    """Read a confined regular file (at most ``limit`` bytes; see the module docstring)."""
    try:
        fd = open_nofollow(real)
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
