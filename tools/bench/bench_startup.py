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

``--then REV`` (repeatable) also times the sidecar of git revision REV (``git archive``, bytecode
compiled, its own data dir of the same sessions made by its own store) in every run, right
after today's: a before/after figure from one run, which machine noise cannot fake as the
comparison of two separate runs can. ``--record`` (with ``--then``) records the figures
docs/lifecycle.md quotes (tools/bench/figures.py), against the first ``--then`` revision.

    python3 dev.py bench bench_startup [--runs N] [--sessions 1000] [--then REV ...] [--record]
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

from revisions import unpack_revision  # noqa: E402

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


def time_sidecar(data_dir: str, initialize: bytes = INITIALIZE, tree: Path = ROOT) -> tuple[float, float]:
    """(spawn -> initialize answer, spawn -> list answer) in seconds, of the sidecar in ``tree``."""
    env = dict(os.environ, CHAT_SIDECAR_LOG_LEVEL="WARNING", CHAT_SIDECAR_KEYCHAIN="off", PYTHONPATH=str(tree))
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "--data-dir", data_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tree,
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


MAKE_SESSIONS = """
import sys
from protocol.sessions import CreateSessionOptions
from sidecar.store.store import Store

store = Store(sys.argv[1])
try:
    with store.transaction():
        for i in range(int(sys.argv[2])):
            store.sessions.create(CreateSessionOptions(title=f"Session {i}", provider_id="p", model_id="m"))
finally:
    store.close()
"""


def make_sessions(data_dir: str, count: int, tree: Path = ROOT) -> None:
    """A data dir of ``count`` sessions, made by the store of ``tree`` (its own schema)."""
    subprocess.run([sys.executable, "-c", MAKE_SESSIONS, data_dir, str(count)], check=True, cwd=tree,
                   env=dict(os.environ, PYTHONPATH=str(tree)), timeout=300)


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
    parser.add_argument("--then", metavar="REV", action="append", default=[],
                        help="also time the sidecar of this git revision, in the same runs (repeatable)")
    parser.add_argument("--record", action="store_true",
                        help="record the figures docs/lifecycle.md quotes (tools/bench/figures.py; needs --then)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        trees = {"now": ROOT}
        for rev in args.then:
            try:
                trees[rev] = unpack_revision(rev, Path(scratch) / f"then-{len(trees)}")
            except (OSError, subprocess.SubprocessError) as exc:
                print(f"the sidecar at {rev} is not timed: git archive failed ({exc})")
        dirs = {}
        for label, tree in trees.items():
            # Bytecode compiled first, as in an installed app or the bundle: with
            # PYTHONDONTWRITEBYTECODE (set on some machines) every spawn would compile the
            # sources changed since the last bytecode was written, and measure the compiler.
            compileall.compile_dir(str(tree / "sidecar"), quiet=1)
            compileall.compile_dir(str(tree / "protocol"), quiet=1)
            dirs[label] = os.path.join(scratch, f"data-{len(dirs)}")
            make_sessions(dirs[label], args.sessions, tree)
            time_sidecar(dirs[label], tree=tree)  # warm-up: migrations done, the OS file cache filled
        time_baseline()
        runs: dict[str, tuple[list[float], list[float], list[float]]] = {label: ([], [], []) for label in trees}
        baseline_runs: list[float] = []
        for _ in range(args.runs):  # interleaved, so machine noise hits all alike
            baseline_runs.append(time_baseline())
            for label, tree in trees.items():
                init_runs, list_runs, keyed_runs = runs[label]
                first, listed = time_sidecar(dirs[label], tree=tree)
                init_runs.append(first)
                list_runs.append(listed)
                keyed_runs.append(time_sidecar(dirs[label], INITIALIZE_WITH_KEY, tree)[0])
        imports = heaviest_imports(dirs["now"], 12)
    init_runs, list_runs, keyed_runs = runs["now"]
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
    for label in trees:
        if label == "now":
            continue
        print(f"the sidecar at {label}, in the same runs (now / then):")
        for name, ours, theirs in zip(("initialize", "first list", "with secretKey"), runs["now"], runs[label]):
            then = statistics.median(theirs) * 1000
            print(f"  {name:15s} median {then:7.1f} ms  (min {min(theirs) * 1000:.1f})  {then / base:5.2f}x"
                  f"   now/then {statistics.median(ours) * 1000 / then:5.2f}")
    then_rev = next((label for label in trees if label != "now"), None)
    if args.record and then_rev is not None:
        import figures

        medians = {label: [statistics.median(r) * 1000 for r in runs[label]] for label in trees}
        now_init, now_list, now_keyed = medians["now"]
        recorded = {
            "startup.baseline": f"{base:.0f} ms",
            "startup.init": f"{now_init:.0f} ms ({now_init / base:.2f}x)",
            "startup.list": f"{now_list:.0f} ms",
            "startup.keyed": f"{now_keyed:.0f} ms",
            "startup.then": then_rev,
            "startup.load": figures.load_average(),
        }
        for name, ours, theirs in zip(("init", "list", "keyed"), medians["now"], medians[then_rev]):
            recorded[f"startup.then.{name}"] = f"{ours / theirs:.2f}"
        figures.record("bench_startup", recorded,
                       command=f"python3 dev.py bench bench_startup --runs {args.runs} --then {then_rev} --record")
    elif args.record:
        print("nothing recorded: --record compares with a --then revision")
    print("heaviest top-level imports before the first list answer (python -X importtime, one run):")
    for us, name in imports:
        print(f"  {us / 1000:7.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
