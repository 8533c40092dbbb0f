"""Fusion of the lexical and vector legs: properties of ``fusion.fuse_scores`` over any legs
(hypothesis), and the never-worse rule on a fixture set run through the HybridRetriever:
hybrid recall@6 and MRR@10 at least those of the better leg, with a vector model that is
good for one language and blind to the other (as the English-centric local model is for
Chinese)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.retrieval import fusion
from sidecar.retrieval.chunking import chunk_document
from sidecar.retrieval.embeddings import Embedded
from sidecar.retrieval.indexes import KnowledgeIndexes
from sidecar.retrieval.retriever import HybridRetriever
from sidecar.store import Store
from sidecar.store.async_store import AsyncStore

scores = st.lists(st.floats(min_value=0.01, max_value=50.0), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(scores, st.floats(min_value=0.05, max_value=1.0), st.integers(min_value=10, max_value=30))
def test_a_level_vector_leg_leaves_the_lexical_order(lexical_scores: list[float], cosine: float, n: int) -> None:
    lexical = sorted(((f"l{i}", s) for i, s in enumerate(lexical_scores)), key=lambda x: -x[1])
    level = [(f"v{i}", cosine) for i in range(n)]  # no spread: no evidence
    fused = fusion.fuse_scores(lexical, [level])
    assert [k for k, s in fused if s > 0][: len(lexical)] == [k for k, _ in lexical]


@settings(max_examples=200, deadline=None)
@given(scores, scores)
def test_an_id_both_legs_put_first_is_first_and_one_leg_alone_keeps_its_order(a: list[float], b: list[float]) -> None:
    lexical = sorted(((f"x{i}", s) for i, s in enumerate(a)), key=lambda x: -x[1])
    vector = sorted(((f"x{i}", min(1.0, s / 50.0)) for i, s in enumerate(b)), key=lambda x: -x[1])
    fused = fusion.fuse_scores(lexical, [vector])
    if lexical[0][0] == vector[0][0]:
        assert fused[0][0] == lexical[0][0]
    alone = fusion.fuse_scores(lexical, [])
    assert [k for k, _ in alone] == [k for k, _ in lexical]
    only_vectors = fusion.fuse_scores([], [vector])
    ranked = [k for k, s in only_vectors if s > 0]
    assert ranked == [k for k, c in vector if c > fusion.VECTOR_BASE * vector[0][1]]


# ---- the fixture set ---------------------------------------------------------------------

_TOPICS = ["lantern", "harbor", "glacier", "orchard", "violin", "compass", "meadow", "furnace", "quarry",
           "beacon", "canyon", "pottery", "saddle", "tunnel", "mirror", "garden"]
_ACTIONS = ["repair", "clean", "measure", "paint", "store", "inspect", "move", "polish", "weigh", "tune"]
_FILLER = ["the", "a", "with", "for", "and", "then", "after", "before", "every", "small", "large", "old"]
_STOP = frozenset([*_FILLER, "how", "to"])
_HAN = "温室植物浇水阳光土壤花园种子肥料修剪工具仓库灯塔港口冰川果园提琴指南草地熔炉采石场峡谷陶器马鞍隧道镜子"


class _HashedWords:
    """A deterministic vector model that knows Latin content words only (hashed bags of words
    and of word prefixes, stop words left out); Chinese text gets one shared direction (the
    model is blind to it)."""

    key = "fixture/hashed"
    input_limit = None
    dims = 256

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dims, dtype=np.float32)
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in _STOP:
                continue
            for piece in (word, word[:4]):
                h = int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=4).digest(), "little")
                v[h % self.dims] += 1.0
        v[0] += 0.5  # every text shares a little of one direction (Chinese: only that)
        return v / np.linalg.norm(v)

    async def embed(self, texts: list[str]) -> Embedded:
        return Embedded(vectors=np.stack([self.vector(t) for t in texts]))

    async def aclose(self) -> None:
        return None


def _documents() -> list[tuple[str, str, str]]:
    """(language, text, query): English pages on topic/action pairs whose query shares the
    action word with many pages and the topic's stem (not its word) with its own, Chinese
    pages whose query is an unspaced phrase of it."""
    rng = np.random.default_rng(7)
    out = []
    for i, (topic, action) in enumerate((t, a) for t in _TOPICS for a in _ACTIONS[:4]):
        words = [str(rng.choice(_FILLER)) for _ in range(60)]
        for k in range(0, 60, 9):
            # the topic only inside a compound: the words miss it, the stems do not
            words[k] = [topic + "work", action + "ing", topic + "works", str(rng.choice(_ACTIONS))][k % 4]
        out.append(("en", " ".join(words), f"how to {action} the {topic}"))
    for i in range(30):
        chars = [_HAN[int(c)] for c in rng.integers(0, len(_HAN), 90)]
        text = "".join(chars)
        start = int(rng.integers(0, 80))
        out.append(("zh", text, text[start : start + 4]))
    return out


def _metrics(ranks: list[int]) -> tuple[float, float]:
    return (sum(1 for r in ranks if 0 < r <= 6) / len(ranks), sum(1 / r for r in ranks if 0 < r <= 10) / len(ranks))


def test_the_fused_floor_keeps_what_the_words_rank_down_to_the_kept_share() -> None:
    best = 12.0
    kept_share = fusion.LEXICAL_KEPT_SHARE
    lexical = [(1, best), (2, best * kept_share * 1.05), (3, best * kept_share * 0.9)]
    fused = fusion.fused_floor(fusion.fuse_scores(lexical, []), fusion.SCORE_RELATIVE_FLOOR)
    # lexical only: a chunk stays down to LEXICAL_KEPT_SHARE of the best BM25, whatever
    # LEXICAL_POWER is; below it, it is left out
    assert [key for key, _ in fused] == [1, 2]
    # the vectors agreeing on the best and finding another: nothing the words ranked above
    # the floor is lost beside it (it is relative to a best fused score up to 1.5x higher)
    both = fusion.fused_floor(fusion.fuse_scores(lexical[:1] + [(2, best * 0.12)], [[(1, 0.9), (4, 0.85)]]),
                              fusion.SCORE_RELATIVE_FLOOR)
    assert [key for key, _ in both][0] == 1 and {2, 4} <= set(dict(both))


def test_hybrid_is_never_worse_than_its_better_leg_on_the_fixture_set(tmp_path: Path) -> None:
    store = Store(tmp_path)
    model = _HashedWords()
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="fixture", description="", embed=("fixture", "hashed"), chunk_size=64,
                            chunk_overlap=0)
        queries: list[tuple[str, str, str]] = []
        for n, (lang, text, query) in enumerate(_documents()):
            doc, _ = repo.add_document(kb_id=kb.id, name=f"{n}.txt", kind="text", source="text", path=None,
                                       size_bytes=len(text), content_hash=str(n), body=text)
            claimed = repo.claim(doc.id)
            assert claimed is not None
            chunks = chunk_document(doc.id, "text", text, None, size=64, overlap=0)
            for c in chunks:
                c.vector = model.vector(c.embed_text).astype("<f4").tobytes()
            repo.write_index(claimed, body=text, pages=None, kind="text", chunks=chunks, model=model.key,
                             dims=model.dims)
            queries.append((lang, query, doc.id))
        gateway = AsyncStore(store)
        indexes = KnowledgeIndexes(gateway)

        async def embedder_for(key: str) -> Any:
            return model

        retriever = HybridRetriever(gateway, indexes, embedder_for)
        kbs = repo.kbs([kb.id])

        async def evaluate() -> dict[tuple[str, str], list[int]]:
            ranks: dict[tuple[str, str], list[int]] = {}
            for lang, query, target in queries:
                lexical = [r for r, _ in repo.lexical([kb.id], query, 10)]
                vector = [r for r, _ in indexes.search_blocking(repo, [(kb.id, model.key)], model.vector(query), 10)]
                hybrid = await retriever._search(kbs, query, 10, None)
                hits = repo.hits(lexical + vector)
                legs = {
                    "lexical": [hits[r].document_id for r in lexical],
                    "vector": [hits[r].document_id for r in vector],
                    "hybrid": [c.chunk.document_id for c in hybrid.chunks],
                }
                for leg, docs in legs.items():
                    for group in (lang, "all"):
                        ranks.setdefault((leg, group), []).append(docs.index(target) + 1 if target in docs else 0)
            return ranks

        ranks = anyio.run(evaluate)
        for group in ("en", "zh", "all"):
            hybrid = _metrics(ranks[("hybrid", group)])
            lexical = _metrics(ranks[("lexical", group)])
            vector = _metrics(ranks[("vector", group)])
            assert hybrid[0] >= max(lexical[0], vector[0]), (group, hybrid, lexical, vector)
            assert hybrid[1] >= max(lexical[1], vector[1]), (group, hybrid, lexical, vector)
        # the set exercises fusion: the legs disagree, neither is perfect
        assert _metrics(ranks[("vector", "zh")])[1] < _metrics(ranks[("lexical", "zh")])[1]
        assert _metrics(ranks[("lexical", "en")])[1] < _metrics(ranks[("vector", "en")])[1]
    finally:
        store.close()
