"""Opening the store: it builds no repository unless a dead process left work behind.

``recovery.left_behind`` decides which crash repairs run at open. These tests hold it to
the repairs themselves: each kind of left-behind row is found, repaired at the next open,
and then no longer found; and an ordinary open (in a fresh interpreter, where nothing else
imported them) loads none of the repository modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from protocol.sessions import CreateSessionOptions
from sidecar.store import recovery
from sidecar.store.db import DB_FILENAME, Database
from sidecar.store.store import Store, open_store
from sidecar.store.tools import ToolRun

ROOT = Path(__file__).resolve().parents[1]

_OPEN_AND_LIST_MODULES = """
import json, sys
from sidecar.store.store import open_store
store = open_store(sys.argv[1])
loaded = sorted(m for m in sys.modules if m.startswith("sidecar.store."))
print(json.dumps({"recovered": store.recovered, "loaded": loaded}))
store.close()
"""

REPOSITORY_MODULES = {
    "sidecar.store.sessions", "sidecar.store.messages", "sidecar.store.search", "sidecar.store.settings",
    "sidecar.store.acp", "sidecar.store.tools", "sidecar.store.citations", "sidecar.store.files",
    "sidecar.store.async_store",
}


def _open_in_fresh_interpreter(data_dir: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _OPEN_AND_LIST_MODULES, str(data_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def _leave_everything_behind(data_dir: Path) -> tuple[str, str]:
    """A store as a process killed mid-reply leaves it: (streaming message id, its session)."""
    store = Store(data_dir)
    try:
        sid = store.sessions.create(CreateSessionOptions(title="s")).id
        user = store.messages.append(sid, role="user", text_content="hi")
        reply = store.messages.append(sid, role="assistant", status="streaming", parent_id=user.id)
        store.tools.begin_run(ToolRun(message_id=reply.id, session_id=sid, provider_id="p", model_id="m"))
        store.acp.append_raw(reply.id, 0, [{"sessionUpdate": "agent_message_chunk"}])
    finally:
        store.close()
    return reply.id, sid


def test_an_ordinary_open_builds_no_repository(tmp_path: Path) -> None:
    store = Store(tmp_path)
    sid = store.sessions.create(CreateSessionOptions(title="s")).id
    store.messages.append(sid, role="user", text_content="hi")
    store.close()
    opened = _open_in_fresh_interpreter(tmp_path)
    assert opened["recovered"] == 0
    assert isinstance(opened["loaded"], list)
    assert REPOSITORY_MODULES.isdisjoint(opened["loaded"]), opened["loaded"]


def test_each_kind_left_behind_is_found_and_repaired_at_open(tmp_path: Path) -> None:
    reply_id, _ = _leave_everything_behind(tmp_path)
    db = Database(tmp_path / DB_FILENAME)  # the database as the dead process left it
    try:
        assert recovery.left_behind(db) == {recovery.MESSAGES, recovery.ACP_CHUNKS, recovery.TOOL_RUNS}
    finally:
        db.close()
    opened = _open_in_fresh_interpreter(tmp_path)  # the process's own open: every repair
    assert opened["recovered"] == 1
    store = Store(tmp_path)
    try:
        assert recovery.left_behind(store._db) == frozenset()
        assert store.messages.get(reply_id).status == "aborted"
        run = store.tools.get_run(reply_id)
        assert run is not None and run.state == "done"
        assert store.acp.raw_parts(reply_id) is None  # the chunks were joined into the message
    finally:
        store.close()
