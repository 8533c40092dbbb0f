"""``chat:messages:*``: the active branch, the tree, search and branch selection (seed 004 sections 5-6).
"""

from __future__ import annotations

from typing import Any

from protocol.limits import Id, MessagesPageLimit, QueryText, SearchOffset, SearchPageLimit
from protocol.types import DateRange, MessageRole, Struct
from protocol.types import MessageTreeNode, MessageV2, SearchResult
from protocol.common import MethodSpec

__all__ = [
    "MessageQueryOptions",
    "SearchOptions",
    "MessagesGetParams",
    "MessagesTreeParams",
    "MessagesSearchParams",
    "MessagesSelectParams",
]


class MessageQueryOptions(Struct, kw_only=True):
    """Options of ``chat:messages:get``."""

    leaf_id: Id | None = None
    """Return the path root -> this message instead of the active branch."""
    limit: MessagesPageLimit | None = None
    """At most this many messages (the newest ones of the path), 1..10000."""
    before: Id | None = None
    """Page backwards: only messages of the path that come before this message id."""
    all_branches: bool = False
    """Every message of the session in creation order (ignores leafId)."""
    include_acp_parts: bool = False
    """Also return ``acpParts`` (an ACP reply's raw ``session/update`` log, verbatim: large);
    without it ``acpParts`` is null."""


class SearchOptions(Struct, kw_only=True):
    """Options of ``chat:messages:search``."""

    session_id: Id | None = None
    role: MessageRole | None = None
    date_range: DateRange | None = None
    include_archived: bool = True
    """False leaves out messages of archived sessions."""
    limit: SearchPageLimit = 20
    """1..200."""
    offset: SearchOffset = 0


class MessagesGetParams(Struct, kw_only=True):
    session_id: Id
    options: MessageQueryOptions | None = None


class MessagesTreeParams(Struct, kw_only=True):
    session_id: Id


class MessagesSearchParams(Struct, kw_only=True):
    query: QueryText
    options: SearchOptions | None = None


class MessagesSelectParams(Struct, kw_only=True):
    session_id: Id
    leaf_id: Id
    """Any message of the session; the active branch becomes root -> the newest leaf below it."""


METHODS: dict[str, MethodSpec] = {
    "chat:messages:get": MethodSpec(
        MessagesGetParams, list[MessageV2], "Messages of the active branch (or another leaf, a page, all)."
    ),
    "chat:messages:tree": MethodSpec(
        MessagesTreeParams, list[MessageTreeNode], "The whole message tree, active path marked."
    ),
    "chat:messages:search": MethodSpec(
        MessagesSearchParams, list[SearchResult], "Full-text search over messages (Chinese and English)."
    ),
    "chat:messages:select": MethodSpec(
        MessagesSelectParams, list[MessageV2], "Switch the active branch; returns the new active path."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
