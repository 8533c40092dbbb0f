"""Section 5 of bench_retrieval.py: retrieval quality on the offline sets (retrieval_sets.py).

Owns how a set is measured: its documents indexed through the product's own path
(``chunking.chunk_document`` at ingestion's size with the base's common lines,
``KnowledgeRepo.write_index``, the local wordllama embedder), each query run through the
lexical leg alone, the vector leg alone and the HybridRetriever, and recall@6 / MRR@10 of
each by query group (retrieval_sets.GROUPS). Each set is measured twice in the same run: chunked as now (small
sections merged) and with ``merge_sections=False``, the rule before merging (every heading
closes a chunk), so the gain from merging is a same-run figure; a set with Markdown or HTML
documents is indexed a third time with every document added as kind ``text`` (paragraphs
only), the reference a reader of small-section documentation would compare against.

A query's rank is the place of the first chunk of a relevant document in the list: a leg's
first 10 chunks, the hybrid's first 10 (which holds at most 3 chunks of one document while
others pass, as every search does).

With a ``then`` tree (revisions.py's ``unpack_revision``: an earlier revision's ``sidecar`` and
``protocol``), the same documents and queries are also ranked by that revision's product
(retrieval_then.py, in a child process on that tree), and its hybrid MRR@10 is printed
beside today's: the gain of everything since then, in the same run. A document read from a
file (``Doc.path``: the HTML pages of the help set) is extracted by each revision itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from retrieval_sets import (
    GROUPS, MANZH, PYDOC, SetUnavailable, in_calibration, libreoffice_help, man_pages, mrr_at, python_docs,
    recall_at, size_distribution,
)
from sidecar.retrieval import chunking
from sidecar.retrieval.indexes import KnowledgeIndexes
from sidecar.retrieval.retriever import HybridRetriever
from sidecar.store import Store
from sidecar.store.async_store import AsyncStore

__all__ = ["Doc", "Query", "measure_set", "debian_set", "help_set", "LEGS"]

LEGS = ("lexical", "vector", "hybrid")
CHUNK_SIZE = chunking.DEFAULT_CHUNK_SIZE
"""Each base's chunk size, today's and (through the job, retrieval_then.py) the earlier
revision's; chunks are cut at ``chunking.effective_size`` of it and the embedder's input
limit, as ingestion cuts them (the local wordllama embedder has none)."""
CHUNK_OVERLAP = chunking.DEFAULT_OVERLAP
Ranks = dict[tuple[str, str], list[int]]


class Doc(NamedTuple):
    base: str
    name: str
    kind: str
    text: str
    path: str | None = None
    """The file the text was extracted from (an earlier revision extracts it itself)."""


class Query(NamedTuple):
    lang: str
    base: str
    text: str
    relevant: frozenset[str]
    calib: bool


def debian_set(limit: int) -> tuple[list[Doc], list[Query], str] | str:
    """The Debian known-item set (one base), or why it is not here."""
    # other packages install a few zh_CN pages too: the package's own doc dir says it is here
    have_zh = (MANZH / "man1").is_dir() and Path("/usr/share/doc/manpages-zh").is_dir()
    missing = [pkg for pkg, ok in (("python3-doc", PYDOC.is_dir()), ("manpages-zh", have_zh)) if not ok]
    if missing:
        return f"the evaluation data is not installed (apt-get install {' '.join(missing)})"
    docs: list[Doc] = []
    queries: list[Query] = []
    for lang, items in (("en", python_docs(limit)), ("zh", man_pages(limit))):
        for name, text, query in items:
            docs.append(Doc("debian", name, "markdown" if lang == "en" else "text", text))
            queries.append(Query(lang, "debian", query, frozenset([name]), in_calibration(f"{lang}:{name}")))
    return docs, queries, f"{sum(q.lang == 'en' for q in queries)} English, {sum(q.lang == 'zh' for q in queries)} Chinese pages"


def help_set(cache: Path, max_queries: int, limit: int) -> tuple[list[Doc], list[Query], str] | str:
    """The LibreOffice help set (a base per language), or why it is not here."""
    docs: list[Doc] = []
    queries: list[Query] = []
    said = []
    for lang in ("en", "zh"):
        try:
            got = libreoffice_help(lang, cache, max_queries)
        except SetUnavailable as exc:
            return str(exc)
        base = f"help-{lang}"
        pages = got.pages[:limit] if limit else got.pages
        kept = {name for name, _ in pages}
        docs.extend(Doc(base, name, "html", text, str(got.root / name)) for name, text in pages)
        for text, relevant in got.queries:
            if relevant & kept:
                queries.append(Query(lang, base, text, relevant & kept, in_calibration("help:" + text)))
        said.append(f"{got.package} {got.version}: {len(pages)} pages, {got.entries} index entries,"
                    f" {sum(q.lang == lang for q in queries)} queries")
    return docs, queries, "; ".join(said)


def _index(store: Store, embedder: Any, docs: list[Doc], merge: bool) -> tuple[dict[str, str], dict[tuple[str, str], str], list[int]]:
    """Bases (label -> kb id), (base, name) -> document id, chunk sizes."""
    repo = store.knowledge
    kb_of: dict[str, str] = {}
    doc_id: dict[tuple[str, str], str] = {}
    sizes: list[int] = []
    size = chunking.effective_size(CHUNK_SIZE, embedder.input_limit)  # what ingestion uses (ingest.py)
    for d in docs:
        if d.base not in kb_of:
            kb_of[d.base] = repo.create_kb(name=d.base, description="", embed=("@local", "wordllama"),
                                           chunk_size=CHUNK_SIZE, chunk_overlap=CHUNK_OVERLAP).id
        kb_id = kb_of[d.base]
        doc, _dup = repo.add_document(kb_id=kb_id, name=d.name, kind=d.kind, source="text", path=None,
                                      size_bytes=len(d.text), content_hash=f"{d.base}:{d.name}", body=d.text)
        claimed = repo.claim(doc.id)
        assert claimed is not None
        kind = "markdown" if d.kind == "html" else d.kind  # extraction already wrote the page as Markdown
        chunks = chunking.chunk_document(doc.id, kind, d.text, None, size=size, overlap=CHUNK_OVERLAP,
                                         common=repo.common_lines(kb_id), merge_sections=merge)
        if not chunks:
            continue
        vectors = embedder.embed_blocking([c.embed_text for c in chunks])
        for c, v in zip(chunks, vectors):
            c.vector = v.astype("<f4").tobytes()
        repo.write_index(claimed, body=d.text, pages=None, kind=kind, chunks=chunks, model=embedder.key,
                         dims=int(vectors.shape[1]))
        doc_id[(d.base, d.name)] = doc.id
        sizes.extend(c.tokens for c in chunks)
    return kb_of, doc_id, sizes


def _rank(store: Store, embedder: Any, kb_of: dict[str, str], doc_id: dict[tuple[str, str], str],
          queries: list[Query]) -> Ranks:
    repo = store.knowledge
    gateway = AsyncStore(store)
    indexes = KnowledgeIndexes(gateway)

    async def embedder_for(key: str) -> Any:
        return embedder

    retriever = HybridRetriever(gateway, indexes, embedder_for)
    kbs = {label: repo.kbs([kb_id]) for label, kb_id in kb_of.items()}

    async def run() -> Ranks:
        ranks: Ranks = {}
        for q in queries:
            kb_id = kb_of[q.base]
            relevant = {doc_id[(q.base, n)] for n in q.relevant if (q.base, n) in doc_id}
            qv = (await embedder.embed([q.text])).vectors[0]
            lexical = [r for r, _ in repo.lexical([kb_id], q.text, 10)]
            vector = [r for r, _ in indexes.search_blocking(repo, [(kb_id, embedder.key)], qv, 10)]
            hybrid = await retriever._search(kbs[q.base], q.text, 10, None)
            hits = repo.hits(lexical + vector)
            lists = {
                "lexical": [hits[r].document_id for r in lexical if r in hits],
                "vector": [hits[r].document_id for r in vector if r in hits],
                "hybrid": [c.chunk.document_id for c in hybrid.chunks],
            }
            for leg, found in lists.items():
                rank = next((i for i, d in enumerate(found, start=1) if d in relevant), 0)
                for group in _groups(q):
                    ranks.setdefault((leg, group), []).append(rank)
        return ranks

    return anyio.run(run)


def _groups(q: Query) -> tuple[str, ...]:
    half = "calib" if q.calib else "held-out"
    return (q.lang, "all", half, *(() if q.calib else (f"held-{q.lang}",)))


def _rank_then(tree: Path, data_dir: Path, docs: list[Doc], queries: list[Query]) -> Ranks:
    """The hybrid ranks of the product in ``tree`` (retrieval_then.py), grouped as today's."""
    job = data_dir / "job.json"
    data_dir.mkdir(parents=True, exist_ok=True)
    job.write_text(json.dumps({
        "tree": str(tree), "data_dir": str(data_dir / "db"), "chunk_size": CHUNK_SIZE, "chunk_overlap": CHUNK_OVERLAP,
        "docs": [{"base": d.base, "name": d.name, "kind": d.kind, **({"path": d.path} if d.path else {"text": d.text})}
                 for d in docs],
        "queries": [{"base": q.base, "text": q.text, "relevant": sorted(q.relevant)} for q in queries],
    }), encoding="utf-8")
    script = Path(__file__).with_name("retrieval_then.py")
    env = dict(os.environ, PYTHONPATH=str(tree))
    got = subprocess.run([sys.executable, str(script), str(job)], capture_output=True, text=True, env=env,
                         timeout=3600)
    if got.returncode != 0:
        raise RuntimeError(f"retrieval_then.py on {tree} failed: {got.stderr.strip()[-2000:]}")
    ranks: Ranks = {}
    for q, rank in zip(queries, json.loads(got.stdout.strip().splitlines()[-1]), strict=True):
        for group in _groups(q):
            ranks.setdefault(("hybrid", group), []).append(rank)
    return ranks


