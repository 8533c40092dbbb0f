"""Every wire type survives encode -> decode unchanged, with non-trivial values.

The types are found automatically (every Struct in ``protocol.__all__``, every variant of
the tagged unions, every params/result of the method table), so a new type is covered
the moment it is exported. Values are built from msgspec's own type description: every
optional field gets a value that differs from its default, strings carry non-ASCII text,
lists have two items, unions pick a non-null member.
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

import protocol
from protocol import METHODS, NOTIFICATIONS

STRUCTS: list[type[msgspec.Struct]] = sorted(
    {
        obj
        for name in protocol.__all__
        if isinstance(obj := getattr(protocol, name), type) and issubclass(obj, msgspec.Struct)
    },
    key=lambda t: t.__name__,
)
UNIONS: dict[str, Any] = {
    name: obj
    for name in protocol.__all__
    if typing.get_origin(obj := getattr(protocol, name)) is typing.Union
    and all(isinstance(a, type) and issubclass(a, msgspec.Struct) for a in typing.get_args(obj))
}
METHOD_TYPES = [
    pytest.param(spec.params if part == "params" else spec.result, id=f"{name}:{part}")
    for table in (METHODS, NOTIFICATIONS)
    for name, spec in table.items()
    for part in ("params", "result")
    if (spec.params if part == "params" else spec.result) is not None
]


def build(info: mi.Type, label: str, depth: int = 0, avoid: Any = msgspec.NODEFAULT) -> Any:
    """A non-trivial value of the type described by ``info`` (different from ``avoid``)."""
    if isinstance(info, mi.Metadata):  # extra JSON Schema only (protocol.limits.Json*)
        return build(info.type, label, depth, avoid)
    if isinstance(info, mi.StructType):
        return build_struct(info, depth)
    if isinstance(info, mi.UnionType):
        members = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return build(members[-1] if depth > 1 else members[0], label, depth, avoid)
    if isinstance(info, mi.LiteralType):
        return ([v for v in info.values if v != avoid] or list(info.values))[-1]
    if isinstance(info, mi.EnumType):
        return ([m.value for m in info.cls if m.value != avoid] or [m.value for m in info.cls])[-1]
    if isinstance(info, mi.ListType):
        if depth > 1:
            return []
        return [build(info.item_type, f"{label}{i}", depth + 1) for i in range(2)]
    if isinstance(info, mi.DictType):
        return {f"{label}-k{i}": build(info.value_type, f"{label}{i}", depth + 1) for i in range(2)}
    if isinstance(info, mi.StrType):
        return f"{label}-値-ü-\n\"q\""
    if isinstance(info, mi.BoolType):
        return avoid is not True
    if isinstance(info, mi.IntType):
        value = 1_700_000_000_123 + len(label)
        return value if info.le is None else min(value, info.le)  # a bounded field gets its maximum
    if isinstance(info, mi.FloatType):
        return 0.25 + len(label)
    if isinstance(info, mi.AnyType):
        return {"nested": [1, "二", None, {"deep": True}], "n": 2.5}
    if isinstance(info, mi.NoneType):
        return None
    raise AssertionError(f"no builder for {info!r}: teach build() about it")


def build_struct(info: mi.StructType, depth: int) -> Any:
    values = {field.name: build(field.type, field.name, depth + 1, field.default) for field in info.fields}
    return info.cls(**values)


def sample(cls: Any) -> Any:
    return build(mi.type_info(cls), cls.__name__ if isinstance(cls, type) else "value")


def roundtrip(value: Any, typ: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value), type=typ)


def test_the_protocol_exports_structs_and_unions() -> None:
    assert len(STRUCTS) > 40
    assert {"ContentPart", "ChatStreamEvent"} <= set(UNIONS)


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda c: c.__name__)
def test_struct_roundtrip(cls: type[msgspec.Struct]) -> None:
    value = sample(cls)
    assert roundtrip(value, cls) == value
    # Non-trivial: every optional field differs from its default, so nothing was omitted
    # (constants such as SessionExport.format have only one possible value).
    for field in mi.type_info(cls).fields:
        constant = isinstance(field.type, mi.LiteralType) and len(field.type.values) == 1
        if not field.required and not constant:
            assert getattr(value, field.name) != field.default, (cls.__name__, field.name)


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda c: c.__name__)
def test_wire_names_are_camel_case(cls: type[msgspec.Struct]) -> None:
    for field in mi.type_info(cls).fields:
        assert "_" not in field.encode_name, (cls.__name__, field.encode_name)


@pytest.mark.parametrize("name", sorted(UNIONS))
def test_tagged_union_variants_roundtrip_through_the_union(name: str) -> None:
    union = UNIONS[name]
    variants = typing.get_args(union)
    tags = set()
    for variant in variants:
        value = sample(variant)
        encoded = msgspec.json.encode(value)
        tag = msgspec.json.decode(encoded)["type"]
        tags.add(tag)
        decoded = msgspec.json.decode(encoded, type=union)
        assert type(decoded) is variant and decoded == value
    assert len(tags) == len(variants), "two variants share a tag"
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"type":"no-such-variant"}', type=union)


@pytest.mark.parametrize("typ", METHOD_TYPES)
def test_method_params_and_results_roundtrip(typ: Any) -> None:
    value = build(mi.type_info(typ), "m")
    assert roundtrip(value, typ) == value


def test_every_field_is_written_defaults_too_and_only_unset_is_left_out() -> None:
    """What the sidecar sends is whole (a default is written like any value); an update's
    ``UNSET`` (keep) is the one value that is not written."""
    session = protocol.SessionV2(id="s", provider_id="p", model_id="m", created_at=1, updated_at=2)
    encoded = msgspec.json.decode(msgspec.json.encode(session))
    assert encoded["isPinned"] is False and encoded["summary"] is None and encoded["tags"] == []
    model = msgspec.json.decode(msgspec.json.encode(protocol.ModelConfig(id="m")))
    assert model["supportsTools"] is True and model["supportsImages"] is False and model["name"] is None
    assert msgspec.json.decode(msgspec.json.encode(protocol.CreateSessionOptions()))["mode"] == "direct"
    assert msgspec.json.encode(protocol.DateRange(from_=1, to=2)) == b'{"from":1,"to":2}'
    assert msgspec.json.encode(protocol.SessionUpdates(title="t")) == b'{"title":"t"}'
