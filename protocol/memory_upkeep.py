"""Memory upkeep: consolidation, expiry, statistics, export and import (``memory:consolidate``,
``memory:stats``, ``memory:export``, ``memory:import``, ``memory:consolidation:*``,
``memory:settings:*``).

Consolidation reads the active memories of a scope, groups the ones that look alike (near
duplicates, or statements about the same thing that may contradict each other) and asks the
model which of them say one thing; such a group becomes one version chain: each of them,
oldest first, superseded by the next, and the last by a new version with the merged text
(history kept: ``memory:get`` on any of them shows the chain). In ``propose`` mode each
merge is a ``memory_consolidation_proposed`` notification first, applied by
``memory:consolidation:accept`` (optionally with the text edited) or dropped by
``memory:consolidation:reject``.

Expiry (``expireAfterDays``; off by default) soft-deletes the memories the model wrote
(sources ``tool`` and ``encoder``, never ``manual`` ones) that no request used for that many
days and were used at most ``expireMaxUses`` times; ``memory:restore`` brings one back.

Export is JSON (every version, or only the active ones) or one readable Markdown file per
scope; import takes either back through the write rule of ``memory:create`` (duplicates are
skipped, a ``key`` an active memory has supersedes it).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocol.common import EmptyParams, IdParams, MethodSpec, SuccessResult
from protocol.limits import Id, Int64
from protocol.memory import Memory, MemoryKind
from protocol.providers import DefaultModel
from protocol.types import Struct

__all__ = [
    "ConsolidationMode",
    "MemoryUpkeepSettings",
    "MemoryUpkeepSettingsUpdate",
    "MemoryConsolidateParams",
    "MergeStatus",
    "MemoryMerge",
    "MemoryConsolidateResult",
    "MemoryConsolidationListParams",
    "MemoryConsolidationAcceptParams",
    "MemoryStatsParams",
    "MemoryScopeStats",
    "MemoryStatsResult",
    "MemoryExportFormat",
    "MemoryExportParams",
    "MemoryExportFile",
    "MemoryExportResult",
    "MemoryImportItem",
    "MemoryImportParams",
    "MemoryImportResult",
    "MAX_IMPORT_ITEMS",
    "MAX_IMPORT_CHARS",
]

MAX_IMPORT_ITEMS = 10_000
MAX_IMPORT_CHARS = 4 * 1024 * 1024

ConsolidationMode = Literal["propose", "auto"]
MemoryExportFormat = Literal["json", "markdown"]
Days = Annotated[int, msgspec.Meta(ge=1, le=36500)]
Uses = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
MergeText = Annotated[str, msgspec.Meta(max_length=2000)]
PageLimit = Annotated[int, msgspec.Meta(ge=1, le=500)]


class MemoryUpkeepSettings(Struct, omit_defaults=False, kw_only=True):
    expire_after_days: Days | None = None
    """Expire what no request used for this many days (None: never)."""
    expire_max_uses: Uses = 0
    """... and was used at most this many times."""
    consolidation_mode: ConsolidationMode = "propose"
    """What ``memory:consolidate`` (and a ``memory-consolidate`` task) does by default."""
    consolidation_model: DefaultModel | None = None
    """The model that judges the groups; default: the scope's assistant's encoder model, else
    the default provider and model."""


class MemoryUpkeepSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    """A field left out keeps its value; ``null`` resets it."""

    expire_after_days: Days | None | UnsetType = UNSET
    expire_max_uses: Uses | None | UnsetType = UNSET
    consolidation_mode: ConsolidationMode | None | UnsetType = UNSET
    consolidation_model: DefaultModel | None | UnsetType = UNSET


class MemoryConsolidateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """One scope (``global`` or an assistant's id), what one assistant sees (its scope and
    ``global``), or every scope when neither is given."""

    scope: Id | None = None
    assistant_id: Id | None = None
    mode: ConsolidationMode | None = None
    """Default: the settings' ``consolidationMode``."""


MergeStatus = Literal["pending", "accepted", "rejected", "applied"]
"""A consolidation merge: proposed (``pending``), decided by the host, or ``applied`` by an ``auto`` run."""


class MemoryMerge(Struct, omit_defaults=False, kw_only=True):
    """Memories of one scope that say one thing, and the text they become."""

    id: str
    scope: str
    memory_ids: list[str]
    """Oldest first: each is superseded by the next, the last by the merged version."""
    memories: list[Memory]
    text: str
    kind: MemoryKind
    reason: str = ""
    contradiction: bool = False
    """The model found them contradicting each other (the newest fact wins)."""
    status: MergeStatus
    """``applied``: written by an ``auto`` run; ``accepted``: a proposal the host accepted."""
    result_id: str | None = None
    """The active memory the chain ends in, once written."""
    created_at: Int64


class MemoryConsolidateResult(Struct, omit_defaults=False, kw_only=True):
    mode: ConsolidationMode
    scopes: list[str]
    examined: Int64
    """Active memories read."""
    groups: Int64
    """Groups of look-alikes shown to the model."""
    applied: list[MemoryMerge] = []
    proposed: list[MemoryMerge] = []
    expired: Int64 = 0
    """Memories the expiry policy deleted in this run."""
    notes: list[str] = []
    """What was skipped and why (a model answer that was not valid, a group that changed)."""


