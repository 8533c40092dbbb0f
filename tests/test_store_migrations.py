"""Opening the database: migrations from an empty file, re-opening, versions, atomic
migrations, pragmas, and crash recovery of a process killed while streaming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from protocol.sessions import CreateSessionOptions
from sidecar.errors import StoreError
from sidecar.store import Store, migrations
from test_store_support import count, db_digest

ROOT = Path(__file__).resolve().parent.parent
SEED_INDEXES = {
    "idx_sessions_updated", "idx_sessions_folder", "idx_sessions_channel",
    "idx_messages_session", "idx_messages_parent",
}


def _user_version(path: Path) -> int:
    conn = apsw.Connection(str(path))
    try:
        return int(conn.execute("PRAGMA user_version").fetchall()[0][0])
    finally:
        conn.close()


def test_migrates_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "chat.db").write_bytes(b"")
    store = Store(tmp_path)
    try:
        assert store.schema_version == len(migrations.MIGRATIONS)
        conn = apsw.Connection(str(store.path))
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"sessions_v2", "messages_v2", "settings", "session_tags", "search_docs",
                "messages_fts"} <= names
        assert SEED_INDEXES <= names
        cols = [r[1] for r in conn.execute("PRAGMA table_info(messages_v2)")]
        assert cols[:19] == [
            "id", "session_id", "parent_id", "role", "content_type", "text_content", "parts",
            "tool_calls", "tool_call_id", "tool_name", "model_id", "usage", "latency_ms",
            "acp_message_id", "acp_parts", "status", "error", "created_at", "updated_at",
        ]
        fks = conn.execute("PRAGMA foreign_key_list(messages_v2)").fetchall()
        assert [(f[2], f[3], f[4], f[6]) for f in fks] == [("sessions_v2", "session_id", "id", "CASCADE")]
        assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
        conn.close()
    finally:
        store.close()
    assert _user_version(tmp_path / "chat.db") == len(migrations.MIGRATIONS)


def test_reopen_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    store = Store(tmp_path)
    sid = store.sessions.create(CreateSessionOptions(title="persist", tags=["a"])).id
    store.messages.append(sid, role="user", text_content="保存的内容")
    digest = db_digest(store)
    store.close()
    for _ in range(2):
        store = Store(tmp_path)
        try:
            assert store.schema_version == len(migrations.MIGRATIONS)
            assert store.recovered == 0
            assert db_digest(store) == digest
            assert store.sessions.get(sid).title == "persist"
            assert len(store.search.messages("内容")) == 1
        finally:
            store.close()


def test_refuses_a_newer_database(tmp_path: Path) -> None:
    Store(tmp_path).close()
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(tmp_path)
    assert _user_version(tmp_path / "chat.db") == 999


def test_a_failing_migration_leaves_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store(tmp_path).close()
    good = len(migrations.MIGRATIONS)

    def broken(conn: apsw.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, broken])
    with pytest.raises(StoreError):
        Store(tmp_path)
    assert _user_version(tmp_path / "chat.db") == good
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'half_done'").fetchall()
    conn.close()


def test_migration_backfills_tags_and_search_for_old_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A database created by a program that only had migrations 1-3 (no tags table, no index).
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
    Store(tmp_path).close()
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    conn.execute(
        "INSERT INTO sessions_v2(id, provider_id, model_id, tags, created_at, updated_at)"
        " VALUES ('s1', 'p', 'm', '[\"x\",\"y\"]', 1, 1)"
    )
    conn.execute(
        "INSERT INTO messages_v2(id, session_id, role, text_content, created_at, updated_at)"
        " VALUES ('m1', 's1', 'user', '旧的消息 legacy', 1, 1)"
    )
    conn.close()
    monkeypatch.undo()
    store = Store(tmp_path)
    try:
        assert [s.id for s in store.sessions.query(_filter(tags=["x", "y"])).sessions] == ["s1"]
        assert [r.message_id for r in store.search.messages("旧的")] == ["m1"]
        assert [r.message_id for r in store.search.messages("LEGACY")] == ["m1"]
        # Migration 12 copied created_at into search_docs for the date filter.
        dated = store.search.messages("旧的", _search(date_range=_dates(0, 5)))
        assert [r.message_id for r in dated] == ["m1"]
        assert store.search.messages("旧的", _search(date_range=_dates(2, 5))) == []
    finally:
        store.close()


def test_the_search_date_copy_is_filled_on_every_kind_of_insert(tmp_path: Path) -> None:
    # A database from before migration 12 (11 migrations), one indexed message in it.
    # (Later migrations are replayed too: they must be re-runnable.)
    good = migrations.MIGRATIONS.index(migrations.m012_search_docs_created_at) + 1
    store = Store(tmp_path)
    sid = store.sessions.create(CreateSessionOptions(title="s")).id
    old = store.messages.append(sid, role="user", text_content="dated words")
    store.close()
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    conn.execute("DROP TRIGGER search_docs_created_at; ALTER TABLE search_docs DROP COLUMN created_at;"
                 f" PRAGMA user_version = {good - 1}")
    conn.close()
    store = Store(tmp_path)  # migration 12 again: backfill + trigger
    try:
        new = store.messages.append(sid, role="user", text_content="dated words again")
        streamed = store.messages.append(sid, role="assistant", status="streaming")
        store.messages.finish(streamed.id, status="completed", text_content="dated reply", parts=None)
        forked = store.sessions.fork(sid, new.id)
        exported = store.sessions.export(sid)
        store.sessions.delete(sid)
        store.sessions.import_(exported.session, exported.messages)
        assert count(store, "SELECT count(*) FROM search_docs WHERE created_at IS NULL") == 0
        mismatched = count(
            store,
            "SELECT count(*) FROM search_docs d JOIN messages_v2 m ON m.id = d.message_id"
            " WHERE d.created_at IS NOT m.created_at",
        )
        assert mismatched == 0
        assert count(store, "SELECT count(*) FROM search_docs") == 3 + 2  # session + fork copies
        only_old = store.search.messages("dated", _search(date_range=_dates(old.created_at, old.created_at)))
        assert {r.message_id for r in only_old} == {old.id} | {
            m.id for m in store.messages.query(forked.id) if m.created_at == old.created_at
        }
    finally:
        store.close()


def _search(**kw: object):  # type: ignore[no-untyped-def]
    from protocol.messages import SearchOptions

    return SearchOptions(**kw)  # type: ignore[arg-type]


def _dates(lo: int, hi: int):  # type: ignore[no-untyped-def]
    from protocol.types import DateRange

    return DateRange(from_=lo, to=hi)


def _filter(**kw: object):  # type: ignore[no-untyped-def]
    from protocol.sessions import SessionFilter

    return SessionFilter(**kw)  # type: ignore[arg-type]


def test_connection_pragmas(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        with store._db.write() as conn:
            assert conn.execute("PRAGMA foreign_keys").fetchall()[0][0] == 1
            assert conn.execute("PRAGMA busy_timeout").fetchall()[0][0] == 5000
            assert conn.execute("PRAGMA synchronous").fetchall()[0][0] == 1  # NORMAL
        with store._db.read() as conn:
            assert conn.execute("PRAGMA foreign_keys").fetchall()[0][0] == 1
            assert conn.execute("PRAGMA busy_timeout").fetchall()[0][0] == 5000
    finally:
        store.close()
    with pytest.raises(StoreError, match="closed"):
        store.sessions.get("x")


_CRASHING_CHILD = """
import json, os, signal, sys
from protocol.sessions import CreateSessionOptions
from protocol.types import TextPart
from sidecar.store import Store
store = Store(sys.argv[1])
sid = store.sessions.create(CreateSessionOptions(title="crash")).id
user = store.messages.append(sid, role="user", text_content="问题")
pending = store.messages.append(sid, role="assistant", status="pending", parent_id=user.id,
                               make_active=False)
