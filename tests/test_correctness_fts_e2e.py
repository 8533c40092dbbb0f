"""Full-text search folds width and case (NFKC + case folding) on both sides, over a real
sidecar subprocess: full-width letters and digits (common in Chinese text) are found by their
ASCII spelling and by themselves, a change between letters and digits is a word boundary
(``Windows10`` is found by ``Windows``), snippets highlight the ORIGINAL characters, and the
same holds for message search, knowledge search and memory search. A database indexed the old
way is re-indexed by its migration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw
import pytest

from kb_helpers import wait_indexed
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

WINDOWS = "请在Ｗｉｎｄｏｗｓ１０上安装驱动。"
EMAIL = "我的ｅｍａｉｌ地址换了"
ENGLISH = "Straße names and ﬁnal words"


async def _imported(proc: SidecarProcess, texts: list[str]) -> tuple[str, list[str]]:
    session = await proc.call("chat:session:create", {"title": "fold"})
    exported = await proc.call("chat:session:export", {"id": session["id"]})
    ids = [f"0190a000-0000-7000-8000-00000000001{i}" for i in range(len(texts))]
    messages = [
        {"id": mid, "sessionId": session["id"], "role": "user", "textContent": text, "status": "completed",
         "createdAt": 10 + i, "updatedAt": 10 + i, "parentId": ids[i - 1] if i else None}
        for i, (mid, text) in enumerate(zip(ids, texts))
    ]
    await proc.call("chat:session:import", {"session": exported["session"], "messages": messages, "replace": True})
    return str(session["id"]), ids


async def _found(proc: SidecarProcess, query: str) -> list[dict[str, Any]]:
    return list(await proc.call("chat:messages:search", {"query": query}))


async def _kb_hits(proc: SidecarProcess, kb_id: str, query: str) -> list[str]:
    result = await proc.call("kb:search", {"kbIds": [kb_id], "query": query})
    return [h["text"] for h in result["hits"]]


async def _memories(proc: SidecarProcess, query: str) -> tuple[list[str], list[str]]:
    listed = await proc.call("memory:list", {"scope": "global", "query": query})
    searched = await proc.call("memory:search", {"query": query})
    return [m["text"] for m in listed["memories"]], [h["memory"]["text"] for h in searched["hits"]]


async def _check_all(proc: SidecarProcess, ids: list[str], kb_id: str) -> None:
    for query in ("Windows", "windows10", "Ｗｉｎｄｏｗｓ", "WINDOWS 10", "10"):
        assert [r["messageId"] for r in await _found(proc, query)] == [ids[0]], query
        assert await _kb_hits(proc, kb_id, query) == [WINDOWS], query
    for query in ("email", "EMAIL", "ｅｍａｉｌ"):
        assert [r["messageId"] for r in await _found(proc, query)] == [ids[1]], query
        assert await _memories(proc, query) == ([EMAIL], [EMAIL]), query
    # case folding beyond ASCII, compatibility ligatures
    assert [r["messageId"] for r in await _found(proc, "STRASSE final")] == [ids[2]]
    # the Chinese words around the full-width ones are still found as before
    assert [r["messageId"] for r in await _found(proc, "驱动")] == [ids[0]]
    assert await _memories(proc, "地址") == ([EMAIL], [EMAIL])
    # snippets mark the original characters
    [hit] = await _found(proc, "windows10")
    assert "<mark>Ｗｉｎｄｏｗｓ１０</mark>" in hit["snippet"], hit["snippet"]
    [hit] = await _found(proc, "Windows")
    assert "<mark>Ｗｉｎｄｏｗｓ</mark>１０" in hit["snippet"], hit["snippet"]
    [hit] = await _found(proc, "ｅｍａｉｌ")
    assert "<mark>ｅｍａｉｌ</mark>" in hit["snippet"], hit["snippet"]
    [hit] = await _found(proc, "strasse FINAL")
    assert hit["snippet"] == "<mark>Straße</mark> names and <mark>ﬁnal</mark> words", hit["snippet"]


async def _setup(proc: SidecarProcess) -> tuple[list[str], str]:
    _, ids = await _imported(proc, [WINDOWS, EMAIL, ENGLISH, "nothing to see here"])
    kb = await proc.call("kb:create", {"name": "guides"})
    for name, text in (("drivers.txt", WINDOWS), ("other.txt", "别的内容 other words")):
        added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": name, "text": text})
        assert (await wait_indexed(proc, added["document"]["id"]))["status"] == "ready"
    for text in (EMAIL, "用户喜欢喝茶"):
        await proc.call("memory:create", {"scope": "global", "text": text})
    return ids, str(kb["id"])


async def test_full_width_text_is_found_by_every_spelling(tmp_path: Path) -> None:
    async with spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        ids, kb_id = await _setup(proc)
        await _check_all(proc, ids, kb_id)
        await proc.close()


def _old_index_text(text: str) -> str:
    """The index text as it was before folding: CJK runs as bigrams, nothing else changed."""
    import re

    def run(m: re.Match[str]) -> str:
        s = m.group()
        return " " + (s if len(s) == 1 else " ".join(a + b for a, b in zip(s, s[1:])) + " " + s[-1]) + " "

    return re.sub(r"[\u3040-\u30ff\u4e00-\u9fff]+", run, text)


def _index_as_before(db: Path) -> None:
    """Rewrite every FTS row the way the code before folding wrote it, and step the schema
    back to before the migration that folds (it runs again at the next start)."""
    from sidecar.store import fts, kb_lexical, migrations

    conn = apsw.Connection(str(db))
    with conn:
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('delete-all')")
        for docid, text, sid, role in conn.execute(
            "SELECT d.docid, m.text_content, m.session_id, m.role FROM search_docs d"
            " JOIN messages_v2 m ON m.id = d.message_id"
        ).fetchall():
            conn.execute("INSERT INTO messages_fts(rowid, body, sid, role) VALUES (?, ?, ?, ?)",
                         (docid, _old_index_text(text), fts.session_token(sid), role))
        for (kb_id,) in conn.execute("SELECT id FROM kb_bases").fetchall():
            table = kb_lexical.table_of(kb_id)
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('delete-all')")
            for rowid, text in conn.execute("SELECT rowid, text FROM kb_chunks WHERE kb_id = ?", (kb_id,)).fetchall():
                conn.execute(f"INSERT INTO {table}(rowid, body) VALUES (?, ?)", (rowid, _old_index_text(text)))
        conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('delete-all')")
        for rowid, scope, text in conn.execute("SELECT rowid, scope, text FROM memories").fetchall():
            conn.execute("INSERT INTO memories_fts(rowid, body, scope) VALUES (?, ?, ?)",
                         (rowid, _old_index_text(text), fts.key_token("m", scope)))
        version = migrations.MIGRATIONS.index(migrations.m_fts_fold)
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


async def test_a_database_indexed_before_folding_is_reindexed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with spawn_sidecar(data) as proc:
        await proc.call("sidecar:initialize", {})
        ids, kb_id = await _setup(proc)
        await proc.close()
    _index_as_before(data / "chat.db")
    # the host's first requests wait in the pipe: the cold start leaves a database that needs
    # a migration to the app, which migrates it before it answers the session list
    waiting = b"".join(json.dumps({"jsonrpc": "2.0", "id": f"w{i}", "method": method, "params": {}}).encode() + b"\n"
                       for i, method in enumerate(("sidecar:initialize", "chat:session:list")))
    async with spawn_sidecar(data, waiting=waiting) as proc:
        assert "result" in await proc.response("w0")
        assert (await proc.response("w1", timeout=60))["result"]["total"] == 1
        assert "applying migration" in proc.stderr_text()
        # the old rows could not match a folded query: the migration rebuilt them
        await _check_all(proc, ids, kb_id)
        await proc.close()
