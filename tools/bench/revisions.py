"""An earlier revision of the product, unpacked beside this checkout, for a benchmark to
measure in the same run as today's tree (``--then REV`` of bench_startup and bench_retrieval).

``unpack_revision(rev, target)`` writes ``sidecar`` and ``protocol`` of git revision ``rev``
into ``target`` (``git archive``): a child process started with ``cwd`` and ``PYTHONPATH`` at
``target`` imports that revision's ``sidecar`` with this checkout's environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unpack_revision(rev: str, target: Path) -> Path:
    """``sidecar`` and ``protocol`` of git revision ``rev`` of this checkout, unpacked in ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "sidecar", "protocol"], capture_output=True,
                             check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True, timeout=120)
    return target
