"""``memory:*`` and ``assistant:soul:*``: long-term memories, proposals of the MemoryEncoder,
and the versions of an assistant's Soul.md.

A memory is one remembered item (a fact, a preference, the outcome of a task...) in a
scope: ``global`` (every assistant sees it) or an assistant's id (only that assistant's
requests see it). Memories are never edited in place: ``memory:update`` writes a new
version that supersedes the old one (``supersededBy`` / ``supersedes`` link the history),
``memory:delete`` hides a memory (``memory:restore`` brings it back) and ``memory:purge``
removes it and its whole history for real.

A memory's text is data. Text that closes a tag or reads like an instruction to a model
is stored as written but flagged (``flags``), and every rendering of a memory to a model
escapes it inside its own element.

The MemoryEncoder (per assistant: ``memory.encoder`` = ``off`` | ``propose`` | ``auto``)
reads a completed exchange in the background; in ``propose`` mode it sends the
``memory_proposed`` notification, answered with ``memory:accept`` (optionally edited) or
``memory:reject``; ``memory:proposal:list`` lists the proposals still open.

Soul.md (seed 004 section 4.1, the self-evolving context) is stored in the database, one
row per version: ``assistant:soul:set`` and ``assistant:soul:revert`` add a version, none
is ever overwritten. ``id`` is an assistant's id, or ``global`` for the Soul.md every
assistant without its own uses.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from protocol.common import IdParams, MethodSpec, SuccessResult
from protocol.limits import Id, Int64, Offset, QueryText
from protocol.types import Struct

__all__ = [
    "GLOBAL_SCOPE",
    "MAX_MEMORY_CHARS",
    "MAX_MEMORY_DETAIL_CHARS",
    "MAX_SOUL_BYTES",
    "MemoryKind",
    "MemorySourceKind",
    "MemoryFlag",
    "MemoryStatus",
    "MemorySource",
    "Memory",
    "MemoryListParams",
    "MemoryListResult",
    "MemoryGetParams",
    "MemoryDetail",
    "MemoryCreateParams",
    "MemoryUpdateParams",
    "MemorySearchParams",
    "MemoryHit",
    "MemorySearchMode",
    "MemorySearchResult",
    "ProposalAction",
    "ProposalStatus",
    "AcceptAction",
    "MemoryProposal",
    "MemoryProposalListParams",
    "MemoryAcceptParams",
    "MemoryAcceptResult",
    "SoulSource",
    "AssistantSoul",
    "SoulVersion",
    "SoulGetParams",
    "SoulSetParams",
    "SoulHistoryParams",
    "SoulRevertParams",
]

GLOBAL_SCOPE = "global"
"""The scope every assistant sees (an assistant may not have this id)."""
MAX_MEMORY_CHARS = 2000
"""A memory's ``text``."""
MAX_MEMORY_DETAIL_CHARS = 4000
"""Each of ``task``, ``outcome`` and ``context``."""
MAX_SOUL_BYTES = 16 * 1024
"""A Soul.md version, in UTF-8 bytes (about 4,000 tokens; counted in the context budget)."""

MemoryKind = Literal["fact", "preference", "task-outcome", "instruction-from-user", "event", "note"]
"""``fact``: something true about the user or their world; ``preference``: how they like
things; ``task-outcome``: what a piece of work came to (with task / outcome / context);
``instruction-from-user``: a standing request the user made ("answer in metric units");
``event``: something that happened; ``note``: anything else."""
MemorySourceKind = Literal["manual", "tool", "encoder"]
"""``manual``: ``memory:create`` / ``memory:update`` / an accepted proposal edited by the
user; ``tool``: a memory tool the model called; ``encoder``: the MemoryEncoder."""
MemoryFlag = Literal["markup", "instruction-like", "role-marker"]
"""Why a memory's text is suspicious (it is escaped whatever its flags): ``markup``: it
holds tag-like text (``</memories>``, ``<system>``); ``instruction-like``: it reads like an
instruction to a model ("ignore previous instructions"); ``role-marker``: a line starts
like a chat role or template token (``system:``, ``<|im_start|>``, ``[INST]``)."""
MemoryStatus = Literal["active", "superseded", "deleted"]

MemoryText = Annotated[str, msgspec.Meta(max_length=MAX_MEMORY_CHARS)]
MemoryDetailText = Annotated[str, msgspec.Meta(max_length=MAX_MEMORY_DETAIL_CHARS)]
MemoryKey = Annotated[str, msgspec.Meta(max_length=200)]
MemoryPageLimit = Annotated[int, msgspec.Meta(ge=1, le=500)]
MemorySearchLimit = Annotated[int, msgspec.Meta(ge=1, le=50)]
SoulPageLimit = Annotated[int, msgspec.Meta(ge=1, le=200)]
SoulVersionNumber = Annotated[int, msgspec.Meta(ge=1, le=2**62)]


