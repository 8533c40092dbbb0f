#!/usr/bin/env python3
"""One small script for the two fresh-machine commands (needs only Python 3.11+).

    python3 dev.py demo [args...]   create .venv, install, run the stdio demo client
    python3 dev.py test [pytest args...]   create .venv, install with test extras, run the tests (2 workers)
    python3 dev.py typecheck         create .venv with test extras, run mypy (strict on sidecar/, protocol/)
    python3 dev.py gen               regenerate protocol/generated/ (JSON Schema, TypeScript, client) and docs/methods.md
    python3 dev.py bench NAME        run tools/bench/NAME.py
    python3 dev.py bundle [args...]  build dist/chat-sidecar/, the folder a desktop app ships

The virtual environment lives in ``.venv`` next to this file (``VENV`` overrides it).
``test`` and ``gen`` also install the pinned TypeScript compiler into
``tools/electron/node_modules`` (``npm ci``) when npm is on PATH; ``test`` also fetches the
examples of the pinned agent-client-protocol sdist into the venv (real ACP agents the tests
run), so no test reaches the network.
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


ACP_SDIST = "agent-client-protocol"
ACP_EXAMPLES = VENV / "share" / "acp-sdk-examples"
"""The ``examples/`` of the agent-client-protocol sdist pinned in constraints.txt: real ACP
agents we did not write, run by tests/test_acp_real_agents.py. Fetched here, at install
time, so the tests never reach the network."""


def ensure_acp_examples() -> None:
    pin = next(
        (line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
         if line.lower().startswith(f"{ACP_SDIST}==")),
        None,
    )
    if pin is None:
        return
    stamp = ACP_EXAMPLES / ".version"
    if stamp.exists() and stamp.read_text() == pin:
        return
    import tarfile
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        download = [PY, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--no-binary", ":all:", "-d", where, pin]
        archives = sorted(Path(where).glob("agent_client_protocol-*.tar.gz")) if run(*download) == 0 else []
        if not archives:
            print(f"could not download the {pin} sdist: tests/test_acp_real_agents.py will skip", file=sys.stderr)
            return
        shutil.rmtree(ACP_EXAMPLES, ignore_errors=True)
        ACP_EXAMPLES.mkdir(parents=True)
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if member.isfile() and len(parts) > 2 and parts[1] == "examples" and member.name.endswith(".py"):
                    member.name = "/".join(parts[2:])
                    tar.extract(member, ACP_EXAMPLES, filter="data")
    stamp.write_text(pin)


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


def workers(args: list[str]) -> list[str]:
    """pytest-xdist's ``-n 2`` (one worker per core of the 2-core machine the suite is sized
    for) unless the arguments choose (``-n N``, ``-n 0``, ``-p no:xdist``)."""
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in args)
    count = min(os.cpu_count() or 1, 2)
    return [] if chosen or count < 2 else ["-n", str(count)]


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("test", [])
    if cmd == "demo":
        ensure_venv("test")  # the demo's scripted provider server comes with the test extras
        return run(PY, ROOT / "tools" / "demo.py", *rest)
    if cmd == "test":
        ensure_venv("test")
        ensure_acp_examples()
        ensure_node_tools()
        code = run(PY, "-m", "pytest", *workers(rest), *rest)
        if code == 5:  # no tests collected: nothing ran, which is not a pass
            print("pytest collected no tests", file=sys.stderr)
        return code
    if cmd == "typecheck":  # the files and the strictness are in pyproject.toml [tool.mypy]
        ensure_venv("test")
        return run(PY, "-m", "mypy", *rest)
    if cmd == "gen":
        ensure_venv()
        ensure_node_tools()
        code = run(PY, ROOT / "tools" / "gen_protocol.py", *rest)
        # the docs' generated parts (tools/gen_docs.py) take only --check of these arguments
        return code or run(PY, ROOT / "tools" / "gen_docs.py", *[a for a in rest if a == "--check"])
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
