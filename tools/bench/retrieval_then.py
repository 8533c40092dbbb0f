"""The product's hybrid ranking as an earlier revision gave it: the "then" of bench_retrieval's section 5.

Run by retrieval_quality.py as ``python retrieval_then.py JOB.json`` with ``PYTHONPATH`` set
to an unpacked earlier tree (``git archive REV sidecar protocol``), so ``sidecar`` here is
that revision's code: its extraction, chunking, full-text index, vectors and fusion, driven
through the calls every revision since the knowledge bases has had (KnowledgeRepo's
create_kb / add_document / claim / write_index, chunking.effective_size and chunk_document,
the local wordllama embedder, HybridRetriever._search), at the chunk size its ingestion
used (the job's chunk size, clamped to that embedder's input limit). What must stay true: it
imports nothing of the current tree (it checks that ``sidecar`` comes from the tree it was
given), and it indexes what the product of then would have: a document with a ``path`` is
read from that file and extracted by that revision (HTML pages with whatever it kept of
them), one with a ``text`` is indexed as given.

JOB.json: ``{"data_dir": ..., "tree": ..., "chunk_size": ..., "chunk_overlap": ...,
"docs": [{"base", "name", "kind", "text" | "path"}], "queries": [{"base", "text", "relevant": [names]}]}``. Prints a JSON list: for each query,
the place of the first chunk of a relevant document in the hybrid's first 10 (0: none).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    import anyio

    import sidecar
    from sidecar.retrieval import chunking
    from sidecar.retrieval.embeddings import LocalEmbedder
    from sidecar.retrieval.extract import extract
    from sidecar.retrieval.indexes import KnowledgeIndexes
    from sidecar.retrieval.retriever import HybridRetriever
    from sidecar.store import AsyncStore, Store

    tree = Path(job["tree"]).resolve()
    if tree not in Path(sidecar.__file__).resolve().parents:
        raise SystemExit(f"sidecar comes from {sidecar.__file__}, not from {tree}: set PYTHONPATH to the tree")
    logging.disable(logging.INFO)
    embedder = LocalEmbedder()
    # the size that revision's ingestion used: the base's, clamped to the embedder's input limit
    overlap = job["chunk_overlap"]
    size = chunking.effective_size(job["chunk_size"], embedder.input_limit)
    store = Store(Path(job["data_dir"]))
    try:
        repo = store.knowledge
        kb_of: dict[str, str] = {}
        doc_id: dict[tuple[str, str], str] = {}
        for d in job["docs"]:
            if d["base"] not in kb_of:
                kb_of[d["base"]] = repo.create_kb(name=d["base"], description="", embed=("@local", "wordllama"),
                                                  chunk_size=job["chunk_size"], chunk_overlap=overlap).id
            if d.get("path"):
                try:
                    extracted = extract(d["kind"], Path(d["path"]).read_bytes())
                except Exception:  # a page that revision refused: not indexed then
                    continue
                kind, text = extracted.kind, extracted.text
            else:
                kind, text = d["kind"], d["text"]
            doc, _dup = repo.add_document(kb_id=kb_of[d["base"]], name=d["name"], kind=kind, source="text",
                                          path=None, size_bytes=len(text), content_hash=f"{d['base']}:{d['name']}",
                                          body=text)
            claimed = repo.claim(doc.id)
            assert claimed is not None
            chunks = chunking.chunk_document(doc.id, kind, text, None, size=size, overlap=overlap)
            if not chunks:
                continue
            vectors = embedder.embed_blocking([c.embed_text for c in chunks])
            for c, v in zip(chunks, vectors):
                c.vector = v.astype("<f4").tobytes()
            repo.write_index(claimed, body=text, pages=None, kind=kind, chunks=chunks, model=embedder.key,
                             dims=int(vectors.shape[1]))
            doc_id[(d["base"], d["name"])] = doc.id
        gateway = AsyncStore(store)
        indexes = KnowledgeIndexes(gateway)

        async def embedder_for(key: str) -> Any:
            return embedder

        retriever = HybridRetriever(gateway, indexes, embedder_for)
        kbs = {base: repo.kbs([kb_id]) for base, kb_id in kb_of.items()}

        async def run() -> list[int]:
            ranks = []
            for q in job["queries"]:
                relevant = {doc_id[(q["base"], n)] for n in q["relevant"] if (q["base"], n) in doc_id}
                found = await retriever._search(kbs[q["base"]], q["text"], 10, None)
                ids = [c.chunk.document_id for c in found.chunks]
                ranks.append(next((i for i, d in enumerate(ids, start=1) if d in relevant), 0))
            return ranks

        print(json.dumps(anyio.run(run)))
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
