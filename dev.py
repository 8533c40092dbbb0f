#!/usr/bin/env python3
"""One small script for the two fresh-machine commands (needs only Python 3.11+).

    python3 dev.py demo [args...]   create .venv, install, run the stdio demo client
    python3 dev.py test [pytest args...]   create .venv, install with test extras, run the tests
    python3 dev.py gen               regenerate protocol/generated/ (JSON Schema + TypeScript)
    python3 dev.py bench NAME        run tools/bench/NAME.py

The virtual environment lives in ``.venv`` next to this file (``VENV`` overrides it).
"""

from __future__ import annotations

import os
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


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("test", [])
    if cmd == "demo":
        ensure_venv("test")  # the demo's scripted provider server comes with the test extras
        return run(PY, ROOT / "tools" / "demo.py", *rest)
    if cmd == "test":
        ensure_venv("test")
        code = run(PY, "-m", "pytest", *rest)
        if code == 5:  # no tests collected: nothing ran, which is not a pass
            print("pytest collected no tests", file=sys.stderr)
        return code
    if cmd == "gen":
        ensure_venv()
        return run(PY, ROOT / "tools" / "gen_protocol.py", *rest)
    if cmd == "bench":
        ensure_venv("test")
        if not rest:
            sys.exit("usage: dev.py bench NAME [args]  (NAME of tools/bench/NAME.py)")
        return run(PY, ROOT / "tools" / "bench" / f"{rest[0]}.py", *rest[1:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
