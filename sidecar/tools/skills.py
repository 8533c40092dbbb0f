"""Skill tools: a skill is a folder holding a ``SKILL.md``; the model lists and loads them.

Skills are found in the configured folders (ToolSettings.skillsDirs) and
``<dataDir>/skills`` (the folder ``skill:*`` manages, sidecar/skills): every direct
sub-folder with a SKILL.md is a skill named after the
``name:`` of its front matter (a ``---`` block at the top) or else the folder. Its
description is the front matter's ``description:`` or the first non-heading line.
``skill_load`` returns the SKILL.md text (at most MAX_SKILL_BYTES) and lists the other
files of the folder, so the model knows what else the skill ships.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec

from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj

__all__ = ["Skill", "find_skills", "skill_tools"]

MAX_SKILL_BYTES = 128 * 1024
MAX_SKILLS = 500


class Skill(msgspec.Struct, kw_only=True):
    name: str
    description: str
    path: Path


def _front_matter(text: str) -> dict[str, str]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    out: dict[str, str] = {}
    for line in lines[1:50]:
        if line.strip() == "---":
            break
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip().lower()] = value.strip().strip("\"'")
    return out


def _describe(text: str, front: dict[str, str]) -> str:
    if front.get("description"):
        return front["description"][:300]
    in_front = text.startswith("---")
    for line in text.splitlines()[1 if in_front else 0 :]:
        stripped = line.strip()
        if in_front:
            if stripped == "---":
                in_front = False
            continue
        if stripped and not stripped.startswith("#"):
            return stripped[:300]
    return ""


def find_skills(dirs: list[Path]) -> list[Skill]:
    """Every skill of ``dirs`` (blocking; unreadable folders are skipped)."""
    found: dict[str, Skill] = {}
    for base in dirs:
        try:
            # dot-folders are not skills (a skill:import's staging folder among them)
            children = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            continue
        for folder in children:
            manifest = folder / "SKILL.md"
            if not manifest.is_file():
                continue
            try:
                with open(manifest, "rb") as f:
                    text = f.read(8192).decode("utf-8", errors="replace")
            except OSError:
                continue
            front = _front_matter(text)
            name = (front.get("name") or folder.name).strip()[:100]
            if name and name not in found:
                found[name] = Skill(name=name, description=_describe(text, front), path=folder)
            if len(found) >= MAX_SKILLS:
                return list(found.values())
    return list(found.values())


class SkillList(Tool):
    name = "skill_list"
    description = "List the skills available (name and what each is for); load one with skill_load."
    source = "skill"

    def __init__(self, skills: list[Skill]) -> None:
        self._skills = skills

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if not self._skills:
            return ToolOutput(text="no skills are installed")
        return ToolOutput(text="\n".join(f"- {s.name}: {s.description}" for s in self._skills))


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
            names = ", ".join(sorted(self._skills)) or "none"
            raise ToolError(f"no skill named {args['name']!r} (available: {names})")

        def load() -> str:
            with open(skill.path / "SKILL.md", "rb") as f:
                data = f.read(MAX_SKILL_BYTES + 1)
            text = data[:MAX_SKILL_BYTES].decode("utf-8", errors="replace")
            if len(data) > MAX_SKILL_BYTES:
                text += "\n[... truncated]"
            others = sorted(
                p.relative_to(skill.path).as_posix()
                for p in skill.path.rglob("*")
                if p.is_file() and p.name != "SKILL.md"
            )[:200]
            if others:
                text += "\n\nFiles of this skill:\n" + "\n".join(f"- {o}" for o in others)
            return text

        return ToolOutput(text=await anyio.to_thread.run_sync(load))


def skill_tools(skills: list[Skill]) -> list[Tool]:
    tools: list[Tool] = [SkillList(skills), SkillLoad(skills)]
    names = ", ".join(s.name for s in skills[:50])
    tools[0].prompt = f"Skills you can load with skill_load: {names}." if skills else None
    return tools


def skill_roots(configured: list[str], data_dir: Path) -> list[Path]:
    return [Path(d) for d in configured if d] + [data_dir / "skills"]


