"""The data lifecycle in process: ownership rows and the journal (triggers), the migration's
backfill of an older build's files, what the janitor refuses to remove, tool-call id
renaming, raw ACP chunks, usage kinds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import apsw
import msgspec
import pytest

from protocol.sessions import CreateSessionOptions
from protocol.storage import StorageGcParams
from protocol.types import FilePart, ImagePart, TextPart, ToolResultPart, Usage
from sidecar.engine.generation import CallIds
from sidecar.engine.storage import StorageService
from sidecar.errors import InvalidParams
from sidecar.store import AsyncStore, Store, migrations
from sidecar.store.files import Deletion
from sidecar.store.janitor import detach

pytestmark = pytest.mark.anyio


def journal(store: Store) -> list[tuple[str, str]]:
    with store._db.read() as conn:  # noqa: SLF001 - the journal has no reader of its own
        return [(r[0], r[1]) for r in conn.execute("SELECT root, path FROM file_deletions ORDER BY path")]


def attach(store: Store, name: str, body: bytes = b"x") -> str:
    root = store.data_dir / "attachments"
    root.mkdir(exist_ok=True)
    path = root / name
    path.write_bytes(body)
    return path.as_uri()


def test_a_file_is_released_with_its_last_owner_and_owned_again_leaves_the_journal(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        a = store.sessions.create(CreateSessionOptions(title="a")).id
        uri = attach(store, "shared.png")
        m = store.messages.append(a, role="user", parts=[ImagePart(mime_type="image/png", url=uri)])
        store.messages.append(a, role="user", text_content=f"again ![x]({uri})")
        fork = store.sessions.fork(a, m.id)
        assert store.files.of_session(a) == [("", "attachments/shared.png", "attachment")]
        store.sessions.delete(a)
        assert journal(store) == []  # the fork still owns it
        exported = store.sessions.export(fork.id)
        store.sessions.delete(fork.id)
        assert journal(store) == [("", "attachments/shared.png")]
        store.sessions.import_(exported.session, exported.messages)  # owned again
        assert journal(store) == []
        # deleting a branch releases what only it referenced (the journal of its transaction)
        branch_uri = attach(store, "branch.bin")
        top = store.messages.append(fork.id, role="user", text_content="branch")
        store.messages.append(fork.id, role="assistant", parts=[FilePart(uri=branch_uri, name="b")])
        store.messages.delete_branch(top.id)
        assert journal(store) == [("", "attachments/branch.bin")]
        # a link to a file outside the attachments folder is never owned
        outside = tmp_path.parent / "elsewhere.txt"
        store.messages.append(fork.id, role="user", parts=[FilePart(uri=outside.as_uri(), name="e")])
        assert {p for _, p, _ in store.files.of_session(fork.id)} == {"attachments/shared.png"}
    finally:
        store.close()


async def test_an_older_builds_files_are_owned_after_the_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = migrations.MIGRATIONS.index(migrations.m_data_lifecycle)
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:index])
    Store(tmp_path).close()  # the schema of the build before it
    monkeypatch.undo()
    root = tmp_path.resolve() / "attachments"
    root.mkdir()
    uri = (root / "old-upload.bin").as_uri()
    generated = (root / "generated-abc.png").as_uri()
    (root / "old-upload.bin").write_bytes(b"u")
    (root / "generated-abc.png").write_bytes(b"g")
    note = ("x" * 10 + "\n\n[output truncated: 40000 bytes in total, the first 4096 shown. The whole output is saved"
            " as tool_outputs/call_1.txt. Read it with read_tool_output(tool_call_id=\"call_1\", offset=...) in slices.]")
    sid, acp_sid = "old-session", "old-agent-session"
    now = int(time.time() * 1000)
    conn = apsw.Connection(str(tmp_path / "chat.db"))
    for session, mode in ((sid, "direct"), (acp_sid, "acp")):
        conn.execute("INSERT INTO sessions_v2 (id, provider_id, model_id, mode, message_count, created_at, updated_at)"
                     " VALUES (?, 'p', 'm', ?, 3, ?, ?)", (session, mode, now, now))
    rows = [  # a first exchange (its title was due: an older build never asked) and a tool result
        ("m1", None, "user", [TextPart(text="hi"), FilePart(uri=uri, name="u")], None),
        ("m2", "m1", "assistant", None, f"look ![i]({generated})"),
        ("m3", "m2", "assistant", [ToolResultPart(tool_use_id="call_1", content=note)], None),
    ]
    for mid, parent, role, parts, text in rows:
        conn.execute(
            "INSERT INTO messages_v2 (id, session_id, parent_id, role, content_type, text_content, parts,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (mid, sid, parent, role, "multipart" if parts else "text", text,
             msgspec.json.encode(parts).decode() if parts else None, now, now),
        )
    conn.close()
    (tmp_path / "tool_outputs").mkdir()
    (tmp_path / "tool_outputs" / "call_1.txt").write_text("y" * 40000)
    (tmp_path / "acp" / acp_sid).mkdir(parents=True)
    (tmp_path / "attachments" / "orphan.bin").write_bytes(b"nobody")
    old = time.time() - 7200
    for path in [*(tmp_path / "attachments").iterdir(), tmp_path / "tool_outputs" / "call_1.txt", tmp_path / "acp" / acp_sid]:
        os.utime(path, (old, old))

    astore = await AsyncStore.open(tmp_path)
    try:
        owned = await astore.run(lambda s: s.files.owned())
        assert owned == {"attachments/old-upload.bin", "attachments/generated-abc.png", "tool_outputs/call_1.txt",
                         f"acp/{acp_sid}"}
        # existing sessions are not titled at the next start (a new one would be)
        assert await astore.run(lambda s: s.sessions.titles_due(["New Chat"], 10)) == []
        with astore.blocking._db.write() as conn:  # noqa: SLF001
            conn.execute("UPDATE sessions_v2 SET title_attempted = 0 WHERE id = ?", (sid,))
        assert [(s.id, r) for s, r in await astore.run(lambda s: s.sessions.titles_due(["New Chat"], 10))] == [(sid, "m2")]

        async def notify(method: str, params: object) -> None:
            pass

        result = await StorageService(astore, notify).gc(StorageGcParams())
        assert (result.files, result.bytes) == (1, 6)  # only the orphan
        assert (tmp_path / "attachments" / "old-upload.bin").exists() and (tmp_path / "acp" / acp_sid).is_dir()
        # deleting the old session removes its files now
        await astore.run(lambda s: s.sessions.delete(sid))
        freed = await StorageService(astore, notify).release()
        assert (freed.files, freed.bytes) == (3, 40000 + 2)  # the upload, the image, the spill
        assert sorted(p.name for p in (tmp_path / "attachments").iterdir()) == []
    finally:
        await astore.close()


def test_the_janitor_removes_only_what_the_sidecar_writes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    late = int(time.time() * 1000) + 60_000

    def gone(root: str, path: str, kind: str) -> bool:
        detached = detach(data, Deletion(root=root, path=path, kind=kind, queued_at=late), [])
        return detached.done and not (victim / "keep.txt").exists()

    # outside the managed folders, up the tree, absolute, wrong kind
    for root, path, kind in [
        ("", "chat.db", "attachment"), ("", "../victim/keep.txt", "attachment"), ("", str(victim / "keep.txt"), "attachment"),
        ("", "attachments/../../victim/keep.txt", "attachment"), (str(victim), "keep.txt", "spill"),
        (str(victim), "tool_outputs/../keep.txt", "spill"), ("", "acp/x", "attachment"),
    ]:
        assert not gone(root, path, kind), (root, path, kind)
    # a symlinked managed folder that leads out is refused; a symlink at the name is removed as a link
    (data / "tool_outputs").symlink_to(victim, target_is_directory=True)
    assert not gone("", "tool_outputs/keep.txt", "spill")
    (data / "attachments").mkdir()
    (data / "attachments" / "link").symlink_to(victim / "keep.txt")
    detach(data, Deletion(root="", path="attachments/link", kind="attachment", queued_at=late), [])
    assert not (data / "attachments" / "link").exists() and (victim / "keep.txt").read_text() == "precious"
    # a directory some session uses as its workspace is never removed
    (data / "acp" / "s1").mkdir(parents=True)
    detached = detach(data, Deletion(root="", path="acp/s1", kind="workspace", queued_at=late), [str(data / "acp" / "s1" / "ws")])
    assert detached.trash is None and (data / "acp" / "s1").is_dir()
    # a file written again after its release is kept
    (data / "attachments" / "re.bin").write_bytes(b"new owner")
    early = int(time.time() * 1000) - 60_000
    detach(data, Deletion(root="", path="attachments/re.bin", kind="attachment", queued_at=early), [])
    assert (data / "attachments" / "re.bin").exists()


def test_call_ids_are_unique_within_a_reply_and_follow_their_calls() -> None:
    ids = CallIds(["c1"])
    # two calls with one id in a step, the second's fragments after its start
    assert [ids.start("c1"), ids.delta("c1"), ids.start("c1"), ids.delta("c1")] == ["c1_2", "c1_2", "c1_3", "c1_3"]
    assert [ids.end("c1"), ids.end("c1")] == ["c1_2", "c1_3"]  # ends close them in order
    assert ids.end("x") == "x" and ids.end("x") == "x_2"  # whole calls without a start
    assert ids.start("") == "call"


def test_raw_acp_chunks_join_in_order_without_decoding(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        sid = store.sessions.create(CreateSessionOptions(mode="acp")).id
        reply = store.messages.append(sid, role="assistant", status="streaming")
        raw = [msgspec.Raw(b'{"sessionUpdate":"a","n":%d}' % i) for i in range(5)]
        store.acp.append_raw(reply.id, 0, raw[:2], "agent-msg")
        store.acp.append_raw(reply.id, 2, raw[2:4])
        store.acp.append_raw(reply.id, 2, raw[2:4])  # a retried tick: written again, not twice
        store.acp.append_raw(reply.id, 4, raw[4:])
        assert msgspec.json.decode(store.acp.raw_parts(reply.id) or "") == [{"sessionUpdate": "a", "n": i} for i in range(5)]
        store.acp.finish_raw(reply.id)
        got = store.messages.get(reply.id)
        assert got.acp_message_id == "agent-msg" and [p["n"] for p in got.acp_parts or []] == [0, 1, 2, 3, 4]
        assert store.acp.raw_parts(reply.id) is None
    finally:
        store.close()


def test_usage_kinds_are_reply_or_side_calls(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        sid = store.sessions.create(CreateSessionOptions()).id
        for bad in ("", "side:", "Side:Title", "titles", "side:" + "x" * 60):
            with pytest.raises(InvalidParams):
                store.sessions.add_usage(sid, Usage(input_tokens=1), 0.0, kind=bad)
        s = store.sessions.add_usage(sid, None, 0.5, kind="side:embedding")
        assert s.usage_by_kind["side:embedding"].calls == 1 and s.total_cost == 0.5 and s.total_tokens == 0
        # a breakdown written by a newer build that does not decode starts again, the totals stay
        with store._db.write() as conn:  # noqa: SLF001
            conn.execute("UPDATE sessions_v2 SET usage_by_kind = '{\"reply\": 7}' WHERE id = ?", (sid,))
        s = store.sessions.add_usage(sid, Usage(input_tokens=2, output_tokens=1), 0.25)
        assert s.usage_by_kind == {"reply": s.usage_by_kind["reply"]} and s.total_tokens == 3
        assert s.total_cost == pytest.approx(0.75)
    finally:
        store.close()


async def test_storage_release_runs_its_hooks_and_a_missing_file_is_fine(tmp_path: Path) -> None:
    astore = await AsyncStore.open(tmp_path)
    calls: list[str] = []

    async def notify(method: str, params: object) -> None:
        pass

    async def hook() -> None:
        calls.append("hook")

    try:
        service = StorageService(astore, notify)
        service.on_release.append(hook)
        sid = (await astore.run(lambda s: s.sessions.create(CreateSessionOptions()))).id
        uri = attach(astore.blocking, "gone-already.bin")
        await astore.run(lambda s: s.messages.append(sid, role="user", parts=[FilePart(uri=uri, name="g")]))
        (tmp_path / "attachments" / "gone-already.bin").unlink()
        await astore.run(lambda s: s.sessions.delete(sid))
        with anyio.fail_after(10):
            freed = await service.release()
        assert (freed.files, calls) == (0, ["hook"])
        assert journal(astore.blocking) == []
        with apsw.Connection(str(tmp_path / "chat.db")) as conn:
            assert conn.execute("SELECT count(*) FROM owned_files").fetchone() == (0,)
    finally:
        await astore.close()
