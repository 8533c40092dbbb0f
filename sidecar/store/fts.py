"""Full-text search text for Chinese (and Japanese/Korean) alongside Latin scripts.

Owns: the derived text stored in the FTS5 index (``index_text``), the MATCH expression
built from a user's query (``build_match``), the highlighted snippet cut from the
ORIGINAL text (``snippet``), and the folding both sides go through (``fold``).

Folding: the indexed text and the query are both NFKC-normalized and case-folded first,
so full-width letters and digits (Ｗｉｎｄｏｗｓ１０, common in Chinese text), ligatures
(ﬁ), compatibility ideographs and half-width katakana match their plain forms, and case
folding goes beyond what unicode61 does (Straße = STRASSE). A change between letters and
(ASCII, which full-width ones become) digits is a word boundary (``Windows10`` is indexed as
``windows 10``, a query word ``windows10`` is the phrase ``"windows 10"``), so ``Windows``
finds ``Windows10`` and ``Windows 10`` finds both.

Why this scheme: FTS5's unicode61 tokenizer makes one token of a whole run of CJK
characters, so 搜索 would never match inside 我们今天讨论全文搜索功能; the trigram tokenizer
cannot match two-character words. So every CJK run is rewritten as its overlapping
bigrams followed by its last character alone (讨论全文 -> "讨论 论全 全文 文"), Latin words
are left to unicode61 (case folding, diacritics). A query runs through the same rewrite:
a CJK word becomes a phrase of its bigrams (consecutive positions = exact substring), a
single CJK character becomes a prefix term (搜* matches every bigram starting with it and
the trailing single character), a Latin word becomes a quoted term.

Must stay true:
- User input never reaches MATCH unquoted: every piece is a double-quoted string built
  only from letters/digits/CJK characters, so FTS syntax in a query (quotes, ``*``, NEAR,
  ``-``, AND/OR, parentheses) is plain text that is searched for or dropped.
- The same rewrite is used for indexing and querying (change one, reindex everything:
  a migration rebuilds every index built from ``index_text``).
- Snippet offsets are in the original text: hits are found in the folded text and mapped
  back through ``_fold_map`` (exact per character, or the whole run of characters that
  NFKC composed together).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, NamedTuple

from protocol import limits

__all__ = [
    "fold",
    "nfkc",
    "QueryPiece",
    "parse_query",
    "build_match",
    "index_text",
    "session_token",
    "snippet",
    "retrieval_terms",
    "retrieval_match",
    "affordable_terms",
    "key_token",
    "rebuild",
    "MAX_QUERY_CHARS",
]

MAX_QUERY_CHARS = limits.MAX_QUERY_CHARS

# Han (with extensions and compatibility ideographs), kana and Hangul. The katakana middle
# dot and double hyphen are punctuation to unicode61, so they stay out of runs.
_CJK = (
    "\u1100-\u11ff\u3005-\u3007\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff"
    "\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    "\U00020000-\U0003134f"
)
# A Latin-ish word as unicode61 sees it: letters and digits, no underscore.
_WORD_CHAR = f"(?:(?![{_CJK}])[^\\W_])"
# A character of a run of letters: a word character but CJK or an ASCII digit (an ASCII digit
# starts a token of its own; other digits stay in the run, as ``_rewrite`` leaves them).
_LETTER_RUN = f"(?:(?![{_CJK}0-9])[^\\W_])"
# Characters that fold to exactly themselves (lowercased), that no NFKC composition joins
# to what precedes them and that join nothing before them: ASCII, CJK unified ideographs,
# the plain hiragana, katakana and Hangul syllables. Folding can be mapped back to the
# original text run by run between them.
_STABLE = "\\x00-\\x7f\\u3041-\\u3096\\u30a1-\\u30fa\\u4e00-\\u9fff\\uac00-\\ud7a3"


# Compiled on first use, not at import: this module is on the process's start-up path.
@cache
def _cjk_run() -> re.Pattern[str]:
    return re.compile(f"[{_CJK}]+")


@cache
def _word() -> re.Pattern[str]:
    return re.compile(_WORD_CHAR + "+")


@cache
def _rewritten() -> re.Pattern[str]:
    # One scan for both rewrites, one character class (a regex scan of a long text is most of
    # their cost, and an alternation scans several times slower): runs of CJK characters and
    # ASCII digits (full-width ones are ASCII once folded), taken apart in ``_rewrite_run``.
    return re.compile(f"[{_CJK}0-9]+")


@cache
def _digit_runs() -> re.Pattern[str]:
    return re.compile("([0-9]+)")


@cache
def _unstable() -> re.Pattern[str]:
    return re.compile(f"[^{_STABLE}]+")


@cache
def _wide() -> re.Pattern[str]:
    return re.compile("[\uff01-\uff5e\u3000]")


def _narrow(char: str) -> str:
    """The NFKC form of a full-width ASCII character or the ideographic space."""
    return " " if char == "\u3000" else chr(ord(char) - 0xFEE0)


def nfkc(text: str) -> str:
    """``unicodedata.normalize("NFKC", text)``, faster: CPython's NFKC of a text that is not
    normalized costs about 1 us per character, and Chinese text is rarely normalized only
    because of its full-width punctuation, which is replaced by its NFKC form first."""
    if text.isascii():
        return text
    import unicodedata  # lazily: most texts on the start-up path are ASCII

    if unicodedata.is_normalized("NFKC", text):
        return text
    text = _narrowed(text)
    return text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)


def _narrowed(text: str) -> str:
    """``text`` with its full-width ASCII characters and ideographic spaces replaced by their
    NFKC forms (one character each: offsets do not move)."""
    for char in set(_wide().findall(text)):
        text = text.replace(char, _narrow(char))
    return text


def fold(text: str) -> str:
    """``text`` as the index and every query see it: NFKC, then case folding."""
    return text.lower() if text.isascii() else nfkc(text).casefold()


def _fold_map(text: str) -> tuple[str, list[int] | None, list[int] | None]:
    """(``fold(text)``, and for each folded character the start and the end in ``text`` of
    what it came from; None, None when every character folds to one in place). A run of
    characters that NFKC composed together maps as a whole."""
    if text.isascii():
        return text.lower(), None, None
    import unicodedata

    narrowed = _narrowed(text)
    if unicodedata.is_normalized("NFKC", narrowed):
        folded = narrowed.casefold()
        if len(folded) == len(text):  # case folding maps a character to one or more: each one stayed one
            return folded, None, None
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for m in _unstable().finditer(text):
        a, b = m.span()
        if a > pos:
            a -= 1  # the stable character before may start a composition (e + U+0301)
        if a > pos:
            out.append(text[pos:a].lower())
            starts.extend(range(pos, a))
            ends.extend(range(pos + 1, a + 1))
        piece = text[a:b]
        whole = fold(piece)
        each = [fold(c) for c in piece]
        if "".join(each) == whole:
            for i, f in enumerate(each):
                starts.extend([a + i] * len(f))
                ends.extend([a + i + 1] * len(f))
        else:
            starts.extend([a] * len(whole))
            ends.extend([b] * len(whole))
        out.append(whole)
        pos = b
    if pos < len(text):
        out.append(text[pos:].lower())
        starts.extend(range(pos, len(text)))
        ends.extend(range(pos + 1, len(text) + 1))
    return "".join(out), starts, ends


def _bigrams(run: str) -> str:
    if len(run) == 1:
        return run
    return " ".join(map(operator.add, run[:-1], run[1:])) + " " + run[-1]


def _rewrite_run(m: re.Match[str]) -> str:
    run = m.group()
    if "0" <= run[0] <= "9" and run.isdigit():
        return " " + run + " "
    if "0" <= run[0] <= "9" or any("0" <= c <= "9" for c in run):  # digits beside CJK: 2024年
        return " ".join(" " + (p if "0" <= p[0] <= "9" else _bigrams(p)) + " " for p in _digit_runs().split(run) if p)
    return " " + _bigrams(run) + " "


def _rewrite(folded: str) -> str:
    """Folded text as it is indexed: CJK runs as their bigrams, runs of digits set apart from
    the letters around them (a change between letters and digits is a word boundary)."""
    return _rewritten().sub(_rewrite_run, folded)


def index_text(text: str) -> str:
    """The text stored in the FTS index for ``text``: folded, digits set apart from letters,
    CJK runs rewritten as bigrams."""
    return _rewrite(fold(text))


def rebuild(conn: Any, table: str, columns: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> int:
    """Replace every row of the contentless FTS5 ``table`` by ``rows`` (rowid, then
    ``columns``, their text already made by ``index_text``), read as they are written (a
    large history is never held whole); how many. For a change of ``index_text``."""
    conn.execute(f"INSERT INTO {table}({table}) VALUES ('delete-all')")
    count = 0

    def counted() -> Iterable[tuple[Any, ...]]:
        nonlocal count
        for row in rows:
            count += 1
            yield row

    marks = ", ".join("?" * (1 + len(columns)))
    conn.executemany(f"INSERT INTO {table}(rowid, {', '.join(columns)}) VALUES ({marks})", counted())
    return count


def session_token(session_id: str) -> str:
    """A single unicode61 token standing for a session (its ``sid`` column in the index)."""
    import hashlib  # lazily: its OpenSSL start-up is a few ms of process start

    return "s" + hashlib.blake2b(session_id.encode(), digest_size=10).hexdigest()


class QueryPiece(NamedTuple):
    """One searched unit, folded: a CJK run (matched as a substring) or a Latin word (its
    letters and digits as consecutive tokens)."""

    text: str
    cjk: bool


def parse_query(query: str) -> list[QueryPiece]:
    """Split a user's query (folded first) into pieces; punctuation and FTS operators become
    separators."""
    query = fold(query)
    pieces: list[QueryPiece] = []
    seen: set[tuple[str, bool]] = set()

    def add(text: str, cjk: bool) -> None:
        key = (text, cjk)
        if key not in seen:
            seen.add(key)
            pieces.append(QueryPiece(text, cjk))

    word = _word()
    pos = 0
    for m in _cjk_run().finditer(query):
        for w in word.findall(query, pos, m.start()):
            add(w, False)
        add(m.group(), True)
        pos = m.end()
    for w in word.findall(query, pos):
        add(w, False)
    return pieces


def _quote(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def build_match(pieces: list[QueryPiece]) -> str | None:
    """The MATCH expression over the ``body`` column for ``pieces`` (None if nothing to search)."""
    terms: list[str] = []
    for p in pieces:
        if p.cjk:
            if len(p.text) == 1:
                terms.append(_quote(p.text) + "*")
            else:
                terms.append(_quote(" ".join(map(operator.add, p.text[:-1], p.text[1:]))))
        else:
            terms.append(_quote(_rewrite(p.text).strip()))  # a Latin word: its letter and digit runs
    if not terms:
        return None
    return "{body} : (" + " AND ".join(terms) + ")"


def retrieval_terms(query: str) -> list[str]:
    """The MATCH terms of a retrieval query (knowledge chunks, memories): a CJK run counts as
    its bigrams, each a term of its own (a question rarely contains a passage's exact
    phrase); a single CJK character is a prefix term; a Latin word is a quoted term (all
    built by ``build_match``)."""
    terms: list[str] = []
    seen: set[str] = set()
    for piece in parse_query(query[:MAX_QUERY_CHARS]):
        if piece.cjk and len(piece.text) > 2:
            units = [QueryPiece(a + b, True) for a, b in zip(piece.text[:-1], piece.text[1:])]
        else:
            units = [piece]
        for unit in units:
            expr = build_match([unit])
            if expr is not None and expr not in seen:
                seen.add(expr)
                terms.append(expr)
    return terms


def affordable_terms(counts: Sequence[int], total: int, budget: int) -> list[int]:
    """Which terms of a retrieval query to score, given how many rows each matches
    (``counts``, possibly capped above ``budget``) of the ``total`` rows: their indexes, in
    query order. Scoring every row a term matches is most of a search's cost, and the
    commonest terms weigh least, so terms are taken rarest first, and a term is dropped
    (while a rarer one remains) when it is in more than half of the rows (BM25 gives it no
    weight: FTS5 clamps its IDF at zero) or when it would bring the rows to score above
    ``budget``. Terms that match nothing are left out; [] when none matches."""
    kept: list[int] = []
    rows = 0
    for n, i in sorted((n, i) for i, n in enumerate(counts) if n > 0):
        if kept and (n > total // 2 or rows + n > budget):
            break
        kept.append(i)
        rows += n
    return sorted(kept)


def retrieval_match(terms: list[str], column: str | None = None, tokens: list[str] | None = None) -> str | None:
    """Any of ``terms`` (ranked by BM25), within the rows whose ``column`` holds one of
    ``tokens`` (``key_token`` values; no ``column``: no filter). None when nothing is
    searchable."""
    if not terms:
        return None
    expr = "(" + " OR ".join(terms) + ")"
    if not column or not tokens:
        return expr
    keys = " OR ".join('"' + t + '"' for t in dict.fromkeys(tokens))
    return "{" + column + "} : (" + keys + ") AND " + expr


def key_token(prefix: str, key: str) -> str:
    """A single unicode61 token standing for ``key`` (a base, a memory scope) in a filter
    column of an index; ``prefix`` is one letter that keeps kinds of keys apart."""
    import hashlib  # lazily, as session_token

    return prefix + hashlib.blake2b(key.encode(), digest_size=10).hexdigest()


def _word_pattern(word: str) -> re.Pattern[str]:
    """Where the tokens of a (folded) query word are in folded text: its letter and digit
    runs in order, separated by anything that is not a token, at token boundaries."""
    runs = re.findall(r"[0-9]+|[^0-9]+", word)
    edge = [r"[0-9]" if "0" <= run[0] <= "9" else _LETTER_RUN for run in (runs[0], runs[-1])]
    return re.compile(
        f"(?<!{edge[0]})" + r"[\W_]*".join(map(re.escape, runs)) + f"(?!{edge[1]})"
    )


def _hit_spans(text: str, pieces: list[QueryPiece]) -> list[tuple[int, int]]:
    """Where the pieces are in ``text``, in its own offsets (found in its folded form)."""
    folded, starts, ends = _fold_map(text)
    found: list[tuple[int, int]] = []
    for p in pieces:
        if p.cjk:
            start = folded.find(p.text)
            while start != -1:
                found.append((start, start + len(p.text)))
                start = folded.find(p.text, start + 1)
        elif p.text:
            found.extend(m.span() for m in _word_pattern(p.text).finditer(folded) if m.end() > m.start())
    spans = found if starts is None or ends is None else [(starts[s], ends[e - 1]) for s, e in found]
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s < merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


_WS = re.compile(r"\s+")


def _plain(s: str) -> str:
    """Whitespace collapsed, HTML-escaped (the snippet goes into innerHTML)."""
    return _WS.sub(" ", s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def snippet(text: str, pieces: list[QueryPiece], width: int = 64) -> str:
    """HTML-escaped excerpt of ``text`` (about ``width`` chars) with hits in ``<mark>``."""
    spans = _hit_spans(text, pieces)
    if not spans:
        end = min(len(text), width)
        return _plain(text[:end]) + ("…" if end < len(text) else "")
    first_s, first_e = spans[0]
    start = max(0, first_s - width // 3)
    end = min(len(text), max(start + width, first_e))
    if end - start < width:
        start = max(0, end - width)
    out: list[str] = ["…"] if start > 0 else []
    pos = start
    for s, e in spans:
        if s >= end:
            break
        s = max(s, pos)
        e = min(e, end)
        if s > pos:
            out.append(_plain(text[pos:s]))
        out.append("<mark>" + _plain(text[s:e]) + "</mark>")
        pos = e
    if pos < end:
        out.append(_plain(text[pos:end]))
    if end < len(text):
        out.append("…")
    return "".join(out)
