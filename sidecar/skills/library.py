"""SkillLibrary: the skill folders on disk, read and written (blocking; callers use a
worker thread).

The roots are those the skill tools read (sidecar/tools/skills.py ``skill_roots``): the
configured ``skillsDirs`` first, then ``<dataDir>/skills``, the managed root, the only one
written. Folders are read and claim their names with the tools' own scan
(``scan_skill_folders``): a skill's name is its front matter's top-level ``name`` when the
manifest is valid, else its folder's name (``valid: false`` and its ``problem``); the first
root, then the first folder by name, that has a name wins, so ``skill:list`` lists exactly
the folders the tools consider, and a listed skill the model is not offered says so in its
``problem``. Writes keep the rule that a managed skill's folder is its name, go through a
temporary file renamed into place (a SKILL.md is never half-written), and never follow a
symlink (``open_nofollow``; a symlinked skill folder is not managed).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from protocol.skills import MAX_SKILL_MD_BYTES, SkillFile, SkillInfo
from sidecar.confine import open_nofollow
from sidecar.skills.manifest import Manifest
from sidecar.tools.skills import SKILL_FILE, SkillFolder, scan_skill_folders, skill_roots

__all__ = ["SkillLibrary", "Found", "SKILL_FILE", "MAX_LISTED_FILES"]

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
        return [self._found(item) for item in scan_skill_folders(self.roots())]

    def find(self, name: str) -> Found | None:
        return next((f for f in self.scan() if f.info.name == name), None)

    def _found(self, item: SkillFolder) -> Found:
        folder = item.folder
        manifest_path = folder / SKILL_FILE
        files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p != manifest_path]
        info = SkillInfo(
            name=item.name,
            description=item.manifest.description if item.manifest is not None else "",
            path=str(folder), read_only=folder.parent != self.managed or folder.is_symlink(), files=len(files),
            bytes=item.size + sum(_size(p) for p in files), updated_at=int(item.mtime * 1000),
            valid=item.manifest is not None, problem=item.problem,
        )
        return Found(info, folder, item.manifest)

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
