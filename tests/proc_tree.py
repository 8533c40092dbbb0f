"""Processes from /proc (Linux): who descends from a pid, and whether a process is gone.

A process is identified by (pid, start time in clock ticks), so a pid the kernel reused
is not mistaken for the process that had it. Used by every test that checks that nothing
outlives the sidecar.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from pathlib import Path

import anyio

HAS_PROC = Path("/proc/self/stat").exists()

Proc = tuple[int, int]
"""(pid, start time in clock ticks)."""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> set[Proc]:
    """Every live process whose parent chain leads to ``root`` (not ``root`` itself)."""
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                parents[int(entry)] = stat[1]
                starts[int(entry)] = stat[2]
    out: set[Proc] = set()
    for pid in parents:
        seen = pid
        for _ in range(64):
            parent = parents.get(seen)
            if parent is None or parent <= 1:
                break
            if parent == root:
                out.add((pid, starts[pid]))
                break
            seen = parent
    return out


def proc_of(pid: int) -> Proc | None:
    stat = _stat(pid)
    return None if stat is None else (pid, stat[2])


def gone(proc: Proc) -> bool:
    """The process no longer runs (exited and reaped, or a zombie, or its pid was reused)."""
    stat = _stat(proc[0])
    return stat is None or stat[0] == "Z" or stat[2] != proc[1]


async def wait_gone(procs: Collection[Proc], timeout: float = 10.0) -> float:
    """Wait until every process is gone; the monotonic time when the last one went."""
    with anyio.fail_after(timeout):
        while not all(gone(p) for p in procs):
            await anyio.sleep(0.005)  # polling /proc: there is no event for "reaped"
    return time.monotonic()
