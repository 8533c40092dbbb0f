"""ChildProcess: one long-lived child speaking JSON-RPC on its stdin/stdout (an ACP agent
engine, an MCP stdio server), from spawn to a reaped exit.

``spawn_child(spec)`` is an async context manager: inside it the child runs with its
stdin/stdout as pipes for JSON-RPC and its stderr drained into our log; leaving it (for
any reason, cancellation included) ends the child and waits for it.

Must stay true (DESIGN.md section 5, acp-notes "Process pitfalls"):
- the child never inherits our stdout (fd 1 is the wire): stdin, stdout and stderr are
  always pipes;
- its stderr is always read, whatever the child writes (megabytes of logs must not block
  it); lines go to the ``sidecar.children.stderr`` logger, at most ``STDERR_LOG_BUDGET``
  bytes per ``STDERR_WINDOW_S`` window (the rest is counted and reported), and the last
  few KiB are kept for error messages;
- its environment is ``sidecar.children.env.child_env(spec.env)``: the allow-list plus
  the child's configured ``env``, passed explicitly; env values are never logged
  (``ChildSpec.__repr__``);
- shutdown: close stdin -> wait -> SIGTERM -> wait -> SIGKILL -> wait, each wait bounded,
  all shielded from cancellation (and so is the start: a cancellation that comes while
  the process starts stops it like any other); the child is always reaped (no zombie).
  On POSIX the child leads its own process group, so what it spawned is signalled with
  it and leftovers of a child that exited are killed too.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from sidecar.children.env import child_env
from sidecar.children.groups import NEW_GROUP, kill_group, signal_group
from sidecar.children.lines import JsonLines
from sidecar.errors import ProviderError
from sidecar.supervision import CHILDREN, SHUTDOWN_CLOCK

__all__ = ["ChildSpec", "ChildProcess", "ChildStartError", "spawn_child", "MAX_LINE_BYTES"]

log = logging.getLogger(__name__)
stderr_log = logging.getLogger("sidecar.children.stderr")

STDERR_LOG_BUDGET = 256 * 1024
STDERR_WINDOW_S = 10.0
STDERR_TAIL = 4096
STDERR_LINE_MAX = 2000
MAX_LINE_BYTES = 64 * 1024 * 1024
"""ACP lines carry file contents and images: tens of MB must fit (acp-notes)."""


class ChildStartError(ProviderError):
    """The child could not be started (no such command, not executable, no working dir)."""


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to run one child. ``env`` holds secrets: it is never logged or repr'd."""

    name: str
    kind: str
    """What the child is, for messages: "agent engine", "MCP server"."""
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    """The child's configured environment, laid over the allow-list (sidecar/children/env.py)."""
    cwd: str | None = None
    shutdown_timeout_s: float = 2.0
    """Each of the three shutdown waits (after closing stdin, after SIGTERM, after SIGKILL)."""

    def __repr__(self) -> str:
        return f"ChildSpec(name={self.name!r}, command={self.command!r}, env keys={sorted(self.env)})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list every field, env values included (rich, pretty-printers)
        return [("name", self.name), ("command", self.command), ("env_keys", sorted(self.env))]


class ChildProcess:
    """A running child: ``stdin`` / ``stdout`` for the JSON-RPC peer, and ``json_lines``, the
    filter stage its stdout must be read through (``LineReader(stdout, MAX_LINE_BYTES,
    line_filter=json_lines)``: junk lines dropped, fast-path notifications handed over)."""

    def __init__(self, process: anyio.abc.Process, spec: ChildSpec) -> None:
        self.process = process
        self.spec = spec
        assert process.stdin is not None and process.stdout is not None
        self.stdin: anyio.abc.ByteSendStream = process.stdin
        self.stdout: anyio.abc.ByteReceiveStream = process.stdout
        self.json_lines = JsonLines(spec.name, max_line_bytes=MAX_LINE_BYTES)
        self.exited = anyio.Event()
        self.stderr_tail = bytearray()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def _last_stderr_line(self) -> str:
        lines = [ln for ln in self.stderr_tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""

    def exit_reason(self) -> str:
        """How it ended ("exited with code 3", "was killed by SIGKILL"; "stopped answering"
        while it runs), with its last stderr line."""
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
        tail = self._last_stderr_line()
        return what + (f" (stderr: {tail})" if tail else "")

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
                        stderr_log.info("%s: %d bytes of stderr not logged (rate limit)", self.spec.name, suppressed)
                    window_start, logged, suppressed = now, 0, 0
                for line in lines:
                    if logged >= STDERR_LOG_BUDGET:
                        suppressed += len(line) + 1
                        continue
                    logged += len(line) + 1
                    text = line[:STDERR_LINE_MAX].decode("utf-8", "replace").rstrip()
                    if text:
                        stderr_log.info("%s: %s", self.spec.name, text)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        if partial.strip():
            stderr_log.info("%s: %s", self.spec.name, partial[:STDERR_LINE_MAX].decode("utf-8", "replace"))
        if suppressed:
            stderr_log.info("%s: %d bytes of stderr not logged (rate limit)", self.spec.name, suppressed)

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
            if NEW_GROUP:
                steps.append(signal.SIGKILL)
            for index, sig in enumerate(steps):
                if self.exited.is_set():
                    break
                if sig is not None:
                    log.info("%s %s (pid %s) still running: sending %s", self.spec.kind, self.spec.name, self.pid, sig.name)
                    signal_group(self.process, sig)
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
                log.error("%s %s (pid %s) did not exit after SIGKILL", self.spec.kind, self.spec.name, self.pid)
            elif NEW_GROUP:
                # the child is gone; anything still in its process group is an orphan of it
                kill_group(self.process)


@asynccontextmanager
async def spawn_child(spec: ChildSpec) -> AsyncIterator[ChildProcess]:
    """Run the child for the duration of the block; it is ended and reaped on exit.
    ChildStartError when it cannot be started."""
    cwd = spec.cwd
    if cwd is not None and not Path(cwd).is_dir():
        raise ChildStartError(f"cannot start the {spec.kind} {spec.name!r}: working directory {cwd!r} does not exist")
    # shielded: a cancellation arriving while the process starts must find it started
    # and tracked (then stopped below), never a running child nobody holds
    with anyio.CancelScope(shield=True):
        try:
            process = await anyio.open_process(
                [spec.command, *spec.args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=child_env(spec.env),
                start_new_session=NEW_GROUP,
            )
        except OSError as exc:
            raise ChildStartError(
                f"cannot start the {spec.kind} {spec.name!r} ({spec.command!r}): {exc.strerror or exc}"
            ) from exc
        CHILDREN.add(process.pid, f"{spec.kind} {spec.name}", group=NEW_GROUP)
    child = ChildProcess(process, spec)
    log.info("%s %s started (pid %s)", spec.kind, spec.name, process.pid)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(child._drain_stderr)
            tg.start_soon(child._watch_exit)
            try:
                yield child
            finally:
                await child.terminate()
                log.info("%s %s (pid %s) ended: %s", spec.kind, spec.name, process.pid, child.exit_reason())
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
