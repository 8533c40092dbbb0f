"""The process's own stdin/stdout as anyio byte streams, with fd 1 guarded.

``take_stdio()`` must run once, before anything else can print: it duplicates the real
stdin/stdout file descriptors for the wire, then points fd 0 at the null device and fd 1
at stderr (and ``sys.stdout`` at ``sys.stderr``). After that a stray ``print``, a C
library writing to fd 1, or a child process inheriting our descriptors cannot corrupt
the protocol or steal its input; only the returned streams reach the real pipes.

How the streams wait (what must stay true: the event loop never blocks on the wire):
- POSIX pipes, sockets and terminals: non-blocking fds polled with ``anyio.wait_readable``
  / ``wait_writable`` (restored to blocking mode on close);
- regular files (``< requests.ndjson``): plain reads and writes, which never block long;
- Windows, or an output pipe shared with stderr (``2>&1``, where non-blocking mode would
  leak into the log stream): blocking calls in a worker thread
  (``anyio.to_thread.run_sync``). A read blocked in a thread cannot be interrupted, so
  ``uses_blocking_thread()`` tells the caller to end the process with ``os._exit`` once
  everything is written.

Before the event loop runs (the cold start, sidecar/coldstart.py) the streams are used
synchronously: ``read_waiting`` takes what has already arrived without waiting (the
framing's LineReader it is fed to keeps what was not answered, and the server reads on from
that reader), ``write_now`` writes whole.
"""

from __future__ import annotations

import os
import select
import stat
import sys
from typing import NamedTuple

import anyio

READ_SIZE = 65536
_threaded = False


def uses_blocking_thread() -> bool:
    """True if a stdio stream reads in a worker thread that may still be blocked at exit."""
    return _threaded


class _Mode(NamedTuple):
    poll: bool
    """Non-blocking fd + readiness polling."""
    thread: bool
    """Blocking calls in a worker thread."""


def _mode_for(fd: int, *, writing: bool) -> _Mode:
    if os.name == "nt":
        return _Mode(poll=False, thread=True)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return _Mode(poll=False, thread=False)
    if writing and stat.S_ISFIFO(st.st_mode):
        try:
            err = os.fstat(2)
        except OSError:
            err = None
        if err is not None and (err.st_dev, err.st_ino) == (st.st_dev, st.st_ino):
            return _Mode(poll=False, thread=True)
    return _Mode(poll=True, thread=False)


class FdReceiveStream:
    """Reads a file descriptor it owns (closes it on ``aclose``). Not a subclass of anyio's
    ByteReceiveStream: that ABC module costs the first answers ~2 ms; the framing's
    ``ReceiveStream`` names this class beside it (what the peer calls is the same)."""

    def __init__(self, fd: int) -> None:
        global _threaded
        self._fd = fd
        self._mode = _mode_for(fd, writing=False)
        self._was_blocking = True
        if self._mode.poll:
            self._was_blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
        if self._mode.thread:
            _threaded = True
        self._closed = False

    def read_waiting(self) -> bytes:
        """What has already arrived, without waiting: b"" when nothing has (or at end of
        input), and always when reads block in a thread. For use before the event loop."""
        if self._mode.thread:
            return b""
        try:
            return os.read(self._fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return b""

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._mode.thread:
            data = await anyio.to_thread.run_sync(os.read, self._fd, max_bytes, abandon_on_cancel=True)
        else:
            while True:
                try:
                    data = os.read(self._fd, max_bytes)
                    break
                except BlockingIOError:
                    await anyio.wait_readable(self._fd)
            await anyio.lowlevel.checkpoint()
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._mode.poll:
            anyio.notify_closing(self._fd)
            _restore_blocking(self._fd, self._was_blocking)
        if not self._mode.thread:
            # A thread may still be blocked reading it; the fd goes away with the process.
            os.close(self._fd)
        await anyio.lowlevel.checkpoint()


class FdSendStream:
    """Writes a file descriptor it owns (closes it on ``aclose``); like FdReceiveStream,
    not an anyio ABC subclass (the framing's ``SendStream`` names it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._mode = _mode_for(fd, writing=True)
        self._was_blocking = True
        if self._mode.poll:
            self._was_blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
        self._closed = False

    def write_now(self, item: bytes) -> None:
        """Write ``item`` whole before the event loop runs (waiting for room if the pipe is
        full). Raises OSError (BrokenPipeError: the reader is gone)."""
        view = memoryview(item)
        while view:
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                select.select([], [self._fd], [])
                continue
            view = view[written:]

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            if self._mode.thread:
                await anyio.to_thread.run_sync(_write_all, self._fd, item)
                return
            view = memoryview(item)
            while view:
                try:
                    written = os.write(self._fd, view)
                except BlockingIOError:
                    await anyio.wait_writable(self._fd)
                    continue
                view = view[written:]
            await anyio.lowlevel.checkpoint()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._mode.poll:
            anyio.notify_closing(self._fd)
            _restore_blocking(self._fd, self._was_blocking)
        os.close(self._fd)
        await anyio.lowlevel.checkpoint()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _restore_blocking(fd: int, blocking: bool) -> None:
    try:
        os.set_blocking(fd, blocking)
    except OSError:
        pass


def take_stdio() -> tuple[FdReceiveStream, FdSendStream]:
    """Take the real stdin/stdout for the wire and guard fds 0 and 1 (see module doc)."""
    sys.stdout.flush()
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return FdReceiveStream(wire_in), FdSendStream(wire_out)
