"""What the wire contract in ``protocol/`` contains, as the generators of
``protocol/generated/`` (tools/gen_protocol.py, tools/protocol_ts.py) need it.

Owns the introspection of the protocol package: which Structs and named union/literal
aliases are on the wire (reachable from ``protocol.__all__`` and the method tables), which
of them the client sends and which the sidecar sends, which fields msgspec always writes,
which defaults are ``msgspec.UNSET`` (left out: keep; ``null``: clear), the params Structs'
``REQUIRED_WHEN`` tables, the lenient ``<Name>Input`` forms, and the docs written under
fields and aliases in ``protocol/*.py`` (read with ``ast``, never by importing more).

What must stay true: everything here depends only on the imported ``protocol`` package and
its source files, and comes out sorted (by name, by file), so what is generated from it is
byte-for-byte reproducible. Imported with the repository root on ``sys.path``
(tools/gen_protocol.py puts it there).
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

import protocol
from protocol import METHODS, NOTIFICATIONS

PROTOCOL_DIR = Path(protocol.__file__).resolve().parent
"""The sources of the imported protocol package: the field and alias docs are read there."""


def exported_aliases() -> dict[str, Any]:
    """Named unions and literals of protocol.__all__ (ContentPart, ChatStreamEvent, SessionMode...)."""
    aliases = {}
    for name in protocol.__all__:
        value = getattr(protocol, name)
        if typing.get_origin(value) in (typing.Union, typing.Literal):
            aliases[name] = value
    return dict(sorted(aliases.items()))


def method_types() -> Iterable[Any]:
    for table in (METHODS, NOTIFICATIONS):
        for spec in table.values():
            yield spec.params
            if spec.result is not None:
                yield spec.result


def _walk_structs(info: Any, found: dict[str, type[msgspec.Struct]]) -> None:
    if isinstance(info, mi.StructType):
        name = info.cls.__name__
        if name in found:
            if found[name] is not info.cls:
                raise SystemExit(f"two wire types are named {name}: rename one")
            return
        found[name] = info.cls
        for field in info.fields:
            _walk_structs(field.type, found)
        return
    for attr in ("types", "item_type", "key_type", "value_type", "type"):  # "type": mi.Metadata
        inner = getattr(info, attr, None)
        if isinstance(inner, tuple):
            for item in inner:
                _walk_structs(item, found)
        elif inner is not None:
            _walk_structs(inner, found)


def structs_in(types: Iterable[Any]) -> dict[str, type[msgspec.Struct]]:
    found: dict[str, type[msgspec.Struct]] = {}
    for info in mi.multi_type_info(list(types)):
        _walk_structs(info, found)
    return found


def all_structs() -> list[type[msgspec.Struct]]:
    """Every Struct reachable from protocol.__all__ and the method tables, sorted by name."""
    roots: list[Any] = [getattr(protocol, n) for n in protocol.__all__]
    roots = [r for r in roots if isinstance(r, type) and issubclass(r, msgspec.Struct)]
    roots += list(exported_aliases().values()) + list(method_types())
    found = structs_in(roots)
    return [found[name] for name in sorted(found)]


def sent_by_client() -> set[str]:
    """Names of the Structs that occur in params (requests and client notifications)."""
    types = [s.params for s in METHODS.values()]
    types += [s.params for s in NOTIFICATIONS.values() if s.direction == "client->server"]
    return set(structs_in(types))


def sent_by_server() -> set[str]:
    """Names of the Structs that occur in results and server notifications."""
    types = [s.result for s in METHODS.values() if s.result is not None]
    types += [s.params for s in NOTIFICATIONS.values() if s.direction == "server->client"]
    return set(structs_in(types))


_OMITTABLE_FACTORIES = (list, dict, set, bytearray)
"""With omit_defaults, msgspec omits a factory default only for these (when empty)."""


def always_sent(cls: type[msgspec.Struct], field: mi.Field) -> bool:
    """True when msgspec writes ``field`` in every encoding of ``cls``."""
    if field.required or not cls.__struct_config__.omit_defaults:
        return True
    factory = field.default_factory
    return factory is not mi.NODEFAULT and factory not in _OMITTABLE_FACTORIES


UNSET_NOTE = "absent: keep; null: clear (to the default)."


def unset_default(field: mi.Field) -> bool:
    """The field's default is ``msgspec.UNSET`` (msgspec.inspect reports no default at all
    for an optional field): left out means keep, ``null`` means clear."""
    return not field.required and field.default is mi.NODEFAULT and field.default_factory is mi.NODEFAULT


def field_doc(docs: dict[tuple[str, str], str], cls: type, field: mi.Field) -> str | None:
    doc = docs.get((cls.__name__, field.name))
    if unset_default(field):
        return f"{doc}\n{UNSET_NOTE}" if doc else UNSET_NOTE
    return doc


def input_variants() -> set[str]:
    """Structs sent both ways whose params form is more lenient than what the server sends
    (or that contain such a Struct): they get a ``<Name>Input`` interface."""
    structs = {cls.__name__: cls for cls in all_structs()}
    both = sent_by_client() & sent_by_server()
    variants = {
        name for name in both
        if any(always_sent(structs[name], f) != f.required for f in mi.type_info(structs[name]).fields)
    }
    changed = True
    while changed:
        changed = False
        for name in both - variants:
            inner: dict[str, type[msgspec.Struct]] = {}
            for field in mi.type_info(structs[name]).fields:
                _walk_structs(field.type, inner)
            if variants & set(inner):
                variants.add(name)
                changed = True
    return variants


def required_when(cls: type) -> dict[str, tuple[str, tuple[str, ...]]]:
    """A params Struct's ``REQUIRED_WHEN``: field -> (another field, the values of it that
    make the field required); the types and the schema say it, the sidecar checks it."""
    table: dict[str, tuple[str, tuple[str, ...]]] = getattr(cls, "REQUIRED_WHEN", {})
    return table


def final_event_types() -> list[str]:
    return [typing.cast(Any, cls).__struct_config__.tag for cls in typing.get_args(protocol.FinalEvent)]


def source_docs() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the docstring written under that field in protocol/*.py."""
    docs: dict[tuple[str, str], str] = {}
    for path in sorted(PROTOCOL_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            body = node.body
            for stmt, following in zip(body, body[1:], strict=False):
                target = None
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    target = stmt.target.id
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    target = stmt.targets[0].id
                if (
                    target
                    and isinstance(following, ast.Expr)
                    and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)
                ):
                    docs[(node.name, target)] = _clean(following.value.value)
    return docs


def alias_docs() -> dict[str, str]:
    """Alias name -> the docstring written under ``Name = Literal[...]`` in protocol/*.py."""
    docs: dict[str, str] = {}
    for path in sorted(PROTOCOL_DIR.glob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for stmt, following in zip(body, body[1:], strict=False):
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[stmt.targets[0].id] = _clean(following.value.value)
    return docs


def class_doc(cls: type) -> str | None:
    doc = cls.__dict__.get("__doc__")
    return _clean(doc) if doc else None


def _clean(doc: str) -> str:
    lines = doc.strip().splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
    return "\n".join([lines[0].strip()] + [line[indent:].rstrip() for line in lines[1:]])
