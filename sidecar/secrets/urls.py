"""The parts of a URL that may carry a secret: its userinfo (``https://user:pass@host``)
and every query value (``?key=...``, ``?api-version=...``: any of them). The one rule for
what of a URL is sealed at rest (sidecar/store/secrets.py) and masked on the wire
(``mask.py``).

``map_secret_parts(url, fn)`` rewrites each such part with ``fn`` (its text as it is in the
URL, still percent-encoded; ``fn`` returns the replacement, or None to drop the part) and
leaves everything else byte for byte: scheme, host, port, path, query keys, fragment.
A bare query component (``?token``, no ``=``) counts as a value. ``split_secret_parts`` is
None for a URL that does not parse (callers refuse such a URL, or mask it whole), and
``map_secret_parts`` returns it as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

__all__ = ["SecretParts", "split_secret_parts", "join_secret_parts", "map_secret_parts"]


class SecretParts(NamedTuple):
    scheme: str
    host: str
    """The netloc without its userinfo (host and port)."""
    path: str
    fragment: str
    userinfo: str | None
    query: list[tuple[str | None, str]]
    """(key, value) per component in order; key None for a bare component (its text is the value)."""


def split_secret_parts(url: str) -> SecretParts | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    userinfo, at, host = parts.netloc.rpartition("@")
    query: list[tuple[str | None, str]] = []
    for component in parts.query.split("&") if parts.query else ():
        key, eq, value = component.partition("=")
        query.append((key, value) if eq else (None, component))
    return SecretParts(parts.scheme, host, parts.path, parts.fragment, userinfo if at else None, query)


def join_secret_parts(parts: SecretParts) -> str:
    netloc = parts.host if parts.userinfo is None else f"{parts.userinfo}@{parts.host}"
    query = "&".join(value if key is None else f"{key}={value}" for key, value in parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def map_secret_parts(url: str, fn: Callable[[str], str | None]) -> str:
    """``url`` with its userinfo and each non-empty query value replaced by ``fn(part)``
    (None drops the part: the userinfo, or the whole query component)."""
    parts = split_secret_parts(url)
    if parts is None or (parts.userinfo is None and not parts.query):
        return url
    userinfo = fn(parts.userinfo) if parts.userinfo else parts.userinfo
    query: list[tuple[str | None, str]] = []
    for key, value in parts.query:
        if not value:
            query.append((key, value))
            continue
        replaced = fn(value)
        if replaced is not None:
            query.append((key, replaced))
    return join_secret_parts(parts._replace(userinfo=userinfo, query=query))
