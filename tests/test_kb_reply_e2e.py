"""Knowledge in a reply, over the real server, the scripted chat provider and the
loopback embeddings server: an assistant with a knowledge base gets at most six chunks in a
tagged system block with markers [1].., ``knowledge_search`` first among its tools (its
results continue the numbering), and ``get_session_capabilities`` telling the truth; with
the embedding server failing, the reply still completes on lexical retrieval."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from chat_helpers import configure_provider, wait_final
from kb_helpers import embedding_provider, embedding_server, wait_indexed
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

FACTS = "\n\n".join(
    f"## Plant {i}\n\nThe plant number {i} in the greenhouse needs {i % 5 + 1} litres of water." for i in range(40)
)
NOTES = "# Pets\n\nThe kitten naps in the greenhouse.\n\n# 备注\n\n温室的门每天早上打开。"


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def system_text(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    content = first["content"]
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)


async def setup(proc: Any, chat: Any, embeddings: Any) -> tuple[str, str]:
    await configure_provider(proc, chat.base_url)
    provider = await embedding_provider(proc, embeddings)
    kb = await proc.call("kb:create", {"name": "Greenhouse", "chunkSize": 64, "chunkOverlap": 0,
                                       "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}})
    for name, text in (("facts.md", FACTS), ("notes.md", NOTES)):
        added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": name, "text": text})
        assert (await wait_indexed(proc, added["document"]["id"]))["status"] == "ready"
    await proc.call("assistant:upsert", {"id": "default", "name": "Gardener", "knowledgeBaseIds": [kb["id"]]})
    session = await proc.call("chat:session:create", {"title": "kb"})
    return kb["id"], session["id"]


async def test_a_reply_gets_the_chunks_markers_and_the_knowledge_tool(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        kb_id, sid = await setup(proc, chat, embeddings)
        tools = await proc.call("tool:list", {"sessionId": sid})
        assert tools[0]["name"] == "knowledge_search" and tools[0]["source"] == "knowledge"
        await chat.script(
            {"tool_calls": [call("k1", "knowledge_search", {"query": "kitten naps"}),
                            call("c1", "get_session_capabilities", {})]},
            {"text": "Plant 3 needs 4 litres [1]. The kitten naps there [7]."},
        )
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "How much water does plant number 3 need?"}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end", final
        streamed = [b for b in await chat.requests() if b.get("stream")]
        assert len(streamed) == 2
        first = streamed[0]
        assert first["tools"][0]["function"]["name"] == "knowledge_search"
        system = system_text(first)
        block = system[system.index("<knowledge>"): system.index("</knowledge>")]
        markers = [int(m) for m in re.findall(r'<source marker="(\d+)"', block)]
        assert 1 <= len(markers) <= 6 and markers == list(range(1, len(markers) + 1))
        assert "plant number 3 " in block and 'document="facts.md"' in block and "[1][3]" in block
        # the same block on the second step (the request is rebuilt), same numbering
        assert system_text(streamed[1]).count("<source ") == len(markers)
        tool_messages = {m["tool_call_id"]: m["content"] for m in streamed[1]["messages"] if m["role"] == "tool"}
        found = re.findall(r'<source marker="(\d+)"', tool_messages["k1"])
        assert found and all(int(m) > len(markers) or int(m) in markers for m in found)
        assert "kitten naps" in tool_messages["k1"]
        kitten = re.search(r'<source marker="(\d+)" document="notes.md"', tool_messages["k1"])
        assert kitten is not None and int(kitten.group(1)) == len(markers) + 1  # numbering continues
        capabilities = json.loads(tool_messages["c1"])
        knowledge = capabilities["retrieval"]["knowledge_base"]
        assert knowledge["enabled"] is True and knowledge["tool"] == "knowledge_search"
        assert knowledge["bases"] == [{"id": kb_id, "name": "Greenhouse", "mode": "hybrid",
                                       "embeddingModel": knowledge["bases"][0]["embeddingModel"]}]
        # an assistant without knowledge bases: no block, no tool, and the capabilities say so
        await proc.call("assistant:upsert", {"id": "default", "name": "Plain"})
        await chat.script({"tool_calls": [call("c2", "get_session_capabilities", {})]}, {"text": "ok"})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "plant number 3?"}})
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
        later = [b for b in await chat.requests() if b.get("stream")][-1]
        if later["messages"][0]["role"] == "system":
            assert "<knowledge>" not in system_text(later)
        assert all(t["function"]["name"] != "knowledge_search" for t in later["tools"])
        result = next(m["content"] for m in later["messages"] if m["role"] == "tool" and m["tool_call_id"] == "c2")
        assert json.loads(result)["retrieval"]["knowledge_base"] == {"enabled": False}
        await proc.close()


async def test_the_reply_completes_on_lexical_retrieval_when_embeddings_fail(tmp_path: Path) -> None:
    async with scripted_provider() as chat, embedding_server() as embeddings, spawn_sidecar(tmp_path / "data") as proc:
        _, sid = await setup(proc, chat, embeddings)
        await embeddings.config(status=500)
        await chat.script({"text": "Open every morning [1]."})
        sent = await proc.call("chat:send", {"sessionId": sid, "input": {"content": "温室的门什么时候打开？"}})
        final = await wait_final(proc, sent["messageId"], timeout=60)
        assert final["type"] == "stream_end", final
        body = [b for b in await chat.requests() if b.get("stream")][-1]
        block = system_text(body)
        assert "<knowledge>" in block and "温室的门每天早上打开" in block
        reply = (await proc.call("chat:messages:get", {"sessionId": sid}))[-1]
        assert reply["status"] == "completed" and reply["textContent"] == "Open every morning [1]."
        await proc.close()
