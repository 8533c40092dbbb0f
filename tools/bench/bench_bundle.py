#!/usr/bin/env python3
"""The shipped bundle against the virtual environment: size, and start to the first answer.

    python3 dev.py bench bench_bundle [--bundle dist/chat-sidecar] [--runs N] [--build] [--no-record]

Size: the bundle on disk (bytes of its files) and compressed (tar.gz and tar.xz, as an
installer would carry it), against the project's ``.venv`` (with the test extras, what
``dev.py`` makes) and the runtime-only distributions of the bundle's build venv (a venv
needs a Python installed besides, the bundle carries its own).

Start: spawn -> ``sidecar:initialize`` and ``chat:session:list`` written at once (as the
Electron client does) -> the list's answer, for the bundle's launcher and for ``.venv``'s
``python -m sidecar``, alternating, each with a fresh data dir (migrations run: an app's
first start) and with an existing one (every later start). The first run of each is shown
apart (the coldest this can measure without dropping the OS page cache); then the median of
``--runs`` runs and the ratio bundle / venv measured in the same run. The optional parts
(``dist/chat-sidecar-parts/``) are measured too, each on disk and as tar.gz.

The figures docs/bundle.md quotes are recorded (tools/bench/figures.py: figures.json and the
documents' marked figures) unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = (
    b'{"jsonrpc":"2.0","id":1,"method":"sidecar:initialize","params":{"protocolVersion":1}}\n'
    b'{"jsonrpc":"2.0","id":2,"method":"chat:session:list","params":{}}\n'
)
SHUTDOWN = b'{"jsonrpc":"2.0","id":3,"method":"sidecar:shutdown"}\n'


def load_bundle_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bundle_tool", ROOT / "tools" / "bundle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_to_list(command: list[str], data_dir: str) -> float:
    env = dict(os.environ, CHAT_SIDECAR_LOG_LEVEL="WARNING")
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*command, "--data-dir", data_dir],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(REQUESTS)
    proc.stdin.flush()
    elapsed = None
    while elapsed is None:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"{command[0]} closed stdout before answering chat:session:list")
        if json.loads(line).get("id") == 2:
            elapsed = time.perf_counter() - started
    proc.stdin.write(SHUTDOWN)
    proc.stdin.close()
    proc.stdout.read()
    proc.stdout.close()
    if proc.wait(timeout=60) != 0:
        raise SystemExit(f"{command[0]} exited with {proc.returncode}")
    return elapsed


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def compressed_bytes(bundle: Path, mode: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / f"bundle.tar.{mode}"
        with tarfile.open(target, f"w:{mode}") as tf:
            tf.add(bundle, arcname=bundle.name)
        return target.stat().st_size


def runtime_site_packages_bytes(bundle_tool: ModuleType) -> int | None:
    """Bytes of the files of the runtime distributions in the bundle's build venv (no build tools)."""
    python = bundle_tool._venv_python(bundle_tool.BUILD_VENV)
    if not python.exists():
        return None
    info = bundle_tool.build_info(python)
    script = (
        "import json, sys, os\nfrom importlib import metadata\nnames = set(json.loads(sys.argv[1]))\ntotal = 0\n"
        "for d in metadata.distributions():\n"
        "    if (d.metadata['Name'] or '').lower().replace('_', '-') in names:\n"
        "        for f in d.files or []:\n"
        "            p = d.locate_file(f)\n"
        "            if os.path.isfile(p): total += os.path.getsize(p)\n"
        "print(total)\n"
    )
    names = json.dumps([d["name"] for d in info["dists"]])
    done = subprocess.run([str(python), "-c", script, names], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:7.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "dist" / "chat-sidecar")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--build", action="store_true", help="build the bundle first (python3 dev.py bundle)")
    parser.add_argument("--no-record", dest="record", action="store_false", help="leave figures.json and the documents alone")
    args = parser.parse_args()
    bundle_tool = load_bundle_tool()
    if args.build:
        bundle_tool.build(args.bundle.resolve().parent, strip=sys.platform.startswith("linux"))
    bundle = args.bundle.resolve()
    manifest_path = bundle / "bundle.json"
    if not manifest_path.is_file():
        raise SystemExit(f"no bundle at {bundle}: run `python3 dev.py bundle` or pass --build")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    launcher = [str(bundle / manifest["launcher"])]
    venv = [sys.executable, "-m", "sidecar"]

    on_disk = folder_bytes(bundle)
    gz = compressed_bytes(bundle, "gz")
    xz = compressed_bytes(bundle, "xz")
    dev_venv = folder_bytes(Path(sys.prefix)) if sys.prefix != sys.base_prefix else None
    runtime = runtime_site_packages_bytes(bundle_tool)
    print(f"bundle {bundle} ({manifest['platform']}-{manifest['machine']}, Python {manifest['python']}, {manifest['builtWith']})")
    print(f"  size on disk          {mib(on_disk)}  ({sum(1 for p in bundle.rglob('*') if p.is_file())} files)")
    print(f"  compressed tar.gz     {mib(gz)}")
    print(f"  compressed tar.xz     {mib(xz)}")
    print(f"  .venv (test extras)   {mib(dev_venv)}  ratio bundle/.venv {on_disk / dev_venv:.2f}" if dev_venv else "  .venv: not run from a venv")
    if runtime is not None:
        print(f"  runtime packages only {mib(runtime)}  (site-packages of the shipped distributions; no Python)")
    parts_root = bundle.parent / f"{bundle.name}-parts"
    parts = {}
    for folder in sorted(p for p in parts_root.iterdir() if p.is_dir()) if parts_root.is_dir() else []:
        parts[folder.name] = (folder_bytes(folder), compressed_bytes(folder, "gz"))
        print(f"  optional part {folder.name:8} {mib(parts[folder.name][0])} on disk, {mib(parts[folder.name][1])} as tar.gz")

    results: dict[tuple[str, str], list[float]] = {}
    first: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bundle-") as tmp:
        kept = {name: str(Path(tmp) / f"kept-{name}") for name in ("bundle", "venv")}
        for run in range(args.runs + 1):
            for name, command in (("bundle", launcher), ("venv", venv)):
                fresh = str(Path(tmp) / f"fresh-{name}-{run}")
                for kind, data_dir in (("fresh data dir", fresh), ("existing data dir", kept[name])):
                    elapsed = time_to_list(command, data_dir)
                    key = (name, kind)
                    if run == 0:
                        first[key] = elapsed
                    else:
                        results.setdefault(key, []).append(elapsed)

    print(f"start to the first chat:session:list answer (first run, then median of {args.runs}):")
    for kind in ("fresh data dir", "existing data dir"):
        b, v = statistics.median(results[("bundle", kind)]), statistics.median(results[("venv", kind)])
        print(
            f"  {kind:18} bundle {first[('bundle', kind)] * 1000:6.0f} ms, median {b * 1000:6.0f} ms"
            f" | venv {first[('venv', kind)] * 1000:6.0f} ms, median {v * 1000:6.0f} ms | ratio bundle/venv {b / v:.2f}"
        )
    print(f"  load average {figures.load_average()}")
    if args.record:
        medians = {key: statistics.median(values) for key, values in results.items()}
        recorded = {
            "bundle.disk": f"{on_disk / 2**20:.1f} MiB ({on_disk / 1e6:.1f} MB)",
            "bundle.targz": f"{gz / 2**20:.1f} MiB ({gz / 1e6:.1f} MB)",
            "bundle.tarxz": f"{xz / 2**20:.1f} MiB",
            "bundle.venv": mib(dev_venv).strip() if dev_venv else "n/a",
            "bundle.load": figures.load_average(),
        }
        for part, (disk, packed) in parts.items():
            recorded[f"bundle.part.{part}"] = f"{disk / 2**20:.1f} MiB ({packed / 2**20:.1f} MiB as tar.gz)"
        for kind, name in (("fresh data dir", "fresh"), ("existing data dir", "existing")):
            b, v = medians[("bundle", kind)], medians[("venv", kind)]
            recorded[f"bundle.start.{name}"] = f"{b * 1000:.0f} ms against {v * 1000:.0f} ms"
            recorded[f"bundle.ratio.{name}"] = f"{b / v:.2f}"
        figures.record("bench_bundle", recorded, command=f"python3 dev.py bench bench_bundle --runs {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
