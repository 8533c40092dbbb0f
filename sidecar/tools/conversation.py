"""``search_conversations``: full-text search over the stored messages (seed 000 section 3,
item 3: references to recent chats), through the store's own search (Chinese and English)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from protocol.messages import SearchOptions
from protocol.types import SearchResult
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj

__all__ = ["ConversationSearch"]

_TAG = re.compile(r"</?mark>")


class ConversationSearch(Tool):
    name = "search_conversations"
    description = (
        "Search the user's earlier conversations (all sessions) for words or phrases. Returns "
        "matching messages with their session title, role and date."
    )
    parameters = obj(
        {
            "query": {"type": "string", "minLength": 1, "maxLength": 500},
            "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            "current_session_only": {"type": "boolean"},
        },
        ["query"],
    )
    source = "conversation"

    def __init__(self, search: Callable[[str, SearchOptions], Awaitable[list[SearchResult]]]) -> None:
        self._search = search

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        query = args["query"].strip()
        if not query:
            raise ToolError("query is empty")
        options = SearchOptions(
            limit=int(args.get("limit", 8)),
            session_id=ctx.session.id if args.get("current_session_only") else None,
        )
        hits = await self._search(query, options)
        if not hits:
            return ToolOutput(text=f"no messages match {query!r}")
        import datetime as dt
        import html

        lines = []
        for h in hits:
            when = dt.datetime.fromtimestamp(h.created_at / 1000).strftime("%Y-%m-%d")
            snippet = html.unescape(_TAG.sub("", h.snippet))
            lines.append(f"- [{when}] {h.session_title!r} ({h.role}): {snippet}")
        return ToolOutput(text="\n".join(lines))
