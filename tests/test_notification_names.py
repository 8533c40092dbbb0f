"""Notification method names live in protocol/ (and sidecar/bindings.py) only.

A service sends ``await notify(SESSION_UPDATED, session)`` with a Notification of
protocol/notifications.py, which carries the name and the params type (mypy checks the
payload); a name spelled out anywhere else in sidecar/ is a call site mypy cannot see.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import typing
from pathlib import Path


from protocol.common import Notification
from protocol.methods import NOTIFICATIONS
from protocol.notification_names import SERVER_NOTIFICATIONS
from protocol import notifications

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {ROOT / "sidecar" / "bindings.py"}


def test_no_notification_name_is_spelled_out_in_sidecar() -> None:
    names = set(NOTIFICATIONS)
    found = []
    for path in sorted((ROOT / "sidecar").rglob("*.py")):
        if path in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "notification names outside protocol/:\n" + "\n".join(found)


def test_the_table_is_the_notifications_declared() -> None:
    declared = [getattr(notifications, name) for name in notifications.__all__ if name not in ("CORE", "DOMAINS", "SENT")]
    assert all(isinstance(note, Notification) for note in declared)
    assert list(notifications.SENT) == declared
    sent = {name for name, spec in NOTIFICATIONS.items() if spec.direction == "server->client"}
    assert sent == {note.method for note in notifications.SENT} == set(SERVER_NOTIFICATIONS)
    for note in notifications.SENT:
        assert NOTIFICATIONS[note.method] is note.spec


def test_each_notification_is_typed_with_its_params() -> None:
    hints = typing.get_type_hints(notifications)
    for name in notifications.__all__:
        if name in ("CORE", "DOMAINS", "SENT"):
            continue
        note = getattr(notifications, name)
        (declared,) = typing.get_args(hints[name])
        assert declared == note.spec.params, f"{name}: annotated {declared}, table says {note.spec.params}"


def test_mypy_refuses_a_payload_of_another_type(tmp_path: Path) -> None:
    """The point of the Notifier: the wrong params for a notification is a type error."""
    sender = tmp_path / "sender.py"
    sender.write_text(
        "from protocol.notifications import SESSION_UPDATED, TASK_FIRED\n"
        "from protocol.tasks import TaskRun\n"
        "from protocol.types import SessionV2\n"
        "from sidecar.notify import Notifier\n"
        "\n"
        "async def send(notify: Notifier, session: SessionV2, run: TaskRun) -> None:\n"
        "    await notify(SESSION_UPDATED, session)\n"
        "    await notify(TASK_FIRED, run)\n"
        "    await notify(SESSION_UPDATED, run)\n"
        "    await notify(TASK_FIRED, session)\n"
        "    await notify('chat:session:updated', session)\n"
    )
    # in a subprocess: mypy raises the interpreter's recursion limit, which would change what
    # later tests in this worker see (msgspec's depth limit, the wire's nesting bounds)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, "--follow-imports=silent", str(sender)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    out, err, status = done.stdout, done.stderr, done.returncode
    refused = sorted(int(line.split(":")[1]) for line in out.splitlines() if line.startswith(str(sender)))
    assert status == 1 and refused == [9, 10, 11], out + err
