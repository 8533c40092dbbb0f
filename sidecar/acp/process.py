"""AgentProcess: one ACP engine subprocess, from spawn to a reaped exit.

``spawn_agent(spec)`` is an async context manager: inside it the child runs with its
stdin/stdout as pipes for JSON-RPC and its stderr drained into our log; leaving it (for
any reason, cancellation included) ends the child and waits for it.

Must stay true (DESIGN.md section 5, acp-notes "Process pitfalls"):
- the child never inherits our stdout (fd 1 is the wire): stdin, stdout and stderr are
  always pipes;
- its stderr is always read, whatever the agent writes (megabytes of logs must not block
  it); lines go to the ``sidecar.acp.agent`` logger, at most ``STDERR_LOG_BUDGET`` bytes per
  ``STDERR_WINDOW_S`` window (the rest is counted and reported), and the last few KiB are
  kept for error messages;
- its environment is a short allow-list of ours (PATH, HOME, locale...) plus the engine's
  configured ``env``, passed explicitly; env values are never logged (``EngineSpec.__repr__``);
- shutdown: close stdin -> wait -> SIGTERM -> wait -> SIGKILL -> wait, each wait bounded,
  all shielded from cancellation; the child is always reaped (no zombie). On POSIX the
  child leads its own process group, so what it spawned is signalled with it and leftovers
  of an engine that exited are killed too.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from sidecar.acp.lines import JsonLines
from sidecar.errors import ProviderError
from sidecar.supervision import CHILDREN, SHUTDOWN_CLOCK

log = logging.getLogger(__name__)
agent_log = logging.getLogger("sidecar.acp.agent")

STDERR_LOG_BUDGET = 256 * 1024
STDERR_WINDOW_S = 10.0
STDERR_TAIL = 4096
STDERR_LINE_MAX = 2000
MAX_LINE_BYTES = 64 * 1024 * 1024
"""ACP lines carry file contents and images: tens of MB must fit (acp-notes)."""

_INHERITED_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ",
)
_INHERITED_ENV_WINDOWS = (
    "PATH", "PATHEXT", "SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "TEMP", "TMP",
    "USERPROFILE", "APPDATA", "LOCALAPPDATA", "PROGRAMDATA", "HOMEDRIVE", "HOMEPATH", "USERNAME",
)


class EngineSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to run one engine. ``env`` holds secrets: it is never logged or repr'd."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd: str | None = None
    shutdown_timeout_s: float = 2.0
    """Each of the three shutdown waits (after closing stdin, after SIGTERM, after SIGKILL)."""

    def __repr__(self) -> str:
        return f"EngineSpec(name={self.name!r}, command={self.command!r}, env keys={sorted(self.env)})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list every field, env values included (rich, pretty-printers)
        return [("name", self.name), ("command", self.command), ("env_keys", sorted(self.env))]


def child_env(configured: dict[str, str]) -> dict[str, str]:
    names = _INHERITED_ENV_WINDOWS if sys.platform == "win32" else _INHERITED_ENV
    env = {k: os.environ[k] for k in names if k in os.environ}
    env.update(configured)
    return env


class AgentProcess:
    """A running child: ``stdin`` / ``stdout`` for the JSON-RPC peer, and ``json_lines``, the
    filter stage its stdout must be read through (``LineReader(stdout, MAX_LINE_BYTES,
    line_filter=json_lines)``: junk lines dropped, fast-path notifications handed over)."""

    def __init__(self, process: anyio.abc.Process, spec: EngineSpec) -> None:
        self.process = process
        self.spec = spec
        assert process.stdin is not None and process.stdout is not None
        self.stdin: anyio.abc.ByteSendStream = process.stdin
        self.stdout: anyio.abc.ByteReceiveStream = process.stdout
        self.json_lines = JsonLines(spec.name, max_line_bytes=MAX_LINE_BYTES)
        self.exited = anyio.Event()
        self.stderr_tail = bytearray()
        self._group = sys.platform != "win32"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def last_stderr_line(self) -> str:
        lines = [ln for ln in self.stderr_tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""

    def describe_exit(self) -> str:
        code = self.process.returncode
        if code is None:
            what = "stopped answering"
        elif code < 0:
            try:
                what = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                what = f"was killed by signal {-code}"
        else:
            what = f"exited with code {code}"
        tail = self.last_stderr_line()
        return f"the agent engine {self.spec.name!r} {what}" + (f" (stderr: {tail})" if tail else "")

    # -- tasks -----------------------------------------------------------------------

    async def _watch_exit(self) -> None:
        try:
            await self.process.wait()
        finally:
            self.exited.set()

    async def _drain_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        partial = bytearray()
        window_start = time.monotonic()
        logged = 0
        suppressed = 0
        try:
            async for chunk in stream:
                self.stderr_tail += chunk
                if len(self.stderr_tail) > STDERR_TAIL:
                    del self.stderr_tail[: len(self.stderr_tail) - STDERR_TAIL]
                partial += chunk
                if b"\n" not in chunk:
                    if len(partial) > STDERR_LINE_MAX * 4:  # one endless line: log what we have
                        lines, partial = [bytes(partial)], bytearray()
                    else:
                        continue
                else:
                    *lines, rest = bytes(partial).split(b"\n")
                    partial = bytearray(rest)
                now = time.monotonic()
                if now - window_start >= STDERR_WINDOW_S:
                    if suppressed:
                        agent_log.info("%s: %d bytes of stderr not logged (rate limit)", self.spec.name, suppressed)
                    window_start, logged, suppressed = now, 0, 0
                for line in lines:
                    if logged >= STDERR_LOG_BUDGET:
                        suppressed += len(line) + 1
                        continue
                    logged += len(line) + 1
                    text = line[:STDERR_LINE_MAX].decode("utf-8", "replace").rstrip()
                    if text:
                        agent_log.info("%s: %s", self.spec.name, text)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        if partial.strip():
            agent_log.info("%s: %s", self.spec.name, partial[:STDERR_LINE_MAX].decode("utf-8", "replace"))
        if suppressed:
            agent_log.info("%s: %d bytes of stderr not logged (rate limit)", self.spec.name, suppressed)

    # -- shutdown --------------------------------------------------------------------

    async def terminate(self) -> None:
        """close stdin -> wait -> SIGTERM -> wait -> SIGKILL -> wait (each bounded); shielded."""
        grace = max(0.05, self.spec.shutdown_timeout_s)
        with anyio.CancelScope(shield=True):
            try:
                await self.stdin.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            steps: list[signal.Signals | None] = [None, signal.SIGTERM]
            if self._group:
                steps.append(signal.SIGKILL)
            for index, sig in enumerate(steps):
                if self.exited.is_set():
                    break
                if sig is not None:
                    log.info("engine %s (pid %s) still running: sending %s", self.spec.name, self.pid, sig.name)
                    self._signal(sig)
                # at shutdown the remaining steps share what is left of the deadline
                with anyio.move_on_after(SHUTDOWN_CLOCK.share(grace, len(steps) - index + 1)):
                    await self.exited.wait()
            if not self.exited.is_set():
                try:
                    self.process.kill()
                except ProcessLookupError:
                    pass
                with anyio.move_on_after(SHUTDOWN_CLOCK.bound(grace)):
                    await self.exited.wait()
            if not self.exited.is_set():
                log.error("engine %s (pid %s) did not exit after SIGKILL", self.spec.name, self.pid)
            elif self._group:
                self._kill_leftovers()

    def _signal(self, sig: signal.Signals) -> None:
        try:
            if self._group:
                os.killpg(self.pid, sig)
            else:
                self.process.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill_leftovers(self) -> None:
        # The engine is gone; anything still in its process group is an orphan of it.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@asynccontextmanager
async def spawn_agent(spec: EngineSpec) -> AsyncIterator[AgentProcess]:
    """Run the engine for the duration of the block; it is ended and reaped on exit."""
    cwd = spec.cwd
    if cwd is not None and not Path(cwd).is_dir():
        raise ProviderError(f"cannot start the agent engine {spec.name!r}: working directory {cwd!r} does not exist")
    try:
        process = await anyio.open_process(
            [spec.command, *spec.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=child_env(spec.env),
            start_new_session=sys.platform != "win32",
        )
    except OSError as exc:
        raise ProviderError(
            f"cannot start the agent engine {spec.name!r} ({spec.command!r}): {exc.strerror or exc}"
        ) from exc
    agent = AgentProcess(process, spec)
    CHILDREN.add(process.pid, f"acp engine {spec.name}", group=agent._group)
    log.info("engine %s started (pid %s)", spec.name, process.pid)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent._drain_stderr)
            tg.start_soon(agent._watch_exit)
            try:
                yield agent
            finally:
                await agent.terminate()
                log.info("engine %s (pid %s) ended: %s", spec.name, process.pid, agent.describe_exit())
                # a grandchild may still hold the stderr pipe open: stop reading it
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_CLOCK.bound(spec.shutdown_timeout_s + 1)):
            try:
                await process.aclose()
            except OSError:
                pass
        if process.returncode is not None:
            CHILDREN.discard(process.pid)
