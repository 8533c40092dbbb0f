"""Checks of everything a V1 caller names: ids, working directories, the API key, the Host.

Rules (the later V1 desktop client's, ``agentWorkDir.ts``, then ours):
- ``user_id``, ``project_id``, ``session_id``, ``request_id`` and an ``agent_work_dir``
  that is not an absolute path match ``[A-Za-z0-9_-]{1,64}`` (so none of them can climb
  out of a directory: no ``/``, ``\\``, ``..`` or drive letter);
- an absolute ``agent_work_dir`` must lie in one of the roots the host allowed at
  ``compat:start`` (sidecar.confine, symlinks resolved: a link out of a root is out), and
  exist, be a directory and be writable; its real path is what is used;
- the API key comes as ``x-api-key`` or ``Authorization: Bearer`` and compares in constant
  time (``hmac.compare_digest``); either one being right is enough;
- the ``Host`` header names this computer by a loopback name (``localhost``,
  ``127.0.0.1``, ``[::1]``; the port, if given, is ours), unless the host allowed remote
  callers: a page whose DNS name was rebound to 127.0.0.1 sends its own name.

Must stay true: a path built from request values only ever joins checked identifiers.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from sidecar.compat.wire import V1Error, invalid
from sidecar.confine import PathRefused, resolve_in

IDENTIFIER = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_ABS_PATH = 4096
TOKEN = re.compile(r"[\x21-\x7e]{16,256}")
"""Printable ASCII without spaces: what an ``x-api-key`` header can carry unchanged."""

AGENT_WORK_DIR_INVALID = "AGENT_WORK_DIR_INVALID"
AGENT_WORK_DIR_NOT_FOUND = "AGENT_WORK_DIR_NOT_FOUND"
AGENT_WORK_DIR_NOT_A_DIRECTORY = "AGENT_WORK_DIR_NOT_A_DIRECTORY"
AGENT_WORK_DIR_NOT_WRITABLE = "AGENT_WORK_DIR_NOT_WRITABLE"


def identifier(value: str | None, field: str, *, required: bool = False) -> str | None:
    """``value`` if it is a valid identifier (None when absent and not required)."""
    if value is None or value == "":
        if required:
            raise invalid(f"{field} is required")
        return None
    if not IDENTIFIER.fullmatch(value):
        raise invalid(f"{field} must be 1-64 characters of [A-Za-z0-9_-]")
    return value


def work_dir(value: str, root: Path, roots: Sequence[Path] = ()) -> Path:
    """The directory an ``agent_work_dir`` names: ``root/value`` for an identifier (not
    created here), the real path of an existing writable directory inside ``root`` or one
    of ``roots`` for an absolute path. Blocking (stat, realpath): call it from a worker
    thread."""
    if os.path.isabs(value):
        if len(value) > MAX_ABS_PATH:
            raise V1Error(400, AGENT_WORK_DIR_INVALID, f"agent_work_dir path exceeds {MAX_ABS_PATH} characters")
        if "\x00" in value:
            raise V1Error(400, AGENT_WORK_DIR_INVALID, "agent_work_dir contains a NUL character")
        resolved = _inside_a_root(value, (root, *roots))
        if not resolved.exists():
            raise V1Error(400, AGENT_WORK_DIR_NOT_FOUND, f"agent_work_dir directory does not exist: {value}")
        if not resolved.is_dir():
            raise V1Error(400, AGENT_WORK_DIR_NOT_A_DIRECTORY, f"agent_work_dir is not a directory: {value}")
        if not os.access(resolved, os.W_OK):
            raise V1Error(400, AGENT_WORK_DIR_NOT_WRITABLE, f"agent_work_dir directory is not writable: {value}")
        return resolved
    if not IDENTIFIER.fullmatch(value):
        raise V1Error(400, AGENT_WORK_DIR_INVALID, "agent_work_dir must be an absolute path or 1-64 characters of [A-Za-z0-9_-]")
    return root / value


def _inside_a_root(value: str, roots: Iterable[Path]) -> Path:
    for allowed in roots:
        try:
            return resolve_in(allowed, value, relative=False, what="an allowed directory")
        except PathRefused:
            continue
    raise V1Error(
        400, AGENT_WORK_DIR_INVALID,
        "agent_work_dir must be inside a directory this computer allows"
        " (the V1 workspace, or compat:start workDirRoots)",
    )


def token_matches(expected: bytes, given: str | None) -> bool:
    if not given:
        return False
    return hmac.compare_digest(expected, given.encode("utf-8", "surrogateescape"))


def request_authorized(headers: Iterable[tuple[bytes, bytes]], expected: bytes) -> bool:
    """Whether a request's headers carry the key (``x-api-key`` or ``Authorization: Bearer``)."""
    key = bearer = None
    for name, value in headers:
        if name == b"x-api-key":
            key = value.decode("latin-1")
        elif name == b"authorization":
            scheme, _, rest = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                bearer = rest.strip()
    # both are checked when both are sent: either one being right is enough
    return token_matches(expected, key) or token_matches(expected, bearer)


LOOPBACK_NAMES = frozenset({b"localhost", b"127.0.0.1", b"[::1]"})


def host_allowed(headers: Iterable[tuple[bytes, bytes]], port: int) -> bool:
    """Whether the ``Host`` header is a loopback name of this server (port ours, or none)."""
    hosts = [value for name, value in headers if name == b"host"]
    if len(hosts) != 1:
        return False
    host = hosts[0].strip().lower()
    name, sep, given = host.rpartition(b":") if not host.endswith(b"]") else (host, b"", b"")
    if not sep:
        name = host
    elif given != str(port).encode():
        return False
    return name in LOOPBACK_NAMES
