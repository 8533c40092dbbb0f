"""The measured figures README.md and docs/*.md quote are the ones the benchmarks last
recorded (tools/bench/figures.py): text compared with text, no timing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "tools" / "bench" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documents_show_the_figures_the_benchmarks_recorded(figures: ModuleType) -> None:
    documents = figures.documents()
    assert ROOT / "README.md" in documents and ROOT / "docs" / "bundle.md" in documents
    texts = {path: path.read_text(encoding="utf-8") for path in documents}
    recorded = figures.values(figures.load())
    marked = {m[1] for text in texts.values() for m in figures.MARK.finditer(text)}
    assert marked, "no document marks a figure"
    assert figures.all_problems(recorded) == [], "run the benchmark (it writes the documents), or tools/bench/figures.py"
    for run in figures.load().values():
        assert run["command"].startswith("python3 dev.py bench ") and run["loadAverage"] and run["measured"]


def test_a_figure_edited_by_hand_or_unrecorded_is_reported(figures: ModuleType) -> None:
    recorded = {"a.size": "52 MiB"}
    assert figures.problems("x <!--fig a.size-->52 MiB<!--/fig--> y", recorded) == []
    assert figures.problems("<!--fig a.size-->50 MiB<!--/fig-->", recorded) == [
        "README shows a.size = '50 MiB', the last run recorded '52 MiB'"
    ]
    assert figures.problems("<!--fig b.time-->1 s<!--/fig-->", recorded) == [
        "README marks 'b.time', which no benchmark recorded"
    ]
    assert figures.render("<!--fig a.size-->old<!--/fig-->", recorded) == "<!--fig a.size-->52 MiB<!--/fig-->"