class MemorySource(Struct, omit_defaults=False, kw_only=True):
    kind: MemorySourceKind
    session_id: str | None = None
    """The session it came from (tool, encoder)."""
    message_id: str | None = None
    """The assistant message whose reply made it (tool: the reply that called the tool;
    encoder: the reply it read)."""
    tool_call_id: str | None = None


class Memory(Struct, omit_defaults=False, kw_only=True):
    id: str
    scope: str
    """``global`` or an assistant's id."""
    kind: MemoryKind
    text: str
    task: str | None = None
    outcome: str | None = None
    context: str | None = None
    key: str | None = None
    """A short topic key (``user.home_city``): a newer memory with the same key in the same
    scope supersedes the older one (the encoder uses it so contradictions never pile up)."""
    source: MemorySource
    flags: list[MemoryFlag] = []
    status: MemoryStatus = "active"
    supersedes: str | None = None
    """The previous version (this one replaced it)."""
    superseded_by: str | None = None
    """The next version (it replaced this one)."""
    deleted_at: Int64 | None = None
    use_count: Int64 = 0
    """How many requests it was put into."""
    last_used_at: Int64 | None = None
    embedding_models: list[str] = []
    """The models (``providerId/modelId``) it has a vector of."""
    tokens: Int64 = 0
    created_at: Int64
    updated_at: Int64


class MemoryListParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``memory:list``: newest first."""

    scope: Id | None = None
    """Only this scope (``global`` or an assistant id)."""
    assistant_id: Id | None = None
    """Only what this assistant sees: its own scope and ``global``."""
    kind: MemoryKind | None = None
    query: QueryText | None = None
    """Full-text search (Chinese and English, as message search)."""
    status: MemoryStatus | Literal["all"] = "active"
    limit: MemoryPageLimit = 50
    offset: Offset = 0


class MemoryListResult(Struct, omit_defaults=False, kw_only=True):
    memories: list[Memory]
    total: Int64


class MemoryGetParams(Struct, forbid_unknown_fields=True, kw_only=True):
    id: Id


class MemoryDetail(Struct, omit_defaults=False, kw_only=True):
    memory: Memory
    versions: list[Memory]
    """Every version of it, oldest first (``memory`` is one of them)."""


class MemoryCreateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``memory:create``: a manual memory."""

    text: MemoryText
    scope: Id = GLOBAL_SCOPE
    kind: MemoryKind = "fact"
    task: MemoryDetailText | None = None
    outcome: MemoryDetailText | None = None
    context: MemoryDetailText | None = None
    key: MemoryKey | None = None


class MemoryUpdateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``memory:update``: a new version of an active memory (the fields given change, the
    others are copied); the old one stays in its history, superseded."""

    id: Id
    text: MemoryText | None = None
    kind: MemoryKind | None = None
    task: MemoryDetailText | None = None
    outcome: MemoryDetailText | None = None
    context: MemoryDetailText | None = None
    key: MemoryKey | None = None


class MemorySearchParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``memory:search``: exactly the retrieval a request of that assistant uses."""

    query: QueryText
    assistant_id: Id | None = None
    """Whose view (its scope and ``global``); default: the default assistant."""
    limit: MemorySearchLimit = 6


class MemoryHit(Struct, omit_defaults=False, kw_only=True):
    memory: Memory
    score: float
    """The fused (reciprocal-rank) score."""
    lexical_rank: int | None = None
    vector_rank: int | None = None
    cosine: float | None = None


MemorySearchMode = Literal["hybrid", "lexical"]
"""``lexical``: no vectors could be used for the search (its notes say why)."""


class MemorySearchResult(Struct, omit_defaults=False, kw_only=True):
    mode: MemorySearchMode
    hits: list[MemoryHit]
    notes: list[str] = []


ProposalAction = Literal["create", "supersede"]


ProposalStatus = Literal["pending", "accepted", "rejected"]
"""A proposal waits (``pending``) until the user accepts or rejects it."""


class MemoryProposal(Struct, omit_defaults=False, kw_only=True):
    """What the encoder would remember (``memory_proposed``; ``memory:proposal:list``)."""

    id: str
    session_id: str
    message_id: str
    """The reply it was read from."""
    assistant_id: str
    scope: str
    kind: MemoryKind
    text: str
    task: str | None = None
    outcome: str | None = None
    context: str | None = None
    key: str | None = None
    action: ProposalAction
    supersedes: str | None = None
    """``supersede``: the memory it would replace."""
    supersedes_text: str | None = None
    reason: str = ""
    flags: list[MemoryFlag] = []
    status: ProposalStatus = "pending"
    created_at: Int64


