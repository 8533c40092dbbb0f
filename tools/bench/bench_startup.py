#!/usr/bin/env python3
"""Cold start: spawn ``python -m sidecar`` -> first ``sidecar:initialize`` answer, and ->
first ``chat:session:list`` answer on a data dir holding 1,000 sessions.

Both requests are written at once, as Electron does (they wait in the pipe). Prints the
medians of N runs (default 20) and the ratios to the baseline measured in the same run,
interleaved: ``python -c "import msgspec, anyio"`` (the interpreter plus the two libraries
the process cannot start without). Goals on a 2-core machine: initialize <= 100 ms,
first list <= 150 ms. Also the handshake README recommends, with the host's ``secretKey``
(it needs the database). Then, with ``python -X importtime``, the heaviest imports on the
way to those answers, so a regression shows where it comes from.

    python3 dev.py bench bench_startup [--runs N] [--sessions 1000]
"""

from __future__ import annotations

import argparse
import base64
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

INITIALIZE = b'{"jsonrpc":"2.0","id":1,"method":"sidecar:initialize","params":{}}\n'
LIST = b'{"jsonrpc":"2.0","id":2,"method":"chat:session:list","params":{"limit":50}}\n'
SHUTDOWN = b'{"jsonrpc":"2.0","id":3,"method":"sidecar:shutdown"}\n'
INITIALIZE_WITH_KEY = (
    b'{"jsonrpc":"2.0","id":1,"method":"sidecar:initialize","params":{"secretKey":"'
    + base64.b64encode(b"k" * 32) + b'"}}\n'
)
"""The handshake README recommends (the host's key from Electron safeStorage): it needs the database."""


def time_baseline() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import msgspec, anyio"], check=True, cwd=ROOT)
    return time.perf_counter() - started


def time_sidecar(data_dir: str, initialize: bytes = INITIALIZE) -> tuple[float, float]:
    """(spawn -> initialize answer, spawn -> list answer) in seconds."""
    env = dict(os.environ, CHAT_SIDECAR_LOG_LEVEL="WARNING", CHAT_SIDECAR_KEYCHAIN="off")
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "--data-dir", data_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(initialize + LIST)
    proc.stdin.flush()
    answers: dict[bytes, float] = {}
    while len(answers) < 2:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("the sidecar closed its output")
        for key in (b'"id":1,', b'"id":2,'):
            if key in line and key not in answers:
                if b'"result"' not in line:
                    raise SystemExit(f"unexpected answer: {line[:200]!r}")
                answers[key] = time.perf_counter() - started
    proc.stdin.write(SHUTDOWN)
    proc.stdin.close()
    proc.stdout.read()
    if proc.wait(timeout=30) != 0:
        raise SystemExit(f"sidecar exited with {proc.returncode}")
    return answers[b'"id":1,'], answers[b'"id":2,']


def make_sessions(data_dir: str, count: int) -> None:
    from protocol.sessions import CreateSessionOptions
    from sidecar.store.store import Store

    store = Store(data_dir)
    try:
        with store.transaction():
            for i in range(count):
                store.sessions.create(CreateSessionOptions(title=f"Session {i}", provider_id="p", model_id="m"))
    finally:
        store.close()


def heaviest_imports(data_dir: str, limit: int) -> list[tuple[int, str]]:
    """Top-level imports made before the first list answer (python -X importtime, one run;
    the services load right after it, so stderr is cut where that answer arrived)."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "sidecar", "--data-dir", data_dir, "--log-level", "WARNING"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=dict(os.environ, CHAT_SIDECAR_WARMUP_MS="60000", CHAT_SIDECAR_KEYCHAIN="off"),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.decode("utf-8", "replace") for line in proc.stderr))
    reader.start()
    proc.stdin.write(INITIALIZE + LIST)
    proc.stdin.flush()
    while b'"id":2,' not in (line := proc.stdout.readline()):
        if not line:
            raise SystemExit("the sidecar closed its output")
    before = len(lines)
    proc.stdin.write(SHUTDOWN)
    proc.stdin.close()
    proc.stdout.read()
    proc.wait(timeout=30)
    reader.join()
    rows: list[tuple[int, str]] = []
    for line in lines[:before]:
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative, name = line.split(":", 1)[1].split("|")
        if name.startswith("  "):  # nested: already counted in its parent's cumulative time
            continue
        rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:limit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args()
    # Bytecode compiled first, as in an installed app or the bundle: with
    # PYTHONDONTWRITEBYTECODE (set on some machines) every spawn would compile the
    # sources changed since the last bytecode was written, and measure the compiler.
    compileall.compile_dir(str(ROOT / "sidecar"), quiet=1)
    compileall.compile_dir(str(ROOT / "protocol"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as data_dir:
        make_sessions(data_dir, args.sessions)
        time_sidecar(data_dir)  # warm-up: migrations done, the OS file cache filled
        time_baseline()
        init_runs: list[float] = []
        list_runs: list[float] = []
        baseline_runs: list[float] = []
        keyed_runs: list[float] = []
        for _ in range(args.runs):  # interleaved, so machine noise hits all alike
            baseline_runs.append(time_baseline())
            first, listed = time_sidecar(data_dir)
            init_runs.append(first)
            list_runs.append(listed)
            keyed_runs.append(time_sidecar(data_dir, INITIALIZE_WITH_KEY)[0])
        imports = heaviest_imports(data_dir, 12)
    base = statistics.median(baseline_runs) * 1000
    init = statistics.median(init_runs) * 1000
    listed = statistics.median(list_runs) * 1000
    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} cpus, {args.runs} runs each, "
          f"{args.sessions} sessions, load {os.getloadavg()[0]:.2f}")
    print(f"baseline  python -c 'import msgspec, anyio'      median {base:7.1f} ms  (min {min(baseline_runs) * 1000:.1f})")
    print(f"sidecar   spawn -> sidecar:initialize answer    median {init:7.1f} ms  (min {min(init_runs) * 1000:.1f})"
          f"  {init / base:5.2f}x  goal <= 100 ms: {'met' if init <= 100 else 'NOT met'}")
    print(f"sidecar   spawn -> first chat:session:list      median {listed:7.1f} ms  (min {min(list_runs) * 1000:.1f})"
          f"  {listed / base:5.2f}x  goal <= 150 ms: {'met' if listed <= 150 else 'NOT met'}")
    keyed = statistics.median(keyed_runs) * 1000
    print(f"sidecar   the same with secretKey (initialize)  median {keyed:7.1f} ms  (min {min(keyed_runs) * 1000:.1f})"
          f"  {keyed / base:5.2f}x")
    print("heaviest top-level imports before the first list answer (python -X importtime, one run):")
    for us, name in imports:
        print(f"  {us / 1000:7.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
