"""Process supervision: the sidecar exits when its parent asks or dies, and leaves no child.

Owns three things, one per class:

- ``ChildProcesses`` (the process-wide ``CHILDREN``): every subprocess we start (ACP
  engines, MCP stdio servers, workspace commands) is tracked from spawn to reap. On POSIX
  each child leads its own process group, so killing the group also ends what it started.
  ``kill_all()`` SIGKILLs every tracked group, and on Linux every other direct child found
  in /proc (a library may spawn without telling us). A descendant that leaves its group
  (``setsid``, a daemon's double fork) would escape that: on Linux the process is a child
  subreaper (``adopt_orphans``, called by the process's start), so such a descendant, once
  its parent is gone, becomes our direct child, and ``kill_all`` finds it at exit. Until
  then it runs (a timed-out command's group is killed at once, such a descendant only when
  the sidecar exits), and one that exits before is a zombie of ours until then.
- ``ShutdownClock`` (``SHUTDOWN_CLOCK``): once shutdown begins, every graceful wait of the
  teardown (an engine's stdin close, SIGTERM grace...) asks ``SHUTDOWN_CLOCK.bound(t)`` for its
  timeout, so the graceful path fits the one hard deadline instead of adding up.
- ``Supervisor``: one thread of its own, for the two jobs that must work even when the
  event loop is wedged (a spinning task, a blocking call): it notices the parent's death
  (Linux: PR_SET_PDEATHSIG wakes it at once; everywhere: the parent pid is polled) and
  asks the server to stop, and once shutdown has begun it enforces the hard deadline:
  when the deadline passes it kills the children and ends the process with exit code 0.
  This is the one thread the sidecar starts outside ``anyio.to_thread``: a worker of the
  event loop could not help when the loop itself is stuck.

Must stay true:
- the process exits within ``SHUTDOWN_DEADLINE_S`` (plus one poll interval for a parent
  death) of the stop trigger, whatever its children and tasks are doing;
- a parent that is alive is never taken for dead: PR_SET_PDEATHSIG also fires when the
  parent's *thread* that spawned us exits, so its signal only triggers a check of the
  parent pid, and only a changed parent pid (we were re-parented) counts as death;
- nothing here writes to stdout; the hard exit writes one line to fd 2 directly (the
  logging module's locks may be held by the wedged thread).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

SHUTDOWN_DEADLINE_S = 1.8
"""From the stop trigger (``sidecar:shutdown``, EOF, SIGTERM, the parent's death) to exit."""
PARENT_POLL_S = 0.1
"""How often the parent pid is checked (a parent death is noticed within this)."""
PDEATH_SIGNAL = getattr(signal, "SIGUSR2", None)
"""The signal the Linux kernel sends us when the parent dies (PR_SET_PDEATHSIG)."""
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def linux_prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux: whether it succeeded (False on other systems)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def adopt_orphans() -> bool:
    """Linux: become the child subreaper of everything we start (see ChildProcesses).
    Whether it is now. Called once, by the process's start (never in a test's own process)."""
    return linux_prctl(_PR_SET_CHILD_SUBREAPER, 1)


class ChildProcesses:
    """The subprocesses this process started and has not reaped yet (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, tuple[str, bool]] = {}

    def add(self, pid: int, name: str, *, group: bool) -> None:
        """Track ``pid``; ``group``: it leads its own process group (started with
        ``start_new_session``), which is killed as a whole."""
        with self._lock:
            self._children[pid] = (name, group)

    def discard(self, pid: int) -> None:
        with self._lock:
            self._children.pop(pid, None)

    def tracked(self) -> dict[int, str]:
        with self._lock:
            return {pid: name for pid, (name, _) in self._children.items()}

    def kill_all(self) -> list[int]:
        """SIGKILL every tracked child (its whole group where it leads one) and, on Linux,
        every other direct child. Returns the pids signalled."""
        with self._lock:
            children = dict(self._children)
        killed: list[int] = []
        for pid, (_, group) in children.items():
            if _kill(pid, group=group):
                killed.append(pid)
        for pid in _linux_direct_children():
            if pid not in children and _kill(pid, group=_leads_group(pid)):
                killed.append(pid)
        return killed


def _kill(pid: int, *, group: bool) -> bool:
    try:
        if group and sys.platform != "win32":
            os.killpg(pid, signal.SIGKILL)
        elif sys.platform == "win32":
            os.kill(pid, signal.SIGTERM)  # TerminateProcess on Windows
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        return False
    return True


def _linux_direct_children() -> list[int]:
    """Pids whose parent is this process (Linux /proc; [] elsewhere)."""
    if not sys.platform.startswith("linux"):
        return []
    me = os.getpid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is not None and stat[0] == me and stat[2] != "Z":
            found.append(int(entry))
    return found


def _leads_group(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[1] == pid and pid != os.getpgrp()


def _proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of ``pid`` from /proc/<pid>/stat, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name is in parentheses and may contain spaces or parentheses itself
    tail = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(tail[1]), int(tail[2]), tail[0].decode()
    except (IndexError, ValueError):
        return None


class ShutdownClock:
    """How much of the shutdown deadline is left (infinite before shutdown begins)."""

    MARGIN_S = 0.15
    """Kept back from every bound for what comes after the graceful path (kill, exit)."""

    def __init__(self) -> None:
        self._deadline: float | None = None

    def reset(self) -> None:
        self._deadline = None

    def begin(self, seconds: float) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + seconds

    @property
    def started(self) -> bool:
        return self._deadline is not None

    def remaining(self) -> float:
        if self._deadline is None:
            return math.inf
        return max(0.0, self._deadline - time.monotonic())

    def bound(self, timeout: float) -> float:
        """``timeout``, or less when the shutdown deadline comes sooner."""
        return max(0.0, min(timeout, self.remaining() - self.MARGIN_S))

    def share(self, timeout: float, parts: int) -> float:
        """``timeout`` for one of ``parts`` waits still to come, so all of them fit."""
        return max(0.0, min(timeout, (self.remaining() - self.MARGIN_S) / max(1, parts)))


CHILDREN = ChildProcesses()
SHUTDOWN_CLOCK = ShutdownClock()


class Supervisor:
    """Watches the parent and enforces the shutdown deadline from a thread of its own."""

    def __init__(
        self,
        *,
        deadline_s: float = SHUTDOWN_DEADLINE_S,
        poll_s: float = PARENT_POLL_S,
        children: ChildProcesses = CHILDREN,
        clock: ShutdownClock = SHUTDOWN_CLOCK,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.deadline_s = deadline_s
        self.poll_s = poll_s
        self.children = children
        self.clock = clock
        self._exit_process = exit_process
        self._parent = os.getppid()
        self._parent_handle: int | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_parent_death: Callable[[], None] | None = None
        self.parent_died = False
        self.exit_code = 0
        """What the hard exit exits with (the server's own exit code once it is known)."""

    def start(self, on_parent_death: Callable[[], None]) -> None:
        """Start watching; ``on_parent_death`` is called once, from the watcher thread."""
        self._on_parent_death = on_parent_death
        self.clock.reset()
        self._arm_parent_death_signal()
        if sys.platform == "win32":
            self._parent_handle = _win_open_process(self._parent)
        self._thread = threading.Thread(target=self._run, name="sidecar-supervisor", daemon=True)
        self._thread.start()

    def begin_shutdown(self) -> None:
        """Start the hard deadline (idempotent: the first trigger counts)."""
        self.clock.begin(self.deadline_s)
        self._wake.set()

    def finish(self) -> None:
        """The server has ended: kill the children that are left. The thread goes on
        enforcing the deadline until the interpreter is gone (it is a daemon thread), so
        a thread that blocks interpreter exit cannot keep the process alive."""
        leftovers = self.children.kill_all()
        if leftovers:
            log.warning("killed %d child process(es) left at exit: %s", len(leftovers), leftovers)

    def parent_alive(self) -> bool:
        if sys.platform == "win32":
            return self._parent_handle is None or not _win_exited(self._parent_handle)
        return os.getppid() == self._parent

    def _arm_parent_death_signal(self) -> None:
        if not sys.platform.startswith("linux") or PDEATH_SIGNAL is None:
            return
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread (in-process tests)
        try:
            signal.signal(PDEATH_SIGNAL, lambda signum, frame: self._wake.set())
        except (OSError, ValueError) as exc:
            log.debug("no parent-death signal: %s", exc)
            return
        if not linux_prctl(_PR_SET_PDEATHSIG, int(PDEATH_SIGNAL)):
            log.debug("prctl(PR_SET_PDEATHSIG) failed")

    def _run(self) -> None:
        while True:
            self._wake.wait(self._wait_time())
            self._wake.clear()
            if not self.parent_died and not self.parent_alive():
                self.parent_died = True
                self.begin_shutdown()
                callback = self._on_parent_death
                if callback is not None:
                    try:
                        callback()
                    except Exception:  # the deadline below still ends the process
                        pass
            if self.clock.started and self.clock.remaining() <= 0:
                self._hard_exit()
                return

    def _wait_time(self) -> float:
        if self.clock.started:
            return min(self.poll_s, max(0.005, self.clock.remaining()))
        return self.poll_s

    def _hard_exit(self) -> None:
        killed = self.children.kill_all()
        message = (
            f"chat-sidecar: shutdown did not finish within {self.deadline_s:g} s; "
            f"killed {len(killed)} child process(es) and exiting\n"
        )
        try:
            os.write(2, message.encode())
        except OSError:
            pass
        self._exit_process(self.exit_code)


def _win_open_process(pid: int) -> int | None:
    try:
        import ctypes

        synchronize = 0x00100000
        handle = ctypes.windll.kernel32.OpenProcess(synchronize, False, pid)  # type: ignore[attr-defined]
        return int(handle) or None
    except (OSError, AttributeError):
        return None


def _win_exited(handle: int) -> bool:
    import ctypes

    wait_object_0 = 0
    return int(ctypes.windll.kernel32.WaitForSingleObject(handle, 0)) == wait_object_0  # type: ignore[attr-defined]
