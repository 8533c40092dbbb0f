"""Query embeddings are side calls of the session they are made for, over a real sidecar
subprocess, the scripted chat provider and the loopback embeddings server reporting usage:
a turn's knowledge retrieval and its ``knowledge_search`` call end up in the session's
``usageByKind["side:embedding"]`` (one call per embedding request, the tokens the server
reported, priced at the embedding model's ``inputPrice``), as do a turn's memory retrieval
and ``memory_search``; ingestion and ``kb:search``/``memory:search`` (no session) are
charged to nobody; a malformed usage (OpenAI-compatible and Ollama) is ignored and the
reply completes on hybrid retrieval all the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import configure_provider, wait_final
from kb_helpers import EmbeddingServer, embedding_server, wait_indexed
from memory_helpers import active, assistant, call, session_of, system_text
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

PRICE = 100.0
"""USD per million input tokens of the embedding model."""
NOTES = "# Pets\n\nThe kitten naps in the greenhouse.\n\n# Doors\n\nThe greenhouse door opens every morning."


async def priced_embeddings(proc: SidecarProcess, server: EmbeddingServer, kind: str = "openai-compat") -> str:
    base = server.base_url if kind == "openai-compat" else server.root
    provider = await proc.call("provider:upsert", {
        "name": "Embeddings", "type": kind, "baseUrl": base, "apiKey": "sk-embed-SECRET",
        "models": [{"id": "embed-1", "contextWindow": 8192, "inputPrice": PRICE}],
    })
    return str(provider["id"])


async def knowledge_session(
    proc: SidecarProcess, chat: Any, embeddings: EmbeddingServer, kind: str
) -> tuple[str, str]:
    """(the knowledge base's id, a session whose assistant retrieves from it)."""
    await configure_provider(proc, chat.base_url)
    provider_id = await priced_embeddings(proc, embeddings, kind)
    kb = await proc.call("kb:create", {"name": "Greenhouse", "chunkSize": 64, "chunkOverlap": 0,
                                       "embeddingModel": {"providerId": provider_id, "modelId": "embed-1"}})
    added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "notes.md", "text": NOTES})
    assert (await wait_indexed(proc, added["document"]["id"]))["status"] == "ready"
    await proc.call("assistant:upsert", {"id": "default", "name": "Gardener", "knowledgeBaseIds": [kb["id"]]})
    session = await proc.call("chat:session:create", {"title": "kb"})
    return str(kb["id"]), str(session["id"])


async def usage_by_kind(proc: SidecarProcess, sid: str) -> dict[str, Any]:
    return dict((await proc.call("chat:session:get", {"id": sid}))["usageByKind"])


