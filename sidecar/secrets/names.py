"""Which header or environment variable names hold secrets: the one list.

Used by the store (masking values on the wire, sealing them at rest), by the providers
(scrubbing them from messages and logs) and by the tools (MCP server settings).
"""

from __future__ import annotations

__all__ = ["SECRET_NAME_HINTS", "is_secret_name"]

SECRET_NAME_HINTS = ("auth", "key", "token", "secret", "cookie", "session", "password")


def is_secret_name(name: str) -> bool:
    """Whether a header or environment variable called ``name`` holds a secret by its name."""
    lowered = name.lower()
    return any(hint in lowered for hint in SECRET_NAME_HINTS)
