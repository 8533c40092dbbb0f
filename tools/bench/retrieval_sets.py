"""The offline Debian evaluation set of bench_retrieval.py (section 5) and its measures.

Owns: the pages (``python_docs``: python3-doc library pages, English; ``man_pages``:
manpages-zh sections 1 and 8, Chinese, rendered with ``man -l``), each with its held-out
title as the query; the split into a calibration half and a held-out half
(``in_calibration``: a stable hash of the page's name, not its order); recall@k, MRR@k and
the chunk-size distribution. Fusion constants (sidecar/retrieval/fusion.py) are tuned on
the calibration half only.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from sidecar.retrieval.extract import extract

PYDOC = Path("/usr/share/doc/python3/html/library")
MANZH = Path("/usr/share/man/zh_CN")


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def python_docs(limit: int) -> list[tuple[str, str, str]]:
    """(name, held-out text, query) of python3-doc library pages."""
    out = []
    for path in sorted(PYDOC.glob("*.html"))[:limit]:
        try:
            text = extract("html", path.read_bytes()).text
        except Exception:
            continue
        first, _, rest = text.partition("\n")
        if not first.startswith("# ") or len(rest) < 200:
            continue
        title = first[2:].strip()
        query = title.split("—", 1)[1].strip() if "—" in title else title
        if len(query) < 4:
            continue
        out.append((path.name, rest.strip(), query))
    return out


_NAME_HEADERS = ("名称", "名字", "NAME", "名  称")


def man_pages(limit: int) -> list[tuple[str, str, str]]:
    """(name, text without its NAME section, the NAME summary) of manpages-zh pages."""
    out = []
    files = sorted((MANZH / "man1").glob("*.gz")) + sorted((MANZH / "man8").glob("*.gz"))
    env = dict(os.environ, MANWIDTH="100", LANG="C.UTF-8")
    for path in files[:limit]:
        try:
            rendered = subprocess.run(["man", "-l", str(path)], capture_output=True, env=env, timeout=20).stdout
            text = subprocess.run(["col", "-b"], input=rendered, capture_output=True, timeout=20).stdout.decode(
                "utf-8", "replace")
        except (OSError, subprocess.SubprocessError):
            continue
        lines = text.splitlines()
        summary = None
        kept: list[str] = []
        i = 0
        while i < len(lines):
            if lines[i].strip() in _NAME_HEADERS and summary is None:
                i += 1
                body = []
                while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                    body.append(lines[i].strip())
                    i += 1
                line = " ".join(b for b in body if b)
                parts = re.split(r"\s+[-—－]+\s+|\s*\\-\s*", line, maxsplit=1)
                summary = parts[1].strip() if len(parts) == 2 else None
                continue
            kept.append(lines[i])
            i += 1
        if summary and len(summary) >= 2 and re.search(r"[\u4e00-\u9fff]", summary):
            body = "\n".join(kept[1:-1]).strip()  # drop the header/footer lines naming the page
            if len(body) > 200:
                out.append((path.name, body, summary))
    return out


GROUPS = ("all", "en", "zh", "calib", "held-out", "held-en", "held-zh")
"""Query groups of the quality table: both languages, each, and the two halves of the set
(``in_calibration``): constants are tuned on ``calib`` only, ``held-out`` shows they carry over."""


def in_calibration(name: str) -> bool:
    """Whether a page is in the calibration half (a stable hash of its name, not its order)."""
    return hashlib.blake2b(name.encode(), digest_size=2).digest()[0] % 2 == 0


def recall_at(ranks: list[int], cut: int) -> float:
    return sum(1 for r in ranks if 0 < r <= cut) / max(1, len(ranks))


def mrr_at(ranks: list[int], cut: int) -> float:
    return sum(1 / r for r in ranks if 0 < r <= cut) / max(1, len(ranks))


def size_distribution(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    return (f"{len(sizes):,} chunks, p10 {pct(sizes, 10):.0f}, median {pct(sizes, 50):.0f}, p90 {pct(sizes, 90):.0f},"
            f" max {max(sizes)}, {sum(1 for n in sizes if n < 50) / len(sizes):.0%} under 50 tokens")