m = store.messages.append(sid, role="assistant", status="streaming", text_content="")
store.messages.update_partial(m.id, text_content="写到一半的回答", parts=[TextPart(text="写到一半的回答")], seq=7)
print(json.dumps({"session": sid, "streaming": m.id, "pending": pending.id}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_crash_recovery_after_sigkill(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_CHILD, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    ids = json.loads(proc.stdout)
    store = Store(tmp_path)
    try:
        assert store.recovered == 2
        m = store.messages.get(ids["streaming"])
        assert (m.status, m.text_content, m.seq) == ("aborted", "写到一半的回答", 7)
        assert store.messages.get(ids["pending"]).status == "aborted"
        # Recovered messages are final now: searchable, and nothing left in flight.
        assert [r.message_id for r in store.search.messages("一半")] == [ids["streaming"]]
        assert count(store, "SELECT count(*) FROM messages_v2 WHERE status IN ('pending','streaming')") == 0
        assert store.sessions.get(ids["session"]).message_count == 3
    finally:
        store.close()
    store = Store(tmp_path)
    assert store.recovered == 0
    store.close()


def test_unwritable_data_dir_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        Store(blocker / "sub")
    if os.geteuid() != 0:  # root ignores permissions
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(StoreError):
            Store(ro)


def test_recovery_survives_unreadable_parts_and_marks_parts_multipart(tmp_path: Path) -> None:
    store = Store(tmp_path)
    sid = store.sessions.create(CreateSessionOptions(title="a")).id
    odd = store.messages.append(sid, role="assistant", status="streaming", text_content="partial odd")
    old = store.messages.append(sid, role="assistant", status="streaming", text_content="partial old")
    store.close()
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    try:
        # A part type from a newer build, and parts written with content_type 'text' (as
        # update_partial did before content_type followed the parts).
        conn.execute("UPDATE messages_v2 SET parts = ? WHERE id = ?",
                     ('[{"type":"future_part","x":1}]', odd.id))
        conn.execute("UPDATE messages_v2 SET parts = ?, content_type = 'text' WHERE id = ?",
                     ('[{"type":"text","text":"partial old"}]', old.id))
    finally:
        conn.close()
    for _ in range(2):  # every start succeeds, not only the first
        store = Store(tmp_path)
        try:
            assert store.messages.get(old.id).content_type == "multipart"
            assert store.messages.get(old.id).status == "aborted"
            assert {r.message_id for r in store.search.messages("partial")} == {odd.id, old.id}
        finally:
            store.close()


def test_one_store_per_data_dir(tmp_path: Path) -> None:
    first = Store(tmp_path)
    try:
        with pytest.raises(StoreError, match="another chat-sidecar is using"):
            Store(tmp_path)
        sid = first.sessions.create(CreateSessionOptions(title="still mine")).id  # untouched
        streaming = first.messages.append(sid, role="assistant", status="streaming")
        first.messages.update_partial(streaming.id, text_content="more", parts=None)
    finally:
        first.close()
    second = Store(tmp_path)  # closing released the lock
    try:
        assert second.recovered == 1
    finally:
        second.close()


def test_a_current_database_is_opened_without_a_write_transaction(tmp_path: Path) -> None:
    from sidecar.store.db import Database

    Store(tmp_path).close()
    other = apsw.Connection(str(tmp_path / "chat.db"))
    other.execute("BEGIN IMMEDIATE")  # another writer holds the write lock meanwhile
    db = Database(tmp_path / "chat.db")
    db.writer.set_busy_timeout(0)  # waiting for the lock would fail at once
    try:
        assert migrations.migrate(db) == len(migrations.MIGRATIONS)
    finally:
        db.close()
        other.execute("ROLLBACK")
        other.close()


def test_every_migration_function_is_registered() -> None:
    # a migration defined without its @migration never runs: a fresh data dir then lacks
    # its tables (a merge once dropped the decorator line above the last one)
    import importlib
    import inspect
    import pkgutil

    import sidecar.store.migrations as root

    modules = [root] + [
        importlib.import_module(f"{root.__name__}.{info.name}")
        for info in pkgutil.iter_modules(getattr(root, "__path__", []))
    ]
    defined = {
        fn for module in modules for name, fn in vars(module).items()
        if name.startswith("m_") and inspect.isfunction(fn)
    }
    assert defined, "no migration functions found"
    assert sorted(f.__name__ for f in defined - set(root.MIGRATIONS)) == []