class MemoryConsolidationListParams(Struct, forbid_unknown_fields=True, kw_only=True):
    scope: Id | None = None
    limit: PageLimit = 100


class MemoryConsolidationAcceptParams(Struct, forbid_unknown_fields=True, kw_only=True):
    id: Id
    text: MergeText | None = None
    """The merged text as the user edited it."""


class MemoryStatsParams(Struct, forbid_unknown_fields=True, kw_only=True):
    scope: Id | None = None
    assistant_id: Id | None = None


class MemoryScopeStats(Struct, omit_defaults=False, kw_only=True):
    scope: str
    active: Int64
    superseded: Int64
    deleted: Int64
    never_used: Int64
    """Active memories no request used yet."""
    expirable: Int64
    """Active memories the expiry policy would delete now (0 while it is off)."""
    tokens: Int64
    """Tokens of the active memories."""
    by_kind: dict[str, int]
    """Active memories per kind."""
    oldest_at: Int64 | None = None
    newest_at: Int64 | None = None
    last_used_at: Int64 | None = None


class MemoryStatsResult(Struct, omit_defaults=False, kw_only=True):
    scopes: list[MemoryScopeStats]
    active: Int64
    pending_proposals: Int64
    """Encoder proposals waiting for an answer."""
    pending_merges: Int64
    """Consolidation proposals waiting for an answer."""


class MemoryExportParams(Struct, forbid_unknown_fields=True, kw_only=True):
    scope: Id | None = None
    assistant_id: Id | None = None
    format: MemoryExportFormat = "json"
    history: bool = True
    """JSON: every version (superseded and deleted ones included); False: the active ones."""


class MemoryExportFile(Struct, omit_defaults=False, kw_only=True):
    scope: str
    name: str
    """A file name for it (``global.md``, ``<assistantId>.md``)."""
    content: str


class MemoryExportResult(Struct, omit_defaults=False, kw_only=True):
    format: MemoryExportFormat
    exported_at: Int64
    memories: list[Memory] = []
    """JSON."""
    files: list[MemoryExportFile] = []
    """Markdown: one per scope (the active memories, by kind)."""


class MemoryImportItem(Struct, kw_only=True):
    """One memory to import: the fields of an exported Memory (the others are ignored)."""

    text: MergeText
    scope: Id | None = None
    kind: MemoryKind = "fact"
    task: Annotated[str, msgspec.Meta(max_length=4000)] | None = None
    outcome: Annotated[str, msgspec.Meta(max_length=4000)] | None = None
    context: Annotated[str, msgspec.Meta(max_length=4000)] | None = None
    key: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    status: Literal["active", "superseded", "deleted"] = "active"
    """Only active ones are imported (an export's history is not replayed)."""


class MemoryImportParams(Struct, forbid_unknown_fields=True, kw_only=True):
    format: MemoryExportFormat
    memories: Annotated[list[MemoryImportItem], msgspec.Meta(max_length=MAX_IMPORT_ITEMS)] = []
    """``json``: the ``memories`` of a JSON export (or written by hand)."""
    content: Annotated[str, msgspec.Meta(max_length=MAX_IMPORT_CHARS)] | None = None
    """``markdown``: one scope's file as ``memory:export`` writes it (or edited by hand)."""
    scope: Id | None = None
    """Where they go (required for ``markdown``; for ``json`` it overrides each item's scope)."""


class MemoryImportResult(Struct, omit_defaults=False, kw_only=True):
    created: Int64
    superseded: Int64
    duplicates: Int64
    skipped: Int64
    notes: list[str] = []


METHODS: dict[str, MethodSpec] = {
    "memory:consolidate": MethodSpec(
        MemoryConsolidateParams, MemoryConsolidateResult,
        "Merge near duplicates and resolve contradictions (one version chain each), expire stale memories.",
    ),
    "memory:consolidation:list": MethodSpec(
        MemoryConsolidationListParams, list[MemoryMerge], "Consolidation proposals waiting for an answer."
    ),
    "memory:consolidation:accept": MethodSpec(
        MemoryConsolidationAcceptParams, MemoryMerge, "Apply a consolidation proposal (optionally edited)."
    ),
    "memory:consolidation:reject": MethodSpec(IdParams, SuccessResult, "Drop a consolidation proposal."),
    "memory:stats": MethodSpec(MemoryStatsParams, MemoryStatsResult, "Counts per scope: active, used, expirable..."),
    "memory:export": MethodSpec(MemoryExportParams, MemoryExportResult, "Memories as JSON or one Markdown file per scope."),
    "memory:import": MethodSpec(MemoryImportParams, MemoryImportResult, "Memories from JSON or a Markdown file."),
    "memory:settings:get": MethodSpec(
        EmptyParams, MemoryUpkeepSettings, "Expiry and consolidation settings.",
    ),
    "memory:settings:update": MethodSpec(
        MemoryUpkeepSettingsUpdate, MemoryUpkeepSettings, "Change the expiry and consolidation settings."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
