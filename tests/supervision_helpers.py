"""Shared steps of the supervision tests and the exit benchmark: put a sidecar in a state
(idle, a reply running a command, a stubborn ACP agent mid-turn...), stop it one of the
four ways a host can (shutdown + EOF, EOF, SIGTERM, the parent's death), and time the exit.

The parent's death is real: ``spawn_sidecar_under(via_parent=True)`` starts the sidecar
through an intermediate process that the test SIGKILLs, while the test itself keeps the
write end of the sidecar's stdin open (so EOF cannot be what ends it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from acp_helpers import acp_session, add_engine
from chat_helpers import configure_provider
from proc_tree import gone, proc_of
from sidecar_proc import SidecarProcess, sidecar_command, spawn_sidecar

TRIGGERS = ("shutdown", "eof", "sigterm", "parent_death")


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def _first_delta(proc: SidecarProcess, message_id: str) -> None:
    await proc.wait_for(
        lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == message_id and m["params"]["type"] in ("text_delta", "tool_call_start"),
        timeout=20,
    )


async def make_busy_reply(proc: SidecarProcess, server: Any, workspace: Path) -> str:
    """A reply whose tool call runs ``sleep 60`` in the workspace (a running reply and a
    running workspace command at once). Returns the reply's message id."""
    await configure_provider(proc, server.base_url)
    session = await proc.call("chat:session:create", {"workspaceDir": str(workspace)})
    await proc.call("tool:policy:set", {"key": "workspace_run_command", "policy": "auto"})
    await server.script(
        {"text": "running it", "tool_calls": [tool_call("c1", "workspace_run_command", {"command": "echo $$ > pid.txt; exec sleep 60"})]}
    )
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "run it"}})
    with anyio.fail_after(20):
        while not (workspace / "pid.txt").exists() or not (workspace / "pid.txt").read_text().strip():
            await anyio.sleep(0.02)
    return str(sent["messageId"])


async def make_stubborn_agent(proc: SidecarProcess, pid_file: Path) -> str:
    """An ACP agent mid-turn that ignores cancel, EOF and SIGTERM (only SIGKILL ends it)."""
    await proc.call("sidecar:initialize", {})
    engine = await add_engine(proc, "--ignore-eof", "--ignore-term", pid_file=pid_file)
    session = await acp_session(proc, engine["id"])
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hang"}})
    await _first_delta(proc, sent["messageId"])
    return str(sent["messageId"])


async def trigger(proc: SidecarProcess, how: str) -> float:
    """Stop the sidecar ``how``; returns the monotonic time of the trigger."""
    if how == "shutdown":
        await proc.call("sidecar:shutdown", {})
        started = time.monotonic()
        await proc.close_stdin()
        return started
    if how == "eof":
        started = time.monotonic()
        await proc.close_stdin()
        return started
    if how == "sigterm":
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        return started
    if how == "parent_death":
        started = time.monotonic()
        proc.process.kill()  # the intermediate parent (SIGKILL: it cannot pass anything on)
        return started
    raise ValueError(how)


_INTERMEDIATE = """
import subprocess, sys, time
child = subprocess.Popen(sys.argv[1:], stdin=0, stdout=1, stderr=2)
sys.stderr.write(f"INTERMEDIATE-CHILD {child.pid}\\n"); sys.stderr.flush()
child.wait()
"""


@asynccontextmanager
async def spawn_sidecar_under(data_dir: Path, *args: str, via_parent: bool) -> AsyncIterator[tuple[SidecarProcess, int]]:
    """A sidecar, directly or through an intermediate parent process; yields it and its pid.

    Through a parent, ``proc`` speaks to the sidecar over pipes the test holds (the
    sidecar inherited them), ``proc.process`` is the parent, and killing the parent
    orphans the sidecar while its stdin stays open.
    """
    command = None
    if via_parent:
        command = [sys.executable, "-c", _INTERMEDIATE, *sidecar_command(data_dir, *args)]
    async with spawn_sidecar(data_dir, *args, command=command, subprocess=True) as proc:
        pid = proc.pid
        if via_parent:
            with anyio.fail_after(20):
                while b"INTERMEDIATE-CHILD " not in proc.stderr:
                    await anyio.sleep(0.01)
            pid = int(bytes(proc.stderr).split(b"INTERMEDIATE-CHILD ", 1)[1].split()[0])
        try:
            yield proc, pid
        finally:
            found = proc_of(pid)
            if via_parent and found is not None and not gone(found):
                os.kill(pid, signal.SIGKILL)

