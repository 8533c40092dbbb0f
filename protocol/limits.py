"""Bounds of the wire contract: the int64 range, string lengths, page sizes, JSON nesting depth.

The one definition of the constrained types the domain modules annotate their fields with.
msgspec checks them while it decodes params, so a value out of bounds is INVALID_PARAMS
whose message names the field (``Expected `int` <= 500 - at `$.limit```), and they appear
in the generated JSON Schema (``minimum``/``maximum``/``maxLength``), so the Electron side
sees the same numbers. README's "Limits" section lists them.

Why these bounds: every integer ends up in an SQLite INTEGER (64-bit signed), so a value
outside int64 can never be stored; ids, titles and searches are short by nature, and a
search or query longer than its maximum is a mistake of the caller, not something to hand
to SQLite's LIKE or FTS5 (whose own limits would fail as database errors).

The nesting depth of free-form JSON (``Json*`` below, and any other ``Any``) cannot be
written as a msgspec constraint: ``sidecar/rpc`` enforces MAX_JSON_DEPTH on every such
field of every params type while decoding, and the schema carries it as ``x-maxDepth``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

__all__ = [
    "INT64_MIN",
    "INT64_MAX",
    "MAX_JSON_DEPTH",
    "MAX_ID_CHARS",
    "MAX_TITLE_CHARS",
    "MAX_SEARCH_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_OFFSET",
    "MAX_SEARCH_OFFSET",
    "MAX_SESSION_PAGE",
    "MAX_SEARCH_PAGE",
    "MAX_AUDIT_PAGE",
    "MAX_MESSAGES_PAGE",
    "MAX_BATCH_ITEMS",
    "MAX_BATCH_ANSWER_BYTES",
    "Int64",
    "Id",
    "Title",
    "SearchText",
    "QueryText",
    "Offset",
    "SearchOffset",
    "SessionPageLimit",
    "SearchPageLimit",
    "AuditPageLimit",
    "MessagesPageLimit",
    "JsonValue",
    "JsonObject",
    "JsonList",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

MAX_JSON_DEPTH = 64
"""Levels of nesting a free-form JSON value may have (``{"a": {"b": 1}}`` has 2)."""
MAX_ID_CHARS = 256
"""Ids and names used as keys: sessions, messages, providers, models, tools, MCP servers."""
MAX_TITLE_CHARS = 1000
"""Titles and display names (sessions, providers, assistants, folders), and tool policy keys
(``mcp:<server>`` is longer than the server's name)."""
MAX_SEARCH_CHARS = 1000
"""``chat:session:list`` ``search`` (a substring of titles and summaries)."""
MAX_QUERY_CHARS = 1000
"""``chat:messages:search`` ``query`` (full-text search: every word and CJK bigram of it is
one more FTS5 term, so a longer query costs more than it can find)."""
MAX_OFFSET = 10_000_000
"""Offsets of paged lists (sessions, audit entries)."""
MAX_SEARCH_OFFSET = 100_000
"""Offset of full-text search results (every result up to it is ranked first)."""
MAX_SESSION_PAGE = 500
MAX_SEARCH_PAGE = 200
MAX_AUDIT_PAGE = 1000
MAX_MESSAGES_PAGE = 10_000
MAX_BATCH_ITEMS = 1000
"""Messages one batch line may hold; more is INVALID_REQUEST for the whole line."""
MAX_BATCH_ANSWER_BYTES = 16 * 1024 * 1024
"""The encoded answer to one batch: a reply that would make it larger is RESPONSE_TOO_LARGE."""

_DEPTH_SCHEMA = {"x-maxDepth": MAX_JSON_DEPTH}

Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Id = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]
Title = Annotated[str, msgspec.Meta(max_length=MAX_TITLE_CHARS)]
SearchText = Annotated[str, msgspec.Meta(max_length=MAX_SEARCH_CHARS)]
QueryText = Annotated[str, msgspec.Meta(max_length=MAX_QUERY_CHARS)]
Offset = Annotated[int, msgspec.Meta(ge=0, le=MAX_OFFSET)]
SearchOffset = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEARCH_OFFSET)]
SessionPageLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_SESSION_PAGE)]
SearchPageLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_SEARCH_PAGE)]
AuditPageLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_AUDIT_PAGE)]
MessagesPageLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_MESSAGES_PAGE)]
JsonValue = Annotated[Any, msgspec.Meta(extra_json_schema=_DEPTH_SCHEMA)]
"""Any JSON value, at most MAX_JSON_DEPTH levels deep."""
JsonObject = Annotated[dict[str, Any], msgspec.Meta(extra_json_schema=_DEPTH_SCHEMA)]
"""A JSON object of free-form content, at most MAX_JSON_DEPTH levels deep (itself included)."""
JsonList = Annotated[list[Any], msgspec.Meta(extra_json_schema=_DEPTH_SCHEMA)]
"""A JSON array of free-form content, at most MAX_JSON_DEPTH levels deep (itself included)."""
