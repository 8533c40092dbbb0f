"""A fast yes/no check of a JSON value against the JSON Schema subset protocol/generated uses.

``jsonschema`` takes about 0.2 s for one page of messages (it builds a validator object per
node and keyword); every line of every end-to-end test is checked (tests/wire_contract.py),
so the common answer, "valid", comes from here: the schema is compiled once into plain
Python predicates. The subset is what msgspec's schema generator writes: ``$ref`` (into
the same document), ``type``, ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``anyOf``, ``minimum``/``maximum`` (and their
exclusive forms), ``maxLength``, ``minLength``, ``maxItems``, ``minItems``, plus the
annotations JSON Schema ignores.

What must stay true: it never says valid where ``jsonschema`` (draft 2020-12) says invalid.
A keyword outside the subset raises ``Unsupported`` when compiling, and the caller then
uses ``jsonschema`` alone; a "no" is always explained by ``jsonschema``, which must agree
(tests/test_wire_contract.py compares the two).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
"""Values are what ``json.loads`` returns: dict, list, str, int, float, bool, None."""

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                         "$comment", "discriminator", "x-maxDepth"})
"""Keywords that assert nothing (``discriminator`` is OpenAPI's, not a 2020-12 keyword)."""


class Unsupported(Exception):
    """The schema uses a keyword this checker does not implement."""


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,), "null": (type(None),),
    "number": (int, float), "integer": (int,),
}
"""What a JSON-decoded value of that type is (``json.loads`` gives exactly these types;
a bool is not an int here: ``type(True) is bool``)."""


def _type_check(names: list[str]) -> Check:
    allowed = frozenset(t for name in names for t in PYTHON_TYPES[name])
    if "integer" in names and "number" not in names:  # 1.0 is an integer in JSON Schema
        return lambda v: type(v) in allowed or (type(v) is float and v.is_integer())
    return lambda v: type(v) in allowed


def _all(checks: list[Check]) -> Check:
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda v: first(v) and second(v)

    def every(value: Any) -> bool:
        for check in checks:
            if not check(value):
                return False
        return True

    return every


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema means it: 1 == 1.0, but true != 1."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


class Compiler:
    """Compiles subschemas of ``root`` (refs resolve within it), each once."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self._refs: dict[str, Check] = {}

    def compile(self, schema: Any) -> Check:
        if schema is True:
            return lambda v: True
        if schema is False:
            return lambda v: False
        if not isinstance(schema, dict):
            raise Unsupported(f"a schema that is {type(schema).__name__}")
        checks: list[Check] = []
        names = schema.get("type")
        names = [names] if isinstance(names, str) else names
        if names is not None:
            checks.append(_type_check(list(names)))
        for keyword, arg in schema.items():
            if keyword in ANNOTATIONS or keyword in ("type", "required", "additionalProperties"):
                continue  # the last two belong to "properties" (below)
            checks.append(self._keyword(keyword, arg, schema))
        if "properties" not in schema and ("required" in schema or "additionalProperties" in schema):
            checks.append(self._object({}, schema))
        return _all(checks)

    def _keyword(self, keyword: str, arg: Any, schema: dict[str, Any]) -> Check:
        if keyword == "$ref":
            return self._ref(arg)
        if keyword == "enum":
            if all(type(option) is str for option in arg):
                options = frozenset(arg)
                return lambda v: type(v) is str and v in options
            return lambda v: any(json_equal(v, option) for option in arg)
        if keyword == "const":
            return lambda v: json_equal(v, arg)
        if keyword == "anyOf":
            branches = [self.compile(branch) for branch in arg]

            def any_of(value: Any) -> bool:
                for branch in branches:
                    if branch(value):
                        return True
                return False

            return any_of
        if keyword == "properties":
            return self._object(arg, schema)
        if keyword == "items":
            item = self.compile(arg)

            def items(value: Any) -> bool:
                if type(value) is not list:
                    return True
                for element in value:
                    if not item(element):
                        return False
                return True

            return items
        if keyword in ("minimum", "maximum"):
            below = keyword == "minimum"
            return lambda v: not _is_number(v) or (v >= arg if below else v <= arg)
        if keyword in ("exclusiveMinimum", "exclusiveMaximum"):
            below = keyword == "exclusiveMinimum"
            return lambda v: not _is_number(v) or (v > arg if below else v < arg)
        if keyword in ("minLength", "maxLength"):
            shortest = keyword == "minLength"
            return lambda v: type(v) is not str or (len(v) >= arg if shortest else len(v) <= arg)
        if keyword in ("minItems", "maxItems"):
            fewest = keyword == "minItems"
            return lambda v: type(v) is not list or (len(v) >= arg if fewest else len(v) <= arg)
        raise Unsupported(keyword)

    def _object(self, properties: dict[str, Any], schema: dict[str, Any]) -> Check:
        fields = {name: self.compile(sub) for name, sub in properties.items()}
        required = tuple(schema.get("required", ()))
        extra = schema.get("additionalProperties", True)
        other = None if extra is True else self.compile(extra)

        def check(value: Any) -> bool:
            if type(value) is not dict:
                return True
            for name in required:
                if name not in value:
                    return False
            for name, item in value.items():
                field = fields.get(name)
                if field is not None:
                    if not field(item):
                        return False
                elif other is not None and not other(item):
                    return False
            return True

        return check

    def _ref(self, ref: str) -> Check:
        found = self._refs.get(ref)
        if found is not None:
            return found
        if not ref.startswith("#/"):
            raise Unsupported(f"$ref {ref!r} outside the document")
        target: Check | None = None
        self._refs[ref] = lambda v: target(v)  # type: ignore[misc]  # a recursive ref sees itself
        node: Any = self.root
        try:
            for step in ref[2:].split("/"):
                node = node[step.replace("~1", "/").replace("~0", "~")]
            target = self.compile(node)
        except BaseException:
            del self._refs[ref]  # not half-compiled for the next caller
            raise
        self._refs[ref] = target
        return target
