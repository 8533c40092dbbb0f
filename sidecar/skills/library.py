"""SkillLibrary: the skill folders on disk, read and written (blocking; callers use a
worker thread).

The roots are those the skill tools read (sidecar/tools/skills.py ``skill_roots``): the
configured ``skillsDirs`` first, then ``<dataDir>/skills``, the managed root, the only one
written. A skill is a direct sub-folder holding a SKILL.md; its name is its front matter's
``name`` when the manifest is valid, else its folder's name (as the tools name it); the
first root that has a name wins, as for the tools. Writes keep the rule that a managed
skill's folder is its name, go through a temporary file renamed into place (a SKILL.md is
never half-written), and never follow a symlink (``open_nofollow``; a symlinked skill
folder is not managed).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from protocol.skills import MAX_SKILL_MD_BYTES, SkillFile, SkillInfo
from sidecar.confine import open_nofollow
from sidecar.skills.manifest import Manifest, ManifestError, parse_manifest
from sidecar.tools.skills import MAX_SKILLS, skill_roots

__all__ = ["SkillLibrary", "Found", "SKILL_FILE", "MAX_LISTED_FILES"]

SKILL_FILE = "SKILL.md"
MAX_LISTED_FILES = 500


class Found:
    def __init__(self, info: SkillInfo, folder: Path, manifest: Manifest | None) -> None:
        self.info = info
        self.folder = folder
        self.manifest = manifest


class SkillLibrary:
    def __init__(self, data_dir: Path, configured: list[str]) -> None:
        self.managed = data_dir / "skills"
        self._data_dir = data_dir
        self.configured = configured

    def roots(self) -> list[Path]:
        return skill_roots(self.configured, self._data_dir)

    def scan(self) -> list[Found]:
        found: dict[str, Found] = {}
        for root in self.roots():
            read_only = root != self.managed
            try:
                children = sorted(p for p in root.iterdir() if p.is_dir())
            except OSError:
                continue
            for folder in children:
                if folder.name.startswith("."):  # staging and replaced folders of an import
                    continue
                item = self._read(folder, read_only)
                if item is not None and item.info.name not in found:
                    found[item.info.name] = item
                if len(found) >= MAX_SKILLS:
                    return list(found.values())
        return list(found.values())

    def find(self, name: str) -> Found | None:
        return next((f for f in self.scan() if f.info.name == name), None)

    def _read(self, folder: Path, read_only: bool) -> Found | None:
        manifest_path = folder / SKILL_FILE
        try:
            fd = open_nofollow(manifest_path)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_SKILL_MD_BYTES + 1)
            stat = os.fstat(f.fileno())
        manifest: Manifest | None = None
        problem = None
        try:
            manifest = parse_manifest(data)
        except ManifestError as exc:
            problem = exc.message
        files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p != manifest_path]
        info = SkillInfo(
            name=manifest.name if manifest is not None else folder.name,
            description=manifest.description if manifest is not None else "",
            path=str(folder), read_only=read_only or folder.is_symlink(), files=len(files),
            bytes=stat.st_size + sum(_size(p) for p in files), updated_at=int(stat.st_mtime * 1000),
            valid=manifest is not None, problem=problem,
        )
        return Found(info, folder, manifest)

    def content(self, found: Found) -> tuple[str, list[SkillFile]]:
        with os.fdopen(open_nofollow(found.folder / SKILL_FILE), "rb") as f:
            text = f.read(MAX_SKILL_MD_BYTES).decode("utf-8", errors="replace")
        top = found.folder / SKILL_FILE
        files = sorted(
            (SkillFile(path=p.relative_to(found.folder).as_posix(), bytes=_size(p))
             for p in found.folder.rglob("*") if p.is_file() and not p.is_symlink() and p != top),
            key=lambda f: f.path,
        )[:MAX_LISTED_FILES]
        return text, files

    def write(self, name: str, content: str, *, new: bool) -> Path:
        """Write ``<managed>/<name>/SKILL.md`` (``new``: the folder must not exist)."""
        self.managed.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = self.managed / name
        if new:
            folder.mkdir(mode=0o700)
        elif folder.is_symlink() or not folder.is_dir():
            raise FileNotFoundError(folder)
        temp = folder / f".{SKILL_FILE}.{uuid.uuid4().hex}"
        fd = open_nofollow(temp, write=True, mode=0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content.encode("utf-8"))
            os.replace(temp, folder / SKILL_FILE)
        except BaseException:
            temp.unlink(missing_ok=True)
            if new:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    def remove(self, found: Found) -> None:
        shutil.rmtree(found.folder)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
