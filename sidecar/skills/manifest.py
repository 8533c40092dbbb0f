"""SKILL.md: reading and checking its front matter (Anthropic's SKILL.md format).

The front matter is the YAML block between a first line ``---`` and the next ``---`` line,
read with ``yaml.safe_load`` (no tags, no objects) and at most MAX_FRONT_MATTER_BYTES
long. Rules (a break is ManifestError naming the field):
- it is a mapping;
- ``name``: a string of 1..64 characters, lowercase letters, digits and single hyphens
  (``pdf-tools``), which is also the skill's folder name;
- ``description``: a string of 1..1024 characters without tags (``<...>``): it reaches the
  model's tool prompt;
- the other fields (``license``, ``allowed-tools``, ``metadata``...) are kept as written;
- the whole file is valid UTF-8 without NUL, at most MAX_SKILL_MD_BYTES.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from protocol.skills import MAX_SKILL_MD_BYTES

__all__ = ["Manifest", "ManifestError", "parse_manifest", "NAME_RE", "MAX_FRONT_MATTER_BYTES"]

MAX_FRONT_MATTER_BYTES = 16 * 1024
NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TAG = re.compile(r"<[^>]*>")


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


def parse_manifest(content: str | bytes) -> Manifest:
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
    name = fields.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError("name", "the front matter needs a name")
    if len(name) > 64 or not NAME_RE.match(name):
        raise ManifestError("name", f"name {name[:80]!r} must be 1..64 lowercase letters, digits and single hyphens")
    description = fields.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ManifestError("description", "the front matter needs a description (what the skill is for, "
                                           "and when to use it)")
    description = description.strip()
    if len(description) > 1024:
        raise ManifestError("description", "description is longer than 1024 characters")
    if _TAG.search(description):
        raise ManifestError("description", "description must not contain tags (<...>)")
    return Manifest(name=name, description=description, fields={str(k): v for k, v in fields.items()})
