"""Knowledge bases under bad input, over a real sidecar subprocess: an unknown base, paths
outside the allowed roots and symlinks out of them, a 0-byte file, a 50 MB file, a corrupt
PDF, a PDF bomb (400 pages sharing one stream of 1 MB of text), binary junk sent as text, a document deleted while it is being embedded, a restart
during ingestion (it resumes) and a SIGKILL during embedding (no vector of it visible).
Each gets a typed error or status ``error`` with an error code; nothing stays
``indexing``; the other documents and the process are unharmed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from kb_helpers import embedding_provider, embedding_server, pdf_bomb, progress_end, wait_indexed
from sidecar_proc import CallError, spawn_sidecar

pytestmark = pytest.mark.anyio

LONG = "\n\n".join(f"Section {i}: the lighthouse keeper logs weather number {i} every night." for i in range(400))


async def start(proc: Any, server: Any, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    await proc.call("sidecar:initialize", {})
    provider = await embedding_provider(proc, server)
    await proc.call("kb:settings:update", {"allowedRoots": [str(root)]})
    kb = await proc.call("kb:create", {"name": "K", "chunkSize": 64, "chunkOverlap": 8,
                                       "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}})
    return provider, kb


def db_counts(data_dir: Path, doc_id: str) -> tuple[str, int, int]:
    conn = apsw.Connection(str(data_dir / "chat.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        status = conn.execute("SELECT status FROM kb_documents WHERE id = ?", (doc_id,)).fetchall()[0][0]
        chunks = conn.execute("SELECT count(*) FROM kb_chunks WHERE document_id = ?", (doc_id,)).fetchall()[0][0]
        vectors = conn.execute(
            "SELECT count(*) FROM kb_vectors v JOIN kb_chunks c ON c.rowid = v.chunk_rowid WHERE c.document_id = ?",
            (doc_id,),
        ).fetchall()[0][0]
    finally:
        conn.close()
    return status, chunks, vectors


async def test_bad_documents_get_typed_errors_and_nothing_else_is_lost(tmp_path: Path) -> None:
    root = tmp_path / "allowed"
    root.mkdir()
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "passwords.txt").write_text("hunter2")
    (root / "good.md").write_text("# Good\n\nThe orchard has forty apple trees.")
    (root / "link.txt").symlink_to(outside / "passwords.txt")
    (root / "linkdir").symlink_to(outside)
    (root / "empty.txt").write_bytes(b"")
    with open(root / "huge.txt", "wb") as f:  # 50 MB, sparse: cheap to make
        f.truncate(50 * 1024 * 1024)
    (root / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R >>\ngarbage\x00\xff\xfe" * 20)
    (root / "bomb.pdf").write_bytes(pdf_bomb(400, 1.0))  # 65 KB holding 400 MB of text
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        _, kb = await start(proc, server, root)
        good = await proc.call("kb:document:add", {"kbId": kb["id"], "path": str(root / "good.md")})
        assert (await wait_indexed(proc, good["document"]["id"]))["status"] == "ready"

        with pytest.raises(CallError) as err:
            await proc.call("kb:document:add", {"kbId": "no-such-kb", "name": "a.txt", "text": "x"})
        assert err.value.code == -32001 and "no-such-kb" in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("kb:search", {"kbIds": [kb["id"], "no-such-kb"], "query": "apple"})
        assert err.value.code == -32001
        refused = {
            "outside": str(outside / "passwords.txt"),
            "dotdot": str(root / ".." / "secret" / "passwords.txt"),
            "symlink file": str(root / "link.txt"),
            "symlink dir": str(root / "linkdir" / "passwords.txt"),
            "relative": "good.md",
            "a directory": str(root),
        }
        for why, path in refused.items():
            with pytest.raises(CallError) as err:
                await proc.call("kb:document:add", {"kbId": kb["id"], "path": path})
            assert err.value.code == -32602 and "$.path" in err.value.message, (why, err.value.message)
            assert "hunter2" not in err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("kb:document:add", {"kbId": kb["id"], "path": str(root / "good.md"), "text": "both"})
        assert err.value.code == -32602

        cases = [
            ("empty", {"path": str(root / "empty.txt")}),
            ("too_large", {"path": str(root / "huge.txt")}),
            ("too_large", {"path": str(root / "bomb.pdf")}),
            ("corrupt", {"path": str(root / "broken.pdf")}),
            ("binary", {"name": "junk.txt", "text": "".join(chr(c) for c in range(1, 32)) * 50 + "\x00abc"}),
        ]
        for number, (code, params) in enumerate(cases):
            token = f"{code}-{number}"
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "progressToken": token, **params})
            doc = await wait_indexed(proc, added["document"]["id"])
            assert doc["status"] == "error" and doc["errorCode"] == code and doc["error"], doc
            updates = await progress_end(proc, token)
            assert updates[-1]["message"].startswith("kb:index: error:")
        docs = await proc.call("kb:document:list", {"kbId": kb["id"]})
        assert not [d for d in docs if d["status"] in ("pending", "indexing")]
        assert len([d for d in docs if d["status"] == "error"]) == len(cases)
        # with no allowed roots no file may be added at all
        await proc.call("kb:settings:update", {"allowedRoots": []})
        with pytest.raises(CallError) as err:
            await proc.call("kb:document:add", {"kbId": kb["id"], "path": str(root / "good.md")})
        assert err.value.code == -32602 and "allowed" in err.value.message
        # a re-index of a file that may no longer be read: error "unreadable"; the index it had
        # stays searchable (nothing is lost by a failed re-index)
        again = await proc.call("kb:document:reindex", {"id": good["document"]["id"]})
        doc = await wait_indexed(proc, again["id"])
        assert doc["status"] == "error" and doc["errorCode"] == "unreadable"
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "orchard apple"})
        assert found["hits"] and "forty apple trees" in found["hits"][0]["text"]
        await proc.close()


async def test_a_document_deleted_while_it_is_embedded(tmp_path: Path) -> None:
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        _, kb = await start(proc, server, tmp_path)
        keep = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "keep.txt", "text": "The ferry leaves at noon."})
        assert (await wait_indexed(proc, keep["document"]["id"]))["status"] == "ready"
        await server.config(delay_ms=200)
        doomed = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "long.txt", "text": LONG,
                                                     "progressToken": "doomed"})
        await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "sidecar:progress"
                            and m["params"]["token"] == "doomed" and 0 < m["params"]["done"] < m["params"]["total"],
                            timeout=30)
        assert await proc.call("kb:document:delete", {"id": doomed["document"]["id"]}) == {"success": True}
        with pytest.raises(CallError) as err:
            await proc.call("kb:document:get", {"id": doomed["document"]["id"]})
        assert err.value.code == -32001
        await server.config(delay_ms=0)
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "lighthouse keeper"})
        assert found["hits"] == []  # nothing of it was written
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "ferry"})
        assert found["hits"][0]["documentId"] == keep["document"]["id"]
        # the workers go on: a new document is indexed
        later = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "later.txt", "text": "Later words."})
        assert (await wait_indexed(proc, later["document"]["id"]))["status"] == "ready"
        # a base deleted with a document still indexing
        await server.config(delay_ms=200)
        other = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "long2.txt", "text": LONG + " again"})
        await proc.call("kb:delete", {"id": kb["id"]})
        with pytest.raises(CallError):
            await proc.call("kb:document:get", {"id": other["document"]["id"]})
        assert await proc.call("kb:list") == []
        await proc.close()


@pytest.mark.sidecar_subprocess  # a SIGKILL, and the restart after it
async def test_sigkill_during_embedding_leaves_no_vectors_and_a_restart_resumes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with embedding_server() as server:
        async with spawn_sidecar(data) as proc:
            _, kb = await start(proc, server, tmp_path)
            await server.config(delay_ms=250)
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "long.txt", "text": LONG,
                                                        "progressToken": "k"})
            doc_id = added["document"]["id"]
            await proc.wait_for(lambda m: isinstance(m, dict) and m.get("method") == "sidecar:progress"
                                and m["params"]["token"] == "k" and 0 < m["params"]["done"] < m["params"]["total"],
                                timeout=30)
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait_exit()
        status, chunks, vectors = db_counts(data, doc_id)
        assert (status, chunks, vectors) == ("indexing", 0, 0)  # no half-written index is visible
        await server.config(delay_ms=0)
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            doc = await wait_indexed(proc, doc_id, timeout=60)
            assert doc["status"] == "ready" and doc["chunkCount"] > 10
            found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "weather number 123"})
            assert found["mode"] == "hybrid" and any("number 123 " in h["text"] for h in found["hits"])
            # a clean restart while a document is queued resumes it too
            await server.config(delay_ms=250)
            second = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "b.txt", "text": LONG + " two"})
            await proc.close()
        status, chunks, vectors = db_counts(data, second["document"]["id"])
        assert status in ("pending", "indexing") and chunks == vectors == 0
        await server.config(delay_ms=0)
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            assert (await wait_indexed(proc, second["document"]["id"], timeout=60))["status"] == "ready"
            await proc.close()
        status, chunks, vectors = db_counts(data, second["document"]["id"])
        assert status == "ready" and chunks == vectors > 0
