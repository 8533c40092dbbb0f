"""The readable form of a scope's memories: one Markdown file, written and read back.

    # Memories: global

    <!-- chat-sidecar memories of scope global ... -->

    ## Facts

    - The user lives in Oslo. <!-- key: user.city; id: 0190...; created: 2026-03-10; uses: 3 -->

    ## Task outcomes

    - Planned a 10 km training.
      - task: training plan
      - outcome: a 6-week plan

One ``## <kind>`` heading per kind (the kind's name or its id: ``fact``, ``Facts``...), one
``- `` item per memory; indented lines continue its text, indented ``- task:`` /
``- outcome:`` / ``- context:`` lines are its details; the trailing comment keeps its topic
key (the rest of the comment is for the reader). A person may edit the file freely: text
before the first heading, blank lines and unknown comment fields are ignored; an item under
a heading that names no kind is a ``note``. ``<!--`` and ``-->`` inside a memory's text are
written as ``<!-​-`` / ``-​->`` (with a zero-width space) so they cannot end its line's comment.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Literal, cast

from protocol.memory import Memory, MemoryKind
from protocol.memory_upkeep import MemoryImportItem

__all__ = ["render_scope", "parse_scope", "KIND_TITLES"]

KIND_TITLES: dict[str, str] = {
    "fact": "Facts",
    "preference": "Preferences",
    "instruction-from-user": "Instructions from the user",
    "task-outcome": "Task outcomes",
    "event": "Events",
    "note": "Notes",
}
_DETAILS = ("task", "outcome", "context")
_ZW = "\u200b"
_COMMENT = re.compile(r"\s*<!--(.*?)-->\s*$")
_HEADING = re.compile(r"^##\s+(.+?)\s*#*\s*$")
_DETAIL = re.compile(r"^\s{2,}-\s+(task|outcome|context):\s?(.*)$", re.IGNORECASE)


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d")


def _safe(text: str) -> str:
    return text.replace("<!--", f"<!-{_ZW}-").replace("-->", f"-{_ZW}->")


def _unsafe(text: str) -> str:
    return text.replace(f"<!-{_ZW}-", "<!--").replace(f"-{_ZW}->", "-->")


def render_scope(scope: str, memories: list[Memory], exported_at: int) -> str:
    """The Markdown file of ``scope``'s active ``memories`` (by kind, oldest first)."""
    lines = [f"# Memories: {scope}", "",
             f"<!-- chat-sidecar memories of scope {scope}, exported {_day(exported_at)}: {len(memories)} active."
             " One memory per '- ' item under its kind's heading; edit freely, then memory:import. -->"]
    for kind, title in KIND_TITLES.items():
        items = [m for m in memories if m.kind == kind]
        if not items:
            continue
        lines += ["", f"## {title}", ""]
        for memory in items:
            text_lines = _safe(memory.text).splitlines() or [""]
            meta = [f"key: {memory.key}"] if memory.key else []
            meta += [f"id: {memory.id}", f"created: {_day(memory.created_at)}", f"uses: {memory.use_count}"]
            lines.append(f"- {text_lines[0]} <!-- {'; '.join(_safe(m) for m in meta)} -->")
            lines += [f"  {rest}" for rest in text_lines[1:]]
            for field in _DETAILS:
                value = getattr(memory, field)
                if value:
                    lines.append(f"  - {field}: {_safe(value).replace(chr(10), ' ')}")
    return "\n".join(lines) + "\n"


def _kind_of(heading: str) -> MemoryKind | None:
    wanted = heading.strip().casefold()
    for kind, title in KIND_TITLES.items():
        if wanted in (kind, title.casefold()):
            return cast(MemoryKind, kind)
    return None


class _Item:
    def __init__(self, kind: MemoryKind, first: str) -> None:
        self.kind = kind
        self.key: str | None = None
        found = _COMMENT.search(first)
        if found is not None:
            first = first[: found.start()]
            for field in found.group(1).split(";"):
                name, sep, value = field.partition(":")
                if sep and name.strip().casefold() == "key" and value.strip():
                    self.key = _unsafe(value.strip())
        self.text = [first.strip()]
        self.details: dict[str, str] = {}

    def done(self) -> MemoryImportItem | None:
        text = _unsafe("\n".join(self.text).strip())
        if not text:
            return None
        details = {k: _unsafe(v.strip()) or None for k, v in self.details.items()}
        return MemoryImportItem(text=text, kind=self.kind, key=self.key, task=details.get("task"),
                                outcome=details.get("outcome"), context=details.get("context"))


def parse_scope(content: str) -> tuple[list[MemoryImportItem], list[str]]:
    """The memories of a file ``render_scope`` wrote (or a person edited), and notes on what
    was read unusually (an unknown heading, an empty item)."""
    items: list[MemoryImportItem] = []
    notes: list[str] = []
    kind: MemoryKind | None = None
    current: _Item | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            item = current.done()
            if item is None:
                notes.append("an empty item was skipped")
            else:
                items.append(item)
        current = None

    for number, line in enumerate(content.splitlines(), 1):
        heading = _HEADING.match(line)
        if heading is not None:
            close()
            kind = _kind_of(heading.group(1))
            if kind is None:
                notes.append(f"line {number}: heading {heading.group(1)[:80]!r} names no kind: its items are notes")
                kind = "note"
            continue
        if kind is None:
            continue  # the title and the header comment
        if line.startswith("- ") or line == "-":
            close()
            current = _Item(kind, line[2:])
            continue
        detail = _DETAIL.match(line)
        if current is not None and detail is not None:
            field = cast(Literal["task", "outcome", "context"], detail.group(1).lower())
            current.details[field] = detail.group(2)
        elif current is not None and line.startswith("  ") and line.strip():
            current.text.append(line.strip())
        elif line.strip():
            close()
    close()
    return items, notes
