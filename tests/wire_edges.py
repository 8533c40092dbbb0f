"""Shared by the wire-bound tests: the free-form fields of the params types (found from the
types, as sidecar/rpc/bounds.py finds them, but written independently) and minimal valid
documents holding a marker where such a field is; strategies for edge-case JSON-RPC lines
(int64 edges, nesting at and past the limits, long strings, numeric and huge ids) for the
fuzz tests. Deep JSON is built as text, so no test recurses whatever the depth."""

from __future__ import annotations

import json
from typing import Any

import msgspec.inspect as mi
from hypothesis import strategies as st

MARK = "@@DEEP@@"
"""Where a document holds its free-form field (``"@@DEEP@@"`` is replaced by JSON text)."""
Segment = str | int


def _free(info: Any) -> bool:
    if isinstance(info, mi.Metadata):
        return _free(info.type)
    if isinstance(info, mi.AnyType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_free(t) for t in info.types)
    if isinstance(info, (mi.ListType, mi.DictType)):
        inner = info.item_type if isinstance(info, mi.ListType) else info.value_type
        return _free(inner)
    return False


def _plain(info: Any) -> Any:
    return info.type if isinstance(info, mi.Metadata) else info


def free_paths(info: Any, seen: frozenset[type] = frozenset()) -> list[tuple[list[tuple[Any, Segment]], Any]]:
    """Every way down to a free-form field: [(step type, segment)...] and the field's type."""
    info = _plain(info)
    if _free(info):
        return [([], info)]
    found: list[tuple[list[tuple[Any, Segment]], Any]] = []
    if isinstance(info, mi.StructType):
        if info.cls in seen:
            return []
        for field in info.fields:
            for steps, leaf in free_paths(field.type, seen | {info.cls}):
                found.append(([(info, field.encode_name), *steps], leaf))
    elif isinstance(info, mi.ListType):
        for steps, leaf in free_paths(info.item_type, seen):
            found.append(([(info, 0), *steps], leaf))
    elif isinstance(info, mi.DictType):
        for steps, leaf in free_paths(info.value_type, seen):
            found.append(([(info, "k"), *steps], leaf))
    elif isinstance(info, mi.UnionType):
        for member in info.types:
            found += free_paths(member, seen)
    return found


def minimal(info: Any) -> Any:
    """The smallest valid value of a type (as plain JSON values)."""
    info = _plain(info)
    if isinstance(info, mi.StructType):
        out: dict[str, Any] = {}
        if info.tag_field is not None:
            out[info.tag_field] = info.tag
        for field in info.fields:
            if field.required:
                out[field.encode_name] = minimal(field.type)
        return out
    if isinstance(info, mi.UnionType):
        members = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return minimal(members[0]) if members else None
    if isinstance(info, mi.LiteralType):
        return info.values[0]
    if isinstance(info, mi.ListType):
        return []
    if isinstance(info, mi.DictType):
        return {}
    if isinstance(info, mi.StrType):
        return "x"
    if isinstance(info, mi.IntType):
        return max(1, info.ge or 1) if info.le is None or info.le >= 1 else info.le
    if isinstance(info, mi.FloatType):
        return 0.5
    if isinstance(info, mi.BoolType):
        return False
    if isinstance(info, (mi.NoneType, mi.AnyType)):
        return None
    raise AssertionError(f"no minimal value for {info!r}")


def document(steps: list[tuple[Any, Segment]]) -> Any:
    """A minimal valid document with MARK where the free-form field of ``steps`` is."""
    if not steps:
        return MARK
    info, segment = steps[0]
    child = document(steps[1:])
    if isinstance(info, mi.StructType):
        out = minimal(info)
        out[segment] = child
        return out
    if isinstance(info, mi.ListType):
        return [child]
    return {segment: child}


