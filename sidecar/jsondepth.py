"""How deep JSON nests, measured without recursion: on decoded values and on JSON text.

msgspec (like the json module) recurses once per level of nesting, so a value nested close
to Python's recursion limit decodes in one place and fails to encode in another
(RecursionError). Whoever accepts free-form JSON from outside bounds its depth with these
two functions first: ``sidecar/rpc`` on params (``json_too_deep``, against
``protocol.limits.MAX_JSON_DEPTH``), ``sidecar/store`` on JSON columns it reads
(``json_text_too_deep``). Depth counts containers: ``1`` is 0, ``[]`` is 1,
``{"a": [1]}`` is 2.

What must stay true: neither function recurses, and both stop early when the answer is
clear (a value with fewer brackets than the limit is never walked).
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

__all__ = ["json_too_deep", "json_text_too_deep"]


def json_too_deep(value: Any, limit: int) -> bool:
    """True if ``value`` (decoded JSON: dicts, lists, scalars) nests deeper than ``limit``."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                push((child, depth + 1))
    return False


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = [0] * 128
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_DELTA = tuple(_STEP)


def json_text_too_deep(text: str, limit: int) -> bool:
    """True if the JSON text ``text`` nests deeper than ``limit`` (brackets inside strings
    do not count). Text that is not valid JSON gives an answer that is only as good as its
    brackets; decoding it reports the error."""
    if text.count("{") + text.count("[") <= limit:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if len(brackets) <= limit:
        return False
    return max(accumulate(map(_DELTA.__getitem__, brackets.encode("ascii")))) > limit
