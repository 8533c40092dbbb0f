"""A document added while the embedding provider is down, over the real server and
the loopback embeddings server: it is chunked and lexically searchable at once (status
``embedding_pending`` with the last error and the next retry), its vectors are made later
by the knowledge service's retry schedule (backoff that doubles, persisted, resumed after a
restart, cancelled by shutdown), and a base where some documents lack vectors ranks those
lexically beside the hybrid rest instead of dropping them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from kb_helpers import embedding_provider, embedding_server, wait_indexed
from sidecar_proc import SidecarProcess, spawn_sidecar

from sidecar.retrieval import retries

pytestmark = pytest.mark.anyio

DOWN_RETRY_AFTER_MS = 5
"""The failing server asks for the provider's next try this soon: each failed attempt of the
knowledge service is the provider's three requests at once, not 0.5 s and 1 s of its backoff
(the schedule under test is the knowledge service's)."""
TEST_RETRY_BASE_S = 0.5
"""The restart test's first wait between attempts (the product's is RETRY_BASE_S, 2 s): the
same doubling schedule, a quarter of the time (the sidecar runs in this process)."""

PRINTER = "The printer manual explains duplex mode and the paper tray."
HARBOUR = "\n\n".join(
    f"# Harbour note {i}\n\nThe harbour lights of pier {i} are checked every evening by the keeper on duty."
    for i in range(8)
)


async def _base(proc: SidecarProcess, server: Any) -> dict[str, Any]:
    await proc.call("sidecar:initialize", {})
    provider = await embedding_provider(proc, server)
    return await proc.call("kb:create", {
        "name": "Manuals", "chunkSize": 64, "chunkOverlap": 0,
        "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"},
    })


async def _document(proc: SidecarProcess, doc_id: str) -> dict[str, Any]:
    return (await proc.call("kb:document:get", {"id": doc_id}))["document"]


async def _wait_status(proc: SidecarProcess, doc_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while (doc := await _document(proc, doc_id))["status"] != status:
            await anyio.sleep(0.1)
    return doc


async def _wait_attempts(proc: SidecarProcess, doc_id: str, attempts: int, timeout: float = 60) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while (doc := await _document(proc, doc_id))["embeddingAttempts"] < attempts:
            await anyio.sleep(0.05)
    return doc


async def test_a_document_added_while_embeddings_fail_is_searchable_then_embedded(tmp_path: Path) -> None:
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        kb = await _base(proc, server)
        await server.config(status=503, retry_after_ms=DOWN_RETRY_AFTER_MS)
        added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "printer.txt", "text": PRINTER})
        doc = await wait_indexed(proc, added["document"]["id"], timeout=60)
        # chunked and in the full-text index at once; the state says why and when next
        assert doc["status"] == "embedding_pending", doc
        assert doc["chunkCount"] == 1 and doc["errorCode"] == "embedding_failed" and "503" in doc["error"]
        assert doc["embeddingAttempts"] == 1 and doc["nextRetryAt"] > doc["updatedAt"]
        [info] = await proc.call("kb:list")
        assert info["documentsEmbeddingPending"] == 1 and info["documentsFailed"] == 0
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "duplex"}, timeout=30)
        assert [h["text"] for h in found["hits"]] == [PRINTER] and found["hits"][0]["mode"] == "lexical"
        listed = await proc.call("kb:document:list", {"kbId": kb["id"], "status": "embedding_pending"})
        assert [d["id"] for d in listed] == [doc["id"]]
        # the provider is back: the retry makes the vectors, no re-index asked for
        await server.config(status=None)
        ready = await _wait_status(proc, doc["id"], "ready")
        assert ready["error"] is None and ready["errorCode"] is None and ready["nextRetryAt"] is None
        assert ready["embeddingAttempts"] == 0 and ready["chunkCount"] == 1
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "duplex"})
        assert found["mode"] == "hybrid" and found["hits"][0]["mode"] == "hybrid"
        assert found["hits"][0]["cosine"] is not None
        [info] = await proc.call("kb:list")
        assert info["documentsEmbeddingPending"] == 0 and info["vectorModel"].endswith("/embed-1")
        await proc.close()


async def test_retries_back_off_survive_a_restart_and_stop_at_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "RETRY_BASE_S", TEST_RETRY_BASE_S)
    async with embedding_server() as server:
        async with spawn_sidecar(tmp_path / "data") as proc:
            assert proc.in_process  # the shorter schedule is this process's
            kb = await _base(proc, server)
            await server.config(status=500, retry_after_ms=DOWN_RETRY_AFTER_MS)
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "printer.txt", "text": PRINTER})
            doc_id = added["document"]["id"]
            first = await _wait_attempts(proc, doc_id, 1)
            second = await _wait_attempts(proc, doc_id, 2)
            third = await _wait_attempts(proc, doc_id, 3)
            # each failed retry waits twice as long as the one before: no busy loop
            delays = [d["nextRetryAt"] - d["updatedAt"] for d in (first, second, third)]
            assert delays[1] == 2 * delays[0] and delays[2] == 2 * delays[1], delays
            assert third["status"] == "embedding_pending" and third["chunkCount"] == 1
            await proc.close()  # a retry is scheduled: shutdown does not wait for it
        tries = len(await server.requests())
        async with spawn_sidecar(tmp_path / "data") as proc:
            await proc.call("sidecar:initialize", {})
            # still down: the schedule read back from the database goes on where it was
            after = await _wait_attempts(proc, doc_id, 4)
            assert after["nextRetryAt"] - after["updatedAt"] == 2 * delays[2]
            assert len(await server.requests()) > tries
            await proc.close()
        await server.config(status=None)
        async with spawn_sidecar(tmp_path / "data") as proc:
            await proc.call("sidecar:initialize", {})
            ready = await _wait_status(proc, doc_id, "ready", timeout=90)
            assert ready["embeddingAttempts"] == 0
            found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "duplex"})
            assert found["hits"][0]["mode"] == "hybrid"
            await proc.close()


async def test_chunks_without_vectors_rank_lexically_beside_hybrid_ones(tmp_path: Path) -> None:
    async with embedding_server() as server, spawn_sidecar(tmp_path / "data") as proc:
        kb = await _base(proc, server)
        harbour = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "harbour.md", "text": HARBOUR})
        assert (await wait_indexed(proc, harbour["document"]["id"]))["status"] == "ready"
        await server.config(status=503, retry_after_ms=DOWN_RETRY_AFTER_MS)
        late = await proc.call("kb:document:add", {"kbId": kb["id"], "name": "late.txt",
                                                   "text": "Harbour, harbour: the harbour."})
        assert (await wait_indexed(proc, late["document"]["id"], timeout=60))["status"] == "embedding_pending"
        await server.config(status=None)  # the query embeds; the late document has no vector yet
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "harbour", "limit": 3})
        assert found["mode"] == "hybrid"
        modes = {h["documentName"]: h["mode"] for h in found["hits"]}
        # the best lexical match is not pushed out by chunks that also have a vector rank
        assert found["hits"][0]["documentName"] == "late.txt" and modes == {"late.txt": "lexical", "harbour.md": "hybrid"}
        assert found["hits"][0]["vectorRank"] is None and found["hits"][0]["lexicalRank"] == 1
        await proc.close()
