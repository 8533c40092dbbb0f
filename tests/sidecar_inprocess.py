"""The real sidecar server as a task of the test's event loop (spawn_sidecar's default mode).

``InProcessServer.run`` serves one client with ``sidecar.server.serve`` over in-memory
byte streams: the same Server, App, JSON-RPC peer and framing module as ``python -m
sidecar``; only the process around it is missing (no stdio guard, no signal handlers,
no cold start before the loop, no Supervisor and its hard exit). ``in_process_config``
builds its Config with ``sidecar.config.build_config`` from the command line and the
environment a subprocess would have been given, and says None when that cannot be
honoured in process (then spawn_sidecar starts a subprocess).

What must stay true:
- the sidecar's log records reach that sidecar's ``stderr`` in the process's own format
  and level (``sidecar.logging_setup``): a handler on the root logger routes each record
  by a context variable set in the server's task, which its tasks and worker threads
  (``anyio.to_thread``) inherit; a record from another thread without it (a library's
  own thread) goes to every running in-process sidecar; the test's own records go nowhere;
- one in-process sidecar at a time (``busy()``; a second one raises NeedsSubprocess): the
  shutdown clock (``sidecar.supervision``) is process-global, so two at once would bound
  each other's shutdown;
- the process-global logging state is restored when the last one ends;
- a server that fails records exit code 1 (its traceback logged to its stderr, like
  ``python -m sidecar``), one cancelled by the test's exit records -9, as a kill would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

if TYPE_CHECKING:
    from sidecar.config import Config

PIPE_CHUNK = 65536
"""What we write to the sidecar arrives in pieces of at most this size, as through a pipe."""
STREAM_BUFFER = 16
"""Chunks in flight each way before a writer waits (a pipe's buffer, roughly)."""
KILLED = -9

class NeedsSubprocess(Exception):
    """What was asked exists only for a real process: run this test's sidecar as one."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} needs the sidecar as a subprocess: mark the test @pytest.mark.sidecar_subprocess "
            "or pass spawn_sidecar(..., subprocess=True) (see tests/sidecar_proc.py)"
        )


_current: ContextVar[InProcessServer | None] = ContextVar("in_process_sidecar", default=None)


def busy() -> bool:
    """An in-process sidecar is running now."""
    return bool(ROUTER.running)


def in_process_env(env: Mapping[str, str]) -> bool:
    """Whether every entry of a test's ``env`` is a setting the in-process config honours."""
    from sidecar.config import ENV_VARS

    honoured = set(ENV_VARS.values()) - {ENV_VARS["secret_key_fd"]}
    return all(key in honoured for key in env)


def in_process_config(data_dir: str | os.PathLike[str], args: Sequence[str], env: Mapping[str, str]) -> Config | None:
    """The Config ``python -m sidecar --data-dir DATA_DIR ARGS`` would run with in ``env``,
    or None when only a process can show what happens (help, a bad command line or
    setting: exit 2; a secret key fd, which is the child's own descriptor)."""
    from sidecar.__main__ import _quick_parse
    from sidecar.config import build_config
    from sidecar.errors import SidecarError

    overrides = _quick_parse(["--data-dir", str(data_dir), *args])
    if overrides is None:
        return None
    try:
        config = build_config(overrides, env)
    except SidecarError:
        return None
    return None if config.secret_key_fd is not None else config


class ChunkedSend(anyio.abc.ByteSendStream):
    """Our end of the sidecar's stdin: a memory stream fed in PIPE_CHUNK pieces."""

    def __init__(self, stream: MemoryObjectSendStream[bytes]) -> None:
        self._stream = stream

    async def send(self, item: bytes) -> None:
        for start in range(0, len(item), PIPE_CHUNK):
            await self._stream.send(item[start : start + PIPE_CHUNK])

    async def aclose(self) -> None:
        await self._stream.aclose()


class InProcessServer:
    """One sidecar server running in this process. ``run`` is its task."""

    def __init__(self, config: Config, on_stderr: Callable[[bytes], None]) -> None:
        self.config = config
        self.level = logging.getLevelNamesMapping()[config.log_level]
        self.returncode: int | None = None
        self._on_stderr = on_stderr
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def streams() -> tuple[tuple[ChunkedSend, MemoryObjectReceiveStream[bytes]],
                           tuple[MemoryObjectReceiveStream[bytes], MemoryObjectSendStream[bytes]]]:
        """``((test_stdin, test_stdout), (server_receive, server_send))``."""
        to_server_send, to_server_receive = anyio.create_memory_object_stream[bytes](STREAM_BUFFER)
        to_test_send, to_test_receive = anyio.create_memory_object_stream[bytes](STREAM_BUFFER)
        return (ChunkedSend(to_server_send), to_test_receive), (to_server_receive, to_test_send)

    async def run(self, receive: MemoryObjectReceiveStream[bytes], send: MemoryObjectSendStream[bytes]) -> None:
        from sidecar.server import serve

        self._loop = asyncio.get_running_loop()
        _current.set(self)  # this task's context: the server's tasks and threads inherit it
        ROUTER.attach(self)
        code = KILLED
        try:
            with self._scope:
                try:
                    await serve(self.config, receive, send)
                    code = 0
                except Exception:
                    logging.getLogger("sidecar").exception("the server failed")
                    code = 1
        finally:
            ROUTER.detach(self)
            with anyio.CancelScope(shield=True):
                await receive.aclose()
                await send.aclose()
            self.returncode = code
            self._done.set()

    def kill(self) -> None:
        self._scope.cancel()

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def write_log(self, data: bytes) -> None:
        """Append to the sidecar's stderr from any thread."""
        loop = self._loop
        if loop is None or _on_loop_thread(loop):
            self._on_stderr(data)
        else:
            try:
                loop.call_soon_threadsafe(self._on_stderr, data)
            except RuntimeError:  # the loop is closed: the test is over
                pass


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _Router(logging.Handler):
    """Routes log records to the stderr of the in-process sidecar they come from."""

    def __init__(self) -> None:
        from sidecar.logging_setup import DATE_FORMAT, FORMAT

        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        self.running: list[InProcessServer] = []
        self._saved: dict[str, int] = {}

    def attach(self, server: InProcessServer) -> None:
        from sidecar.logging_setup import QUIET_BELOW_DEBUG

        self.running.append(server)
        root = logging.getLogger()
        self._saved = {"": root.level, **{name: logging.getLogger(name).level for name in QUIET_BELOW_DEBUG}}
        root.addHandler(self)
        root.setLevel(min(root.getEffectiveLevel(), server.level))
        for name in QUIET_BELOW_DEBUG:  # as setup_logging does in the process
            logging.getLogger(name).setLevel(logging.DEBUG if server.level <= logging.DEBUG else logging.WARNING)

    def detach(self, server: InProcessServer) -> None:
        if server not in self.running:
            return
        self.running.remove(server)
        logging.getLogger().removeHandler(self)
        for name, level in self._saved.items():
            logging.getLogger(name or None).setLevel(level)

    def emit(self, record: logging.LogRecord) -> None:
        server = _current.get()
        if server is not None:
            targets = [server]
        elif threading.current_thread() is not threading.main_thread():
            targets = list(self.running)
        else:
            return  # the test's own code
        line: bytes | None = None
        for target in targets:
            if record.levelno >= target.level:
                if line is None:
                    try:
                        line = (self.format(record) + "\n").encode("utf-8", "replace")
                    except Exception:
                        self.handleError(record)
                        return
                target.write_log(line)


ROUTER = _Router()
