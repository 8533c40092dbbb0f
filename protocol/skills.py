"""``skill:*``: the skills the model can load (folders holding a ``SKILL.md``), managed.

A skill is a folder with a ``SKILL.md`` whose front matter (a YAML block between ``---``
lines at its top, Anthropic's SKILL.md format) has a ``name`` (1..64 characters: lowercase
letters, digits and single hyphens) and a ``description`` (1..1024 characters, no tags);
other fields (``license``, ``allowed-tools``, ``metadata``...) are kept as written. The
managed folder is ``<dataDir>/skills/<name>``: create, update, delete and import write
only there; skills found in the configured ``skillsDirs`` (``tool:settings``) are listed
too, ``readOnly``.

``skill:import`` takes a zip (base64): SKILL.md at its top or in its one top folder; an
entry that would land outside the skill's folder (``../``, an absolute path, a drive), a
symlink, too many entries or too many bytes (counted while extracting, whatever the headers
say) refuse the whole archive and nothing is written. ``skill:export`` gives the folder
back as a zip.

Proposals: after a completed reply that used several tools (``skill:settings``
``autoPropose``, ``minToolCalls``), or when the host asks (``skill:propose``), the model may
write a SKILL.md for what the reply did; it is sent as ``skill_proposed`` and is nothing
until ``skill:accept`` (optionally edited) writes it; ``skill:reject`` drops it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocol.common import EmptyParams, IdParams, MethodSpec, NameParams, SuccessResult
from protocol.limits import Id, Int64
from protocol.providers import DefaultModel
from protocol.types import Struct

__all__ = [
    "MAX_SKILL_MD_BYTES",
    "MAX_SKILL_ARCHIVE_BYTES",
    "SkillInfo",
    "SkillFile",
    "SkillDetail",
    "SkillCreateParams",
    "SkillUpdateParams",
    "SkillImportParams",
    "SkillExportResult",
    "SkillProposeParams",
    "SkillProposal",
    "SkillProposeResult",
    "SkillProposalListParams",
    "SkillAcceptParams",
    "SkillSettings",
    "SkillSettingsUpdate",
]

MAX_SKILL_MD_BYTES = 128 * 1024
MAX_SKILL_ARCHIVE_BYTES = 8 * 1024 * 1024
"""A zip given to ``skill:import`` (its base64 is about 4/3 of this)."""

SkillText = Annotated[str, msgspec.Meta(max_length=MAX_SKILL_MD_BYTES)]
Base64Zip = Annotated[str, msgspec.Meta(max_length=(MAX_SKILL_ARCHIVE_BYTES * 4) // 3 + 4)]
ToolCount = Annotated[int, msgspec.Meta(ge=1, le=100)]


class SkillInfo(Struct, omit_defaults=False, kw_only=True):
    name: str
    description: str
    path: str
    """The skill's folder."""
    read_only: bool
    """Found in a configured ``skillsDirs`` folder: listed and loaded, never written."""
    files: Int64
    """Files of the folder besides SKILL.md."""
    bytes: Int64
    updated_at: Int64
    valid: bool = True
    """False: its front matter breaks the rules (``problem`` says how); the tools still
    load it under its folder's name."""
    problem: str | None = None


class SkillFile(Struct, omit_defaults=False, kw_only=True):
    path: str
    """Relative to the skill's folder, ``/``-separated."""
    bytes: Int64


class SkillDetail(Struct, omit_defaults=False, kw_only=True):
    skill: SkillInfo
    content: str
    """SKILL.md."""
    files: list[SkillFile]


class SkillCreateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    content: SkillText
    """The SKILL.md; its front matter's ``name`` names the skill (and its folder)."""


class SkillUpdateParams(Struct, forbid_unknown_fields=True, kw_only=True):
    name: Id
    content: SkillText
    """The new SKILL.md (its ``name`` must stay the same)."""


class SkillImportParams(Struct, forbid_unknown_fields=True, kw_only=True):
    data: Base64Zip
    """The zip, base64."""
    replace: bool = False
    """A skill of that name exists: replace it (else BAD_STATE)."""


class SkillExportResult(Struct, omit_defaults=False, kw_only=True):
    name: str
    data: str
    """The zip, base64: the folder under ``<name>/``."""
    bytes: Int64


class SkillProposeParams(Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: Id
    message_id: Id | None = None
    """A completed reply of the session (default: the last one of its active branch)."""


class SkillProposal(Struct, omit_defaults=False, kw_only=True):
    id: str
    session_id: str
    message_id: str
    name: str
    description: str
    content: str
    """The SKILL.md the model wrote (valid: checked before it is proposed)."""
    reason: str = ""
    status: Literal["pending", "accepted", "rejected"] = "pending"
    created_at: Int64


class SkillProposeResult(Struct, omit_defaults=False, kw_only=True):
    proposal: SkillProposal | None = None
    """None: the model found nothing worth a skill in that reply (``reason`` says why)."""
    reason: str = ""


class SkillProposalListParams(Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: Id | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100


class SkillAcceptParams(Struct, forbid_unknown_fields=True, kw_only=True):
    id: Id
    content: SkillText | None = None
    """The SKILL.md as the user edited it."""


class SkillSettings(Struct, omit_defaults=False, kw_only=True):
    auto_propose: bool = False
    """After a completed reply with at least ``minToolCalls`` tool calls, ask the model
    (in the background) whether it is worth a skill."""
    min_tool_calls: ToolCount = 3
    model: DefaultModel | None = None
    """The model that writes proposals; default: the reply's own."""


class SkillSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    auto_propose: bool | UnsetType = UNSET
    min_tool_calls: ToolCount | UnsetType = UNSET
    model: DefaultModel | None | UnsetType = UNSET


METHODS: dict[str, MethodSpec] = {
    "skill:list": MethodSpec(EmptyParams, list[SkillInfo], "Every skill the tools can load, managed or read-only."),
    "skill:get": MethodSpec(NameParams, SkillDetail, "A skill's SKILL.md and its files."),
    "skill:create": MethodSpec(SkillCreateParams, SkillInfo, "A new managed skill from a SKILL.md."),
    "skill:update": MethodSpec(SkillUpdateParams, SkillInfo, "Replace a managed skill's SKILL.md."),
    "skill:delete": MethodSpec(NameParams, SuccessResult, "Delete a managed skill's folder."),
    "skill:import": MethodSpec(SkillImportParams, SkillInfo, "A skill from a zip, confined to its folder."),
    "skill:export": MethodSpec(NameParams, SkillExportResult, "A skill's folder as a zip."),
    "skill:propose": MethodSpec(
        SkillProposeParams, SkillProposeResult, "Ask the model for a SKILL.md of what a completed reply did."
    ),
    "skill:proposal:list": MethodSpec(SkillProposalListParams, list[SkillProposal], "Skill proposals still open."),
    "skill:accept": MethodSpec(SkillAcceptParams, SkillInfo, "Write a proposed skill (optionally edited)."),
    "skill:reject": MethodSpec(IdParams, SuccessResult, "Drop a skill proposal."),
    "skill:settings:get": MethodSpec(EmptyParams, SkillSettings, "Skill proposal settings."),
    "skill:settings:update": MethodSpec(SkillSettingsUpdate, SkillSettings, "Change the skill proposal settings."),
}
"""The methods of this domain (see ``protocol.methods``)."""
