"""Chunk ids and citations across a re-index, over the real server and the
scripted chat provider: a chunk's id covers its heading path, so a new section that repeats
a cited sentence leaves the citation on its own section (with its offsets refreshed), a
cited section renamed makes the citation ``documentChanged``, and a database whose ids were
made the old way (text only, repeats numbered over the whole document) is migrated with its
citations."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path
from typing import Any

import apsw
import pytest

from chat_helpers import configure_provider, wait_final
from kb_helpers import wait_indexed
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

# each section too large to share a chunk of 64 tokens with the next: one chunk per section
SENTENCE = ("Restart the device and wait ten seconds before printing again, then check that the paper tray is"
            " closed, the toner cartridge is seated firmly and the status light has stopped blinking.")
PRINTER = (f"# Printer\n\n{SENTENCE}\n\n# Network\n\nCheck the cable and the router lights, then open the"
           " network settings page and confirm that the printer has an address on the same subnet as the computer.\n")
SCANNER = f"# Scanner\n\n{SENTENCE}\n\n"


async def _cited(proc: SidecarProcess, chat: Any, root: Path) -> tuple[str, str, str, dict[str, Any]]:
    """A lexical base with manual.md, a reply citing its Printer section: (session, reply,
    document, the citation)."""
    await configure_provider(proc, chat.base_url)
    await proc.call("kb:settings:update", {"allowedRoots": [str(root)]})
    kb = await proc.call("kb:create", {"name": "Manuals", "chunkSize": 64, "chunkOverlap": 0})
    added = await proc.call("kb:document:add", {"kbId": kb["id"], "path": str(root / "manual.md")})
    doc_id = added["document"]["id"]
    assert (await wait_indexed(proc, doc_id))["status"] == "ready"
    await proc.call("assistant:upsert", {"id": "default", "name": "Helper", "knowledgeBaseIds": [kb["id"]]})
    session = await proc.call("chat:session:create", {"title": "printer"})
    await chat.script({"text": "Restart it [1]."})
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "restart the device before printing"}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    [citation] = [c for c in await _citations(proc, session["id"]) if c["heading"] == ["Printer"]]
    assert citation["text"] == SENTENCE and not citation["documentChanged"] and not citation["dangling"]
    return session["id"], sent["messageId"], doc_id, citation


async def _citations(proc: SidecarProcess, sid: str) -> list[dict[str, Any]]:
    reply = (await proc.call("chat:messages:get", {"sessionId": sid}))[-1]
    assert reply["role"] == "assistant"
    return list(reply["citations"])


async def _marker(proc: SidecarProcess, sid: str, marker: int) -> dict[str, Any]:
    [citation] = [c for c in await _citations(proc, sid) if c["marker"] == marker]
    return citation


async def _reindexed(proc: SidecarProcess, doc_id: str) -> dict[str, dict[str, Any]]:
    await proc.call("kb:document:reindex", {"id": doc_id})
    assert (await wait_indexed(proc, doc_id))["status"] == "ready"
    detail = await proc.call("kb:document:get", {"id": doc_id, "includeChunks": True})
    return {c["id"]: c for c in detail["chunks"]}


async def test_a_citation_stays_on_its_section_when_another_repeats_its_text(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    manual = root / "manual.md"
    manual.write_text(PRINTER)
    async with scripted_provider() as chat, spawn_sidecar(tmp_path / "data") as proc:
        sid, _, doc_id, before = await _cited(proc, chat, root)
        # a new section first, with the same sentence: the cited id stays the Printer's
        manual.write_text(SCANNER + PRINTER)
        chunks = await _reindexed(proc, doc_id)
        assert chunks[before["chunkId"]]["heading"] == ["Printer"]
        twins = [c for c in chunks.values() if c["text"] == SENTENCE]
        assert sorted(c["heading"][0] for c in twins) == ["Printer", "Scanner"]
        assert not any("." in c["id"].split(":")[1] for c in twins)  # no repeat number: other sections
        after = await _marker(proc, sid, before["marker"])
        assert after["chunkId"] == before["chunkId"] and not after["documentChanged"], after
        # its offsets follow the chunk to where it is now, in the document's new text
        text = SCANNER + PRINTER
        start = text.index(SENTENCE, text.index("# Printer"))
        assert (after["start"], after["end"]) == (start, start + len(SENTENCE)) != (before["start"], before["end"])
        assert (after["start"], after["end"]) == (chunks[after["chunkId"]]["start"], chunks[after["chunkId"]]["end"])
        assert after["heading"] == ["Printer"] and after["text"] == SENTENCE
        # the cited section renamed: the chunk the citation named is gone
        manual.write_text(SCANNER + PRINTER.replace("# Printer", "# Printers and copiers"))
        chunks = await _reindexed(proc, doc_id)
        assert before["chunkId"] not in chunks
        renamed = await _marker(proc, sid, before["marker"])
        assert renamed["documentChanged"] and not renamed["documentDeleted"]
        # the snapshot, as it was cited
        assert renamed["heading"] == ["Printer"] and renamed["text"] == SENTENCE
        assert (renamed["start"], renamed["end"]) == (before["start"], before["end"])
        await proc.close()


def _old_id(document_id: str, text: str) -> str:
    """A chunk id as versions before the heading path made them."""
    normalized = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip()
    return f"{document_id}:{hashlib.blake2b(normalized.encode(), digest_size=10).hexdigest()}"


async def test_chunk_ids_made_without_the_heading_path_are_migrated_with_their_citations(tmp_path: Path) -> None:
    from sidecar.store import migrations

    root = tmp_path / "docs"
    root.mkdir()
    manual = root / "manual.md"
    manual.write_text(SCANNER + PRINTER)
    data = tmp_path / "data"
    async with scripted_provider() as chat:
        async with spawn_sidecar(data) as proc:
            sid, reply_id, doc_id, cited = await _cited(proc, chat, root)
            await proc.close()
        # the ids of an older version: text only, repeats numbered in document order
        conn = apsw.Connection(str(data / "chat.db"))
        with conn:
            seen: dict[str, int] = {}
            for rowid, text in conn.execute(
                "SELECT rowid, text FROM kb_chunks WHERE document_id = ? ORDER BY ordinal", (doc_id,)
            ).fetchall():
                old = _old_id(doc_id, text)
                seen[old] = seen.get(old, 0) + 1
                old = old if seen[old] == 1 else f"{old}.{seen[old]}"
                new = conn.execute("SELECT id FROM kb_chunks WHERE rowid = ?", (rowid,)).fetchall()[0][0]
                conn.execute("UPDATE kb_chunks SET id = ? WHERE rowid = ?", (f"~{rowid}", rowid))
                conn.execute("UPDATE kb_chunks SET id = ? WHERE rowid = ?", (old, rowid))
                conn.execute("UPDATE message_citations SET chunk_id = ? WHERE chunk_id = ?", (old, new))
            [(stored,)] = conn.execute(
                "SELECT chunk_id FROM message_citations WHERE message_id = ? AND marker = ?", (reply_id, cited["marker"])
            ).fetchall()
            assert stored == _old_id(doc_id, SENTENCE) + ".2"  # the Printer's: the second of the twins
            conn.execute(f"PRAGMA user_version = {migrations.MIGRATIONS.index(migrations.m_kb_chunk_ids)}")
        conn.close()
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            after = await _marker(proc, sid, cited["marker"])
            assert after["chunkId"] == cited["chunkId"] and not after["documentChanged"], after
            assert not any(c["documentChanged"] for c in await _citations(proc, sid))
            detail = await proc.call("kb:document:get", {"id": doc_id, "includeChunks": True})
            ids = {c["id"]: c["heading"] for c in detail["chunks"]}
            assert ids[cited["chunkId"]] == ["Printer"]
            # a re-index keeps every id the migration wrote
            chunks = await _reindexed(proc, doc_id)
            assert set(chunks) == set(ids)
            await proc.close()
