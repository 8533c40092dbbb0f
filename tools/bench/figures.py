"""README's measured figures, from the benchmark run that measured them.

A benchmark that measures a figure README quotes records it here (``record``): the figure
goes into ``tools/bench/figures.json`` (committed: the last run's values, with the command,
the date and the machine's load average), and README.md's text between the markers
``<!--fig NAME-->`` and ``<!--/fig-->`` is rewritten to it. ``tests/test_figures.py``
checks that README and figures.json agree (text against text, never timing), so a figure
edited by hand, or a run whose new figures were not committed, fails the tests.

    python3 tools/bench/figures.py          rewrite README from figures.json
    python3 tools/bench/figures.py --check  exit 1 when README disagrees (what the test runs)
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
MARK = re.compile(r"<!--fig ([a-z0-9_.-]+)-->(.*?)<!--/fig-->", re.DOTALL)


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


def problems(text: str, figures: dict[str, str]) -> list[str]:
    """What is wrong between README's marks and the recorded figures."""
    found = []
    for match in MARK.finditer(text):
        name, shown = match[1], match[2]
        if name not in figures:
            found.append(f"README marks {name!r}, which no benchmark recorded")
        elif shown != figures[name]:
            found.append(f"README shows {name} = {shown!r}, the last run recorded {figures[name]!r}")
    return found


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not on every platform
        return "n/a"


def record(bench: str, figures: dict[str, str], *, command: str) -> None:
    """Store ``figures`` as ``bench``'s last run and write them into README."""
    data = load()
    data[bench] = {
        "command": command,
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadAverage": load_average(),
        "figures": dict(sorted(figures.items())),
    }
    FIGURES.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n", encoding="utf-8")
    README.write_text(render(README.read_text(encoding="utf-8"), values(data)), encoding="utf-8")
    print(f"recorded {len(figures)} figures of {bench} in {FIGURES.relative_to(ROOT)} and README.md")


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    figures = values(load())
    if argv == ["--check"]:
        found = problems(text, figures)
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    README.write_text(render(text, figures), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
