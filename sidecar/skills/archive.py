"""Skill archives: a zip unpacked into one skill's folder, confined; a folder packed back.

Unpacking (``unpack``, blocking) refuses the whole archive, writing nothing, when:
- it is not a zip, is larger than MAX_SKILL_ARCHIVE_BYTES, or has more than MAX_ENTRIES entries;
- an entry is a symlink (its Unix mode), names the same path twice, or would land outside the
  skill's folder: every entry's path goes through sidecar/confine.py's rule (relative, no
  ``..``, no absolute path or drive, nothing that resolves outside);
- the bytes actually read (never the headers' sizes: a zip bomb lies there) pass MAX_FILE_BYTES
  for one entry or MAX_UNPACKED_BYTES in all;
- there is no SKILL.md at its top or in its one top folder, or that SKILL.md breaks the
  manifest rules (manifest.py).
The entries are written into a fresh staging folder beside the skills (files with
``open_nofollow``, 0600 and folders 0700 on POSIX), which is renamed to ``<root>/<name>``
only once everything is in: a skill folder is never half-written.

Packing (``pack``) walks the folder without following symlinks (they are left out) and
writes each file under ``<name>/``.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import uuid
import zipfile
from collections.abc import Collection
from pathlib import Path

from protocol.skills import MAX_SKILL_ARCHIVE_BYTES
from sidecar.confine import PathRefused, open_nofollow, resolve_in
from sidecar.skills.manifest import Manifest, parse_manifest

__all__ = ["ArchiveRefused", "SkillExists", "unpack", "pack", "MAX_ENTRIES", "MAX_FILE_BYTES", "MAX_UNPACKED_BYTES", "SKILL_FILE"]

SKILL_FILE = "SKILL.md"
MAX_ENTRIES = 1000
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_UNPACKED_BYTES = 32 * 1024 * 1024
_CHUNK = 64 * 1024


class ArchiveRefused(ValueError):
    """The archive breaks a rule (the message says which); nothing was written."""


class SkillExists(ArchiveRefused):
    """A skill of that name exists and ``replace`` was not asked for."""

    def __init__(self, name: str, why: str = "import with replace: true to replace it") -> None:
        super().__init__(f"a skill named {name!r} exists already ({why})")
        self.name = name


def _is_symlink(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _prefix(names: list[str]) -> str:
    """The folder the skill's files are in inside the archive: '' or '<top>/'."""
    if SKILL_FILE in names:
        return ""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1:
        top = next(iter(tops))
        if f"{top}/{SKILL_FILE}" in names:
            return f"{top}/"
    raise ArchiveRefused(f"the archive has no {SKILL_FILE} at its top or in its one top folder")


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: list[int], out: io.RawIOBase | None) -> bytes:
    """The entry's bytes (written to ``out`` when given, else returned), counted against
    MAX_FILE_BYTES and the archive's remaining ``budget``."""
    kept = bytearray()
    read = 0
    with archive.open(info) as source:
        while chunk := source.read(_CHUNK):
            read += len(chunk)
            budget[0] -= len(chunk)
            if read > MAX_FILE_BYTES:
                raise ArchiveRefused(f"entry {info.filename!r} unpacks to more than {MAX_FILE_BYTES} bytes")
            if budget[0] < 0:
                raise ArchiveRefused(f"the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")
            if out is not None:
                out.write(chunk)
            else:
                kept += chunk
    return bytes(kept)


def unpack(data: bytes, root: Path, *, replace: bool, taken: Collection[str] = ()) -> Manifest:
    """Unpack the skill in ``data`` into ``root/<name>``; its manifest. ArchiveRefused,
    SkillExists (also for a name in ``taken``: skills elsewhere, never replaced) or
    ManifestError (nothing written) when it breaks a rule."""
    if len(data) > MAX_SKILL_ARCHIVE_BYTES:
        raise ArchiveRefused(f"the archive is larger than {MAX_SKILL_ARCHIVE_BYTES} bytes")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArchiveRefused(f"not a zip archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise ArchiveRefused(f"the archive has more than {MAX_ENTRIES} entries")
        seen: set[str] = set()
        for info in infos:
            if _is_symlink(info):
                raise ArchiveRefused(f"entry {info.filename!r} is a symlink: skills hold files only")
            if "\x00" in info.filename or "\\" in info.filename:
                raise ArchiveRefused(f"entry {info.filename!r} has a name that is not a plain relative path")
            parts = [p for p in info.filename.split("/") if p not in ("", ".")]
            if not parts or ".." in parts or info.filename.startswith("/"):
                raise ArchiveRefused(f"entry {info.filename!r} would land outside the skill's folder")
            key = "/".join(parts).casefold()
            if key in seen:
                raise ArchiveRefused(f"the archive names {info.filename!r} twice")
            seen.add(key)
        files = [i for i in infos if not i.is_dir()]
        prefix = _prefix([i.filename for i in files])
        budget = [MAX_UNPACKED_BYTES]
        manifest_info = next(i for i in files if i.filename == prefix + SKILL_FILE)
        manifest = parse_manifest(_read(archive, manifest_info, budget, None))
        if manifest.name in taken:
            raise SkillExists(manifest.name, "a read-only skill of a configured skills folder")
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        final = root / manifest.name
        if final.exists() and not replace:
            raise SkillExists(manifest.name)
        staging = root / f".import-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o700)
        budget = [MAX_UNPACKED_BYTES]
        try:
            for info in infos:
                relative = info.filename[len(prefix):] if info.filename.startswith(prefix) else None
                if relative is None:
                    raise ArchiveRefused(f"entry {info.filename!r} is outside the skill's folder {prefix!r}")
                if not relative.strip("/"):
                    continue
                try:
                    target = resolve_in(staging, relative.rstrip("/"), relative=True, what="the skill's folder")
                except PathRefused as exc:
                    raise ArchiveRefused(f"entry {info.filename!r}: {exc}") from None
                if info.is_dir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = open_nofollow(target, write=True, mode=0o600)
                with os.fdopen(fd, "wb") as out:
                    _read(archive, info, budget, out)  # type: ignore[arg-type]
            _install(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return manifest


def _install(staging: Path, final: Path) -> None:
    """Put the staged folder in place of ``final`` (the old one, if any, removed after)."""
    old = None
    if final.exists():
        old = final.with_name(f".replaced-{uuid.uuid4().hex}")
        final.rename(old)
    try:
        staging.rename(final)
    except OSError:
        if old is not None:
            old.rename(final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def pack(folder: Path, name: str) -> bytes:
    """The folder as a zip, each file under ``<name>/`` (symlinks left out)."""
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for base, dirs, names in os.walk(folder, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
            for file_name in sorted(names):
                path = Path(base, file_name)
                if path.is_symlink() or not path.is_file():
                    continue
                total += path.stat().st_size
                if total > MAX_UNPACKED_BYTES:
                    raise ArchiveRefused(f"the skill's folder holds more than {MAX_UNPACKED_BYTES} bytes")
                archive.write(path, f"{name}/{path.relative_to(folder).as_posix()}")
    return buffer.getvalue()