def expected_path(steps: list[tuple[Any, Segment]]) -> str:
    """The JSON path the error names: ``.field``, ``[index]``, ``.key`` (a plain dict key)."""
    return "$" + "".join(f"[{segment}]" if isinstance(segment, int) else f".{segment}" for _, segment in steps)


def deep_text(leaf: Any, depth: int) -> str:
    leaf = _plain(leaf)
    if isinstance(leaf, mi.UnionType):
        leaf = _plain(next(t for t in leaf.types if not isinstance(t, mi.NoneType)))
    if isinstance(leaf, mi.ListType):
        return "[" * depth + "]" * depth
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def free_form_cases(methods: dict[str, Any]) -> list[tuple[str, list[tuple[Any, Segment]], Any]]:
    """(method, steps, field type) for every free-form field of every method's params."""
    return [
        (method, steps, leaf)
        for method, spec in sorted(methods.items())
        for steps, leaf in free_paths(mi.type_info(spec.params))
    ]


def field_kind(leaf: Any) -> str:
    """"object", "array" or "any": what JSON a free-form field of this type holds at its top."""
    leaf = _plain(leaf)
    if isinstance(leaf, mi.UnionType):
        leaf = _plain(next(t for t in leaf.types if not isinstance(t, mi.NoneType)))
    if isinstance(leaf, mi.ListType):
        return "array"
    if isinstance(leaf, mi.DictType):
        return "object"
    return "any"


def shaped(depth: int, pattern: str, top: str, leaf: str = "1") -> str:
    """JSON text nested ``depth`` levels (0: just ``leaf``): every level an object
    (``{"k":``), an array, or alternating, starting with ``top`` when it is not "any"."""
    opens: list[str] = []
    closes: list[str] = []
    for level in range(depth):
        kind = pattern if pattern in ("object", "array") else ("object" if level % 2 == 0 else "array")
        if level == 0 and top in ("object", "array"):
            kind = top
        opens.append('{"k":' if kind == "object" else "[")
        closes.append("}" if kind == "object" else "]")
    return "".join(opens) + leaf + "".join(reversed(closes))


# ---- edge-case lines for the fuzz tests ----------------------------------------------------

INT64_EDGES = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30), 0, -1]
depths = st.sampled_from([0, 1, 63, 64, 65, 66, 200, 900, 950, 980, 1000, 1100, 5000])
long_strings = st.integers(1_000, 120_000).map(lambda n: "x" * n) | st.sampled_from(["漢" * 30_000, "\\" * 5000])
float_ids = st.sampled_from(["7.0", "1.5", "-0.0", "1e3", "2.5E-3", "1e300", "-1.7976931348623157e308"])
huge_ids = st.sampled_from([str(10**40), str(-(10**40)), str(2**63), str(2**64 + 1)]) | st.integers(300, 20_000).map(
    lambda n: json.dumps("i" * n)
)
small_ids = st.integers(-3, 3).map(str) | st.sampled_from(['"a"', "null"])


@st.composite
def edge_line(draw: st.DrawFn, methods: list[str]) -> bytes:
    """One JSON-RPC request line with an edge value: an int64 edge, a nesting depth at or
    past a limit, a long string, a numeric or huge id (as raw JSON text)."""
    request_id = draw(float_ids | huge_ids | small_ids)
    method = draw(st.sampled_from(methods))
    key = draw(st.sampled_from(["value", "id", "limit", "offset", "channelMeta", "body", "search", "sessionId"]))
    kind = draw(st.sampled_from(["int", "deep", "string", "none"]))
    if kind == "int":
        value = str(draw(st.sampled_from(INT64_EDGES)))
    elif kind == "deep":
        value = shaped(draw(depths), draw(st.sampled_from(["object", "array", "mixed"])), "any")
    elif kind == "string":
        value = json.dumps(draw(long_strings))
    else:
        value = "null"
    return f'{{"jsonrpc":"2.0","id":{request_id},"method":{json.dumps(method)},"params":{{"{key}":{value}}}}}'.encode()
