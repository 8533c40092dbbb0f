"""The files a session owns, over a real subprocess: deleting a session (or replacing it by
an import) removes every one of them and nothing else, a failed send leaves none, a delete
cut by a crash is finished at the next start, and ``storage:gc`` sweeps orphans.

What a session owns: its attachments (``attachments/``), the images the output transform
wrote (``attachments/generated-*``), tool-output spill files (``tool_outputs/`` in the data
dir, or in the session's own workspace), an ACP session's default workspace
(``acp/<sessionId>``). Never the user's own ``workspaceDir`` (only our spill files in it).
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import configure_provider, wait_final
from mcp_helpers import stdio_server
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

from sidecar.tools.spill import spill_name

pytestmark = pytest.mark.anyio

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
GENERATED_PNG = base64.b64encode(PNG + b"generated").decode()  # any bytes: it is stored, not decoded


def entries(data_dir: Path) -> set[str]:
    """Every entry of the managed folders, relative to the data dir."""
    found: set[str] = set()
    for folder in ("attachments", "tool_outputs", "acp"):
        base = data_dir / folder
        if base.is_dir():
            found |= {f"{folder}/{p.name}" for p in base.iterdir()}
    return found


def attachment(name: str, data: bytes, mime: str = "application/octet-stream") -> dict[str, Any]:
    return {"name": name, "mimeType": mime, "data": base64.b64encode(data).decode()}


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def wait_until(predicate: Any, what: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
    assert predicate(), what


async def wait_ready(proc: SidecarProcess, name: str) -> None:
    with anyio.fail_after(30):
        while True:
            servers = {s["name"]: s for s in await proc.call("mcp:server:list", {})}
            if servers.get(name, {}).get("status") == "ready":
                return
            await anyio.sleep(0.05)


async def send(proc: SidecarProcess, session_id: str, content: Any, attachments: list[Any] | None = None) -> dict[str, Any]:
    user_input: dict[str, Any] = {"content": content}
    if attachments:
        user_input["attachments"] = attachments
    return await proc.call("chat:send", {"sessionId": session_id, "input": user_input})


async def test_deleting_a_session_removes_every_file_it_owns_and_nothing_else(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "mine.txt").write_text("the user's own file")
    (workspace / "big.txt").write_text("w" * 50_000)
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        await proc.call("mcp:server:upsert", stdio_server("fx"))
        await proc.call("tool:policy:set", {"key": "mcp:fx", "policy": "auto"})
        await wait_ready(proc, "fx")
        keep = await proc.call("chat:session:create", {"title": "keep"})
        doomed = await proc.call("chat:session:create", {"title": "doomed"})
        with_ws = await proc.call("chat:session:create", {"title": "with a workspace", "workspaceDir": str(workspace)})
        await server.script(
            {"text": "ok"},  # keep's reply
            # doomed: a spill in the data dir (a large MCP result), then a generated image
            {"tool_calls": [call("c_mcp", "mcp__fx__echo", {"text": "m" * 40_000})]},
            {"text": f"here: ![dot](data:image/png;base64,{GENERATED_PNG})"},
            # with_ws: a spill in its workspace (a large workspace read)
            {"tool_calls": [call("c_ws", "workspace_read_file", {"path": "big.txt"})]},
            {"text": "read it"},
        )
        kept = await send(proc, keep["id"], "keep this", [attachment("kept.bin", b"kept bytes")])
        assert (await wait_final(proc, kept["messageId"]))["type"] == "stream_end"
        before = entries(data)
        sent = await send(proc, doomed["id"], [{"type": "text", "text": "look"},
                                               {"type": "image", "mimeType": "image/png",
                                                "base64": base64.b64encode(PNG).decode()}],
                          [attachment("notes.txt", b"private notes", "text/plain")])
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end", final
        owned = entries(data) - before
        kinds = sorted(e.split("/")[0] for e in owned)
        assert kinds == ["attachments", "attachments", "attachments", "tool_outputs"], owned
        assert f"tool_outputs/{spill_name(doomed['id'], 'c_mcp')}" in owned
        assert any(e.startswith("attachments/generated-") for e in owned)
        in_ws = await send(proc, with_ws["id"], "read big.txt")
        assert (await wait_final(proc, in_ws["messageId"]))["type"] == "stream_end"
        ws_spill = workspace / "tool_outputs" / spill_name(with_ws["id"], "c_ws")
        assert ws_spill.is_file()

        # a fork shares the doomed session's files: they stay while the fork has them
        messages = await proc.call("chat:messages:get", {"sessionId": doomed["id"]})
        fork = await proc.call("chat:session:fork", {"id": doomed["id"], "messageId": messages[0]["id"]})
        user_files = {e for e in owned if not e.startswith(("attachments/generated-", "tool_outputs/"))}
        assert len(user_files) == 2

        assert await proc.call("chat:session:delete", {"id": doomed["id"]}) == {"success": True}
        # at once (the delete answers once they are gone): what only doomed owned is gone
        assert entries(data) == before | user_files
        # the fork still reads its copy of the image
        forked = await proc.call("chat:messages:get", {"sessionId": fork["id"]})
        assert any(p["type"] == "image" for p in forked[0]["parts"])
        await proc.call("chat:session:delete", {"id": fork["id"]})
        assert entries(data) == before
        # a session with the user's own workspace: only our spill file in it goes
        await proc.call("chat:session:delete", {"id": with_ws["id"]})
        assert not ws_spill.exists()
        assert (workspace / "mine.txt").read_text() == "the user's own file"
        assert (workspace / "big.txt").exists() and workspace.is_dir()
        assert entries(data) == before
        # the other session is untouched
        assert (await proc.call("chat:messages:get", {"sessionId": keep["id"]}))[0]["parts"][-1]["name"] == "kept.bin"
        await proc.close()


async def test_an_acp_sessions_default_workspace_goes_with_it_a_chosen_one_stays(tmp_path: Path) -> None:
    data = tmp_path / "data"
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc)
        own = await acp_session(proc, engine["id"])
        theirs = await acp_session(proc, engine["id"], workspaceDir=str(chosen))
        await send_and_wait(proc, own["id"], "hello")
        await send_and_wait(proc, theirs["id"], "hello")
        default = data / "acp" / own["id"]
        assert default.is_dir()
        (default / "agent-wrote.txt").write_text("scratch")
        (default / "sub").mkdir()
        (default / "sub" / "deep.txt").write_text("deep")
        await proc.call("chat:session:delete", {"id": own["id"]})
        assert not default.exists()
        assert not [p for p in (data / "acp").iterdir() if p.name.startswith(".trash-")]
        await proc.call("chat:session:delete", {"id": theirs["id"]})
        assert chosen.is_dir()
        await proc.close()


async def test_a_failed_send_leaves_no_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure_provider(proc, server.base_url)
        session = await proc.call("chat:session:create", {})
        # bad input after a good attachment: nothing is written (it used to be, first)
        with pytest.raises(CallError) as err:
            await send(proc, session["id"], "x", [attachment("a.bin", b"good"),
                                                  {"name": "b.bin", "mimeType": "text/plain", "data": "%%%"}])
        assert err.value.code == -32602
        assert entries(data) == set()
        # an unknown session
        with pytest.raises(CallError) as err:
            await send(proc, "0190c9a4-0000-7000-8000-000000000000", "x", [attachment("a.bin", b"good")])
        assert err.value.code == -32001
        assert entries(data) == set()
        # sends that race a delete: whichever way each goes, no file outlives the session
        await server.script({"text": "slow " * 200, "delay_ms": 5})
        first = await send(proc, session["id"], "slow please")
        async with anyio.create_task_group() as tg:
            outcomes: list[str] = []

            async def racing_send(n: int) -> None:
                try:
                    await send(proc, session["id"], f"race {n}", [attachment(f"r{n}.bin", b"racing bytes")])
                    outcomes.append("sent")
                except CallError as exc:
                    outcomes.append(str(exc.code))

            for n in range(4):
                tg.start_soon(racing_send, n)
            await proc.call("chat:session:delete", {"id": session["id"]})
        await wait_final(proc, first["messageId"])
        assert len(outcomes) == 4 and set(outcomes) <= {"sent", "-32001"}, outcomes
        # a send that was answered first stored its message, which the delete removed with
        # its files; one that came during or after the delete was refused before writing
        assert entries(data) == set(), entries(data)
        await proc.close()
    assert "Traceback" not in proc.stderr_text()


async def test_a_delete_cut_by_a_crash_is_finished_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server:
        async with spawn_sidecar(data) as proc:
            await configure_provider(proc, server.base_url)
            await proc.call("settings:update", {"generateTitles": False})
            session = await proc.call("chat:session:create", {})
            sent = await send(proc, session["id"], "keep my bytes", [attachment("a.bin", b"x" * 1000)])
            await wait_final(proc, sent["messageId"])
            files = entries(data)
            assert len(files) == 1
            await proc.close()
        # the state a crash leaves after the delete's transaction and before the removal:
        # the rows are gone (the journal holds the file), the bytes are still on disk
        db = apsw.Connection(str(data / "chat.db"))
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("DELETE FROM sessions_v2 WHERE id = ?", (session["id"],))
        assert db.execute("SELECT path FROM file_deletions").fetchall() == [(sorted(files)[0],)]
        db.close()
        assert entries(data) == files
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            # answered before the start-up pass is done (it runs in the background)
            await proc.call("chat:session:list", {})
            await wait_until(lambda: entries(data) == set(), "the start-up pass removes the file")

            def journal() -> tuple[int, ...]:
                db = apsw.Connection(str(data / "chat.db"))
                try:
                    return tuple(db.execute("SELECT count(*) FROM file_deletions").fetchone())
                finally:
                    db.close()

            # the pass removes the file, then clears its journal row in its next transaction
            await wait_until(lambda: journal() == (0,), "the start-up pass clears the journal")
            assert journal() == (0,)
            await proc.close()
        assert "removed 1 files" in proc.stderr_text() or "freed 1 files" in proc.stderr_text()


async def test_storage_gc_sweeps_orphans_with_progress_and_keeps_what_is_owned(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        session = await proc.call("chat:session:create", {})
        sent = await send(proc, session["id"], "mine", [attachment("owned.bin", b"owned")])
        await wait_final(proc, sent["messageId"])
        owned = entries(data)
        old = time.time() - 3600
        orphans = {
            data / "attachments" / "crashed-upload.bin": b"o" * 700,
            data / "tool_outputs" / "call_zz.txt": b"t" * 300,
            data / "acp" / "no-such-session" / "f.txt": b"a" * 50,
        }
        for path, body in orphans.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
            os.utime(path, (old, old))
        os.utime(data / "acp" / "no-such-session", (old, old))
        fresh = data / "attachments" / "just-written.bin"
        fresh.write_bytes(b"f" * 10)  # younger than the grace period: maybe a send in flight
        outside = data / "notes.txt"
        outside.write_text("not in a managed folder")
        os.utime(outside, (old, old))

        result = await proc.call("storage:gc", {"progressToken": "gc-1"})
        assert result == {"files": 3, "bytes": 1050, "pending": 0}
        assert entries(data) == owned | {"attachments/just-written.bin"}
        assert outside.exists()
        progress = [p for p in proc.notifications("sidecar:progress") if p["token"] == "gc-1"]
        assert progress[0]["kind"] == "begin" and progress[-1]["kind"] == "end"
        assert [p["kind"] for p in progress].count("end") == 1
        assert "3 files" in progress[-1]["message"]
        # graceMs 0: the fresh one too; owned files never
        again = await proc.call("storage:gc", {"graceMs": 0})
        assert again == {"files": 1, "bytes": 10, "pending": 0}
        assert entries(data) == owned
        with pytest.raises(CallError) as err:
            await proc.call("storage:gc", {"graceMs": -1})
        assert err.value.code == -32602
        await proc.close()


async def test_import_replace_takes_the_delete_path(tmp_path: Path) -> None:
    data = tmp_path / "data"
    outside = tmp_path / "somewhere"
    outside.mkdir()
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        session = await proc.call("chat:session:create", {})
        sent = await send(proc, session["id"], "first", [attachment("old.bin", b"old bytes")])
        await wait_final(proc, sent["messageId"])
        exported = await proc.call("chat:session:export", {"id": session["id"]})
        old_files = entries(data)
        assert len(old_files) == 1

        # the race: a reply streams (about 4 s), and once its text flows an import replaces the session
        await server.script({"text": "word " * 400, "delay_ms": 10})
        running = await send(proc, session["id"], "go on")
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == running["messageId"]
            and m["params"]["type"] == "text_delta"
        )
        document = {
            "session": {**exported["session"], "workspaceDir": str(outside)},
            "messages": [m for m in exported["messages"] if m["role"] == "user"][:1],
        }
        document["messages"][0] = {**document["messages"][0], "parts": None, "contentType": "text",
                                   "textContent": "first (imported)"}
        document["session"]["activeLeafId"] = None
        seen_before_answer = len(proc.messages)
        imported = await proc.call("chat:session:import", {**document, "replace": True})
        answer_at = next(i for i, m in enumerate(proc.messages) if isinstance(m, dict) and m.get("result") == imported)
        aborted = [
            i for i, m in enumerate(proc.messages)
            if isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == running["messageId"] and m["params"]["type"] in ("aborted", "error", "stream_end")
        ]
        assert aborted and proc.messages[aborted[0]]["params"]["type"] == "aborted", aborted
        assert seen_before_answer <= aborted[0] < answer_at
        # the imported workspaceDir was dropped: the caller did not trust it
        assert imported["workspaceDir"] is None
        # the old attachment is gone with the old session (the import does not reference it)
        assert entries(data) == set()
        stored = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert [m["textContent"] for m in stored] == ["first (imported)"]
        # trusted and existing: kept; trusted but missing: dropped
        kept = await proc.call("chat:session:import", {**document, "replace": True, "trustWorkspace": True})
        assert kept["workspaceDir"] == str(outside)
        missing = {**document, "session": {**document["session"], "workspaceDir": str(tmp_path / "nope")}}
        dropped = await proc.call("chat:session:import", {**missing, "replace": True, "trustWorkspace": True})
        assert dropped["workspaceDir"] is None
        await proc.close()
    assert "Traceback" not in proc.stderr_text()
    assert "internal error while ending the reply" not in json.dumps(proc.messages)


async def test_import_replace_ends_paused_replies_and_closes_agent_sessions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ws = tmp_path / "ws"
    ws.mkdir()
    async with scripted_provider() as server, spawn_sidecar(data) as proc:
        await configure_provider(proc, server.base_url)
        await proc.call("settings:update", {"generateTitles": False})
        session = await proc.call("chat:session:create", {"workspaceDir": str(ws)})
        sid = session["id"]
        await server.script({"tool_calls": [call("w1", "workspace_write_file", {"path": "a.txt", "content": "x"})]})
        paused = await send(proc, sid, "write a file")
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == paused["messageId"] and m["params"]["type"] == "tool_approval_required",
            timeout=20,
        )
        assert [p["toolCallId"] for p in await proc.call("tool:pending:list", {"sessionId": sid})] == ["w1"]
        exported = await proc.call("chat:session:export", {"id": sid})
        document = {"session": exported["session"], "messages": [m for m in exported["messages"] if m["role"] == "user"]}
        document["session"]["activeLeafId"] = None
        imported = await proc.call("chat:session:import", {**document, "replace": True, "trustWorkspace": True})
        assert imported["workspaceDir"] == str(ws)
        # the paused reply was ended (aborted) before the import answered, its call is no longer pending
        answer_at = next(i for i, m in enumerate(proc.messages) if isinstance(m, dict) and m.get("result") == imported)
        ended = [
            (i, m["params"]["type"]) for i, m in enumerate(proc.messages)
            if isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == paused["messageId"] and m["params"]["type"] in ("aborted", "error", "stream_end")
        ]
        assert [t for _, t in ended] == ["aborted"] and ended[0][0] < answer_at, ended
        assert await proc.call("tool:pending:list", {"sessionId": sid}) == []
        with pytest.raises(CallError):
            await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "w1", "decision": "approved"})
        assert not (ws / "a.txt").exists()
        # the session serves the next reply at once
        await server.script({"text": "fresh"})
        sent = await send(proc, sid, "again")
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"

        # an ACP session: the agent session of the replaced turns is closed at the engine
        engine = await add_engine(proc, "--close")
        agent = await acp_session(proc, engine["id"])
        await send_and_wait(proc, agent["id"], "hello")
        exported = await proc.call("chat:session:export", {"id": agent["id"]})
        assert exported["session"]["acpSessionId"] == "sess-1"
        document = {"session": {**exported["session"], "activeLeafId": None},
                    "messages": [m for m in exported["messages"] if m["role"] == "user"]}
        await proc.call("chat:session:import", {**document, "replace": True})
        await proc.wait_stderr("closed sess-1", timeout=20)
        # the next turn starts a new agent session (the replaced one is gone)
        sent, final = await send_and_wait(proc, agent["id"], "after the import")
        assert final["type"] == "stream_end"
        assert (await proc.call("chat:session:get", {"id": agent["id"]}))["acpSessionId"] == "sess-2"
        await proc.close()
    assert "Traceback" not in proc.stderr_text()


async def test_a_send_to_an_unavailable_agent_keeps_its_file_only_with_its_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, command=[str(tmp_path / "no-such-agent")])
        session = await acp_session(proc, engine["id"])
        sent = await send(proc, session["id"], "x", [attachment("a.bin", b"agent bytes")])
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "error" and "cannot start the agent engine" in final["error"]
        # the user turn was stored with its file (it can be retried); the file is its message's
        stored = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        uri = next(p["uri"] for p in stored[0]["parts"] if p["type"] == "file")
        assert entries(data) == {"attachments/" + uri.rsplit("/", 1)[1]}
        await proc.call("chat:session:delete", {"id": session["id"]})
        assert entries(data) == set()
        await proc.close()
    assert "Traceback" not in proc.stderr_text()
