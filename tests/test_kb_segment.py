"""An unspaced Chinese query (sidecar/store/kb_segment.py): the bigrams across its word
boundaries, rare in the base, count only beside the query's words and no longer decide the ranking."""

from __future__ import annotations

from pathlib import Path

from kb_helpers import fill_base
from sidecar.store import Store, fts
from sidecar.store.kb_segment import straddling_terms

RIGHT = "如何定义一个对象的边框：在样式里设置边框的宽度和颜色。"
# 定义对象边框 = 定义 (define) 对象 (object) 边框 (border); 义对 and 象边 straddle its words
STRADDLING = "意义对于形象边界的讨论"


def _documents() -> list[str]:
    return (
        [RIGHT, STRADDLING, "意义对照表", "形象边缘"]
        + [f"在这里定义每个对象的属性 第{i}节" for i in range(6)]
        + [f"边框样式说明 第{i}节" for i in range(4)]
        + [f"网络代理的设置 第{i}节" for i in range(12)]
    )


def test_an_unspaced_chinese_query_ranks_the_page_about_its_words_first(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.knowledge
        kb = repo.create_kb(name="kb", description="", embed=None, chunk_size=64, chunk_overlap=0)
        fill_base(repo, kb.id, _documents())

        def first(query: str) -> str:
            top = repo.lexical([kb.id], query, 5)
            assert top, query
            return repo.hits([top[0][0]])[top[0][0]].text

        assert first("定义 对象 边框") == RIGHT  # spaced: the words themselves
        # unspaced: 义对 and 象边 (rare) no longer lift the page that holds them in other words
        assert first("定义对象边框") == RIGHT
        assert first("如何定义对象边框？") == RIGHT
        # what the base does not know as words is still searched by all its bigrams
        assert first("意义对于") == STRADDLING
        assert first("形象边界") == STRADDLING
    finally:
        store.close()


def test_straddling_terms_are_the_bigrams_across_word_boundaries() -> None:
    counts = {"定": 8, "义": 10, "对": 10, "象": 10, "边": 8, "框": 5,
              "定义": 8, "义对": 2, "对象": 8, "象边": 2, "边框": 5}
    term = {fts.build_match([fts.QueryPiece(unit, True)]): n for unit, n in counts.items()}

    def doc_freq(expr: str) -> int:
        return term.get(expr, 0)

    def bigrams(terms: set[str]) -> set[str]:
        return {t.split('"')[1] for t in terms}

    assert bigrams(straddling_terms("定义对象边框", doc_freq, 30)) == {"义对", "象边"}
    assert bigrams(straddling_terms("box 定义对象边框？", doc_freq, 30)) == {"义对", "象边"}
    assert straddling_terms("定义对象边框", doc_freq, 5) == set()  # nothing cohesive: plain bigrams
    assert straddling_terms("未知文字", doc_freq, 30) == set()  # unknown to the base: plain bigrams
    assert straddling_terms("定义", doc_freq, 30) == set()  # two characters: one bigram