def _table(say: Callable[[str], None], ranks: Ranks) -> None:
    groups = [g for g in GROUPS if ("lexical", g) in ranks]
    counts = ", ".join(f"{g} {len(ranks[('lexical', g)])}" for g in groups)
    width = 9 * len(groups)
    say(f"    {'':8} {'recall@6':>{width}} {'MRR@10':>{width}}   (queries: {counts})")
    say(f"    {'':8} " + "".join(f"{g:>9}" for g in groups) + " " + "".join(f"{g:>9}" for g in groups))
    for leg in LEGS:
        say(f"    {leg:8} " + "".join(f"{recall_at(ranks[(leg, g)], 6):9.3f}" for g in groups) + " "
            + "".join(f"{mrr_at(ranks[(leg, g)], 10):9.3f}" for g in groups))
    for g in groups:
        verdict = []
        for name, fn, cut in (("recall@6", recall_at, 6), ("MRR@10", mrr_at, 10)):
            best = max(fn(ranks[(leg, g)], cut) for leg in ("lexical", "vector"))
            got = fn(ranks[("hybrid", g)], cut)
            verdict.append(f"{name} {got:.3f} {'>=' if got >= best - 1e-12 else '<'} {best:.3f}")
        say(f"    hybrid vs the better leg, {g:>9}: " + ", ".join(verdict))


