"""Splitting a rendered reply into chunks that fit one platform message.

Owns: the line model the renderer produces (``Line`` with its fence/table context) and
``split_lines``, which packs lines into chunks no larger than a limit measured in characters,
UTF-8 bytes, JSON-string bytes or UTF-16 code units (``Measure``).

Must stay true (tests/test_channels_split.py checks them with hypothesis):
- every chunk is within the limit;
- a chunk boundary inside a code fence closes the fence at the end of the chunk and reopens
  it (same marker and language) at the start of the next, so every chunk's fences balance;
- a boundary between table rows repeats the table's header (and delimiter) row at the start
  of the next chunk, when the header takes at most a quarter of the limit;
- apart from those added lines (marked ``synthetic``) and whitespace at the cuts, the chunks
  hold exactly the rendered text, in order: nothing is lost or duplicated;
- where to cut, best first: between blocks, between lines outside fences and tables, between
  code lines or table rows, then inside a line after a sentence, after a clause, at a space,
  between two CJK characters, and only as a last resort anywhere (never inside a grapheme
  cluster). Cuts of the first four kinds are only taken if the chunk is at least half full,
  so a Latin word or a CJK phrase is cut only when it alone is longer than half a chunk;
  no cut falls inside a link, an inline code span or a short emphasis (``Line.atoms``)
  unless nothing else fits.
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from protocol.channels import SizeUnit

__all__ = ["Role", "Fence", "Table", "Line", "Measure", "SplitChunk", "split_lines"]


class Role(enum.IntEnum):
    TEXT = 0
    BLANK = 1
    """A separator between blocks (its text is empty)."""
    FENCE_OPEN = 2
    FENCE_BODY = 3
    FENCE_CLOSE = 4
    TABLE_HEAD = 5
    """The header row and the delimiter row of a table."""
    TABLE_ROW = 6


@dataclass(eq=False, slots=True)
class Fence:
    opener: str
    closer: str


@dataclass(eq=False, slots=True)
class Table:
    header: tuple[str, ...]


@dataclass(slots=True)
class Line:
    text: str
    role: Role = Role.TEXT
    fence: Fence | None = None
    table: Table | None = None
    atoms: tuple[tuple[int, int], ...] = ()
    """Character ranges of ``text`` not to cut inside (links, code spans, short emphasis)."""


_json = msgspec.json.Encoder()


class Measure:
    """Size of text in one unit; ``size(lines joined by '\\n')`` = ``base + sum(cost) + sep * (n - 1)``."""

    def __init__(self, unit: SizeUnit) -> None:
        self.unit = unit
        self.sep = 2 if unit == "json_bytes" else 1
        self.base = 2 if unit == "json_bytes" else 0

    def cost(self, text: str) -> int:
        if self.unit == "chars":
            return len(text)
        if self.unit == "utf8_bytes":
            return len(text.encode("utf-8", "surrogatepass"))
        if self.unit == "utf16_units":
            return len(text.encode("utf-16-le", "surrogatepass")) // 2
        return len(_json.encode(text)) - 2

    def char_cost(self, ch: str) -> int:
        o = ord(ch)
        if self.unit == "chars":
            return 1
        if self.unit == "utf8_bytes":
            return 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
        if self.unit == "utf16_units":
            return 2 if o >= 0x10000 else 1
        if o < 0x20:
            return 2 if ch in "\n\r\t\b\f" else 6
        if ch in '"\\':
            return 2
        return 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4

    def size(self, text: str) -> int:
        return self.base + self.cost(text)


@dataclass(slots=True)
class SplitChunk:
    lines: list[str] = field(default_factory=list)
    synthetic: list[bool] = field(default_factory=list)
    """Per line: added by the splitter (a reopened fence, a repeated table header, a closer)."""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(slots=True)
class _Item:
    line: Line
    synthetic: bool
    cost: int
    fence_after: Fence | None
    table_after: Table | None


_SENTENCE_END = frozenset(".!?。！？…‼⁉")
_CLAUSE_END = frozenset(",;:，；：、")
_CLOSING = frozenset("。，、；：！？）」』】》〉”’\"')]}…")
_OPENING = frozenset("（「『【《〈“‘([{")
_MIN_FILL = 0.5


def split_lines(lines: list[Line], limit: int, measure: Measure) -> list[SplitChunk]:
    """Pack ``lines`` into chunks of at most ``limit`` (in ``measure``'s unit)."""
    return _Splitter(limit, measure).run(lines)


class _Splitter:
    def __init__(self, limit: int, measure: Measure) -> None:
        self.limit = limit
        self.m = measure
        self.out: list[SplitChunk] = []
        self.cur: list[_Item] = []
        self.size = measure.base
        self.real = 0
        """Lines of ``cur`` that are neither synthetic nor blank."""

    # ---- the current chunk ----------------------------------------------------------

    def _state(self) -> tuple[Fence | None, Table | None]:
        if not self.cur:
            return None, None
        last = self.cur[-1]
        return last.fence_after, last.table_after

    @staticmethod
    def _after(line: Line) -> tuple[Fence | None, Table | None]:
        """The open fence / table after ``line`` (a line carries its own context)."""
        role = line.role
        if role == Role.FENCE_OPEN:
            return line.fence, None
        if role == Role.FENCE_CLOSE:
            return None, None
        if role == Role.FENCE_BODY:
            return line.fence, None
        if role in (Role.TABLE_HEAD, Role.TABLE_ROW):
            return None, line.table
        return None, None

    def _push(self, line: Line, synthetic: bool = False) -> None:
        fence, table = self._after(line)
        cost = self.m.cost(line.text)
        self.size += cost + (self.m.sep if self.cur else 0)
        self.cur.append(_Item(line, synthetic, cost, fence, table))
        if not synthetic and line.role != Role.BLANK:
            self.real += 1

    def _closer_cost(self, fence: Fence | None) -> int:
        return 0 if fence is None else self.m.cost(fence.closer) + self.m.sep

    def _fits(self, line: Line) -> bool:
        fence, table = self._after(line)
        grown = self.size + self.m.cost(line.text) + (self.m.sep if self.cur else 0)
        return grown + self._closer_cost(fence) <= self.limit

    def _real(self) -> int:
        return self.real

    def _reopen(self, fence: Fence | None, table: Table | None) -> list[Line]:
        if fence is not None:
            return [Line(fence.opener, Role.FENCE_OPEN, fence=fence)]
        if table is not None:
            cost = sum(self.m.cost(h) + self.m.sep for h in table.header)
            if cost * 4 <= self.limit:
                return [Line(h, Role.TABLE_HEAD, table=table) for h in table.header]
        return []

    # ---- emitting -------------------------------------------------------------------

    def _emit(self, k: int) -> None:
        """Close the chunk after ``cur[:k]`` and start the next with ``cur[k:]``."""
        head, rest = self.cur[:k], self.cur[k:]
        last = head[-1]
        chunk = SplitChunk()
        for item in head:
            chunk.lines.append(item.line.text)
            chunk.synthetic.append(item.synthetic)
        if last.fence_after is not None:
            chunk.lines.append(last.fence_after.closer)
            chunk.synthetic.append(True)
        _trim(chunk)
        if chunk.lines:
            self.out.append(chunk)
        self.cur = []
        self.size = self.m.base
        self.real = 0
        for line in self._reopen(last.fence_after, last.table_after):
            self._push(line, synthetic=True)
        for item in rest:
            if item.line.role == Role.BLANK and self._real() == 0:
                continue
            self._push(item.line, item.synthetic)

    def _break_class(self, k: int) -> int:
        """How good a cut between cur[k-1] and cur[k] is (0 best, 3 forced)."""
        before = self.cur[k - 1]
        after = self.cur[k] if k < len(self.cur) else None
        if before.fence_after is None and before.table_after is None:
            if before.line.role == Role.BLANK or (after is not None and after.line.role == Role.BLANK):
                return 0
            return 1
        if before.line.role in (Role.FENCE_OPEN, Role.TABLE_HEAD):
            return 3
        if after is not None and after.line.role == Role.FENCE_CLOSE:
            return 3
        return 2

    def _choose(self, incoming_class: int) -> int:
        """Where to close the current chunk (a k with 1 <= k <= len(cur))."""
        first_real = next(
            (i for i, it in enumerate(self.cur) if not it.synthetic and it.line.role != Role.BLANK), len(self.cur)
        )
        sizes = []  # size of the chunk closed after cur[:k], closer included
        total = self.m.base
        for i, item in enumerate(self.cur):
            total += item.cost + (self.m.sep if i else 0)
            sizes.append(total + self._closer_cost(item.fence_after))
        full: dict[int, int] = {}  # class -> the latest cut of that class leaving a chunk half full
        any_fill: dict[int, int] = {}
        for k in range(first_real + 1, len(self.cur) + 1):
            cls = self._break_class(k) if k < len(self.cur) else incoming_class
            any_fill[cls] = k
            if sizes[k - 1] >= self.limit * _MIN_FILL:
                full[cls] = k
        for table in (full, any_fill):
            for cls in (0, 1, 2):
                if cls in table:
                    return table[cls]
        return any_fill.get(3, len(self.cur))

    def _incoming_class(self, line: Line) -> int:
        """The class of a cut between the last current line and ``line``."""
        fence, table = self._state()
        last = self.cur[-1]
        if fence is None and table is None:
            if last.line.role == Role.BLANK or line.role == Role.BLANK:
                return 0
            return 1
        if last.line.role in (Role.FENCE_OPEN, Role.TABLE_HEAD) or line.role == Role.FENCE_CLOSE:
            return 3
        return 2

    # ---- the loop -------------------------------------------------------------------

    def run(self, lines: list[Line]) -> list[SplitChunk]:
        pending = list(reversed(lines))
        while pending:
            line = pending.pop()
            if line.role == Role.BLANK and self._real() == 0:
                continue
            if self._fits(line):
                self._push(line)
                continue
            if self._real() > 0:
                self._emit(self._choose(self._incoming_class(line)))
                pending.append(line)
                # what was carried over plus the reopened lines may no longer fit: hand the
                # carried lines back and start from the reopened ones alone
                if self.size + self._closer_cost(self._state()[0]) > self.limit:
                    carried = [it.line for it in self.cur if not it.synthetic]
                    synthetic = [it.line for it in self.cur if it.synthetic]
                    self.cur, self.size, self.real = [], self.m.base, 0
                    for s in synthetic:
                        self._push(s, synthetic=True)
                    pending.extend(reversed(carried))
                continue
            head, tail = self._cut(line)
            self._push(head)
            self._emit(len(self.cur))
            if tail is not None:
                pending.append(tail)
        if self._real() > 0:
            self._emit(len(self.cur))
        return self.out

    def _cut(self, line: Line) -> tuple[Line, Line | None]:
        """Split a line that does not fit even alone into a head that fits and the rest."""
        fence, _ = self._after(line)
        budget = self.limit - self.size - (self.m.sep if self.cur else 0) - self._closer_cost(fence)
        text = line.text
        end, used = 0, 0
        for ch in text:
            c = self.m.char_cost(ch)
            if used + c > budget:
                break
            used += c
            end += 1
        end = max(end, 1)
        if end >= len(text):
            return line, None
        cut = _best_cut(text, end, line.atoms)
        head_text, tail_text = text[:cut].rstrip(), text[cut:]
        stripped = len(tail_text) - len(tail_text.lstrip())
        tail_text = tail_text.lstrip()
        if not head_text:
            head_text, tail_text, stripped, cut = text[:end], text[end:], 0, end
        offset = cut + stripped
        atoms_head = tuple((s, min(e, len(head_text))) for s, e in line.atoms if s < len(head_text))
        atoms_tail = tuple((max(s - offset, 0), e - offset) for s, e in line.atoms if e > offset)
        head = Line(head_text, line.role, line.fence, line.table, atoms_head)
        if not tail_text:
            return head, None
        return head, Line(tail_text, line.role, line.fence, line.table, atoms_tail)


def _trim(chunk: SplitChunk) -> None:
    while chunk.lines and not chunk.lines[-1].strip() and not chunk.synthetic[-1]:
        chunk.lines.pop()
        chunk.synthetic.pop()
    while chunk.lines and not chunk.lines[0].strip() and not chunk.synthetic[0]:
        chunk.lines.pop(0)
        chunk.synthetic.pop(0)


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # kana
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xAC00 <= o <= 0xD7AF  # hangul
        or 0xF900 <= o <= 0xFAFF
        or 0x20000 <= o <= 0x2FA1F
    )


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _grapheme_boundary(text: str, i: int) -> bool:
    """True unless a cut at ``i`` would split a grapheme cluster (combining marks, ZWJ
    sequences, variation selectors, skin tones, tags, flag pairs, CRLF)."""
    if i <= 0 or i >= len(text):
        return True
    a, b = text[i - 1], text[i]
    ob = ord(b)
    if a == "\r" and b == "\n":
        return False
    if a == "\u200d" or b == "\u200d":
        return False
    if unicodedata.category(b) in ("Mn", "Me", "Mc"):
        return False
    if 0xFE00 <= ob <= 0xFE0F or 0xE0100 <= ob <= 0xE01EF or 0x1F3FB <= ob <= 0x1F3FF or 0xE0020 <= ob <= 0xE007F:
        return False
    if 0xD800 <= ob <= 0xDFFF:
        return False
    if _regional(a) and _regional(b):
        run = 0
        j = i - 1
        while j >= 0 and _regional(text[j]):
            run += 1
            j -= 1
        return run % 2 == 0
    return True


