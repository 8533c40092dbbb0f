"""Process groups: on POSIX every child we start leads its own (``start_new_session``), so a
signal to the group also reaches what the child started (a shell's background job, an
agent's tool processes). Windows has no groups: the child alone is signalled.

Owns ``NEW_GROUP`` (the ``start_new_session`` flag every spawn passes), ``signal_group``
and ``kill_group``. A child that is gone already, or a group we may not signal, is not an
error: stopping is best effort, reaping is the caller's (bounded) job.
"""

from __future__ import annotations

import os
import signal
import sys

import anyio.abc

__all__ = ["NEW_GROUP", "signal_group", "kill_group"]

NEW_GROUP = sys.platform != "win32"
"""Children lead their own process group (POSIX)."""


def signal_group(process: anyio.abc.Process, sig: signal.Signals) -> None:
    """``sig`` to the child's whole group (POSIX), else to the child."""
    try:
        if NEW_GROUP:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(process: anyio.abc.Process) -> None:
    """SIGKILL the child's group (POSIX: also after the leader exited, for what it left
    running), else kill the child."""
    if NEW_GROUP:
        signal_group(process, signal.SIGKILL)
        return
    try:
        process.kill()
    except ProcessLookupError:
        pass