def measure_set(say: Callable[[str], None], data_dir: Path, label: str, docs: list[Doc], queries: list[Query],
                embedder: Any, then: tuple[str, Path] | None = None) -> dict[str, Ranks]:
    """Both chunkings of one set, each in its own data dir, and the product of ``then``
    (revision, unpacked tree) if given; the ranks by chunking (and ``then``)."""
    out: dict[str, Ranks] = {}
    modes = [("headings", "before merging (every heading closes a chunk)", False, docs),
             ("merged", "merged sections (now)", True, docs)]
    if any(d.kind != "text" for d in docs):
        modes.append(("text", "the same documents added as kind text (paragraphs only, no headings)", True,
                      [d._replace(kind="text") for d in docs]))
    for key, mode, merge, indexed in modes:
        store = Store(data_dir / f"quality-{label}-{key}")
        try:
            t = time.perf_counter()
            kb_of, doc_id, sizes = _index(store, embedder, indexed, merge)
            say(f"  {mode}: {len(doc_id)} documents, {len(sizes):,} chunks indexed in {time.perf_counter() - t:.1f} s")
            say("    chunk sizes (tokens): " + size_distribution(sizes))
            t = time.perf_counter()
            ranks = _rank(store, embedder, kb_of, doc_id, queries)
            say(f"    {len(queries)} queries in {time.perf_counter() - t:.1f} s")
            _table(say, ranks)
            out[key] = ranks
        finally:
            store.close()
    for g in ("all", "en", "zh", "held-out"):
        if ("hybrid", g) in out["merged"]:
            now, before = (mrr_at(out[m][("hybrid", g)], 10) for m in ("merged", "headings"))
            as_text = f", {mrr_at(out['text'][('hybrid', g)], 10):.3f} as kind text" if "text" in out else ""
            say(f"  hybrid MRR@10 {g:>8}: {before:.3f} before merging, {now:.3f} merged ({now - before:+.3f})"
                f"{as_text}   (target +0.10)")
    if then is not None:
        rev, tree = then
        t = time.perf_counter()
        try:
            out["then"] = _rank_then(tree, data_dir / f"then-{label}", docs, queries)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # a revision the script cannot drive
            say(f"  the product at {rev} could not be ranked: {exc}")
            return out
        say(f"  the product at {rev} (its own extraction, chunking, index and fusion), ranked in"
            f" {time.perf_counter() - t:.1f} s:")
        for g in GROUPS:
            if ("hybrid", g) in out["then"]:
                old, now = mrr_at(out["then"][("hybrid", g)], 10), mrr_at(out["merged"][("hybrid", g)], 10)
                old_r, now_r = recall_at(out["then"][("hybrid", g)], 6), recall_at(out["merged"][("hybrid", g)], 6)
                say(f"    hybrid {g:>8}: MRR@10 {old:.3f} at {rev}, {now:.3f} now ({now - old:+.3f});"
                    f" recall@6 {old_r:.3f}, {now_r:.3f} ({now_r - old_r:+.3f})")
    return out
