"""Whatever an embeddings endpoint answers, a document ends indexed (ready, pending its
vectors, or failed with a code), search answers, and a later good answer makes it ready.

The loopback embeddings server (fixtures/embedding_server.py, a real subprocess) answers
every request with a valid answer of either format (OpenAI's ``data[].embedding`` with
``usage``, Ollama's ``embeddings`` with ``prompt_eval_count``) mutated as
tests/test_provider_bytes_property.py mutates a provider's events: values of any type and
size (vectors of the wrong size, numbers out of float32, strings), keys dropped. For each
round: the document leaves ``pending``/``indexing``, ``kb:search`` answers, nothing is
-32603. At the end the server answers well again: a re-index makes every document ready.
No traceback is logged; every line sent validates against the generated schema
(spawn_sidecar checks it on exit). The draws are fixed (``derandomize``): a failure replays.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kb_helpers import embedding_provider, embedding_server, wait_indexed
from sidecar_proc import spawn_sidecar
from mutation import fixed_draws, mutated_document, sendable

pytestmark = pytest.mark.anyio

ROUNDS = 6
EXAMPLES = 3
VECTOR = [0.5, -0.25, 0.125, 1.0, 0.0, -1.0, 0.75, 0.3]
ANSWERS: dict[str, Any] = {
    "openai-compat": {"object": "list", "model": "embed-1", "usage": {"prompt_tokens": 9, "total_tokens": 9},
                      "data": [{"object": "embedding", "index": 0, "embedding": VECTOR}]},
    "ollama": {"model": "embed-1", "embeddings": [VECTOR], "prompt_eval_count": 9},
}
FLOATS = [1e39, -1e39, 3.4e38, 1e-320, 0.0]


@st.composite
def answers(draw: st.DrawFn, kind: str) -> Any:
    answer = draw(mutated_document(ANSWERS[kind]))
    if draw(st.integers(0, 3)) == 0:  # a vector of odd numbers, as float32 sees them
        answer = {**ANSWERS[kind]}
        row = [draw(st.sampled_from(FLOATS + VECTOR)) for _ in range(len(VECTOR))]
        answer = {**answer, **({"embeddings": [row]} if kind == "ollama" else
                               {"data": [{"object": "embedding", "index": 0, "embedding": row}]})}
    return sendable(answer)


@st.composite
def scripts(draw: st.DrawFn) -> tuple[str, list[Any]]:
    kind = draw(st.sampled_from(sorted(ANSWERS)))
    return kind, [draw(answers(kind)) for _ in range(ROUNDS)]


@fixed_draws(EXAMPLES)
@given(script=scripts())
async def test_any_embeddings_answer_leaves_documents_indexed_and_search_answering(
    tmp_path_factory: pytest.TempPathFactory, script: tuple[str, list[Any]]
) -> None:
    kind, rounds = script
    async with embedding_server() as server, spawn_sidecar(tmp_path_factory.mktemp("data")) as proc:
        await proc.call("sidecar:initialize", {})
        provider = await embedding_provider(proc, server, kind=kind)
        kb = await proc.call("kb:create", {"name": "Manuals", "chunkSize": 64, "chunkOverlap": 0,
                                           "embeddingModel": {"providerId": provider["id"], "modelId": "embed-1"}})
        await server.config(dims=len(VECTOR))
        documents = []
        for n, answer in enumerate(rounds):
            await server.config(raw=answer)
            added = await proc.call("kb:document:add", {"kbId": kb["id"], "name": f"{n}.txt",
                                                        "text": f"Printer note {n}: duplex mode and the paper tray."})
            doc = await wait_indexed(proc, added["document"]["id"], timeout=60)
            assert doc["status"] in ("ready", "embedding_pending", "error"), doc
            assert doc["status"] != "error" or doc["errorCode"], doc
            documents.append(doc["id"])
            found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "duplex"}, timeout=30)
            assert isinstance(found["hits"], list), found
        await server.config(raw=None)
        for doc_id in documents:
            await proc.call("kb:document:reindex", {"id": doc_id})
            doc = await wait_indexed(proc, doc_id, timeout=60)
            assert doc["status"] == "ready", (doc, rounds)
        found = await proc.call("kb:search", {"kbIds": [kb["id"]], "query": "duplex"}, timeout=30)
        assert found["mode"] == "hybrid" and found["hits"], found
        await proc.close(timeout=60)
    proc.assert_no_traceback()
