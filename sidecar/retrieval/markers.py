"""Citation markers in a finished reply: normalized to ``[n]`` runs, the unknown ones found.

The model is told to cite ``[1][3]``; it also writes ``[1, 3]``, ``[1,3]``, ``[1、3]``,
``【3】`` or ``［3］``. ``normalize(text)`` rewrites every marker group of ``text`` to runs of
``[n]`` and returns the numbers it saw, so the caller can flag the ones that point at no
citation of the reply (``Citation.dangling``).

A marker group: an opening ``[``, ``【`` or ``［``, one or more numbers 1..MAX_MARKER separated
by commas (``,`` ``，`` ``、``), semicolons (``;`` ``；``) or spaces, and a closing ``]``,
``】`` or ``］``. Not a group (left exactly as written, not counted): anything inside code
(fenced blocks and inline code spans, where ``[1, 3]`` is a list), Markdown link text (a
group followed by ``(``), a reference definition (a group at the start of a line followed by
``:``), a footnote reference (``[^1]``), and numbers outside 1..MAX_MARKER (``[0]``,
``[2024]``). A number repeated within one group is written once.

Pure functions over strings; the reply's content is the caller's (the step loop's finalize).
"""

from __future__ import annotations

import re

__all__ = ["MAX_MARKER", "normalize", "MarkerScan"]

MAX_MARKER = 999

_GROUP = re.compile(
    r"[\[【［][ \t]*(\d{1,3}(?:[ \t]*[,，、;；][ \t]*\d{1,3}|[ \t]+\d{1,3})*)[ \t]*[\]】］]"
)
_NUMBER = re.compile(r"\d+")
# a fenced block (its closing fence, or the end of the text) or an inline code span
_CODE = re.compile(
    r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]{0,3}(?P=fence)[`~]*[ \t]*$|\Z)"
    r"|(?P<ticks>`+)(?!`).*?(?<!`)(?P=ticks)(?!`)",
    re.MULTILINE | re.DOTALL,
)


class MarkerScan:
    """What ``normalize`` found: the rewritten text and the numbers in order of first use."""

    __slots__ = ("text", "numbers")

    def __init__(self, text: str, numbers: list[int]) -> None:
        self.text = text
        self.numbers = numbers


def _rewrite(prose: str, seen: dict[int, None]) -> str:
    out: list[str] = []
    last = 0
    for match in _GROUP.finditer(prose):
        start, end = match.span()
        after = prose[end : end + 1]
        if after == "(":
            continue  # [1](url): link text
        if after == ":" and (start == 0 or prose[start - 1] == "\n"):
            continue  # [1]: url, a reference definition
        numbers = [int(n) for n in _NUMBER.findall(match.group(1))]
        if not all(1 <= n <= MAX_MARKER for n in numbers):
            continue
        unique = list(dict.fromkeys(numbers))
        for n in unique:
            seen.setdefault(n)
        out.append(prose[last:start])
        out.append("".join(f"[{n}]" for n in unique))
        last = end
    out.append(prose[last:])
    return "".join(out)


def normalize(text: str) -> MarkerScan:
    """``text`` with its marker groups as ``[a][b]`` runs (code untouched), and the numbers."""
    seen: dict[int, None] = {}
    out: list[str] = []
    last = 0
    for code in _CODE.finditer(text):
        out.append(_rewrite(text[last : code.start()], seen))
        out.append(code.group(0))
        last = code.end()
    out.append(_rewrite(text[last:], seen))
    return MarkerScan("".join(out), list(seen))
