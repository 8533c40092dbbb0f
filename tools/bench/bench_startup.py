#!/usr/bin/env python3
"""Cold start: spawn ``python -m sidecar`` -> first ``sidecar:initialize`` answer.

Prints the median of N runs (default 10) and the ratio to the baseline measured in the
same run: ``python -c "import msgspec, anyio"`` (the interpreter plus the two libraries
the process cannot start without). Target: under 250 ms. Then, with ``python -X
importtime``, the heaviest imports on the way to serving, so a regression shows where
it comes from.

    python3 dev.py bench bench_startup [--runs N] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INITIALIZE = b'{"jsonrpc":"2.0","id":1,"method":"sidecar:initialize","params":{}}\n'
SHUTDOWN = b'{"jsonrpc":"2.0","id":2,"method":"sidecar:shutdown"}\n'


def time_baseline() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import msgspec, anyio"], check=True, cwd=ROOT)
    return time.perf_counter() - started


BARE_LAUNCHER = """
import contextlib, sys
import sidecar.__main__ as cli
import sidecar.server as server
from sidecar.app import App

@contextlib.asynccontextmanager
async def bare_app(config, notify):
    yield App(config, __import__("pathlib").Path(config.data_dir), notify)

server.open_app = bare_app
sys.exit(cli.main(sys.argv[1:]))
"""
"""The same process with an App that attaches no services: the transport's own share."""


def time_sidecar(data_dir: str, *, bare: bool = False) -> float:
    env = dict(os.environ, CHAT_SIDECAR_LOG_LEVEL="WARNING")
    command = [sys.executable, "-c", BARE_LAUNCHER] if bare else [sys.executable, "-m", "sidecar"]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*command, "--data-dir", data_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(INITIALIZE)  # sent at once, as Electron does; it waits in the pipe
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    if b'"result"' not in line:
        raise SystemExit(f"unexpected answer: {line[:200]!r}")
    proc.stdin.write(SHUTDOWN)
    proc.stdin.close()
    proc.stdout.read()
    if proc.wait(timeout=30) != 0:
        raise SystemExit(f"sidecar exited with {proc.returncode}")
    return elapsed


def heaviest_imports(data_dir: str, limit: int) -> list[tuple[int, str]]:
    """Top-level imports of a real serving run (initialize + shutdown), by cumulative time."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sidecar", "--data-dir", data_dir, "--log-level", "WARNING"],
        input=INITIALIZE + SHUTDOWN,
        capture_output=True,
        cwd=ROOT,
        check=True,
    )
    rows: list[tuple[int, str]] = []
    for line in done.stderr.decode("utf-8", "replace").splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative, name = line.split(":", 1)[1].split("|")
        if name.startswith("  "):  # nested: already counted in its parent's cumulative time
            continue
        rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:limit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--data-dir", help="default: a fresh temporary directory (created on the warm-up run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        data_dir = args.data_dir or tmp
        time_sidecar(data_dir)  # warm-up: creates the database, fills the OS file cache
        time_baseline()
        sidecar_runs: list[float] = []
        bare_runs: list[float] = []
        baseline_runs: list[float] = []
        for _ in range(args.runs):  # interleaved, so machine noise hits all alike
            baseline_runs.append(time_baseline())
            sidecar_runs.append(time_sidecar(data_dir))
            bare_runs.append(time_sidecar(data_dir, bare=True))
    sidecar_ms = statistics.median(sidecar_runs) * 1000
    baseline_ms = statistics.median(baseline_runs) * 1000
    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} cpus, {args.runs} runs each")
    print(f"baseline  python -c 'import msgspec, anyio'    median {baseline_ms:7.1f} ms  (min {min(baseline_runs) * 1000:.1f})")
    print(f"sidecar   spawn -> sidecar:initialize answer  median {sidecar_ms:7.1f} ms  (min {min(sidecar_runs) * 1000:.1f})")
    bare_ms = statistics.median(bare_runs) * 1000
    print(f"bare      same, App without services          median {bare_ms:7.1f} ms  (min {min(bare_runs) * 1000:.1f})")
    print(f"ratio     sidecar / baseline                  {sidecar_ms / baseline_ms:7.2f}x")
    print(f"ratio     bare / baseline                     {bare_ms / baseline_ms:7.2f}x")
    print(f"target    < 250 ms: {'met' if sidecar_ms < 250 else 'NOT met'}")
    print("heaviest top-level imports while starting and serving (python -X importtime, one run):")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        imports = heaviest_imports(args.data_dir or tmp, 12)
    for us, name in imports:
        print(f"  {us / 1000:7.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
