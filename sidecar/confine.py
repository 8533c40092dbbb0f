"""Confinement: a path from outside, resolved inside a root, or refused. The one rule.

Used by every place that touches a file named by someone else: the workspace tools and
their spill files (a model's paths), an ACP agent's fs requests, stored attachment URIs,
knowledge-base documents (the roots the host allowed).

The rule:
- the path is text of at most MAX_PATH_CHARS characters (MAX_COMPONENT_CHARS per
  component), without NUL;
- ``relative`` callers (a model's workspace paths) must give a relative path without any
  ``..`` component: absolute paths (``/etc/passwd``, ``C:\\x``, ``\\\\server``) and ``..`` are
  refused outright, even when they would stay inside;
- the path is resolved with every symbolic link followed, and the real result must be the
  real root or lie below it: a symlink that leads out is refused whether it is the file
  itself or a directory on the way;
- files are opened with ``open_nofollow``: a symlink planted at the final name between the
  check and the open is never followed (and a FIFO never blocks the open).
What is not promised: a directory on the way swapped for a symlink between the check and
the open (single-user desktop threat model).

PathRefused (a ValueError) says which part of the rule failed; each caller turns it into
its layer's error (a tool error for the model, invalid params for an agent).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["PathRefused", "resolve_in", "inside", "open_nofollow", "MAX_PATH_CHARS", "MAX_COMPONENT_CHARS"]

MAX_PATH_CHARS = 4096
MAX_COMPONENT_CHARS = 255
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


class PathRefused(ValueError):
    """The path breaks the confinement rule; the message says how."""


def resolve_in(root: Path | str, path: object, *, relative: bool, what: str = "the root") -> Path:
    """The real path of ``path`` inside ``root`` (named ``what`` in messages), or PathRefused.

    ``relative``: only relative paths without ``..`` are accepted (a model's input);
    otherwise absolute paths are too (they must still resolve inside ``root``)."""
    if not isinstance(path, str):
        raise PathRefused("path must be a string")
    if "\x00" in path:
        raise PathRefused("path must not contain NUL characters")
    if len(path) > MAX_PATH_CHARS:
        raise PathRefused(f"path is too long: longer than {MAX_PATH_CHARS} characters ({len(path)})")
    text = path.strip() or "."
    absolute = PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute() or bool(PureWindowsPath(text).drive)
    parts = text.replace("\\", "/").split("/")
    if relative:
        if absolute:
            raise PathRefused(f"path {path!r} is absolute: give a path relative to {what}")
        if any(p == ".." for p in parts):
            raise PathRefused(f"path {path!r} contains '..': paths must stay inside {what}")
    if any(len(p) > MAX_COMPONENT_CHARS for p in parts):
        raise PathRefused(f"path {path!r} has a component that is too long: longer than {MAX_COMPONENT_CHARS} characters")
    real_root = Path(os.path.realpath(root))
    if absolute:
        candidate = Path(text)
    else:
        candidate = real_root.joinpath(*[p for p in parts if p not in ("", ".")])
    real = inside(real_root, candidate)
    if real is None:
        raise PathRefused(f"path {path!r} leads outside {what}")
    return real


def inside(root: Path | str, candidate: Path | str) -> Path | None:
    """The real path of ``candidate`` (symlinks followed) if it is ``root`` or below it."""
    real_root = os.path.realpath(root)
    try:
        real = os.path.realpath(candidate)
    except (OSError, ValueError, RuntimeError):  # a symlink loop, an unencodable name
        return None
    if real != real_root and os.path.commonpath([real_root, real]) != real_root:
        return None
    return Path(real)


def open_nofollow(
    path: Path | str, *, write: bool = False, append: bool = False, exclusive: bool = False, mode: int = 0o666
) -> int:
    """A file descriptor on ``path``; OSError (ELOOP) when its last component is a symlink.
    ``write`` truncates (or, with ``append``, appends) and creates the file if missing;
    ``exclusive``: the file must not exist yet (FileExistsError), as for a temporary file."""
    if write:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        if exclusive:
            flags |= os.O_EXCL
    else:
        flags = os.O_RDONLY
    return os.open(path, flags | _NOFOLLOW, mode)
