"""run_command: one shell command, run to its end (or its timeout) with its output captured.

``/bin/sh -c`` (``cmd /c`` on Windows) in ``cwd``, in its own process group, with stdin
closed, the allow-listed environment of ``sidecar/children/env.py`` and nothing else (no
configured env: a command's secrets are the ones it is given in its text), and
stdout+stderr captured up to ``max_capture`` bytes (the rest counted, not kept).

Must stay true: when the command ends (exit, cancellation or timeout, a cancellation
that came while the process was starting included) its whole group is killed (SIGKILL) before this returns, so background children (``sleep 60 &``) do not
outlive it; the final reap is time-bounded; the child is tracked by
``sidecar.supervision.CHILDREN`` from spawn to reap.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import msgspec

from sidecar.children.env import child_env
from sidecar.children.groups import NEW_GROUP, kill_group
from sidecar.supervision import CHILDREN, SHUTDOWN_CLOCK

__all__ = ["CommandResult", "run_command"]


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    code: int | None
    """The exit code (None when it had to be killed and was not reaped in time)."""
    output: str
    """stdout and stderr as they interleaved, decoded (invalid UTF-8 replaced)."""
    dropped: int
    """Bytes of output beyond ``max_capture``, not kept."""
    timed_out: bool


async def run_command(command: str, cwd: Path, timeout: float, *, max_capture: int) -> CommandResult:
    """Run ``command`` in ``cwd``; killed (whole group) on cancellation or after ``timeout``."""
    argv = ["cmd", "/c", command] if sys.platform == "win32" else ["/bin/sh", "-c", command]
    # shielded: a cancellation arriving while the process starts must find it started
    # and tracked (then killed below), never a running child nobody holds
    with anyio.CancelScope(shield=True):
        process = await anyio.open_process(
            argv,
            cwd=str(cwd),
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=NEW_GROUP,
        )
        CHILDREN.add(process.pid, "workspace command", group=NEW_GROUP)
    kept = bytearray()
    dropped = 0
    timed_out = False
    try:
        with anyio.move_on_after(timeout) as scope:
            assert process.stdout is not None
            async for chunk in process.stdout:
                room = max_capture - len(kept)
                kept += chunk[:room]
                dropped += max(0, len(chunk) - room)
            await process.wait()
        timed_out = scope.cancelled_caught
    finally:
        with anyio.CancelScope(shield=True):
            # on POSIX the group is killed even when the shell already exited: a background
            # child keeps the group alive and must not outlive the command
            if NEW_GROUP or process.returncode is None:
                kill_group(process)
            # aclose closes the pipes and reaps; the bound keeps a wedged reap from hanging us
            with anyio.move_on_after(SHUTDOWN_CLOCK.bound(5)):
                await process.aclose()
            if process.returncode is not None:
                CHILDREN.discard(process.pid)
    return CommandResult(
        code=process.returncode, output=kept.decode("utf-8", errors="replace"), dropped=dropped, timed_out=timed_out
    )
