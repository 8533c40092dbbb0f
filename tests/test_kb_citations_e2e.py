"""Citations of replies, over a real sidecar subprocess, the scripted chat provider and the
loopback embeddings server: what a reply was sent is exactly what it stores, announced
while it streams; the markers it wrote are normalized and the unknown ones flagged; a
regenerate numbers its own sources while the old branch keeps its; deleting or re-indexing
a document marks old citations and keeps their snapshots; export/import round-trips them
(and checks them); a knowledge base deleted during a reply ends nothing badly; a reply that
pauses for an approval keeps them and continues the numbering; a reply killed mid-stream
keeps what it announced."""

from __future__ import annotations

import html
import os
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from chat_helpers import assert_well_ordered, configure_provider, events_of, streamed_text, wait_final
from kb_helpers import embedding_provider, embedding_server, wait_indexed
from scripted_server import scripted_provider
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

FACTS = "\n\n".join(
    f"## Plant {i}\n\nThe plant number {i} in the greenhouse needs {i % 5 + 1} litres of water. It stands by"
    f" window {i}, away from the heater, and it is repotted every spring." for i in range(40)
)  # each section too large to share a chunk of 64 tokens with the next: one chunk each
NOTES = ("# Pets\n\nThe kitten naps in the greenhouse on the warm shelf above the seed trays every afternoon, while"
         " the old dog sleeps by the door and the parrot watches the tomatoes from its perch near the window. The cat"
         " food is kept in the blue tin on the bottom shelf.\n\n# 备注\n\n温室的门每天早上打开。")
QUESTION = "How much water does plant number 3 need?"
EITHER = "How much water does plant number 3 need in the greenhouse?"
# one element per chunk, on one line: the text entity-escaped, line breaks written as \n
SOURCE = re.compile(r'<source marker="(\d+)"[^>\n]*>([^<\n]*)</source>')


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def system_text(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    content = first["content"]
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)


def sent_sources(text: str) -> dict[int, str]:
    """marker -> chunk text of every <source> in a request's text (block or tool result)."""
    return {int(m): html.unescape(body.replace("\\n", "\n")) for m, body in SOURCE.findall(text)}


def block_of(body: dict[str, Any]) -> dict[int, str]:
    system = system_text(body)
    return sent_sources(system[system.index("<knowledge>") : system.index("</knowledge>")])


async def streamed_bodies(chat: Any) -> list[dict[str, Any]]:
    return [b for b in await chat.requests() if b.get("stream")]


