"""Which header or environment variable names hold secrets: the one list.

Used by the providers (scrubbing such headers' values from messages and logs) and as a
check of the child environment's allow-list (sidecar/children/env.py). What is sealed at
rest and masked on the wire does not depend on names: every value is
(sidecar/store/secrets.py, ``mask``).
"""

from __future__ import annotations

__all__ = ["SECRET_NAME_HINTS", "is_secret_name"]

SECRET_NAME_HINTS = ("auth", "key", "token", "secret", "cookie", "session", "password")


def is_secret_name(name: str) -> bool:
    """Whether a header or environment variable called ``name`` holds a secret by its name."""
    lowered = name.lower()
    return any(hint in lowered for hint in SECRET_NAME_HINTS)