async def test_a_turns_query_embeddings_are_the_sessions_side_calls(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        await embeddings.config(usage="count")
        kb_id, sid = await knowledge_session(proc, chat, embeddings, "openai-compat")
        before = await embeddings.stats()
        assert before["prompt_tokens"] > 0  # ingestion reported usage too ...
        assert "side:embedding" not in await usage_by_kind(proc, sid)  # ... and is charged to nobody
        await chat.script(
            {"tool_calls": [call("k1", "knowledge_search", {"query": "when does the door open"})]},
            {"text": "The kitten naps there [1]."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "Where does the kitten nap?"}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        after = await embeddings.stats()
        # the first step's retrieval and the tool each embedded their query once (the second
        # step's request reuses the reply's retrieval)
        requests, tokens = after["requests"] - before["requests"], after["prompt_tokens"] - before["prompt_tokens"]
        assert requests == 2 and tokens > 0
        by_kind = await usage_by_kind(proc, sid)
        embedding = by_kind["side:embedding"]
        assert embedding["calls"] == requests and embedding["inputTokens"] == tokens
        assert embedding["outputTokens"] == 0 and embedding["cost"] == pytest.approx(tokens * PRICE / 1e6)
        assert by_kind["reply"]["calls"] == 1  # the reply is counted apart
        got = await proc.call("chat:session:get", {"id": sid})
        assert got["totalCost"] >= by_kind["reply"]["cost"] + embedding["cost"] - 1e-12
        # kb:search carries no session: it embeds, nobody is charged
        hits = await proc.call("kb:search", {"kbIds": [kb_id], "query": "doors"})
        assert hits["mode"] == "hybrid"
        assert (await embeddings.stats())["requests"] == after["requests"] + 1
        assert (await usage_by_kind(proc, sid))["side:embedding"] == embedding
        await proc.close()
    assert "Traceback" not in proc.stderr_text()


MALFORMED = {
    # the answer's `usage` object (OpenAI-compatible), its `prompt_eval_count` (Ollama)
    "openai-compat": [{"prompt_tokens": -5}, {"prompt_tokens": "many"}, {"prompt_tokens": 10**30}, [3], 7],
    "ollama": [-5, "many", 10**30, {"prompt_tokens": 3}, 2.5],
}


@pytest.mark.parametrize("kind", ["openai-compat", "ollama"])
async def test_a_malformed_usage_is_ignored_and_the_reply_completes(tmp_path: Path, kind: str) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        await embeddings.config(usage="count")
        _, sid = await knowledge_session(proc, chat, embeddings, kind)
        await chat.script({"text": "Every morning [1]."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "When does the door open?"}})
        assert (await wait_final(proc, sent["messageId"], timeout=60))["type"] == "stream_end"
        counted = (await usage_by_kind(proc, sid))["side:embedding"]  # a well-formed count is read
        assert counted["calls"] == 1 and counted["inputTokens"] > 0
        assert counted["cost"] == pytest.approx(counted["inputTokens"] * PRICE / 1e6)
        for n, bad in enumerate(MALFORMED[kind]):
            await embeddings.config(usage=bad)
            before = await embeddings.stats()
            await chat.script({"text": "See [1]."})
            question = f"Question {n}: where does the kitten nap?"  # a new query: not from the cache
            sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": question}})
            final = await wait_final(proc, sent["messageId"], timeout=60)
            assert final["type"] == "stream_end", (bad, final)
            # the query was embedded (the vector leg ran), the usage dropped
            assert (await embeddings.stats())["requests"] == before["requests"] + 1, bad
            body = [b for b in await chat.requests() if b.get("stream")][-1]
            assert "The kitten naps in the greenhouse." in system_text(body)
            assert (await usage_by_kind(proc, sid))["side:embedding"] == counted, bad
        reply = (await proc.call("chat:messages:get", {"sessionId": sid}))[-1]
        assert reply["status"] == "completed" and reply["textContent"] == "See [1]."
        await proc.close()
    assert "Traceback" not in proc.stderr_text()


async def test_memory_retrieval_and_memory_search_charge_their_session(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        await configure_provider(proc, chat.base_url)
        await embeddings.config(usage="count")
        provider_id = await priced_embeddings(proc, embeddings)
        await assistant(proc, "walker", rag=True, embeddingModel={"providerId": provider_id, "modelId": "embed-1"})
        await proc.call("memory:create", {"text": "The user's dog is called Rex.", "scope": "walker"})
        await proc.call("memory:create", {"text": "The user walks every morning at seven.", "scope": "walker"})
        with anyio.fail_after(20):  # the stored vectors are embedded in the background (no session)
            while not all(m["embeddingModels"] for m in await active(proc, "walker")):
                await anyio.sleep(0.05)
        sid = await session_of(proc, "walker")
        await chat.script(
            {"tool_calls": [call("m1", "memory_search", {"query": "the name of the dog"})]},
            {"text": "Rex, walked at seven."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "When do I walk my dog?"}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        first = [b for b in await chat.requests() if b.get("stream")][0]
        assert "walks every morning" in system_text(first)
        embedding = (await usage_by_kind(proc, sid))["side:embedding"]
        # the request's retrieval and the tool's search, one embedding request each
        assert embedding["calls"] == 2 and embedding["inputTokens"] > 0
        assert embedding["cost"] == pytest.approx(embedding["inputTokens"] * PRICE / 1e6)
        inputs = [b["input"] for b in await embeddings.requests()]
        assert ["When do I walk my dog?"] in inputs and ["the name of the dog"] in inputs
        # memory:search carries no session
        found = await proc.call("memory:search", {"query": "what is the dog called", "assistantId": "walker"})
        assert found["mode"] == "hybrid"
        assert ["what is the dog called"] in [b["input"] for b in await embeddings.requests()]
        assert (await usage_by_kind(proc, sid))["side:embedding"] == embedding
        # memory_save: its near-duplicate check is charged, the saved memory's stored vector is not
        saved, question = "The user's cat is called Tom.", "Remember: my cat is called Tom."
        await chat.script({"tool_calls": [call("s1", "memory_save", {"text": saved})]}, {"text": "Noted."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": question}})
        assert (await wait_final(proc, sent["messageId"], timeout=60))["type"] == "stream_end"
        with anyio.fail_after(20):
            while not all(m["embeddingModels"] for m in await active(proc, "walker")):
                await anyio.sleep(0.05)
        inputs = [b["input"] for b in await embeddings.requests()]
        assert inputs.count([saved]) == 2  # the check, then the stored vector (in the background)
        asked = inputs.count([question])  # the request's retrieval (again after the write)
        assert asked >= 1
        later = (await usage_by_kind(proc, sid))["side:embedding"]
        assert later["calls"] == embedding["calls"] + asked + 1
        await proc.close()
    assert "Traceback" not in proc.stderr_text()
