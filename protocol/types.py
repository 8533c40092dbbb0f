"""Stored shapes: SessionV2, MessageV2, ContentPart, ToolCall, Usage and friends.

Mirrors seed 004 sections 3 and 5. Columns of ``sessions_v2``/``messages_v2`` map
one-to-one onto fields here (snake_case column -> camelCase wire name); JSON
columns (tags, parts, tool_calls, usage, acp_parts, channel_meta, delivery) are decoded
into typed values. Timestamps are integer milliseconds since the epoch.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

import msgspec

from protocol.limits import Id, Int64, JsonList, JsonObject, JsonValue, Title

__all__ = [
    "Struct",
    "TextPart",
    "ImagePart",
    "UsageTotals",
    "FilePart",
    "CodePart",
    "ToolUsePart",
    "ToolResultPart",
    "ThinkingPart",
    "StepStartPart",
    "StepFinishPart",
    "DiffPart",
    "ContentPart",
    "ToolCall",
    "Usage",
    "SessionMode",
    "MessageRole",
    "MessageStatus",
    "ContentType",
    "SessionV2",
    "MessageV2",
    "MessageTreeNode",
    "SearchResult",
    "DateRange",
    "SessionExport",
    "DeliveryStatus",
    "MessageDelivery",
    "RetrievalMode",
    "Citation",
    "MAX_CITATIONS",
    "MAX_CITATION_TEXT_CHARS",
    "SummarySource",
]


class Struct(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=False):
    """Base of every wire type: camelCase names, keyword-only, and every field written, a
    default too (a reader never has to know a default: what the sidecar sends is whole).
    A field whose default is ``msgspec.UNSET`` (an update's "keep") is still left out."""


class _Part(Struct, tag_field="type", kw_only=True):
    """Base of the ContentPart union (tagged by ``type``)."""


class TextPart(_Part, tag="text", kw_only=True):
    text: str


class ImagePart(_Part, tag="image", kw_only=True):
    mime_type: str
    url: str | None = None
    """http(s) URL or ``file://`` URI of a stored copy in the data dir."""
    base64: str | None = None


class FilePart(_Part, tag="file", kw_only=True):
    uri: str
    mime_type: str | None = None
    name: str | None = None


class CodePart(_Part, tag="code", kw_only=True):
    language: str
    code: str


class ToolUsePart(_Part, tag="tool_use", kw_only=True):
    id: str
    name: str
    input: JsonObject


class ToolResultPart(_Part, tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str
    is_error: bool = False


class ThinkingPart(_Part, tag="thinking", kw_only=True):
    text: str
    signature: str | None = None
    """Anthropic's signature of this thinking block, needed to send the block back
    when a tool-use turn continues; absent for other providers."""


class StepStartPart(_Part, tag="step_start", kw_only=True):
    step_id: str
    title: str | None = None


class StepFinishPart(_Part, tag="step_finish", kw_only=True):
    step_id: str
    result: JsonValue = None


class DiffPart(_Part, tag="diff", kw_only=True):
    file_path: str
    hunks: JsonList


ContentPart = Union[
    TextPart,
    ImagePart,
    FilePart,
    CodePart,
    ToolUsePart,
    ToolResultPart,
    ThinkingPart,
    StepStartPart,
    StepFinishPart,
    DiffPart,
]


class ToolCall(Struct, kw_only=True):
    """A tool call issued by the assistant; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str


class Usage(Struct, kw_only=True):
    """Token counts of one reply (seed: inputTokens/outputTokens; the rest where given)."""

    input_tokens: Int64 = 0
    output_tokens: Int64 = 0
    cache_read_tokens: Int64 | None = None
    cache_write_tokens: Int64 | None = None
    reasoning_tokens: Int64 | None = None
    context_used: Int64 | None = None
    """Tokens in the context window at the end of the reply (ACP ``usage_update.used``)."""
    context_size: Int64 | None = None
    """The context window in tokens (ACP ``usage_update.size``)."""


class UsageTotals(Struct, omit_defaults=False, kw_only=True):
    """Usage and cost of one kind of model call in a session, summed."""

    input_tokens: Int64 = 0
    """Every prompt token, cached ones included."""
    output_tokens: Int64 = 0
    cache_read_tokens: Int64 = 0
    cache_write_tokens: Int64 = 0
    reasoning_tokens: Int64 = 0
    cost: float = 0.0
    """USD, from the model's prices (cached tokens at their own prices)."""
    calls: Int64 = 0
    """Replies (or side calls) counted."""


SessionMode = Literal["direct", "acp", "server", "remote"]
"""``direct``: the sidecar calls the model; ``acp``: an agent engine subprocess runs the turn;
``server``: the turn is forwarded to the Qiming server the session is linked to; ``remote``:
the turn goes to another agent service's V1 API (a channel's ``remote-agent`` route; such
sessions are made by channels only)."""
MessageRole = Literal["system", "user", "assistant", "tool"]
MessageStatus = Literal["pending", "streaming", "completed", "error", "aborted", "paused"]
"""``paused``: the reply waits for a tool-call approval (``chat:tool:approve``); it is not
final, survives a restart (crash recovery only touches pending/streaming rows) and resumes
when no call of it is pending, or ends ``aborted`` when a newer send supersedes it."""
FinalMessageStatus = Literal["completed", "error", "aborted"]
"""The statuses a message ends in: after one it no longer changes (and it is in the search
index). Every other status (pending, streaming, paused) is a reply still in flight."""
FINAL_MESSAGE_STATUSES: frozenset[FinalMessageStatus] = frozenset(get_args(FinalMessageStatus))
"""``FinalMessageStatus`` as a set: ``status in FINAL_MESSAGE_STATUSES`` also narrows a str."""
ContentType = Literal["text", "multipart"]
SummarySource = Literal["user", "ai"]
"""Who wrote a session's ``summary``: the user (``chat:session:update``, an import) or the
sidecar (``chat:session:summarize``, the automatic summary)."""


class SessionV2(Struct, omit_defaults=False, kw_only=True):
    """One row of ``sessions_v2`` (seed 004 section 3.1) plus its active leaf."""

    id: Id
    title: Title = "New Chat"
    summary: str | None = None
    summary_source: SummarySource | None = None
    """Who wrote ``summary``; the automatic summary never replaces one that is not ``ai``'s."""
    provider_id: Id
    model_id: Id
    system_prompt: str | None = None
    mode: SessionMode = "direct"
    acp_session_id: str | None = None
    tags: list[str] = []
    folder: Title | None = None
    is_pinned: bool = False
    is_archived: bool = False
    message_count: Int64 = 0
    total_tokens: Int64 = 0
    total_cost: float = 0.0
    channel_id: Id | None = None
    channel_meta: JsonObject | None = None
    created_at: Int64
    updated_at: Int64
    last_message_at: Int64 | None = None
    active_leaf_id: Id | None = None
    """The leaf of the active branch (root -> leaf is what the renderer shows)."""
    workspace_dir: str | None = None
    """Absolute path of the session's working directory: workspace tools (direct mode) are
    confined to it and an ACP engine gets it as ``cwd``. None: no workspace."""
    usage_by_kind: dict[str, UsageTotals] = {}
    """What ``totalTokens``/``totalCost`` add up, per kind of call: ``reply`` (every reply,
    whatever its ending: completed, error, aborted), and side calls ``side:<what>``
    (``side:title``, ``side:summary``, ``side:ocr``, ``side:suggestions``,
    ``side:memory-encoder``, ``side:embedding``: the query embeddings of the session's
    retrieval; other features add their own)."""


DeliveryStatus = Literal["pending", "sending", "delivered", "failed"]
"""Of an IM reply: ``pending`` (the reply is not finished, e.g. it waits for a tool approval,
or waits for the rate limit), ``sending`` (sent, not all acknowledged yet), ``delivered``
(every delivery acknowledged), ``failed`` (a delivery failed after its retries)."""


class MessageDelivery(Struct, omit_defaults=False, kw_only=True):
    """How a reply to an IM message (``channel:message``) is being delivered by the host."""

    channel: str
    chat_id: str
    status: DeliveryStatus
    deliveries: int = 0
    """``channel:reply`` notifications of this reply so far."""
    delivered: int = 0
    failed: int = 0
    error: str | None = None
    """The last delivery error (the host's, or a missing acknowledgement)."""
    updated_at: int


RetrievalMode = Literal["hybrid", "lexical"]
"""How a knowledge chunk was found: both legs (vectors and full text) or full text only."""

MAX_CITATIONS = 999
"""Markers of one reply run 1..MAX_CITATIONS (and so do its citations)."""
MAX_CITATION_TEXT_CHARS = 100_000
"""A citation's text snapshot is at most this long (a chunk is far shorter)."""


class Citation(Struct, omit_defaults=False, kw_only=True):
    """One source of an assistant reply: a marker ``[n]`` the model saw next to a knowledge
    chunk that this reply's request retrieved (or an executed ``knowledge_search``
    returned), with a snapshot of that chunk as it was sent; or (``dangling``) a marker the
    reply wrote that points at no sent chunk (the chunk fields are then null).

    ``documentDeleted`` / ``documentChanged`` are computed when the message is read: the
    document (or its base) is gone, or the document was re-indexed and the cited chunk (its
    text under its heading path) is no longer in it. While the chunk is there, ``start``,
    ``end`` and ``page`` are where it is now (text inserted before it moves it); the rest
    is the snapshot, which stays readable either way."""

    message_id: Id | None = None
    """The assistant message it belongs to."""
    marker: Annotated[int, msgspec.Meta(ge=1, le=MAX_CITATIONS)]
    chunk_id: Title | None = None
    """Content-addressed: ``{documentId}:{hash of the heading path and the normalized text}``
    (``.2``, ``.3``... for repeats under the same heading path)."""
    kb_id: Id | None = None
    document_id: Id | None = None
    document_name: Title | None = None
    heading: Annotated[list[Title], msgspec.Meta(max_length=64)] = []
    """The chunk's heading path (Markdown/HTML headings above it)."""
    start: Int64 | None = None
    """Offsets in Unicode code points of the document's extracted text (its current text
    while the chunk is in it)."""
    end: Int64 | None = None
    page: Int64 | None = None
    """PDF page (1-based)."""
    score: float = 0.0
    """The fused retrieval score the chunk was chosen with."""
    mode: RetrievalMode = "lexical"
    text: Annotated[str, msgspec.Meta(max_length=MAX_CITATION_TEXT_CHARS)] = ""
    """The chunk text as it was sent."""
    document_deleted: bool = False
    document_changed: bool = False
    dangling: bool = False


class MessageV2(Struct, omit_defaults=False, kw_only=True):
    """One row of ``messages_v2`` (seed 004 section 3.2).

    ``seq`` is the last stream event number of a message that is streaming or
    was streamed, so a reloaded renderer can resync.
    """

    id: Id
    session_id: Id
    parent_id: Id | None = None
    role: MessageRole
    content_type: ContentType = "text"
    text_content: str | None = None
    parts: list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    model_id: str | None = None
    usage: Usage | None = None
    latency_ms: Int64 | None = None
    acp_message_id: str | None = None
    acp_parts: JsonList | None = None
    status: MessageStatus = "completed"
    error: str | None = None
    created_at: Int64
    updated_at: Int64
    seq: Int64 | None = None
    delivery: MessageDelivery | None = None
    """Set on an assistant reply to an IM message: its delivery to the chat."""
    citations: Annotated[list[Citation], msgspec.Meta(max_length=MAX_CITATIONS)] | None = None
    """An assistant reply's sources, in marker order (table ``message_citations``); null
    when it has none."""
    suggestions: list[str] | None = None
    """Follow-up questions proposed after the reply (settings ``generateSuggestions``)."""
    edited_at: Int64 | None = None
    """When the user corrected this reply's text (``chat:messages:update``); None: never."""


class MessageTreeNode(Struct, omit_defaults=False, kw_only=True):
    """A message and its children (siblings in creation order)."""

    message: MessageV2
    children: list[MessageTreeNode] = []
    is_active: bool = False
    """True when the message lies on the session's active path."""


class SearchResult(Struct, omit_defaults=False, kw_only=True):
    session_id: str
    session_title: str
    message_id: str
    role: MessageRole
    snippet: str
    """Matched text with hits wrapped in ``<mark>``…``</mark>``; other text is HTML-escaped."""
    created_at: Int64
    score: float
    """Relevance (higher is better)."""


class DateRange(Struct, kw_only=True):
    from_: Int64 = msgspec.field(name="from")
    to: Int64


class SessionExport(Struct, omit_defaults=False, kw_only=True):
    """A whole session with every branch, as one JSON document."""

    format: Literal["chat-sidecar.session"] = "chat-sidecar.session"
    version: Int64 = 1
    session: SessionV2
    messages: list[MessageV2]
