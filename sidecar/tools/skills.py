"""Skills: the one reader of a skill folder's SKILL.md, and the tools that offer skills to
the model (``skill_list``, ``skill_load``).

A skill is a direct sub-folder (not a dot-folder: an import's staging folder is one) of a
root holding a regular file ``SKILL.md``. The roots (``skill_roots``) are the configured
folders (ToolSettings.skillsDirs) in their order, then ``<dataDir>/skills``, the folder
``skill:*`` manages (sidecar/skills, which reads every folder through this module too).

The front matter rules (``parse_manifest``; a break is ManifestError naming the field). The
front matter is the YAML block between a first line ``---`` and the next ``---`` line, read
with ``yaml.safe_load`` (no tags, no objects), at most MAX_FRONT_MATTER_BYTES long:
- it is a mapping; only its top-level ``name`` and ``description`` say what the skill is;
- ``name``: a string of 1..64 characters, lowercase letters, digits and single hyphens
  (``pdf-tools``, NAME_RE); a managed skill's folder is named so (sidecar/skills writes
  ``<dataDir>/skills/<name>`` and never renames);
- ``description``: a string of 1..1024 characters without tags (``<...>``): it reaches the
  model;
- the other fields (``license``, ``allowed-tools``, ``metadata``...) are kept as written and
  never read for the skill's identity;
- the whole file is valid UTF-8 without NUL, at most MAX_SKILL_MD_BYTES.

What the model sees of a folder (``read_skill_folder``): with a valid manifest, its name and
description; with a broken one (``problem`` says how; skill:list shows ``valid: false``), its
folder's name if that passes the same name rule, described by the first line of the body
that is not a heading; else nothing (left out, logged).

Must stay true:
- a name the model sees passes NAME_RE, and no two skills offered share one. A name is
  claimed by the first folder that has it (roots in order, then folders by name), and
  skill:list (sidecar/skills/library.py) uses this same scan, ``scan_skill_folders``;
  a later folder with that name is shadowed: not offered, not listed, logged;
- names and descriptions reach the tool prompt and ``skill_list``'s result only through
  sidecar/untrusted.py's ``escape`` (SECURITY.md, boundary 1). ``skill_load`` returns the
  SKILL.md as written (a tool result, at most MAX_SKILL_BYTES) and lists the other files of
  the folder.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

import anyio
import msgspec

from protocol.skills import MAX_SKILL_MD_BYTES
from sidecar.confine import open_nofollow
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj
from sidecar.untrusted import escape

__all__ = [
    "Skill", "SkillFolder", "Manifest", "ManifestError", "parse_manifest", "read_skill_folder",
    "scan_skill_folders", "find_skills", "skill_tools", "skill_roots",
    "NAME_RE", "MAX_FRONT_MATTER_BYTES", "MAX_SKILLS", "MAX_SKILL_BYTES", "SKILL_FILE",
]

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
MAX_SKILL_BYTES = 128 * 1024
MAX_SKILLS = 500
MAX_FRONT_MATTER_BYTES = 16 * 1024
MAX_SHOWN_DESCRIPTION = 300
NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TAG = re.compile(r"<[^>]*>")


# ---- the manifest ----------------------------------------------------------------------------


class ManifestError(ValueError):
    """The SKILL.md breaks a rule: ``field`` names where, the message says how."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Manifest(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    description: str
    fields: dict[str, Any]
    """Every front matter field, as read."""


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ManifestError("name", "the front matter needs a name")
    if len(name) > 64 or not NAME_RE.match(name):
        raise ManifestError("name", f"name {name[:80]!r} must be 1..64 lowercase letters, digits and single hyphens")
    return name


def _check_description(description: object) -> str:
    if not isinstance(description, str) or not description.strip():
        raise ManifestError("description", "the front matter needs a description (what the skill is for, "
                                           "and when to use it)")
    description = description.strip()
    if len(description) > 1024:
        raise ManifestError("description", "description is longer than 1024 characters")
    if _TAG.search(description):
        raise ManifestError("description", "description must not contain tags (<...>)")
    return description


