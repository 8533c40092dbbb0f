"""Shared steps of the ACP tests: an acp-engine provider, an ACP session, process checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from chat_helpers import wait_final
from sidecar_proc import ROOT, SidecarProcess

AGENT = ROOT / "fixtures" / "acp" / "scripted_agent.py"


async def add_engine(
    proc: SidecarProcess,
    *flags: str,
    pid_file: Path | None = None,
    name: str = "Scripted agent",
    command: list[str] | None = None,
    **engine: Any,
) -> dict[str, Any]:
    """Register an acp-engine provider running the scripted agent with ``flags``."""
    args = [str(AGENT), *flags]
    if pid_file is not None:
        args += ["--pid-file", str(pid_file)]
    cmd = command or [sys.executable, *args]
    config = {"command": cmd[0], "args": cmd[1:], **engine}
    return await proc.call("provider:upsert", {"name": name, "type": "acp-engine", "engine": config})


async def acp_session(proc: SidecarProcess, provider_id: str, **extra: Any) -> dict[str, Any]:
    return await proc.call(
        "chat:session:create", {"mode": "acp", "providerId": provider_id, "modelId": "agent", **extra}
    )


async def send_and_wait(proc: SidecarProcess, session_id: str, text: str, timeout: float = 20) -> tuple[dict[str, Any], dict[str, Any]]:
    """chat:send; returns (send result, final event)."""
    sent = await proc.call("chat:send", {"sessionId": session_id, "input": {"content": text}})
    final = await wait_final(proc, sent["messageId"], timeout=timeout)
    return sent, final


async def stored(proc: SidecarProcess, session_id: str, message_id: str) -> dict[str, Any]:
    messages = await proc.call(
        "chat:messages:get", {"sessionId": session_id, "options": {"allBranches": True, "includeAcpParts": True}}
    )
    return next(m for m in messages if m["id"] == message_id)


def pids(pid_file: Path) -> list[int]:
    if not pid_file.exists():
        return []
    return [int(line) for line in pid_file.read_text().split() if line.strip()]


def process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, Z...) or None when it does not exist (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


async def assert_gone(pid_list: list[int], timeout: float = 10) -> None:
    """Every pid has exited and been reaped (no zombie, nothing running)."""
    if not Path("/proc").is_dir():  # not Linux: fall back to a signal probe
        for pid in pid_list:
            with anyio.fail_after(timeout):
                while True:
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    await anyio.sleep(0.05)
        return
    with anyio.fail_after(timeout):
        for pid in pid_list:
            while process_state(pid) is not None:
                await anyio.sleep(0.05)  # polling /proc: there is no event for "reaped"


def alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")
