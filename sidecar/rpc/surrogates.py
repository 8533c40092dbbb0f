"""Lone UTF-16 surrogate escapes in JSON text: found, masked, and named.

JSON's grammar allows any ``\\uXXXX`` escape, so ``"\\ud800"`` is well-formed JSON text,
but a surrogate that is not half of a pair names no Unicode character (RFC 8259 8.2):
msgspec refuses the whole document (a DecodeError, even when the string sits in a field
kept as ``Raw``), and Python could not write such a string back as UTF-8 anyway. Reading
it as a parse error would lose the request's id, so the caller's request never settles.

``mask`` replaces every lone surrogate escape by MASK_ESCAPE (``\\uFdD0``, a noncharacter
written with mixed-case hex, which no encoder emits), so the rest of the text decodes and
the envelope (id, method) can be read; ``holds`` and ``first_path`` tell the parser where
a masked string ended up. The parser then refuses the message with the right error
(sidecar.rpc.parse): nothing masked is ever handled as if it were the caller's text.

Must stay true: only escapes that are really escapes count (``\\\\ud800`` is a backslash
followed by the text ``ud800``); a high surrogate escape directly followed by a low one is
a pair and stays; the cost is proportional to the surrogate escapes in the text, and
nothing recurses into a value.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "MASK_ESCAPE", "mask", "holds", "first_path"]

MASK = "\ufdd0"
"""What a masked escape decodes to."""
MASK_ESCAPE = b"\\uFdD0"
"""What a lone surrogate escape is replaced by in the text."""

_SURROGATE = re.compile(rb"(\\+)u([dD][89a-fA-F][0-9a-fA-F]{2})")
_HIGH_END = 0xDBFF


def mask(text: bytes) -> bytes | None:
    """``text`` with every lone surrogate escape replaced by MASK_ESCAPE; None when it
    holds none (valid pairs are left as they are)."""
    if b"\\u" not in text:
        return None
    escapes: list[tuple[int, int, int]] = []  # (start of the escape, its end, the code unit)
    for match in _SURROGATE.finditer(text):
        if len(match.group(1)) % 2 == 0:
            continue  # an escaped backslash, then the text "uD..."
        escapes.append((match.end(1) - 1, match.end(), int(match.group(2), 16)))
    lone: list[tuple[int, int]] = []
    i = 0
    while i < len(escapes):
        start, end, unit = escapes[i]
        if unit <= _HIGH_END and i + 1 < len(escapes):
            next_start, _, next_unit = escapes[i + 1]
            if next_start == end and next_unit > _HIGH_END:
                i += 2  # a pair: one character outside the BMP
                continue
        lone.append((start, end))
        i += 1
    if not lone:
        return None
    out = bytearray()
    last = 0
    for start, end in lone:
        out += text[last:start]
        out += MASK_ESCAPE
        last = end
    out += text[last:]
    return bytes(out)


def holds(value: Any) -> bool:
    """Whether a decoded envelope member (an id, a method name) is a masked string."""
    return isinstance(value, str) and MASK in value


def first_path(value: Any) -> tuple[str | int, ...] | None:
    """The JSON path of the first string (a key or a value) in ``value`` holding MASK, or None.

    Walks without recursion, so any depth msgspec decoded is fine."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if MASK in node:
                return path
        elif isinstance(node, dict):
            children = []
            for key, child in node.items():
                if MASK in key:
                    return (*path, key)
                children.append(((*path, key), child))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(((*path, i), child) for i, child in reversed(list(enumerate(node))))
    return None
