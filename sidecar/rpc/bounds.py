"""The nesting limit of free-form JSON in params, derived from the params types.

msgspec checks the shape of typed fields, but a field typed ``Any``, ``dict[str, Any]`` or
``list[Any]`` (``channelMeta``, a provider's ``body``, a tool call's ``input``, imported
``acpParts``...) accepts any JSON, however deep. A value nested hundreds of levels deep is
stored fine and then cannot be encoded again (RecursionError), so it must be refused where
it comes in. ``DepthCheck.for_type(params_type)`` finds every such field of a params type
once (through nested Structs, lists, dicts and unions) and ``check(value)`` measures only
those fields of a decoded value, without recursion.

The rule: a free-form value (the outermost container below the nearest typed Struct) nests
at most ``protocol.limits.MAX_JSON_DEPTH`` levels, the value itself included, so
``{"a": {"b": 1}}`` has 2. A violation is reported as the JSON path of the field
(``$.messages[3].parts[0].input``), the way msgspec names fields.

``raw_free_form_path`` names the field when the value is too deep for msgspec itself to
decode (RecursionError): it scans the JSON text without recursion and maps the path where
the nesting exceeds the limit onto the type. What must stay true: nothing here recurses
into the value, and the cost of ``check`` is proportional to the free-form content only
(typed fields are not visited).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from protocol.limits import MAX_JSON_DEPTH
from sidecar.jsondepth import json_too_deep

__all__ = ["DepthCheck", "raw_free_form_path", "format_path"]

PathPart = str | int
Path = tuple[PathPart, ...]
_Walker = Callable[[Any, Path], "Path | None"]


def format_path(path: Path) -> str:
    """``("messages", 3, "input")`` -> ``$.messages[3].input`` (dict keys as ``[...]``)."""
    out = ["$"]
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _NAME.fullmatch(part) and len(part) <= 64:
            out.append(f".{part}")
        else:
            out.append("[...]")
    return "".join(out)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_free(info: Any) -> bool:
    """Holds arbitrary JSON below this point (Any somewhere, no Struct in between)."""
    if isinstance(info, mi.Metadata):
        return _is_free(info.type)
    if isinstance(info, mi.AnyType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_is_free(t) for t in info.types)
    if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        return _is_free(info.item_type)
    if isinstance(info, mi.TupleType):
        return any(_is_free(t) for t in info.item_types)
    if isinstance(info, mi.DictType):
        return _is_free(info.key_type) or _is_free(info.value_type)
    return False


def _free(value: Any, path: Path) -> Path | None:
    return path if json_too_deep(value, MAX_JSON_DEPTH) else None


class _StructWalker:
    """The free-form fields of one Struct type (filled after creation: types may recurse)."""

    __slots__ = ("fields",)

    def __init__(self) -> None:
        self.fields: list[tuple[str, str, _Walker]] = []

    def __call__(self, value: Any, path: Path) -> Path | None:
        for attr, name, walk in self.fields:
            field = getattr(value, attr, None)
            if field is not None:
                found = walk(field, (*path, name))
                if found is not None:
                    return found
        return None


def _compile(info: Any, memo: dict[type, _StructWalker]) -> _Walker | None:
    """A walker that returns the path of the first too-deep free-form value, or None when
    this type cannot hold free-form JSON at all (so nothing needs to be visited)."""
    if isinstance(info, mi.Metadata):
        return _compile(info.type, memo)
    if _is_free(info):
        return _free
    if isinstance(info, mi.StructType):
        cached = memo.get(info.cls)
        if cached is not None:
            return cached
        walker = _StructWalker()
        memo[info.cls] = walker
        for field in info.fields:
            inner = _compile(field.type, memo)
            if inner is not None:
                walker.fields.append((field.name, field.encode_name, inner))
        # Empty: None, so nothing is visited; a recursive reference taken while compiling
        # keeps the (empty, hence cheap) walker itself.
        return walker if walker.fields else None
    if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        item = _compile(info.item_type, memo)
        if item is None:
            return None

        def walk_items(value: Any, path: Path) -> Path | None:
            for index, entry in enumerate(value):
                found = item(entry, (*path, index))
                if found is not None:
                    return found
            return None

        return walk_items
    if isinstance(info, mi.DictType):
        member = _compile(info.value_type, memo)
        if member is None:
            return None

        def walk_values(value: Any, path: Path) -> Path | None:
            for key, entry in value.items():
                found = member(entry, (*path, key))
                if found is not None:
                    return found
            return None

        return walk_values
    if isinstance(info, mi.UnionType):
        by_struct: dict[type, _Walker] = {}
        by_container: dict[type, _Walker] = {}
        for member_info in info.types:
            member_walker = _compile(member_info, memo)
            if member_walker is None:
                continue
            base = member_info.type if isinstance(member_info, mi.Metadata) else member_info
            if isinstance(base, mi.StructType):
                by_struct[base.cls] = member_walker
            elif isinstance(base, mi.DictType):
                by_container[dict] = member_walker
            else:
                by_container[list] = member_walker
        if not by_struct and not by_container:
            return None

        def walk_member(value: Any, path: Path) -> Path | None:
            walker = by_struct.get(type(value)) or by_container.get(type(value))
            return walker(value, path) if walker is not None else None

        return walk_member
    return None


class DepthCheck:
    """The free-form fields of one params type and the check of a decoded value."""

    __slots__ = ("_walker", "_info")

    def __init__(self, walker: _Walker | None, info: Any) -> None:
        self._walker = walker
        self._info = info

    @classmethod
    def for_type(cls, params_type: Any) -> DepthCheck:
        info = mi.type_info(params_type)
        return cls(_compile(info, {}), info)

    @property
    def needed(self) -> bool:
        """False when the type has no free-form field (nothing is ever checked)."""
        return self._walker is not None

    def check(self, value: Any) -> Path | None:
        """The path of the first free-form value nested deeper than MAX_JSON_DEPTH, or None."""
        if self._walker is None:
            return None
        return self._walker(value, ())

    def raw_path(self, raw: bytes) -> Path | None:
        """``raw_free_form_path`` for this type."""
        return raw_free_form_path(self._info, raw)


# ---- naming the field of a value too deep to decode ------------------------------------

_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')
_SCAN_BUDGET = 2_000_000
"""Tokens scanned at most (past it the field is not named; the error still is -32602)."""
_SCAN_DEPTH = MAX_JSON_DEPTH + 64
"""A nesting this deep lies inside a free-form value (typed levels are far fewer)."""


def raw_free_form_path(info: Any, raw: bytes) -> Path | None:
    """The path of the free-form field of type ``info`` inside which ``raw`` (JSON text)
    nests past _SCAN_DEPTH, or None if it does not or cannot be told within the budget."""
    path = _deep_position(raw)
    if path is None:
        return None
    return _free_root(info, path)


def _deep_position(raw: bytes) -> list[PathPart] | None:
    # A stack of (is_object, current key or index) per open container.
    stack: list[list[Any]] = []
    expect_key = False
    for count, match in enumerate(_TOKEN.finditer(raw)):
        if count > _SCAN_BUDGET:
            return None
        token = match.group()
        first = token[:1]
        if first == b'"':
            if expect_key and stack:
                try:
                    stack[-1][1] = msgspec.json.decode(token)
                except msgspec.DecodeError:
                    return None
                expect_key = False
        elif first in (b"{", b"["):
            stack.append([first == b"{", 0])
            expect_key = first == b"{"
            if len(stack) > _SCAN_DEPTH:
                return [entry[1] for entry in stack[:-1]]
        elif first in (b"}", b"]"):
            if stack:
                stack.pop()
            expect_key = False
        elif first == b",":
            if stack:
                if stack[-1][0]:
                    expect_key = True
                else:
                    stack[-1][1] += 1
    return None


def _free_root(info: Any, path: list[PathPart]) -> Path:
    """The prefix of ``path`` that leads to a free-form field of ``info`` (best effort)."""
    prefix: list[PathPart] = []
    current = info
    for part in path:
        current = _unwrap(current, part)
        if current is None or _is_free(current):
            prefix.append(part)
            return tuple(prefix)
        prefix.append(part)
    return tuple(prefix)


def _unwrap(info: Any, part: PathPart) -> Any:
    """The type at ``part`` below ``info``; None when the step cannot be followed."""
    if isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        for member in info.types:
            inner = _unwrap(member, part)
            if inner is not None:
                return inner
        return None
    if isinstance(info, mi.StructType) and isinstance(part, str):
        for field in info.fields:
            if field.encode_name == part:
                return field.type
        return None
    if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)) and isinstance(part, int):
        return info.item_type
    if isinstance(info, mi.DictType) and isinstance(part, str):
        return info.value_type
    return None
