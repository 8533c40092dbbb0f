"""Range and shape checks of store inputs that msgspec decoding cannot express.

Owns: every InvalidParams the store raises for bad arguments (limits, offsets, enum-like
strings, tag lists). Params decoded from the wire already have the right types; these
checks also guard Python callers (the engine), who bypass decoding.
Must stay true: a check runs before anything is written, and its message names the field.
"""

from __future__ import annotations

from typing import Any, TypeVar, get_args

from protocol.sessions import SessionSortBy
from protocol.types import ContentType, DateRange, MessageRole, MessageStatus, SessionMode
from sidecar.errors import InvalidParams

__all__ = [
    "check_range",
    "check_choice",
    "check_tags",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "check_date_range",
    "check_text",
    "check_workspace_dir",
    "ROLES",
    "STATUSES",
    "CONTENT_TYPES",
    "MODES",
    "SORT_COLUMNS",
]

ROLES: frozenset[MessageRole] = frozenset(get_args(MessageRole))
STATUSES: frozenset[MessageStatus] = frozenset(get_args(MessageStatus))
CONTENT_TYPES: frozenset[ContentType] = frozenset(get_args(ContentType))
MODES: frozenset[SessionMode] = frozenset(get_args(SessionMode))
SORT_COLUMNS: frozenset[SessionSortBy] = frozenset(get_args(SessionSortBy))

S = TypeVar("S", bound=str)


def check_range(field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParams(f"{field} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InvalidParams(f"{field} must be between {lo} and {hi}, got {value}")
    return value


def check_choice(field: str, value: Any, choices: frozenset[S]) -> S:
    """``value`` as one of ``choices`` (a set of a protocol Literal's values narrows it to
    that Literal), else InvalidParams naming the field."""
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(sorted(choices))
        raise InvalidParams(f"{field} must be one of {allowed}, got {value!r}")
    return value


MAX_TAGS = 100
"""Tags per session or per filter: each filter tag is one more probe in the list query."""
MAX_TAG_CHARS = 200


def check_tags(field: str, value: Any) -> list[str]:
    """A list of at most MAX_TAGS non-empty strings of at most MAX_TAG_CHARS characters,
    duplicates dropped (first occurrence kept)."""
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InvalidParams(f"{field} must be a list of strings")
    if len(value) > MAX_TAGS:
        raise InvalidParams(f"{field} must not hold more than {MAX_TAGS} tags, got {len(value)}")
    if any(not t.strip() for t in value):
        raise InvalidParams(f"{field} must not contain empty tags")
    if any(len(t) > MAX_TAG_CHARS for t in value):
        raise InvalidParams(f"{field} must not contain tags longer than {MAX_TAG_CHARS} characters")
    return list(dict.fromkeys(value))


def check_date_range(field: str, value: DateRange | None) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, DateRange):
        raise InvalidParams(f"{field} must be an object with from and to")
    lo = check_range(f"{field}.from", value.from_, -(2**53), 2**53)
    hi = check_range(f"{field}.to", value.to, -(2**53), 2**53)
    if lo > hi:
        raise InvalidParams(f"{field}.from must not be after {field}.to")
    return lo, hi


def check_text(field: str, value: Any, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidParams(f"{field} must be a string")
    return value


MAX_WORKSPACE_PATH = 4096


def check_workspace_dir(field: str, value: Any) -> str | None:
    """None or "" (no workspace), else an absolute path without NUL, at most 4096 chars.
    Whether it exists is checked when a tool uses it, not here (a drive may be unmounted)."""
    import os.path

    text = check_text(field, value)
    if not text:
        return text
    if "\x00" in text or len(text) > MAX_WORKSPACE_PATH:
        raise InvalidParams(f"{field} must be a path of at most {MAX_WORKSPACE_PATH} characters")
    if not os.path.isabs(text):
        raise InvalidParams(f"{field} must be an absolute path, got {text!r}")
    return os.path.normpath(text)
