"""``chat:messages:*``: the active branch, the tree, search and branch selection (seed 004 sections 5-6).
"""

from __future__ import annotations

from typing import Literal

from protocol.limits import Id, MessagesPageLimit, QueryText, SearchOffset, SearchPageLimit, Title
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
    "MessagesUpdateParams",
    "MessagesDeleteParams",
    "MessagesDeleteResult",
    "DeleteMode",
    "MessagesPageParams",
    "MessagesPage",
    "SearchPageParams",
    "SearchPage",
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


class MessagesUpdateParams(Struct, kw_only=True):
    """``chat:messages:update``: the user corrects the text of a finished assistant reply."""

    session_id: Id
    message_id: Id
    """An assistant message of the session that is not being generated or paused."""
    content: str
    """The new text; the reply's thinking, tool calls and images stay as they are."""


DeleteMode = Literal["message", "branch"]
"""``message``: only that message (its children move up to its parent; a root user message
takes the replies below it, down to the next user messages, so no branch starts with a
reply); ``branch``: the message and everything below it."""


class MessagesDeleteParams(Struct, kw_only=True):
    """``chat:messages:delete``: remove one message, or a message with its subtree."""

    session_id: Id
    message_id: Id
    """A message of the session (any role, any status: a streaming or paused reply it
    reaches is stopped first)."""
    mode: DeleteMode


class MessagesDeleteResult(Struct, omit_defaults=False, kw_only=True):
    success: bool
    deleted: int
    """How many messages were removed."""
    active_leaf_id: str | None = None
    """The session's active leaf after the delete (None: the session has no messages left)."""


class MessagesPageParams(Struct, kw_only=True):
    """``chat:messages:page``: ``chat:messages:get`` one page at a time."""

    session_id: Id
    options: MessageQueryOptions | None = None
    """As for chat:messages:get; ``limit`` defaults to 100 here."""
    cursor: Title | None = None
    """``nextCursor`` of the previous page (the next, older page); takes the place of
    ``options.before``."""


class MessagesPage(Struct, omit_defaults=False, kw_only=True):
    items: list[MessageV2]
    """Root side first, as chat:messages:get."""
    has_more: bool
    """Older messages exist before ``items``."""
    next_cursor: str | None = None
    """Pass as ``cursor`` for the older page; None when there is none."""


class SearchPageParams(Struct, kw_only=True):
    """``chat:messages:searchPage``: ``chat:messages:search`` one page at a time."""

    query: QueryText
    options: SearchOptions | None = None
    cursor: Title | None = None
    """``nextCursor`` of the previous page; takes the place of ``options.offset``."""


class SearchPage(Struct, omit_defaults=False, kw_only=True):
    items: list[SearchResult]
    has_more: bool
    """More results follow ``items``."""
    next_cursor: str | None = None


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
    "chat:messages:update": MethodSpec(
        MessagesUpdateParams, MessageV2, "Correct the text of a finished assistant reply (marked edited)."
    ),
    "chat:messages:delete": MethodSpec(
        MessagesDeleteParams, MessagesDeleteResult,
        "Delete a message (its children move up) or a message with its subtree; stops a reply it reaches.",
    ),
    "chat:messages:page": MethodSpec(
        MessagesPageParams, MessagesPage, "chat:messages:get one page at a time, with hasMore and a cursor."
    ),
    "chat:messages:searchPage": MethodSpec(
        SearchPageParams, SearchPage, "chat:messages:search one page at a time, with hasMore and a cursor."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