async def setup(proc: SidecarProcess, chat: Any, embeddings: Any, root: Path | None = None) -> tuple[str, str, dict[str, str]]:
    """A base with facts.md and notes.md (texts), the default assistant using it, a session."""
    await configure_provider(proc, chat.base_url)
    provider = await embedding_provider(proc, embeddings)
    kb = await proc.call("kb:create", {"name": "Greenhouse", "chunkSize": 64, "chunkOverlap": 0,
                                       "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}})
    docs: dict[str, str] = {}
    for name, text in (("facts.md", FACTS), ("notes.md", NOTES)):
        added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": name, "text": text})
        assert (await wait_indexed(proc, added["document"]["id"]))["status"] == "ready"
        docs[name] = added["document"]["id"]
    await proc.call("assistant:upsert", {"id": "default", "name": "Gardener", "knowledgeBaseIds": [kb["id"]]})
    session = await proc.call("chat:session:create", {"title": "kb"})
    return kb["id"], session["id"], docs


async def last_reply(proc: SidecarProcess, sid: str) -> dict[str, Any]:
    reply = (await proc.call("chat:messages:get", {"sessionId": sid}))[-1]
    assert reply["role"] == "assistant"
    return reply


def sources_of(citations: list[dict[str, Any]]) -> dict[int, str]:
    return {c["marker"]: c["text"] for c in citations if not c["dangling"]}


async def test_stored_citations_are_what_was_sent_and_the_markers_are_checked(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        kb_id, sid, docs = await setup(proc, chat, embeddings)
        init = await proc.call("sidecar:initialize", {"protocolVersion": 1})
        kb_methods = {m for m in init["capabilities"]["methods"] if m.startswith("kb:")}
        assert {"kb:create", "kb:search", "kb:document:add", "kb:settings:update"} <= kb_methods
        assert kb_methods <= set(init["capabilities"]["implemented"])

        # 1. the request's own block: markers in every form the models write
        await chat.script({"text": "Plant 3 needs 4 litres [1, 2], see also【3】 and [1,3]; `[1, 2]` is code; [42]."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end", final
        events = events_of(proc, sent["messageId"])
        assert_well_ordered(events)
        block = block_of((await streamed_bodies(chat))[-1])
        assert 3 <= len(block) <= 6 and sorted(block) == list(range(1, len(block) + 1))
        types = [e["type"] for e in events]
        first_citations = next(e for e in events if e["type"] == "citations")
        assert types.index("citations") < types.index("text_delta")  # before the text that may use them
        assert sources_of(first_citations["citations"]) == block
        reply = await last_reply(proc, sid)
        stored = reply["citations"]
        assert sources_of(stored) == block  # exactly what was sent, nothing else
        assert all(c["messageId"] == reply["id"] and c["documentId"] in docs.values() for c in stored if not c["dangling"])
        assert all(c["chunkId"].startswith(c["documentId"] + ":") and c["kbId"] == kb_id for c in stored if not c["dangling"])
        assert all(c["mode"] == "hybrid" and c["documentName"] in docs for c in stored if not c["dangling"])
        assert [c["marker"] for c in stored if c["dangling"]] == [42]  # flagged, not silently kept
        expected = "Plant 3 needs 4 litres [1][2], see also[3] and [1][3]; `[1, 2]` is code; [42]."
        assert reply["textContent"] == expected
        assert "[1, 2], see" in streamed_text(events)
        # the renderer is told what was stored: the final list, the stored text, then stream_end
        last_citations = [e for e in events if e["type"] == "citations"][-1]
        assert [e["type"] for e in events][-3:] == ["citations", "content_replaced", "stream_end"]
        assert last_citations["citations"] == stored
        assert events[-2]["text"] == expected

        # 2. a knowledge_search call adds sources: numbering continues, announced after the result
        n = len(block)
        await chat.script(
            {"tool_calls": [call("k1", "knowledge_search", {"query": "kitten naps"})]},
            {"text": f"The kitten naps there [{n + 1}] and plant 3 needs water [1]."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end", final
        events = events_of(proc, sent["messageId"])
        # nothing to normalize: the stored text is the streamed one
        assert "content_replaced" not in [e["type"] for e in events]
        bodies = await streamed_bodies(chat)
        first_block, second_block = block_of(bodies[-2]), block_of(bodies[-1])
        assert first_block == second_block and len(first_block) == n  # the same block at every step
        tool_text = next(m["content"] for m in bodies[-1]["messages"] if m["role"] == "tool" and m["tool_call_id"] == "k1")
        from_tool = sent_sources(tool_text)
        assert n + 1 in from_tool and "kitten naps" in from_tool[n + 1]
        types = [e["type"] for e in events]
        result_at = types.index("tool_result")
        later = [i for i, t in enumerate(types) if t == "citations" and i > result_at]
        assert later and later[0] < types.index("text_delta", result_at)
        reply = await last_reply(proc, sid)
        assert sources_of(reply["citations"]) == {**first_block, **from_tool}
        assert not [c for c in reply["citations"] if c["dangling"]]
        await proc.close()


async def test_a_regenerate_numbers_its_own_sources_and_the_old_branch_keeps_its(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        _, sid, docs = await setup(proc, chat, embeddings)
        await chat.script(
            {"tool_calls": [call("k1", "knowledge_search", {"query": "kitten naps"})]},
            {"text": "Water [1]; the kitten [7]."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": EITHER}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        old = await last_reply(proc, sid)
        assert len(sources_of(old["citations"])) > len(block_of((await streamed_bodies(chat))[0]))  # the tool's too

        await proc.call("kb:document:delete", {"id": docs["facts.md"]})  # the next retrieval finds other chunks
        await chat.script({"text": "Only the notes now [1]."})
        regenerated = await proc.call("chat:regenerate", {"sessionId": sid, "messageId": old["id"]})
        assert (await wait_final(proc, regenerated["messageId"]))["type"] == "stream_end"
        new = await last_reply(proc, sid)
        assert new["id"] == regenerated["messageId"] != old["id"] and new["parentId"] == old["parentId"]
        block = block_of((await streamed_bodies(chat))[-1])
        assert block and sources_of(new["citations"]) == block  # its own numbering, from [1], no tool sources
        assert all(c["documentId"] == docs["notes.md"] and c["messageId"] == new["id"] for c in new["citations"])
        assert not any(c["documentDeleted"] for c in new["citations"])

        everything = await proc.call("chat:messages:get", {"sessionId": sid, "options": {"allBranches": True}})
        kept = next(m for m in everything if m["id"] == old["id"])
        assert sources_of(kept["citations"]) == sources_of(old["citations"])  # untouched by the regenerate
        facts = [c for c in kept["citations"] if c["documentId"] == docs["facts.md"]]
        assert facts and all(c["documentDeleted"] and c["text"] for c in facts)  # marked, still readable
        await proc.close()


async def test_deleting_or_reindexing_a_document_marks_old_citations(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    guide = root / "guide.md"
    guide.write_text("# Guide\n\nThe lantern of plant number 3 is red.\n\n# Care\n\nWater plant number 3 gently.")
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        kb_id, sid, docs = await setup(proc, chat, embeddings)
        await proc.call("kb:settings:update", {"allowedRoots": [str(root)]})
        added = await proc.call("kb:document:add", {"kbId": kb_id, "path": str(guide)})
        guide_id = added["document"]["id"]
        assert (await wait_indexed(proc, guide_id))["status"] == "ready"
        await chat.script({"text": "Red [1], gently [2]."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "lantern of plant number 3, water gently"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        reply = await last_reply(proc, sid)
        cited = {c["chunkId"]: c for c in reply["citations"]}
        of_guide = [c for c in cited.values() if c["documentId"] == guide_id]
        of_notes_or_facts = [c for c in cited.values() if c["documentId"] != guide_id]
        assert of_guide and of_notes_or_facts
        assert not any(c["documentDeleted"] or c["documentChanged"] for c in cited.values())

        # a re-index that keeps the text keeps the citations resolving
        await proc.call("kb:document:reindex", {"id": guide_id})
        assert (await wait_indexed(proc, guide_id))["status"] == "ready"
        again = {c["chunkId"]: c for c in (await last_reply(proc, sid))["citations"]}
        assert not any(c["documentChanged"] for c in again.values())

        # the file changes: its chunks' text is no longer in the document
        guide.write_text("# Guide\n\nEverything about the lantern moved elsewhere.")
        await proc.call("kb:document:reindex", {"id": guide_id})
        assert (await wait_indexed(proc, guide_id))["status"] == "ready"
        for doc_id in {c["documentId"] for c in of_notes_or_facts}:
            await proc.call("kb:document:delete", {"id": doc_id})
        after = await last_reply(proc, sid)
        by_chunk = {c["chunkId"]: c for c in after["citations"]}
        for c in of_guide:
            assert by_chunk[c["chunkId"]]["documentChanged"] and not by_chunk[c["chunkId"]]["documentDeleted"]
            assert by_chunk[c["chunkId"]]["text"] == c["text"]  # the snapshot stays readable
        for c in of_notes_or_facts:
            assert by_chunk[c["chunkId"]]["documentDeleted"] and by_chunk[c["chunkId"]]["text"] == c["text"]
        assert after["textContent"] == "Red [1], gently [2]."
        await proc.close()


async def test_export_and_import_round_trip_citations_and_import_checks_them(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        _, sid, _ = await setup(proc, chat, embeddings)
        await chat.script({"text": "Water [1][2] and [9]."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        before = await proc.call("chat:messages:get", {"sessionId": sid})
        assert before[-1]["citations"] and any(c["dangling"] for c in before[-1]["citations"])
        exported = await proc.call("chat:session:export", {"id": sid})
        reply = next(m for m in exported["messages"] if m["id"] == sent["messageId"])
        assert reply["citations"] == before[-1]["citations"]

        bad_cases = {
            "a marker twice": lambda m: m["citations"].append(dict(m["citations"][0])),
            "a marker of 0": lambda m: m["citations"][0].update(marker=0),
            "no chunk": lambda m: m["citations"][0].update(chunkId=None, dangling=False),
            "another message's": lambda m: m["citations"][0].update(messageId="someone-else"),
            "a bad mode": lambda m: m["citations"][0].update(mode="psychic"),
        }
        for why, spoil in bad_cases.items():
            broken = {**exported, "messages": [dict(m, citations=[dict(c) for c in m["citations"]]) if m.get("citations") else dict(m)
                                               for m in exported["messages"]]}
            spoil(next(m for m in broken["messages"] if m["id"] == sent["messageId"]))
            with pytest.raises(CallError) as err:
                await proc.call("chat:session:import", {"session": broken["session"], "messages": broken["messages"], "replace": True})
            assert err.value.code == -32602, (why, err.value)
        on_user = {**exported, "messages": [dict(m) for m in exported["messages"]]}
        user = next(m for m in on_user["messages"] if m["role"] == "user")
        user["citations"] = [dict(reply["citations"][0], messageId=user["id"])]
        with pytest.raises(CallError) as err:
            await proc.call("chat:session:import", {"session": on_user["session"], "messages": on_user["messages"], "replace": True})
        assert err.value.code == -32602 and "citations" in err.value.message
        assert await proc.call("chat:messages:get", {"sessionId": sid}) == before  # nothing lost

        await proc.call("chat:session:delete", {"id": sid})
        await proc.call("chat:session:import", {"session": exported["session"], "messages": exported["messages"]})
        assert await proc.call("chat:messages:get", {"sessionId": sid}) == before
        forked = await proc.call("chat:session:fork", {"id": sid, "messageId": sent["messageId"]})
        copy = (await proc.call("chat:messages:get", {"sessionId": forked["id"]}))[-1]
        assert sources_of(copy["citations"]) == sources_of(before[-1]["citations"])
        assert all(c["messageId"] == copy["id"] for c in copy["citations"])
        await proc.close()


async def test_a_knowledge_base_deleted_during_a_reply_ends_nothing_badly(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        kb_id, sid, _ = await setup(proc, chat, embeddings)
        await chat.script(
            {"text": "Let me look that up for you in the greenhouse notes.", "chunks": 12, "delay_ms": 60,
             "tool_calls": [call("k1", "knowledge_search", {"query": "kitten naps"})]},
            {"text": "It needs 4 litres [1]."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "text_delta",
            timeout=20,
        )
        live = await last_reply(proc, sid)  # in flight: the overlay has the announced citations
        assert live["status"] == "streaming" and live["citations"]
        await proc.call("kb:delete", {"id": kb_id})
        final = await wait_final(proc, sent["messageId"], timeout=30)
        assert final["type"] == "stream_end", final
        bodies = await streamed_bodies(chat)
        assert block_of(bodies[-1]) == block_of(bodies[-2])  # the reply's own block, sent again
        reply = await last_reply(proc, sid)
        assert reply["status"] == "completed" and reply["textContent"].endswith("notes.It needs 4 litres [1].")
        assert sources_of(reply["citations"]) == block_of(bodies[-2])
        assert all(c["documentDeleted"] and c["text"] for c in reply["citations"])
        # the process keeps serving, and a later reply just has no knowledge
        await chat.script({"text": "No sources now."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        assert (await last_reply(proc, sid))["citations"] is None
        with anyio.fail_after(10):
            assert await proc.call("kb:list", {}) == []
        await proc.close()


async def test_a_reply_paused_for_approval_keeps_its_citations_and_continues_the_numbering(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        _, sid, _ = await setup(proc, chat, embeddings)
        await proc.call("tool:policy:set", {"key": "knowledge_search", "policy": "ask"})
        await chat.script(
            {"text": "Checking [1].", "tool_calls": [call("k1", "knowledge_search", {"query": "kitten naps"})]},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
        await proc.wait_for(
            lambda m: isinstance(m, dict) and m.get("method") == "chat:stream"
            and m["params"]["messageId"] == sent["messageId"] and m["params"]["type"] == "tool_approval_required",
            timeout=20,
        )
        block = block_of((await streamed_bodies(chat))[-1])
        with anyio.fail_after(20):  # the paused row is stored right after the event
            while (paused := await last_reply(proc, sid))["status"] != "paused":
                await anyio.sleep(0.05)
        assert sources_of(paused["citations"]) == block
        n = len(block)
        await chat.script({"text": f"The kitten [{n + 1}]; water [1]."})
        approved = await proc.call("chat:tool:approve", {"sessionId": sid, "toolCallId": "k1", "decision": "approved"})
        assert approved["resumed"] is True
        final = await wait_final(proc, sent["messageId"], timeout=30)
        assert final["type"] == "stream_end", final
        body = (await streamed_bodies(chat))[-1]
        assert block_of(body) == block  # the resumed reply's request: the same markers
        tool_text = next(m["content"] for m in body["messages"] if m["role"] == "tool" and m["tool_call_id"] == "k1")
        from_tool = sent_sources(tool_text)
        # numbering continues after the pause; a chunk of the block found again keeps its marker
        assert min(m for m in from_tool if m not in block) == n + 1
        assert all(from_tool[m] == block[m] for m in from_tool if m in block)
        reply = await last_reply(proc, sid)
        assert sources_of(reply["citations"]) == {**block, **from_tool}
        assert not [c for c in reply["citations"] if c["dangling"]]
        await proc.close()


@pytest.mark.sidecar_subprocess  # a SIGKILL, and the restart after it
async def test_a_reply_killed_while_streaming_keeps_the_citations_it_announced(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with scripted_provider() as chat, embedding_server() as embeddings:
        async with spawn_sidecar(data) as proc:
            _, sid, _ = await setup(proc, chat, embeddings)
            await chat.script({"text": "word " * 400, "chunks": 400, "delay_ms": 50})
            sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": QUESTION}})
            conn = apsw.Connection(str(data / "chat.db"), flags=apsw.SQLITE_OPEN_READONLY)
            try:
                with anyio.fail_after(30):  # a persistence tick stored them with the partial row
                    while not conn.execute(
                        "SELECT count(*) FROM message_citations WHERE message_id = ?", (sent["messageId"],)
                    ).fetchall()[0][0]:
                        await anyio.sleep(0.05)
            finally:
                conn.close()
            block = block_of((await streamed_bodies(chat))[-1])
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait_exit()
        async with spawn_sidecar(data) as proc:
            await proc.call("sidecar:initialize", {})
            reply = await last_reply(proc, sid)
            assert reply["status"] == "aborted" and reply["textContent"].startswith("word")
            assert sources_of(reply["citations"]) == block
            await proc.close()
