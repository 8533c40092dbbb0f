"""Knowledge bases over the real server and a loopback embeddings server whose
vectors the test controls: Markdown, PDF, HTML and Chinese documents with progress,
kb:search by an English word, a two-character Chinese word and by vector similarity
alone, the Ollama endpoint, lexical fallback when the embedding server fails, a change of
embedding model re-embedded in the background, and the handshake listing the kb methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from kb_helpers import concept, embedding_provider, embedding_server, pdf_bytes, progress_end, wait_indexed
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio

MARKDOWN = """# Garden guide

Intro text about gardens.

## Roses

Roses need six hours of sunlight and deep watering every week.

## Pets in the garden

The kitten sleeps under the hydrangea all afternoon.

```python
def water(plant):
    return plant.soak(minutes=20)
```
"""

HTML = """<!doctype html><html><head><title>Tides</title><script>var x = "scriptword";</script></head>
<body><nav>Home | About navword</nav><h1>Ocean tides</h1><p>Tides are caused by the moon's gravity.</p>
<h2>Spring tides</h2><p>Spring tides happen at full moon and new moon.</p></body></html>"""

CHINESE = """第一章 网络配置

本章介绍网络代理的设置方法。首先打开设置面板；然后选择代理选项。

第二章 数据备份

备份数据可以防止丢失。请每周备份一次！"""


async def setup_kb(proc: Any, server: Any, root: Path, **kb: Any) -> dict[str, Any]:
    await proc.call("sidecar:initialize", {"protocolVersion": 1})
    provider = await embedding_provider(proc, server)
    await proc.call("kb:settings:update", {"allowedRoots": [str(root)]})
    return await proc.call("kb:create", {
        "name": "Docs", "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}, **kb,
    })


async def test_documents_are_indexed_with_progress_and_found_three_ways(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "garden.md").write_text(MARKDOWN, encoding="utf-8")
    (root / "tides.html").write_text(HTML, encoding="utf-8")
    (root / "report.pdf").write_bytes(pdf_bytes([
        ["Quarterly report", "Revenue grew twelve percent."],
        ["Outlook", "The glacier project starts in spring."],
    ]))
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        # texts about small cats share a concept with the query "feline" (no shared word)
        await server.config(rules=[{"contains": "kitten", "vector": concept(3)},
                                   {"contains": "feline", "vector": concept(3)}])
        info = await proc.call("sidecar:initialize", {"protocolVersion": 1})
        kb_methods = [m for m in info["capabilities"]["implemented"] if m.startswith("kb:")]
        assert {"kb:create", "kb:list", "kb:get", "kb:update", "kb:delete", "kb:document:add",
                "kb:document:list", "kb:document:get", "kb:document:delete", "kb:document:reindex",
                "kb:search"} <= set(kb_methods)
        assert "sidecar:progress" in info["capabilities"]["notifications"]
        kb = await setup_kb(proc, server, root)
        docs = {}
        for token, params in {
            "md": {"path": str(root / "garden.md")},
            "html": {"path": str(root / "tides.html")},
            "pdf": {"path": str(root / "report.pdf")},
            "zh": {"name": "网络手册.txt", "text": CHINESE},
        }.items():
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "progressToken": token, **params})
            assert added["duplicate"] is False and added["document"]["status"] in ("pending", "indexing", "ready")
            docs[token] = added["document"]["id"]
        for token, doc_id in docs.items():
            updates = await progress_end(proc, token)
            assert updates[-1]["done"] == updates[-1]["total"] > 0 and updates[-1]["message"] == "kb:index: ready", updates
            assert [u["kind"] for u in updates] == ["begin", *["report"] * (len(updates) - 2), "end"]
            assert all(u["message"].startswith("kb:index: ") for u in updates)
            assert [u["done"] for u in updates] == sorted(u["done"] for u in updates)  # never goes back
            assert sum(u["done"] == u["total"] for u in updates) == 1  # only the last one ends it
            doc = await wait_indexed(proc, doc_id)
            assert doc["status"] == "ready" and doc["chunkCount"] > 0, doc
        kinds = {d["id"]: d["kind"] for d in await proc.call("kb:document:list", {"kbId": kb["id"]})}
        assert kinds == {docs["md"]: "markdown", docs["html"]: "html", docs["pdf"]: "pdf", docs["zh"]: "text"}

        # an English word: the Markdown chunk, with its heading path
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "sunlight"})
        assert found["mode"] == "hybrid"
        top = found["hits"][0]
        assert top["documentId"] == docs["md"] and "six hours of sunlight" in top["text"]
        # the small sections are one chunk under the path they share, their heading lines in it
        assert top["heading"] == ["Garden guide"] and top["lexicalRank"] == 1 and top["mode"] == "hybrid"
        assert "Intro text about gardens.\n\n## Roses\n\nRoses need" in top["text"]
        # a two-character Chinese word inside a longer run
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "代理"})
        assert found["hits"][0]["documentId"] == docs["zh"] and "网络代理" in found["hits"][0]["text"]
        # vector similarity alone: no word of the query is in the chunk
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "feline"})
        top = found["hits"][0]
        assert "kitten" in top["text"] and top["lexicalRank"] is None and top["vectorRank"] == 1, found
        # PDF pages: the second page's text is cited as page 2; offsets point into the document
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "glacier"})
        top = found["hits"][0]
        assert top["documentId"] == docs["pdf"] and top["page"] == 2
        detail = await proc.call("kb:document:get", {"id": docs["pdf"], "includeChunks": True})
        assert detail["document"]["pageCount"] == 2 and {c["page"] for c in detail["chunks"]} == {1, 2}
        # HTML: visible text only, headings as the path
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "spring tides full moon"})
        top = found["hits"][0]
        assert top["documentId"] == docs["html"] and top["heading"] == ["Ocean tides"]
        assert "## Spring tides\n\nSpring tides happen" in top["text"]
        for hidden in ("scriptword", "navword"):
            hits = (await proc.call("kb:search", {"kbIds": [kb["id"]], "query": hidden}))["hits"]
            assert all(hidden not in h["text"] for h in hits)
        # the same content again is a no-op
        again = await proc.call("kb:document:add", {"kbId": kb["id"], "path": str(root / "garden.md")})
        assert again["duplicate"] is True and again["document"]["id"] == docs["md"]
        listed = await proc.call("kb:list")
        assert listed[0]["documentCount"] == 4 and listed[0]["documentsIndexing"] == 0
        assert listed[0]["vectorModel"].endswith("/embed-1") and listed[0]["vectorDims"] == 16
        # the embeddings server got the key, batches, and no chat body
        bodies = await server.requests()
        assert all(b["model"] == "embed-1" and isinstance(b["input"], list) for b in bodies)
        assert "sk-embed-SECRET" not in proc.stderr_text()
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_embedding_failure_falls_back_to_lexical(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    async with spawn_sidecar(tmp_path / "data") as proc:
        async with embedding_server() as server:
            kb = await setup_kb(proc, server, root)
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "g.md", "text": MARKDOWN})
            assert (await wait_indexed(proc, added["document"]["id"]))["status"] == "ready"
            assert (await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "roses"}))["mode"] == "hybrid"
            await server.config(status=500)
            found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "sunlight"}, timeout=30)
            assert found["mode"] == "lexical" and found["hits"][0]["mode"] == "lexical"
            assert "sunlight" in found["hits"][0]["text"] and "500" in found["notes"][0]
            assert len([b for b in await server.requests() if b["input"] == ["sunlight"]]) == 3  # 2 retries
        # the server is gone: still lexical results
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "kitten"}, timeout=30)
        assert found["mode"] == "lexical" and "kitten" in found["hits"][0]["text"]
        # a document added now cannot be embedded: searchable lexically, its vectors retried
        added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "late.txt", "text": "late words"})
        doc = await wait_indexed(proc, added["document"]["id"], timeout=60)
        assert doc["status"] == "embedding_pending" and doc["errorCode"] == "embedding_failed", doc
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "late"}, timeout=30)
        assert [h["text"] for h in found["hits"]] == ["late words"]
        await proc.close()


async def test_ollama_embed_and_a_base_without_model(tmp_path: Path) -> None:
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {})
        ollama = await embedding_provider(proc, server, kind="ollama", name="Local Ollama")
        kb = await proc.call("kb:create", {"name": "O", "embeddingModel": {"providerId": ollama["id"], "modelId": "nomic"}})
        plain = await proc.call("kb:create", {"name": "Plain", "chunkSize": 128, "chunkOverlap": 16})
        a = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "zh.txt", "text": CHINESE})
        b = await proc.call("kb:document:add", {"kbId": plain["id"], "name": "zh.txt", "text": CHINESE})
        assert (await wait_indexed(proc, a["document"]["id"]))["status"] == "ready"
        assert (await wait_indexed(proc, b["document"]["id"]))["status"] == "ready"
        assert any(r["model"] == "nomic" for r in await server.requests())
        both = await proc.call("kb:search", {"kbIds": [kb["id"], plain["id"]], "query": "备份"})
        assert both["mode"] == "hybrid"
        assert {h["kbId"]: h["mode"] for h in both["hits"]} == {kb["id"]: "hybrid", plain["id"]: "lexical"}
        # anthropic has no embeddings API: refused, not a setting that does nothing
        anthropic = await proc.call("provider:upsert", {"name": "A", "type": "anthropic", "baseUrl": server.root})
        with pytest.raises(Exception) as err:
            await proc.call("kb:create", {"name": "X", "embeddingModel": {"providerId": anthropic["id"], "modelId": "m"}})
        assert err.value.code == -32602 and "embeddings" in err.value.message
        await proc.close()


async def test_changing_the_model_reembeds_while_old_vectors_serve(tmp_path: Path) -> None:
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        await server.config(rules=[{"contains": "topic7 ", "vector": concept(5)}])  # both legs agree
        await proc.call("sidecar:initialize", {})
        provider = await embedding_provider(proc, server)
        kb = await proc.call("kb:create", {"name": "R", "chunkSize": 64, "chunkOverlap": 0,
                                           "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}})
        text = "\n\n".join(f"Paragraph {i} talks about topic{i} and the harbour lights." for i in range(300))
        added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "long.txt", "text": text})
        doc = await wait_indexed(proc, added["document"]["id"])
        assert doc["status"] == "ready" and doc["chunkCount"] > 10
        await server.config(delay_ms=150)  # each batch of the re-embedding is slow
        updated = await proc.call("kb:update", {
            "id": kb["id"], "embeddingModel": {"providerId": provider["id"], "modelId": "embed-2"},
            "progressToken": "re",
        })
        assert updated["embeddingModel"]["modelId"] == "embed-2" and updated["vectorModel"].endswith("/embed-1")
        assert updated["reembedding"] is True
        # while it runs, the old vectors answer (the query is embedded by the old model)
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "topic7 harbour"}, timeout=30)
        assert found["mode"] == "hybrid" and found["hits"]
        updates = await progress_end(proc, "re", timeout=60)
        assert updates[-1]["message"] == "kb:reembed: ready" and updates[-1]["kind"] == "end"
        assert all(u["message"].startswith("kb:reembed: ") for u in updates)
        after = await proc.call("kb:get", {"id": kb["id"]})
        assert after["vectorModel"].endswith("/embed-2") and after["reembedding"] is False
        assert {r["model"] for r in await server.requests()} == {"embed-1", "embed-2"}
        await server.config(delay_ms=0)
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "topic7 harbour"})
        assert found["mode"] == "hybrid" and "topic7" in found["hits"][0]["text"]
        # dropping the model: lexical only, no vectors left
        cleared = await proc.call("kb:update", {"id": kb["id"], "clearEmbeddingModel": True})
        assert cleared["embeddingModel"] is None and cleared["vectorModel"] is None
        assert (await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "topic7"}))["mode"] == "lexical"
        await proc.close()