def _best_cut(text: str, end: int, atoms: tuple[tuple[int, int], ...]) -> int:
    """The best position in (0, end] to cut ``text`` (see the module docstring)."""
    low = max(1, int(end * _MIN_FILL))

    def inside_atom(i: int) -> bool:
        return any(s < i < e for s, e in atoms)

    def last(pred: Callable[[int], bool], min_i: int) -> int | None:
        for i in range(end, min_i - 1, -1):
            if pred(i) and not inside_atom(i) and _grapheme_boundary(text, i):
                return i
        return None

    def sentence(i: int) -> bool:
        a = text[i - 1]
        b = text[i] if i < len(text) else " "
        if a in _SENTENCE_END:
            return b.isspace() or _is_cjk(b) or a not in ".!?" and b not in _CLOSING
        return False

    def clause(i: int) -> bool:
        a = text[i - 1]
        b = text[i] if i < len(text) else " "
        if a in _CLAUSE_END:
            return b.isspace() or a not in ",;:" and b not in _CLOSING
        return False

    def space(i: int) -> bool:
        return i < len(text) and text[i].isspace() and not text[i - 1].isspace()

    def cjk(i: int) -> bool:
        a, b = text[i - 1], text[i] if i < len(text) else ""
        return bool(b) and _is_cjk(a) and _is_cjk(b) and b not in _CLOSING and a not in _OPENING

    for pred in (sentence, clause, space, cjk):
        found = last(pred, low)
        if found is not None:
            return found
    for i in range(end, 0, -1):
        if _grapheme_boundary(text, i):
            return i
    return end
