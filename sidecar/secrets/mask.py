"""What the wire shows of stored secrets, and how a masked value sent back keeps the stored
one. The one rule for every listing (``provider:list``: headers, body, base URL, an
engine's env; ``mcp:server:list``: the URL).

Every value is shown as MASK (``***``), whatever its name: a header called ``X-Trace``,
a body field ``api_key``, a query value, an env value. Names stay visible (header and env
names, body keys, query keys, the URL's host and path), so the user sees what is
configured, and an entry that cannot be opened (sealed with a key this process was not
given) is listed all the same: sending the listing back keeps it.

Unmasking (``unmask_map``, ``unmask_url``): an update that sends MASK for an entry keeps
that entry's stored value (whatever its stored form: sealed, or locked); MASK for an
entry that is not stored stays as the literal text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from sidecar.secrets.urls import join_secret_parts, map_secret_parts, split_secret_parts

__all__ = ["MASK", "mask_map", "unmask_map", "mask_url", "unmask_url"]

MASK = "***"
V = TypeVar("V")


def mask_map(values: Mapping[str, Any]) -> dict[str, str]:
    return {key: MASK for key in values}


def unmask_map(sent: Mapping[str, V], stored: Mapping[str, V]) -> dict[str, V]:
    """``sent`` with every MASK value replaced by the stored value of its key."""
    return {key: (stored[key] if value == MASK and key in stored else value) for key, value in sent.items()}


def mask_url(url: str) -> str:
    """``url`` with its userinfo and every non-empty query value shown as MASK (a URL that
    does not parse: MASK as a whole)."""
    if split_secret_parts(url) is None:
        return MASK
    return map_secret_parts(url, lambda _: MASK)


def unmask_url(sent: str, stored: str) -> str:
    """``sent`` with each MASK part replaced by the stored part it stands for: the userinfo,
    or the query value of the same key at the same position among that key's values."""
    new, old = split_secret_parts(sent), split_secret_parts(stored)
    if new is None or old is None:
        return sent
    userinfo = old.userinfo if new.userinfo == MASK and old.userinfo is not None else new.userinfo
    stored_values: dict[str | None, list[str]] = {}
    for key, value in old.query:
        stored_values.setdefault(key, []).append(value)
    seen: dict[str | None, int] = {}
    query: list[tuple[str | None, str]] = []
    for key, value in new.query:
        index = seen.get(key, 0)
        seen[key] = index + 1
        candidates = stored_values.get(key, [])
        if value == MASK and index < len(candidates):
            value = candidates[index]
        query.append((key, value))
    return join_secret_parts(new._replace(userinfo=userinfo, query=query))
