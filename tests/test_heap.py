"""sidecar/heap.py: once frozen, what the start-up made is out of the collector's oldest
generation (what a full collection walks), in a fresh interpreter of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import gc, json
import sidecar.server  # the start-up's imports: modules, classes, functions
from sidecar.heap import freeze_startup
before = len(gc.get_objects(generation=2)) + len(gc.get_objects(generation=1)) + len(gc.get_objects(generation=0))
frozen = freeze_startup()
after = len(gc.get_objects(generation=2))
print(json.dumps({"before": before, "frozen": frozen, "after": after}))
"""


def test_freezing_takes_the_start_up_out_of_the_oldest_generation() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["before"] > 10_000  # the imports alone
    assert counts["frozen"] >= counts["before"]
    assert counts["after"] < counts["before"] // 100