def parse_manifest(content: str | bytes) -> Manifest:
    """The manifest of a SKILL.md, or ManifestError (the rules: this module's docstring)."""
    import yaml

    if isinstance(content, bytes):
        if len(content) > MAX_SKILL_MD_BYTES:
            raise ManifestError("content", f"SKILL.md is larger than {MAX_SKILL_MD_BYTES} bytes")
        try:
            content = content.decode("utf-8")
        except UnicodeDecodeError:
            raise ManifestError("content", "SKILL.md is not UTF-8 text") from None
    if len(content.encode("utf-8")) > MAX_SKILL_MD_BYTES:
        raise ManifestError("content", f"SKILL.md is larger than {MAX_SKILL_MD_BYTES} bytes")
    if "\x00" in content:
        raise ManifestError("content", "SKILL.md must not contain NUL characters")
    lines = content.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ManifestError("content", "SKILL.md must start with a front matter block (a '---' line, "
                                       "name: and description:, a closing '---' line)")
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise ManifestError("content", "the front matter of SKILL.md has no closing '---' line") from None
    block = "\n".join(lines[1:end])
    if len(block.encode("utf-8")) > MAX_FRONT_MATTER_BYTES:
        raise ManifestError("content", f"the front matter is larger than {MAX_FRONT_MATTER_BYTES} bytes")
    try:
        fields = yaml.safe_load(block) if block.strip() else None
    except yaml.YAMLError as exc:
        raise ManifestError("content", f"the front matter is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(fields, dict):
        raise ManifestError("content", "the front matter must be a mapping of fields (name: ..., description: ...)")
    name = _check_name(fields.get("name"))
    description = _check_description(fields.get("description"))
    return Manifest(name=name, description=description, fields={str(k): v for k, v in fields.items()})


# ---- skill folders ---------------------------------------------------------------------------


class Skill(msgspec.Struct, kw_only=True):
    """A skill as the model sees it: ``name`` passes NAME_RE; ``description`` is raw (escape
    it where it is written)."""

    name: str
    description: str
    path: Path


class SkillFolder(msgspec.Struct, kw_only=True):
    """A folder holding a SKILL.md, as read: ``name`` is what it is listed under (the
    manifest's name, else the folder's), ``offered`` what the model sees of it (None: left
    out, ``problem`` says why)."""

    folder: Path
    name: str
    manifest: Manifest | None
    problem: str | None
    offered: Skill | None
    size: int
    mtime: float


def _body_line(text: str) -> str:
    """The first line after the front matter (if any) that is neither blank nor a heading."""
    lines = text.lstrip("\ufeff").splitlines()
    start = 0
    if lines and lines[0].strip() == "---":
        start = next((i + 1 for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), len(lines))
    return next((s for s in (line.strip() for line in lines[start:]) if s and not s.startswith("#")), "")


def read_skill_folder(folder: Path) -> SkillFolder | None:
    """``folder`` as a skill (blocking), or None: no regular SKILL.md there (a symlinked
    SKILL.md is not followed) or it cannot be read."""
    try:
        fd = open_nofollow(folder / SKILL_FILE)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None
            data = f.read(MAX_SKILL_MD_BYTES + 1)
    except OSError:
        return None
    try:
        manifest: Manifest | None = parse_manifest(data)
        problem = None
    except ManifestError as exc:
        manifest, problem = None, exc.message
    if manifest is not None:
        name = manifest.name
        offered: Skill | None = Skill(name=name, description=manifest.description, path=folder)
    else:
        name = folder.name
        try:
            _check_name(name)
        except ManifestError:
            offered = None
            problem = f"{problem}; the folder's name {name[:80]!r} is not a skill name either: not offered to the model"
        else:
            body = _body_line(data[:MAX_SKILL_MD_BYTES].decode("utf-8", errors="replace"))
            offered = Skill(name=name, description=body, path=folder)
    return SkillFolder(folder=folder, name=name, manifest=manifest, problem=problem, offered=offered,
                       size=st.st_size, mtime=st.st_mtime)


_reported: set[tuple[str, str]] = set()


def _warn_once(folder: Path, message: str) -> None:
    """A warning for a skill folder the model is not offered, once per process and reason (the
    scan runs for every turn)."""
    key = (str(folder), message)
    if key in _reported:
        return
    if len(_reported) >= 4 * MAX_SKILLS:
        _reported.clear()
    _reported.add(key)
    log.warning("skill folder %s is not offered to the model: %s", folder, message)


def scan_skill_folders(roots: list[Path]) -> list[SkillFolder]:
    """Every skill folder of ``roots`` that claims its name (blocking; unreadable roots are
    skipped; at most MAX_SKILLS): roots in order, folders by name, the first folder with a
    name wins and a later one is shadowed (left out and logged)."""
    found: dict[str, SkillFolder] = {}
    for root in roots:
        try:
            children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            continue
        for folder in children:
            item = read_skill_folder(folder)
            if item is None:
                continue
            first = found.get(item.name)
            if first is not None:
                _warn_once(folder, f"its skill name {item.name!r} is taken by {first.folder}, which wins")
                continue
            found[item.name] = item
            if item.offered is None:
                _warn_once(folder, item.problem or "its SKILL.md breaks the rules")
            if len(found) >= MAX_SKILLS:
                return list(found.values())
    return list(found.values())


def find_skills(dirs: list[Path]) -> list[Skill]:
    """The skills the model is offered from ``dirs`` (blocking): names unique and valid."""
    return [item.offered for item in scan_skill_folders(dirs) if item.offered is not None]


# ---- the tools -------------------------------------------------------------------------------


def _shown(skill: Skill) -> str:
    return f"- {escape(skill.name)}: {escape(skill.description[:MAX_SHOWN_DESCRIPTION])}"


class SkillList(Tool):
    name = "skill_list"
    description = "List the skills available (name and what each is for); load one with skill_load."
    source = "skill"

    def __init__(self, skills: list[Skill]) -> None:
        self._skills = skills

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if not self._skills:
            return ToolOutput(text="no skills are installed")
        return ToolOutput(text="\n".join(_shown(s) for s in self._skills))


class SkillLoad(Tool):
    name = "skill_load"
    description = "Load a skill's instructions (its SKILL.md) by name."
    parameters = obj({"name": {"type": "string"}}, ["name"])
    source = "skill"

    def __init__(self, skills: list[Skill]) -> None:
        self._skills = {s.name: s for s in skills}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        skill = self._skills.get(args["name"])
        if skill is None:
            names = ", ".join(escape(n) for n in sorted(self._skills)) or "none"
            raise ToolError(f"no skill named {args['name']!r} (available: {names})")

        def load() -> str:
            with os.fdopen(open_nofollow(skill.path / SKILL_FILE), "rb") as f:
                data = f.read(MAX_SKILL_BYTES + 1)
            text = data[:MAX_SKILL_BYTES].decode("utf-8", errors="replace")
            if len(data) > MAX_SKILL_BYTES:
                text += "\n[... truncated]"
            others = sorted(
                p.relative_to(skill.path).as_posix()
                for p in skill.path.rglob("*")
                if p.is_file() and p.name != SKILL_FILE
            )[:200]
            if others:
                text += "\n\nFiles of this skill:\n" + "\n".join(f"- {o}" for o in others)
            return text

        return ToolOutput(text=await anyio.to_thread.run_sync(load))


def skill_tools(skills: list[Skill]) -> list[Tool]:
    tools: list[Tool] = [SkillList(skills), SkillLoad(skills)]
    names = ", ".join(escape(s.name) for s in skills[:50])
    tools[0].prompt = f"Skills you can load with skill_load: {names}." if skills else None
    return tools


def skill_roots(configured: list[str], data_dir: Path) -> list[Path]:
    """The roots skills are read from, in the order that decides which folder wins a name."""
    return [Path(d) for d in configured if d] + [data_dir / "skills"]
