"""The Supervisor's hard deadline and parent watch, in processes of their own.

The deadline is what ends the process when its event loop is wedged: these tests wedge
the main thread on purpose (``time.sleep``) and check that the supervisor's thread still
kills the children (tracked or not) and exits with the server's exit code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from proc_tree import gone, proc_of

from sidecar.supervision import ShutdownClock

ROOT = Path(__file__).resolve().parent.parent

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks /proc")


def test_the_clock_bounds_waits_only_once_shutdown_began() -> None:
    clock = ShutdownClock()
    assert clock.bound(5.0) == 5.0 and clock.share(5.0, 3) == 5.0
    clock.begin(1.0)
    assert 0.0 < clock.bound(5.0) <= 1.0 - clock.MARGIN_S
    assert clock.share(5.0, 4) <= (1.0 - clock.MARGIN_S) / 4 + 1e-9
    clock.begin(100.0)  # the first trigger counts
    assert clock.remaining() <= 1.0


@linux_only
def test_the_deadline_kills_children_and_exits_when_the_main_thread_is_stuck() -> None:
    script = textwrap.dedent(
        """
        import json, subprocess, sys, time
        from sidecar.supervision import CHILDREN, Supervisor
        tracked = subprocess.Popen(["sleep", "60"], start_new_session=True)
        CHILDREN.add(tracked.pid, "tracked", group=True)
        untracked = subprocess.Popen(["sleep", "60"])  # a library's child we were not told of
        supervisor = Supervisor(deadline_s=0.4)
        supervisor.exit_code = 7
        supervisor.start(lambda: None)
        print(json.dumps([tracked.pid, untracked.pid]), flush=True)
        supervisor.begin_shutdown()
        time.sleep(30)  # a wedged event loop: nothing on this thread runs any more
        """
    )
    started = time.monotonic()
    with subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        pids = [proc_of(pid) for pid in json.loads(process.stdout.readline())]
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 7
    assert time.monotonic() - started < 10
    assert b"did not finish within 0.4 s" in stderr
    deadline = time.monotonic() + 10
    while not all(p is None or gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(p is None or gone(p) for p in pids)


@linux_only
def test_a_thread_of_the_parent_ending_is_not_the_parent_dying(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG fires when the spawning *thread* exits: the sidecar must check
    that its parent really is gone before it stops."""
    holder: dict[str, subprocess.Popen[bytes]] = {}

    def spawn() -> None:
        holder["p"] = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "--data-dir", str(tmp_path / "data")],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()  # the spawning thread is gone; the parent process is not
    process = holder["p"]
    try:
        assert process.stdin is not None and process.stdout is not None
        time.sleep(1.0)  # well past the parent poll interval and the death signal
        assert process.poll() is None, "the sidecar stopped though its parent lives"
        process.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"sidecar:initialize","params":{}}\n')
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        process.stdin.close()
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
