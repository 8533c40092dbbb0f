"""Structure-aware chunking of a document's text, sized in tokens.

Owns how a document becomes chunks (``chunk_document``) and their content-addressed ids.

The text is cut into blocks first: Markdown (and HTML, which extraction writes as
Markdown) gives ATX/setext headings, fenced code blocks and paragraphs; other kinds give
paragraphs (blank-line separated; CSV: rows, with the header row as every chunk's heading;
code: blank-line separated blocks). Blocks are packed into chunks of at most ``size``
tokens (the project's tokenizer, ``sidecar/tokens.py``, cl100k_base):
- sections are merged up to the size: a section (its heading line and its own text, up to
  the next heading) joins the chunk before it when it fits there and lies under that
  chunk's heading path (so small sections do not make small chunks), or when that chunk is
  under a quarter of the size and the section's first block fits (the rest of the section
  starts the next chunk); otherwise the heading closes the chunk before it;
- a chunk's heading path is the path in force where it starts; its first section's heading
  line is not in its text (the path carries it), the headings of the sections merged into
  it are (their lines are in the span). A chunk that starts a section and will take a
  sibling section (one that is not under its heading) starts at its heading line instead,
  and its path is the parent's: every heading of a chunk is in its path or in its text,
  and a section that merges with nothing is cut exactly as before merging existed (its id
  unchanged);
- a PDF page boundary closes a chunk, so every chunk has one page;
- a code fence is kept whole when it fits in a chunk; a larger one is split between lines;
- a paragraph larger than a chunk is split at sentence ends (``. ! ?`` before a space,
  ``。！？；`` anywhere, line breaks), a sentence larger than a chunk at token boundaries;
- when a section is split because of size, the next chunk starts with up to ``overlap``
  tokens of the end of the previous one (whole blocks or sentences).

Must stay true:
- a chunk is a contiguous span of the document text: ``text[start:end]`` is its text
  exactly (offsets in code points), so citations can point into the document;
- a chunk's id is ``chunk_id`` (sidecar/store/kb_records.py): ``{documentId}:{blake2b of its
  heading path and normalized text}``, with ``.2``, ``.3``... for repeats of the same text
  under the same heading path in one document, so the same text in the same section gets
  the same id after any re-index, and a section inserted elsewhere moves no id;
- what is embedded and full-text indexed is ``embed_text``: the heading path, a blank
  line, the text, without the lines common to the base (``kb_common``; the text keeps
  them); ``embed_hash`` is its hash (a vector is reused only when it matches).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import NamedTuple

from sidecar import tokens as tk
from sidecar.store import kb_common
from sidecar.store.knowledge import NewChunk, chunk_id, embed_text

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_OVERLAP",
    "MIN_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "ENCODING",
    "chunk_document",
    "chunk_id",
    "embed_text",
    "effective_size",
]

DEFAULT_CHUNK_SIZE = 512
DEFAULT_OVERLAP = 64
MIN_CHUNK_SIZE = 64
MAX_CHUNK_SIZE = 8192
ENCODING = "cl100k_base"
SMALL_SHARE = 4
"""A chunk under 1/SMALL_SHARE of the size takes the start of the next section even when
the whole section does not fit (the rest of it starts the next chunk)."""
HEADING_ALLOWANCE = 48
"""Tokens kept free for the heading path when a chunk is clamped to a model's input limit."""


class _Block(NamedTuple):
    start: int
    end: int
    kind: str
    """heading | code | para | page"""
    level: int = 0
    title: str = ""


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_SENTENCE = re.compile(r"[.!?][\"')\]]*(?=\s)|[。！？；][」』”’）】]*|\n")


