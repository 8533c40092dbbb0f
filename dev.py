#!/usr/bin/env python3
"""One small script for the two fresh-machine commands (needs only Python 3.11+).

    python3 dev.py demo [args...]   create .venv, install, run the stdio demo client
    python3 dev.py test [pytest args...]   create .venv, install with test extras, run the tests
    python3 dev.py typecheck         create .venv with test extras, run mypy (strict on sidecar/, protocol/)
    python3 dev.py gen               regenerate protocol/generated/ (JSON Schema, TypeScript, client)
    python3 dev.py bench NAME        run tools/bench/NAME.py
    python3 dev.py bundle [args...]  build dist/chat-sidecar/, the folder a desktop app ships

The virtual environment lives in ``.venv`` next to this file (``VENV`` overrides it).
``test`` and ``gen`` also install the pinned TypeScript compiler into
``tools/electron/node_modules`` (``npm ci``) when npm is on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def run(*cmd: str | os.PathLike[str]) -> int:
    return subprocess.call([str(c) for c in cmd], cwd=ROOT)


def ensure_venv(extras: str = "") -> None:
    if sys.version_info < (3, 11):
        sys.exit("chat-sidecar needs Python 3.11 or newer")
    if not PY.exists():
        if run(sys.executable, "-m", "venv", VENV) != 0:
            sys.exit("could not create the virtual environment")
    stamp = VENV / f".installed{extras}"
    inputs = [ROOT / "pyproject.toml", ROOT / "constraints.txt"]
    if stamp.exists() and all(stamp.stat().st_mtime >= p.stat().st_mtime for p in inputs):
        return
    target = f".[{extras}]" if extras else "."
    # editable_mode=compat: a plain .pth path entry; the default import-hook finder costs
    # ~20 ms at every start of the sidecar
    install = [PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    pinned = ["-c", ROOT / "constraints.txt"]
    if run(*install, *pinned, "--config-settings", "editable_mode=compat", "-e", target) != 0:
        sys.exit("pip install failed")
    stamp.touch()


def ensure_node_tools() -> None:
    """``npm ci`` in tools/electron when its lockfile changed; without npm the TypeScript
    tests say so and skip."""
    tools = ROOT / "tools" / "electron"
    npm = shutil.which("npm")
    stamp = tools / "node_modules" / ".installed"
    if npm is None:
        print("npm is not on PATH: the TypeScript client tests will be skipped", file=sys.stderr)
        return
    lock = tools / "package-lock.json"
    if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
        return
    if run(npm, "ci", "--prefix", tools, "--no-audit", "--no-fund", "--loglevel", "error") != 0:
        sys.exit("npm ci --prefix tools/electron failed")
    stamp.touch()


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("test", [])
    if cmd == "demo":
        ensure_venv("test")  # the demo's scripted provider server comes with the test extras
        return run(PY, ROOT / "tools" / "demo.py", *rest)
    if cmd == "test":
        ensure_venv("test")
        ensure_node_tools()
        code = run(PY, "-m", "pytest", *rest)
        if code == 5:  # no tests collected: nothing ran, which is not a pass
            print("pytest collected no tests", file=sys.stderr)
        return code
    if cmd == "typecheck":  # the files and the strictness are in pyproject.toml [tool.mypy]
        ensure_venv("test")
        return run(PY, "-m", "mypy", *rest)
    if cmd == "gen":
        ensure_venv()
        ensure_node_tools()
        return run(PY, ROOT / "tools" / "gen_protocol.py", *rest)
    if cmd == "bench":
        ensure_venv("test")
        if not rest:
            sys.exit("usage: dev.py bench NAME [args]  (NAME of tools/bench/NAME.py)")
        return run(PY, ROOT / "tools" / "bench" / f"{rest[0]}.py", *rest[1:])
    if cmd == "bundle":  # the tool makes its own build venv (runtime dependencies only)
        return run(sys.executable, ROOT / "tools" / "bundle.py", *rest)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
