"""The one place the server token is sealed for storage and opened again.

Owns: the stored form of the Qiming token. Everything that writes the token to the
database calls ``seal``; everything that reads it back calls ``unseal``. Today the sealed
form is the token behind a version prefix (``plain:``), the same protection the API keys
of ``provider:*`` have (the data dir's file permissions); encryption at rest (AES-GCM with
a key from the host, DESIGN.md section 6) replaces these two functions and adds a prefix
of its own, and ``unseal`` keeps reading the older prefixes so stored tokens survive the
upgrade.

Must stay true: a sealed value is never returned on the wire or logged; ``unseal`` of
something it does not recognise returns None (the account then needs a new token) rather
than handing back garbage as a credential.
"""

from __future__ import annotations

__all__ = ["seal", "unseal"]

_PLAIN = "plain:"


def seal(token: str) -> str:
    """The stored form of ``token``."""
    return _PLAIN + token


def unseal(stored: str | None) -> str | None:
    """The token of a stored value, or None when there is none or it cannot be read."""
    if not stored:
        return None
    if stored.startswith(_PLAIN):
        return stored[len(_PLAIN):] or None
    return None