def effective_size(chunk_size: int, model_limit: int | None) -> int:
    """The chunk size in force: the base's, clamped to the embedding model's input limit."""
    size = max(MIN_CHUNK_SIZE, min(MAX_CHUNK_SIZE, chunk_size))
    if model_limit:
        size = min(size, max(MIN_CHUNK_SIZE // 2, int(model_limit * 0.9) - HEADING_ALLOWANCE))
    return size


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    pos = 0
    n = len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl == -1 else nl
        yield pos, end, text[pos:end]
        pos = end + 1


def _markdown_blocks(text: str, base: int = 0) -> list[_Block]:
    blocks: list[_Block] = []
    para_start: int | None = None
    para_end = 0
    para_lines = 0
    fence: tuple[str, int] | None = None

    def close_para() -> None:
        nonlocal para_start, para_lines
        if para_start is not None:
            blocks.append(_Block(base + para_start, base + para_end, "para"))
        para_start = None
        para_lines = 0

    for start, end, line in _lines(text):
        if fence is not None:
            marker, fstart = fence
            if line.strip().startswith(marker[0] * len(marker)) and not line.strip().strip(marker[0]):
                blocks.append(_Block(base + fstart, base + end, "code"))
                fence = None
            continue
        m = _FENCE.match(line)
        if m:
            close_para()
            fence = (m.group(1), start)
            continue
        m = _ATX.match(line)
        if m:
            close_para()
            title = (m.group(2) or "").strip().rstrip("¶").strip()
            blocks.append(_Block(base + start, base + end, "heading", len(m.group(1)), title))
            continue
        if not line.strip():
            close_para()
            continue
        if para_start is not None and para_lines == 1 and _SETEXT.match(line):
            # "Title\n=====": the paragraph line before was a heading
            title = text[para_start:para_end].strip()
            blocks.append(_Block(base + para_start, base + end, "heading", 1 if line.strip()[0] == "=" else 2, title))
            para_start = None
            para_lines = 0
            continue
        if para_start is None:
            para_start = start
        para_end = end
        para_lines += 1
    if fence is not None:  # an unclosed fence runs to the end
        blocks.append(_Block(base + fence[1], base + len(text), "code"))
    close_para()
    return blocks


def _paragraph_blocks(text: str, base: int = 0, kind: str = "para") -> list[_Block]:
    blocks: list[_Block] = []
    start: int | None = None
    last = 0
    for s, e, line in _lines(text):
        if line.strip():
            if start is None:
                start = s
            last = e
        elif start is not None:
            blocks.append(_Block(base + start, base + last, kind))
            start = None
    if start is not None:
        blocks.append(_Block(base + start, base + last, kind))
    return blocks


def _row_blocks(text: str) -> tuple[list[_Block], str]:
    rows = [(s, e) for s, e, line in _lines(text) if line.strip()]
    if not rows:
        return [], ""
    header = text[rows[0][0] : rows[0][1]].strip()
    return [_Block(s, e, "para") for s, e in rows[1:]] or [_Block(rows[0][0], rows[0][1], "para")], header


def _blocks(kind: str, text: str, pages: list[int] | None) -> tuple[list[_Block], str]:
    if kind == "csv":
        return _row_blocks(text)
    if kind == "pdf" and pages:
        out: list[_Block] = []
        bounds = [*pages, len(text)]
        for number in range(len(pages)):
            s, e = bounds[number], bounds[number + 1]
            out.append(_Block(s, s, "page", number + 1))
            out.extend(_paragraph_blocks(text[s:e], s))
        return out, ""
    if kind in ("markdown", "html"):
        return _markdown_blocks(text), ""
    return _paragraph_blocks(text, 0, "code" if kind in ("code", "json") else "para"), ""


class _Section(NamedTuple):
    path: tuple[str, ...]
    """The heading path in force under this heading."""
    parent: tuple[str, ...]
    """The path of the sections around it (its own heading left out)."""
    line: int
    """Tokens of the heading line."""
    tokens: int
    """Tokens of the heading line and its own text (the blocks up to the next heading)."""
    first: int
    """Tokens of the first block of its own text."""
    next: int | None
    """The block index of the next heading when no page boundary is between."""


def _sections(blocks: list[_Block], counts: dict[tuple[int, int], int], packer: _Packer) -> dict[int, _Section]:
    """The sections of the heading blocks, by block index."""
    out: dict[int, _Section] = {}
    stack: list[tuple[int, str]] = []
    current: int | None = None
    for i, block in enumerate(blocks):
        if block.kind == "page":
            current = None
        elif block.kind == "heading":
            while stack and stack[-1][0] >= block.level:
                stack.pop()
            parent = tuple(t for _, t in stack)
            if block.title:
                stack.append((block.level, block.title))
            line = packer.count(block.start, block.end)
            if current is not None:
                out[current] = out[current]._replace(next=i)
            out[i] = _Section(tuple(t for _, t in stack), parent, line, line, 0, None)
            current = i
        elif current is not None:
            n = counts[(block.start, block.end)]
            here = out[current]
            out[current] = here._replace(tokens=here.tokens + n, first=here.first or n)
    return out


def _joins_sibling(sections: dict[int, _Section], i: int, size: int) -> bool:
    """Whether a chunk that starts with section ``i`` and takes the sections after it while
    they fit will hold one that is not under ``i``'s heading (then the chunk's path must be
    ``i``'s parent's)."""
    first = sections[i]
    total = first.tokens
    k = first.next
    while k is not None and total + sections[k].tokens <= size:
        if not _under(sections[k].parent, first.path):
            return _under(sections[k].parent, first.parent)
        total += sections[k].tokens
        k = sections[k].next
    return False


def _under(path: tuple[str, ...], ancestor: tuple[str, ...]) -> bool:
    return path[: len(ancestor)] == ancestor


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class _Packer:
    """Packs blocks into spans; the current span is [start, end) with ``tokens`` tokens."""

    def __init__(self, text: str, size: int, overlap: int, counts: dict[tuple[int, int], int]) -> None:
        self.text = text
        self.size = size
        self.overlap = overlap
        self.counts = counts
        self.spans: list[tuple[int, int, int, tuple[str, ...], int | None]] = []
        self.pieces: list[tuple[int, int, int]] = []
        """(start, end, tokens) of what the current chunk holds."""
        self.total = 0
        self.heading: tuple[str, ...] = ()
        """The heading path of the chunk being packed (the path in force where it began)."""
        self.path: tuple[str, ...] = ()
        """The heading path in force at the block being added (the next chunk's)."""
        self.page: int | None = None
        self.heads: set[int] = set()
        """Start offsets of the heading lines among the pieces."""

    def count(self, start: int, end: int) -> int:
        key = (start, end)
        n = self.counts.get(key)
        if n is None:
            n = self.counts[key] = tk.count_text(self.text[start:end], ENCODING)
        return n

    def close(self, *, carry: bool) -> None:
        while self.pieces and self.pieces[-1][0] in self.heads:
            # a heading line ending a chunk: its section is in the next one, whose path names it
            self.total -= self.pieces.pop()[2]
        if not self.pieces:
            self.total = 0
            self.heading = self.path
            return
        start, end = self.pieces[0][0], self.pieces[-1][1]
        self.spans.append((start, end, self.total, self.heading, self.page))
        kept: list[tuple[int, int, int]] = []
        if carry and self.overlap > 0:
            budget = self.overlap
            for piece in reversed(self.pieces):
                if piece[2] > budget:
                    tail = self._sentence_tail(piece, budget)
                    if tail is not None:
                        kept.insert(0, tail)
                    break
                kept.insert(0, piece)
                budget -= piece[2]
            if len(kept) == len(self.pieces):  # the whole chunk again would repeat it
                kept = kept[1:]
        self.pieces = kept
        self.total = sum(t for _, _, t in kept)
        self.heading = self.path

    def _sentence_tail(self, piece: tuple[int, int, int], budget: int) -> tuple[int, int, int] | None:
        start, end, _ = piece
        cuts = [start + m.end() for m in _SENTENCE.finditer(self.text, start, end) if start + m.end() < end]
        for cut in cuts:
            while cut < end and self.text[cut].isspace():
                cut += 1
            if cut >= end:
                continue
            n = self.count(cut, end)
            if n <= budget:
                return (cut, end, n)
        return None

    def add_heading(self, start: int, end: int, tokens: int) -> None:
        """A heading line into the current chunk, as the start of a section that fits."""
        self.heads.add(start)
        self.pieces.append((start, end, tokens))
        self.total += tokens

    def add(self, start: int, end: int, tokens: int) -> None:
        if self.pieces and self.total + tokens > self.size:
            self.close(carry=True)
            while self.pieces and self.total + tokens > self.size:
                self.total -= self.pieces.pop(0)[2]  # the carried overlap does not fit beside this block
        if not self.pieces:
            self.heading = self.path
        self.pieces.append((start, end, tokens))
        self.total += tokens

    def add_large(self, start: int, end: int, code: bool) -> None:
        """A block larger than a chunk: split at sentence ends (code: line ends), then tokens."""
        for s, e in self._units(start, end, code):
            n = self.count(s, e)
            if n > self.size:
                for hs, he, hn in self._hard_split(s, e):
                    self.add(hs, he, hn)
            else:
                self.add(s, e, n)

    def _units(self, start: int, end: int, code: bool) -> Iterator[tuple[int, int]]:
        pattern = re.compile(r"\n") if code else _SENTENCE
        pos = start
        for m in pattern.finditer(self.text, start, end):
            cut = m.end()
            if cut <= pos:
                continue
            s = pos
            while s < cut and self.text[s].isspace():
                s += 1
            e = cut
            while e > s and self.text[e - 1].isspace():
                e -= 1
            if e > s:
                yield s, e
            pos = cut
        s = pos
        while s < end and self.text[s].isspace():
            s += 1
        if end > s:
            yield s, end

    def _hard_split(self, start: int, end: int) -> Iterator[tuple[int, int, int]]:
        """Windows of at most ``size`` tokens, cut at a space when there is one near the end.
        The window's length in characters is estimated from the tokens per character of the
        whole piece and shrunk until it fits (each try is one encode of a window)."""
        total = self.count(start, end)
        per_char = total / max(1, end - start)
        pos = start
        while pos < end:
            guess = max(1, int(self.size / max(per_char, 1e-6)))
            e = min(end, pos + guess)
            while True:
                cut = e
                if e < end:
                    space = self.text.rfind(" ", pos + (e - pos) * 4 // 5, e)
                    if space > pos:
                        cut = space + 1
                n = self.count(pos, cut)
                if n <= self.size or cut - pos <= 1:
                    break
                e = pos + max(1, (e - pos) * 9 // 10)
            if self.text[pos:cut].strip():
                s, t = pos, cut
                while t > s and self.text[t - 1].isspace():
                    t -= 1
                yield s, t, self.count(s, t) if t != cut else n
            pos = cut
            while pos < end and self.text[pos].isspace():
                pos += 1


def chunk_document(
    document_id: str, kind: str, text: str, pages: list[int] | None, *, size: int, overlap: int,
    common: frozenset[int] = frozenset(), merge_sections: bool = True,
) -> list[NewChunk]:
    """The chunks of a document (see the module docstring); ``common``: the base's common
    lines (``kb_common``), left out of what is embedded (not of the text, its offsets or its
    id). ``merge_sections=False``: every heading closes a chunk, the rule before sections
    were merged (the baseline tools/bench/bench_retrieval.py measures against). Blocking:
    CPU only."""
    size = max(16, size)
    overlap = max(0, min(overlap, size // 2))
    blocks, csv_header = _blocks(kind, text, pages)
    encode = tk.get_encoding(ENCODING).encode_ordinary
    counts = {(b.start, b.end): len(encode(text[b.start : b.end])) for b in blocks if b.kind in ("para", "code")}
    packer = _Packer(text, size, overlap, counts)
    sections = _sections(blocks, counts, packer)
    if csv_header:
        packer.heading = packer.path = (csv_header,)
    for i, block in enumerate(blocks):
        if block.kind == "page":
            packer.close(carry=False)
            packer.page = block.level
            continue
        if block.kind == "heading":
            here = sections[i]
            fits = packer.total + here.tokens <= size or (
                packer.total < size // SMALL_SHARE and packer.total + here.line + here.first <= size)
            if merge_sections and packer.pieces and _under(here.parent, packer.heading) and fits:
                # a section under the chunk's path joins it, its heading line with it (every
                # heading of a chunk is in its path or in its text), when it fits beside it,
                # or when the chunk is small and the section's first block fits
                packer.add_heading(block.start, block.end, here.line)
            else:
                packer.close(carry=False)
                if merge_sections and _joins_sibling(sections, i, size):
                    # a section beside this one (not under it) will join this chunk: the
                    # chunk's path is their parent's, this heading line is in its text
                    packer.heading = here.parent
                    packer.add_heading(block.start, block.end, here.line)
            packer.path = here.path
            if not packer.pieces:
                packer.heading = packer.path
            continue
        n = counts[(block.start, block.end)]
        if n > size:
            packer.add_large(block.start, block.end, block.kind == "code")
        else:
            packer.add(block.start, block.end, n)
    packer.close(carry=False)
    if not packer.spans and text.strip():
        # only headings (or a lone fence marker): the text is one block of lines, cut at the
        # size like any other (20,000 heading lines were once one chunk of 139,000 tokens)
        packer.heads.clear()
        packer.path = packer.heading = ()
        packer.page = 1 if pages else None
        packer.add_large(len(text) - len(text.lstrip()), len(text.rstrip()), True)
        packer.close(carry=False)
    chunks: list[NewChunk] = []
    seen: dict[str, int] = {}
    for ordinal, (start, end, tokens, heading, page) in enumerate(packer.spans):
        body = text[start:end]
        path = list(heading)
        cid = chunk_id(document_id, path, body)
        repeat = seen.get(cid, 0) + 1
        seen[cid] = repeat
        if repeat > 1:
            cid = f"{cid}.{repeat}"
        full = kb_common.embedded(embed_text(path, body), common)
        chunks.append(
            NewChunk(
                id=cid, ordinal=ordinal, heading=path, start=start, end=end, page=page, tokens=tokens,
                embed_hash=_hash(full), text=body, embed_text=full,
            )
        )
    return chunks
