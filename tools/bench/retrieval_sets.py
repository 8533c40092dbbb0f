"""The offline evaluation sets of bench_retrieval.py (section 5) and their measures.

Owns two sets. The Debian known-item set: the pages (``python_docs``: python3-doc library pages, English; ``man_pages``:
manpages-zh sections 1 and 8, Chinese, rendered with ``man -l``), each with its held-out
title as the query; the split into a calibration half and a held-out half
(``in_calibration``: a stable hash of the page's name, not its order); recall@k, MRR@k and
the chunk-size distribution. Fusion constants (sidecar/retrieval/fusion.py) are tuned on
the calibration half only.

The LibreOffice help set (``libreoffice_help``): product documentation judged by its own
authors. Debian's ``libreoffice-help-en-us`` and ``libreoffice-help-zh-cn`` ship the help
as HTML (about 2,560 pages per language, many small sections) with the index the help's
writers keep (``bookmarks.js``: each entry an index term, "term -- subterm", and the page
and anchor it points to; the Chinese help's terms are translated). Queries are the index
terms ("--" read as a space; Chinese: the terms with Han characters), relevant are the
pages the same term points to; the page text is indexed whole (the terms are in
``<meta>`` keywords, which extraction does not read, so nothing is held out by us). The
packages are fetched with ``apt-get download`` into a cache directory once and unpacked
with ``dpkg-deb -x`` (``fetch_package``; their version is printed with the figures); a
missing client or package raises SetUnavailable with what to do. The split into a
calibration and a held-out half is a stable hash of the query text (``in_calibration``).
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

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


# ---- the LibreOffice help set ------------------------------------------------------------

HELP_PACKAGES = {"en": ("libreoffice-help-en-us", "en-US"), "zh": ("libreoffice-help-zh-cn", "zh-CN")}
_BOOKMARK = re.compile(r'\{url:"([^"]*)", app:"[^"]*", text:"((?:[^"\\]|\\.)*)"\}')
_HAN = re.compile(r"[\u4e00-\u9fff]")


class SetUnavailable(Exception):
    """An evaluation set that cannot be fetched here (the message says why and what to do)."""


def fetch_package(package: str, cache: Path) -> tuple[Path, str]:
    """(the directory a Debian package is unpacked in, its version): ``cache/<package>_<version>``,
    downloaded with ``apt-get download`` and unpacked with ``dpkg-deb -x`` the first time."""
    done = sorted(cache.glob(f"{package}_*/.unpacked"))
    if done:
        return done[-1].parent, done[-1].read_text().strip()
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise SetUnavailable(f"{package}: apt-get and dpkg-deb are needed to fetch it (a Debian system)")
    cache.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(["apt-get", "download", package], cwd=cache, capture_output=True, text=True, timeout=600)
    debs = sorted(cache.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
    if got.returncode != 0 or not debs:
        tail = (got.stderr or got.stdout).strip().splitlines()[-1:] or ["no .deb"]
        raise SetUnavailable(f"{package}: apt-get download failed ({tail[0]}); run apt-get update, or put"
                             f" the .deb in {cache}")
    deb = debs[-1]
    version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    target = cache / f"{package}_{re.sub(r'[^A-Za-z0-9.+~-]', '_', version)}"
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True, timeout=600)
    (target / ".unpacked").write_text(version)
    return target, version


class HelpSet(NamedTuple):
    lang: str
    package: str
    version: str
    root: Path
    """The directory the pages' names are relative to."""
    pages: list[tuple[str, str]]
    """(name: the path under text/, extracted text) of every page."""
    queries: list[tuple[str, frozenset[str]]]
    """(index term as a query, the names of the pages it points to)."""
    entries: int
    """Index entries of the language read (before the same term's entries were joined)."""


def libreoffice_help(lang: str, cache: Path, max_queries: int) -> HelpSet:
    """The pages and index of one language's LibreOffice help (module docstring); at most
    ``max_queries`` queries, a stable sample (the smallest hashes of the query text)."""
    package, code = HELP_PACKAGES[lang]
    root, version = fetch_package(package, cache)
    base = root / "usr/share/libreoffice/help" / code
    if not (base / "bookmarks.js").is_file():
        raise SetUnavailable(f"{package} {version} has no {code}/bookmarks.js")
    pages: list[tuple[str, str]] = []
    for path in sorted((base / "text").rglob("*.html")):
        try:
            text = extract("html", path.read_bytes()).text
        except Exception:  # a page extraction refuses (empty): not a document of the set
            continue
        pages.append((path.relative_to(base).as_posix(), text))
    names = {name for name, _ in pages}
    by_term: dict[str, tuple[str, set[str]]] = {}
    entries = 0
    for url, raw in _BOOKMARK.findall((base / "bookmarks.js").read_text(encoding="utf-8")):
        term = html.unescape(raw.replace('\\"', '"'))
        if lang == "zh" and not _HAN.search(term):
            continue  # an entry the translators left in English
        entries += 1
        query = re.sub(r"\s*--\s*", " ", term).strip()
        name = url.split("?", 1)[0].split("#", 1)[0].removeprefix(code + "/")
        if len(query) < 2 or name not in names:
            continue
        key = " ".join(query.casefold().split())
        by_term.setdefault(key, (query, set()))[1].add(name)
    ordered = sorted(by_term.values(), key=lambda q: hashlib.blake2b(q[0].encode(), digest_size=8).digest())
    queries = [(query, frozenset(relevant)) for query, relevant in ordered[:max_queries]]
    return HelpSet(lang, package, version, base, pages, queries, entries)
