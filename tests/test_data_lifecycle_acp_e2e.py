"""ACP growth, over a real subprocess and the scripted agent: plain turns continue one agent
session, released agent sessions are closed (also after an engine restart), the raw update
log is appended per tick and returned only when asked, and ACP sessions get titles from
the default direct provider.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import apsw
import pytest

from acp_helpers import acp_session, add_engine, send_and_wait
from chat_helpers import configure_provider, events_of, streamed_text, wait_final
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


async def wait_log(proc: SidecarProcess, text: str) -> None:
    await proc.wait_stderr(text, timeout=15)


async def test_plain_turns_continue_one_agent_session(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, "--fork", "--close")
        session = await acp_session(proc, engine["id"])
        for n in range(1, 5):
            sent, final = await send_and_wait(proc, session["id"], f"turn{n}")
            assert final["type"] == "stream_end"
            assert streamed_text(events_of(proc, sent["messageId"])) == f"echo: turn{n} [turn {n} of sess-1]"
        assert (await proc.call("chat:session:get", {"id": session["id"]}))["acpSessionId"] == "sess-1"
        db = apsw.Connection(str(tmp_path / "data" / "chat.db"), flags=apsw.SQLITE_OPEN_READONLY)
        assert db.execute("SELECT count(DISTINCT agent_session_id) FROM acp_turns").fetchone() == (1,)
        db.close()
        await proc.close()


async def test_released_agent_sessions_are_closed_also_after_an_engine_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        engine = await add_engine(proc, "--fork", "--close", "--load")
        doomed = await acp_session(proc, engine["id"])
        other = await acp_session(proc, engine["id"])
        first, _ = await send_and_wait(proc, doomed["id"], "a")
        second, _ = await send_and_wait(proc, doomed["id"], "b")
        regen = await proc.call("chat:regenerate", {"sessionId": doomed["id"], "messageId": second["messageId"]})
        await wait_final(proc, regen["messageId"])  # a fork: sess-2
        await proc.close()
    async with spawn_sidecar(data) as proc:  # a new engine process, which never opened them
        await proc.call("sidecar:initialize", {})
        await proc.call("chat:session:delete", {"id": doomed["id"]})
        assert "closed sess-" not in proc.stderr_text()  # the engine is not running: kept for later
        await send_and_wait(proc, other["id"], "start the engine")
        await wait_log(proc, "closed sess-1")
        await wait_log(proc, "closed sess-2")
        db = apsw.Connection(str(data / "chat.db"), flags=apsw.SQLITE_OPEN_READONLY)
        assert db.execute("SELECT count(*) FROM acp_released").fetchone() == (0,)
        db.close()
        # the other session's agent session is still in use: never closed
        assert "closed sess-3" not in proc.stderr_text()
        await proc.close()


async def test_raw_updates_are_appended_and_returned_only_when_asked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        await proc.call("settings:update", {"persistIntervalMs": 20})
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"])
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "slow 40"}})
        # while it streams: chunks, one per tick, each holding only the updates since the last
        db = apsw.Connection(str(data / "chat.db"), flags=apsw.SQLITE_OPEN_READONLY)
        chunks: list[tuple[int, str]] = []
        with anyio.fail_after(20):
            while len(chunks) < 3:
                chunks = db.execute(
                    "SELECT first, body FROM acp_raw_chunks WHERE message_id = ? ORDER BY first", (sent["messageId"],)
                ).fetchall()
                await anyio.sleep(0.02)
        live = await proc.call("chat:messages:get", {"sessionId": session["id"], "options": {"includeAcpParts": True}})
        assert live[-1]["status"] == "streaming" and len(live[-1]["acpParts"]) >= chunks[1][0]
        await wait_final(proc, sent["messageId"])
        assert db.execute("SELECT count(*) FROM acp_raw_chunks").fetchone() == (0,)
        firsts = [c[0] for c in chunks]
        assert firsts == sorted(set(firsts)) and firsts[0] == 0
        db.close()
        plain = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert plain[-1]["acpParts"] is None
        tree = await proc.call("chat:messages:tree", {"sessionId": session["id"]})
        assert tree[0]["children"][0]["message"]["acpParts"] is None
        full = await proc.call("chat:messages:get", {"sessionId": session["id"], "options": {"includeAcpParts": True}})
        raw = full[-1]["acpParts"]
        assert len(raw) == 40 and all(u["sessionUpdate"] == "agent_message_chunk" for u in raw)
        exported = await proc.call("chat:session:export", {"id": session["id"]})
        assert exported["messages"][-1]["acpParts"] == raw
        await proc.close()


async def test_acp_sessions_are_titled_by_the_default_direct_provider(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, server.base_url)  # the default provider: a direct one
        engine = await add_engine(proc)
        session = await acp_session(proc, engine["id"])
        await send_and_wait(proc, session["id"], "hello agent")
        with anyio.fail_after(20):
            while True:
                updated = await proc.next_notification("chat:session:updated")
                if updated["id"] == session["id"] and updated["title"] != "New Chat":
                    break
        assert updated["title"].startswith("A chat about")
        assert updated["usageByKind"]["side:title"]["calls"] == 1
        titled = [b for b in await server.requests() if not b.get("stream")]
        assert len(titled) == 1 and "hello agent" in str(titled[0]["messages"])
        await proc.close()
