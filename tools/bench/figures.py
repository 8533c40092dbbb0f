"""The measured figures README.md and docs/*.md quote, from the benchmark run that measured them.

A benchmark that measures a figure the documents quote records it here (``record``): the
figure goes into ``tools/bench/figures.json`` (committed: the last run's values, with the
command, the date and the machine's load average), and the text between the markers
``<!--fig NAME-->`` and ``<!--/fig-->`` in every document (``documents()``) is rewritten to
it. ``tests/test_figures.py`` checks that the documents and figures.json agree (text against
text, never timing), so a figure edited by hand, or a run whose new figures were not
committed, fails the tests.

    python3 tools/bench/figures.py          rewrite the documents from figures.json
    python3 tools/bench/figures.py --check  exit 1 when a document disagrees (what the test runs)
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "tools" / "bench" / "figures.json"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARK = re.compile(r"<!--fig ([a-z0-9_.-]+)-->(.*?)<!--/fig-->", re.DOTALL)


def documents() -> list[Path]:
    """Every document that may mark figures: README.md and the pages of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def load() -> dict[str, Any]:
    if not FIGURES.exists():
        return {}
    data: dict[str, Any] = json.loads(FIGURES.read_text(encoding="utf-8"))
    return data


def values(data: dict[str, Any]) -> dict[str, str]:
    """Figure name -> its text, over every benchmark's last run."""
    out: dict[str, str] = {}
    for run in data.values():
        out.update(run["figures"])
    return out


def render(text: str, figures: dict[str, str]) -> str:
    """``text`` with every marked figure set to its recorded value (unknown names kept)."""
    return MARK.sub(lambda m: f"<!--fig {m[1]}-->{figures.get(m[1], m[2])}<!--/fig-->", text)


def problems(text: str, figures: dict[str, str], where: str = "README") -> list[str]:
    """What is wrong between the marks of one document (named ``where``) and the recorded figures."""
    found = []
    for match in MARK.finditer(text):
        name, shown = match[1], match[2]
        if name not in figures:
            found.append(f"{where} marks {name!r}, which no benchmark recorded")
        elif shown != figures[name]:
            found.append(f"{where} shows {name} = {shown!r}, the last run recorded {figures[name]!r}")
    return found


def all_problems(figures: dict[str, str]) -> list[str]:
    """``problems`` of every document."""
    found = []
    for path in documents():
        found += problems(path.read_text(encoding="utf-8"), figures, str(path.relative_to(ROOT)))
    return found


def write_all(figures: dict[str, str]) -> None:
    """Every document's marked figures set to ``figures`` (files without a change untouched)."""
    for path in documents():
        text = path.read_text(encoding="utf-8")
        rendered = render(text, figures)
        if rendered != text:
            path.write_text(rendered, encoding="utf-8")


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not on every platform
        return "n/a"


def record(bench: str, figures: dict[str, str], *, command: str) -> None:
    """Store ``figures`` as ``bench``'s last run and write them into the documents."""
    data = load()
    data[bench] = {
        "command": command,
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadAverage": load_average(),
        "figures": dict(sorted(figures.items())),
    }
    FIGURES.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n", encoding="utf-8")
    write_all(values(data))
    print(f"recorded {len(figures)} figures of {bench} in {FIGURES.relative_to(ROOT)} and the documents that quote them")


def main(argv: list[str]) -> int:
    figures = values(load())
    if argv == ["--check"]:
        found = all_problems(figures)
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    write_all(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
