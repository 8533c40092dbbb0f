"""Checks of everything a V1 caller names: ids, working directories, the API key.

Rules (the later V1 desktop client's, ``agentWorkDir.ts``):
- ``user_id``, ``project_id``, ``session_id``, ``request_id`` and an ``agent_work_dir``
  that is not an absolute path match ``[A-Za-z0-9_-]{1,64}`` (so none of them can climb
  out of a directory: no ``/``, ``\\``, ``..`` or drive letter);
- an absolute ``agent_work_dir`` (at most 4096 characters) must exist, be a directory and
  be writable; its real path (symlinks resolved) is what is used;
- the API key compares in constant time (``hmac.compare_digest``).

Must stay true: a path built from request values only ever joins checked identifiers.
"""

from __future__ import annotations

import hmac
import os
import re
from pathlib import Path

from sidecar.compat.wire import V1Error, invalid

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


def work_dir(value: str, root: Path) -> Path:
    """The directory an ``agent_work_dir`` names: ``root/value`` for an identifier (not
    created here), the real path of an existing writable directory for an absolute path.
    Blocking (stat, realpath): call it from a worker thread."""
    if os.path.isabs(value):
        if len(value) > MAX_ABS_PATH:
            raise V1Error(400, AGENT_WORK_DIR_INVALID, f"agent_work_dir path exceeds {MAX_ABS_PATH} characters")
        if "\x00" in value:
            raise V1Error(400, AGENT_WORK_DIR_INVALID, "agent_work_dir contains a NUL character")
        try:
            resolved = Path(os.path.realpath(value, strict=True))
        except OSError:
            raise V1Error(400, AGENT_WORK_DIR_NOT_FOUND, f"agent_work_dir directory does not exist: {value}") from None
        if not resolved.is_dir():
            raise V1Error(400, AGENT_WORK_DIR_NOT_A_DIRECTORY, f"agent_work_dir is not a directory: {value}")
        if not os.access(resolved, os.W_OK):
            raise V1Error(400, AGENT_WORK_DIR_NOT_WRITABLE, f"agent_work_dir directory is not writable: {value}")
        return resolved
    if not IDENTIFIER.fullmatch(value):
        raise V1Error(400, AGENT_WORK_DIR_INVALID, "agent_work_dir must be an absolute path or 1-64 characters of [A-Za-z0-9_-]")
    return root / value


def token_matches(expected: bytes, given: str | None) -> bool:
    if not given:
        return False
    return hmac.compare_digest(expected, given.encode("utf-8", "surrogateescape"))