class MemoryProposalListParams(Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: Id | None = None
    limit: MemoryPageLimit = 100


class MemoryAcceptParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``memory:accept``: store a proposal, with the user's edits of the fields given."""

    id: Id
    """The proposal's id."""
    text: MemoryText | None = None
    kind: MemoryKind | None = None
    scope: Id | None = None
    task: MemoryDetailText | None = None
    outcome: MemoryDetailText | None = None
    context: MemoryDetailText | None = None


AcceptAction = Literal["created", "superseded", "duplicate"]
"""What accepting a proposal did; ``duplicate``: an equal memory existed already."""


class MemoryAcceptResult(Struct, omit_defaults=False, kw_only=True):
    memory: Memory
    action: AcceptAction
    """``duplicate``: an equal memory existed already (``memory`` is that one)."""


SoulSource = Literal["user", "tool", "revert", "import"]
"""Who wrote a version: ``assistant:soul:set``, the ``soul_update`` tool (approved),
``assistant:soul:revert``, or the import of a Soul.md file of an older version."""


class AssistantSoul(Struct, omit_defaults=False, kw_only=True):
    assistant_id: str
    """The id asked for (an assistant id or ``global``)."""
    content: str
    """What requests of this assistant get (its own Soul.md, else the global one)."""
    version: Int64
    """Its own current version (0: none yet)."""
    inherited: bool = False
    """``content`` is the global Soul.md (the assistant has none of its own)."""
    source: SoulSource | None = None
    updated_at: Int64 | None = None
    bytes: Int64 = 0
    tokens: Int64 = 0
    """Estimated tokens of ``content`` in a request's system prompt."""
    max_bytes: Int64 = MAX_SOUL_BYTES


class SoulVersion(Struct, omit_defaults=False, kw_only=True):
    version: Int64
    content: str
    bytes: Int64
    source: SoulSource
    reason: str | None = None
    session_id: str | None = None
    message_id: str | None = None
    reverted_from: Int64 | None = None
    created_at: Int64


class SoulGetParams(Struct, forbid_unknown_fields=True, kw_only=True):
    id: Id


class SoulSetParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """A new version; ``""`` clears it (an assistant then inherits the global Soul.md)."""

    id: Id
    content: str
    reason: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


class SoulHistoryParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """Newest first."""

    id: Id
    limit: SoulPageLimit = 50
    offset: Offset = 0


class SoulRevertParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """A new version with the content of ``version`` (the versions after it stay)."""

    id: Id
    version: SoulVersionNumber


METHODS: dict[str, MethodSpec] = {
    "memory:list": MethodSpec(MemoryListParams, MemoryListResult, "Memories by scope, kind, text; paged."),
    "memory:get": MethodSpec(MemoryGetParams, MemoryDetail, "One memory with every version of it."),
    "memory:create": MethodSpec(MemoryCreateParams, Memory, "Remember something (a manual memory)."),
    "memory:update": MethodSpec(
        MemoryUpdateParams, Memory, "A new version of a memory; the old one stays in its history."
    ),
    "memory:delete": MethodSpec(IdParams, Memory, "Hide a memory from every request (memory:restore undoes it)."),
    "memory:restore": MethodSpec(IdParams, Memory, "Bring a deleted memory back."),
    "memory:purge": MethodSpec(IdParams, SuccessResult, "Remove a memory and its whole history for real."),
    "memory:search": MethodSpec(MemorySearchParams, MemorySearchResult, "Search memories as a request does."),
    "memory:proposal:list": MethodSpec(
        MemoryProposalListParams, list[MemoryProposal], "Proposals of the MemoryEncoder still waiting for an answer."
    ),
    "memory:accept": MethodSpec(MemoryAcceptParams, MemoryAcceptResult, "Store a proposal (optionally edited)."),
    "memory:reject": MethodSpec(IdParams, SuccessResult, "Drop a proposal."),
    "assistant:soul:get": MethodSpec(SoulGetParams, AssistantSoul, "An assistant's Soul.md as requests get it."),
    "assistant:soul:set": MethodSpec(SoulSetParams, AssistantSoul, "A new version of an assistant's Soul.md."),
    "assistant:soul:history": MethodSpec(SoulHistoryParams, list[SoulVersion], "Every version of a Soul.md."),
    "assistant:soul:revert": MethodSpec(
        SoulRevertParams, AssistantSoul, "A new version with the content of an earlier one."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
