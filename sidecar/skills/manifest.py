"""SKILL.md's front matter for the skills package: the manifest rules, re-exported.

The rules and their one reader live in sidecar/tools/skills.py (``parse_manifest``): the
skill tools that offer skills to the model sit below this package, and they must read a
SKILL.md exactly as ``skill:*`` validates it, so there is one parser and it lives where both
may import it. Must stay true: this module defines no parsing of its own.
"""

from __future__ import annotations

from sidecar.tools.skills import MAX_FRONT_MATTER_BYTES, NAME_RE, Manifest, ManifestError, parse_manifest

__all__ = ["Manifest", "ManifestError", "parse_manifest", "NAME_RE", "MAX_FRONT_MATTER_BYTES"]
