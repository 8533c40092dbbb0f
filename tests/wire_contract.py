"""Every line the sidecar sends, checked against the wire contract (protocol/generated/schema.json).

``check_wire_contract(proc)`` runs when a ``spawn_sidecar`` block exits without an
exception (in process and subprocess alike), so every end-to-end test's traffic is
checked: each stdout line must be JSON-RPC 2.0, and
- a notification: a ``server->client`` notification of the contract, its params valid
  against the notification's params schema;
- a response with a result: to a request we sent (by id), the result valid against that
  method's result schema (the hidden ``sidecar:bench:*`` and ``sidecar:test:*`` methods,
  registered only by a flag, are not part of the contract and are not checked);
- a response with an error: its code one of the contract's ``errorCodes``;
- a request: a ``server->client`` method of the contract, its params valid.
A line outside the contract fails the test with the line, the JSON path of the value
and the schema path that refused it. An object of a protocol Struct is closed: a key the
Struct does not declare is outside the contract (``closed_structs``).

``KNOWN_DRIFTS`` lists the drifts that are known and not fixed yet, each with its reason:
they do not fail the test that shows them, they are listed at the end of the run
(tests/conftest.py), and tests/test_wire_contract.py keeps one strict expected failure
for each, which passes (and so fails) once the contract or the sidecar is fixed.

Each (method, part) is compiled once per process: tests/schema_fast.py answers "valid"
quickly; what it refuses is explained by ``jsonschema`` (draft 2020-12, on one
``referencing`` registry), which must agree.
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

import schema_fast

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "protocol" / "generated" / "schema.json"
SCHEMA_URI = "urn:chat-sidecar:protocol"
UNCHECKED_PREFIXES = ("sidecar:bench:", "sidecar:test:")
"""Methods outside the contract on purpose, registered only by a flag (``--bench``, a test clock)."""


@dataclass(frozen=True)
class KnownDrift:
    where: str
    """``notification chat:stream params`` / ``result of chat:send`` ... as in Drift.where."""
    json_path: str
    value: Any
    reason: str


KNOWN_DRIFTS: tuple[KnownDrift, ...] = ()
"""Drifts not fixed yet; each has a strict xfail in tests/test_wire_contract.py."""

SEEN_KNOWN: list[tuple[KnownDrift, str]] = []
"""(known drift, line) seen in this process: tests/conftest.py lists them at the end of the run."""


@dataclass(frozen=True)
class Drift:
    index: int
    """Of the stdout line (``proc.lines[index]``)."""
    line: bytes
    where: str
    json_path: str
    value: Any
    problem: str
    schema_path: str

    def describe(self) -> str:
        return (
            f"stdout line {self.index} is outside the wire contract: {self.where} at {self.json_path}: "
            f"{self.problem}\n    schema path: {self.schema_path}\n    line: {self.line[:600]!r}"
        )

    def known(self) -> KnownDrift | None:
        for known in KNOWN_DRIFTS:
            if (known.where, known.json_path, known.value) == (self.where, self.json_path, self.value):
                return known
        return None


class Contract:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = schema["$defs"]
        self.methods: dict[str, Any] = schema["methods"]
        self.notifications: dict[str, Any] = schema["notifications"]
        self.error_codes = frozenset(schema["errorCodes"].values())
        resource = referencing.Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT202012)
        self.registry: referencing.Registry[Any] = referencing.Registry().with_resource(SCHEMA_URI, resource)
        self._validators: dict[tuple[str, str, str], jsonschema.protocols.Validator] = {}
        self.compiler = schema_fast.Compiler(schema)
        self._fast: dict[tuple[str, str, str], schema_fast.Check | None] = {}

    def validator(self, table: str, name: str, part: str) -> tuple[jsonschema.protocols.Validator, str]:
        """The validator of ``schema[table][name][part]`` and where that part points."""
        key = (table, name, part)
        target = getattr(self, table)[name][part]
        validator = self._validators.get(key)
        if validator is None:
            pointer = "/".join(step.replace("~", "~0").replace("/", "~1") for step in key)
            schema = {"$ref": f"{SCHEMA_URI}#/{urllib.parse.quote(pointer, safe='/~')}"}
            validator = jsonschema.Draft202012Validator(schema, registry=self.registry)
            self._validators[key] = validator
        return validator, target.get("$ref", f"{table}[{name!r}].{part}")

    def resolve(self, ref: str) -> Any:
        """The subschema at ``#/$defs/Name``."""
        return self.defs[ref.removeprefix("#/$defs/")]

    def fast(self, table: str, name: str, part: str) -> schema_fast.Check | None:
        """The compiled check of that part, None when it uses what schema_fast lacks."""
        key = (table, name, part)
        if key not in self._fast:
            try:
                self._fast[key] = self.compiler.compile(getattr(self, table)[name][part])
            except schema_fast.Unsupported:
                self._fast[key] = None
        return self._fast[key]

    def check(self, value: Any, table: str, name: str, part: str) -> Iterator[tuple[str, Any, str, str]]:
        """(json path, value, problem, schema path) of what in ``value`` the schema refuses."""
        fast = self.fast(table, name, part)
        if fast is not None and fast(value):
            return
        validator, root = self.validator(table, name, part)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None and fast is not None:
            raise AssertionError(f"tests/schema_fast.py refuses what jsonschema accepts ({table} {name} {part}): {value!r}"[:2000])
        if error is not None:
            error = _in_tagged_branch(error)
            yield error.json_path, error.instance, error.message[:500], _schema_path(error, root)


def _in_tagged_branch(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For a union (anyOf/oneOf) of tagged Structs, the error inside the one branch whose
    tag (``type``) matched, where the real problem is; the error itself otherwise."""
    while error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[jsonschema.ValidationError]] = {}
        for inner in error.context:
            branches.setdefault(inner.relative_schema_path[0], []).append(inner)
        tagged = [
            errors for errors in branches.values()
            if not any(e.validator in ("const", "enum") and list(e.relative_path) == ["type"] for e in errors)
        ]
        if len(tagged) != 1:
            break
        best = jsonschema.exceptions.best_match(tagged[0])
        if best is None:
            break
        error = best
    return error


def _schema_path(error: jsonschema.ValidationError, root: str) -> str:
    """Where in schema.json the refusing keyword is: the innermost ``$defs`` entry the
    path went through (a union's branch), then the keywords inside it."""
    chain = [error]
    while chain[-1].parent is not None:
        chain.append(chain[-1].parent)  # type: ignore[arg-type]
    chain.reverse()
    where, steps = root, [str(step) for step in chain[0].relative_schema_path]
    for parent, child in zip(chain, chain[1:]):
        branch = child.relative_schema_path[0]
        subschemas = parent.schema.get(parent.validator) if isinstance(parent.schema, dict) else None
        chosen = subschemas[branch] if isinstance(subschemas, list) else None
        if isinstance(chosen, dict) and isinstance(chosen.get("$ref"), str):
            where, steps = chosen["$ref"], [str(step) for step in list(child.relative_schema_path)[1:]]
        else:
            steps += [str(step) for step in child.relative_schema_path]
    return f"{where} -> {'/'.join(steps)}" if steps else where


@functools.cache
def contract() -> Contract:
    return Contract(closed_structs(json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))))


def closed_structs(schema: Any) -> Any:
    """``schema`` with every object that lists its ``properties`` (a protocol Struct) closed
    to others, unless it says otherwise: msgspec encodes a Struct's fields and nothing else,
    so a key outside them was sent by something that is not the contract's type (a dict in
    its place) and no client type knows it. Free-form values (``dict[str, Any]``) list no
    properties and stay open."""
    if isinstance(schema, list):
        return [closed_structs(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: closed_structs(value) for key, value in schema.items()}
    if closed.get("type") == "object" and "properties" in closed and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


def drifts(sent: Sequence[bytes], lines: Sequence[bytes], messages: Sequence[Any]) -> list[Drift]:
    """What in ``lines`` (stdout, ``messages`` parsed) falls outside the contract, given
    the lines ``sent`` to the sidecar (to know which method each response answers)."""
    from sidecar_proc import jsonrpc_problem

    spec = contract()
    asked = _requests_by_id(sent)
    found: list[Drift] = []
    for index, (line, message) in enumerate(zip(lines, messages, strict=True)):

        def drift(where: str, json_path: str, value: Any, problem: str, schema_path: str) -> None:
            found.append(Drift(index, line, where, json_path, value, problem, schema_path))

        if isinstance(message, (dict, list)):
            problem = jsonrpc_problem(message)
        else:
            problem = "not a JSON object or array"
        if problem:
            drift("the JSON-RPC envelope", "$", None, problem, "JSON-RPC 2.0")
            continue
        for item in message if isinstance(message, list) else [message]:
            for where, (json_path, value, problem_text, schema_path) in _item_problems(spec, item, asked):
                drift(where, json_path, value, problem_text, schema_path)
    return found


Problem = tuple[str, Any, str, str]
"""(json path, value, problem, schema path)."""


def _item_problems(
    spec: Contract, item: dict[str, Any], asked: dict[tuple[type, Any], set[str]]
) -> Iterator[tuple[str, Problem]]:
    """(where, problem) for what the contract refuses in one message."""
    method = item.get("method")
    if method is not None:
        table = "methods" if "id" in item else "notifications"
        kind = "request" if table == "methods" else "notification"
        entry = getattr(spec, table).get(method)
        if entry is None or entry.get("direction") != "server->client":
            yield f"{kind} {method}", ("$.method", method, f"not a server->client {kind} of the contract", table)
            return
        for problem in spec.check(item.get("params"), table, method, "params"):
            yield f"{kind} {method} params", problem
        return
    if "error" in item:
        code = item["error"].get("code")
        if code not in spec.error_codes:
            yield "error response", ("$.error.code", code, "not one of the contract's error codes", "errorCodes")
        return
    methods = asked.get((type(item["id"]), item["id"]), set())
    if not methods:
        yield "response", ("$.id", item["id"], "a result for an id that was never asked", "methods")
        return
    checked = sorted(m for m in methods if not m.startswith(UNCHECKED_PREFIXES))
    # One id reused for several methods: the result answers one of them, and it is valid if
    # it fits any of those of the contract (a method outside it can only be refused).
    known = [name for name in checked if name in spec.methods]
    if checked and not known:
        yield "response", ("$.id", item["id"], f"a result for {checked[0]!r}, not a method of the contract", "methods")
        return
    found = [list(spec.check(item["result"], "methods", name, "result")) for name in known]
    if found and all(found):
        for problem in found[0]:
            yield f"result of {known[0]}", problem


def _requests_by_id(sent: Sequence[bytes]) -> dict[tuple[type, Any], set[str]]:
    asked: dict[tuple[type, Any], set[str]] = {}
    for line in sent:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # what the sidecar answers with a null id
            continue
        for item in message if isinstance(message, list) else [message]:
            if isinstance(item, dict) and isinstance(item.get("method"), str) and "id" in item:
                try:
                    asked.setdefault((type(item["id"]), item["id"]), set()).add(item["method"])
                except TypeError:  # an unhashable id (a test of bad input): no answer to check
                    continue
    return asked


def check_wire_contract(proc: Any) -> None:
    """Fail (AssertionError) when a line ``proc`` received is outside the contract; known
    drifts are recorded in SEEN_KNOWN instead."""
    found = drifts(bytes(proc.sent).split(b"\n"), proc.lines, proc.messages)
    if not found:
        return
    unknown = []
    for drift in found:
        known = drift.known()
        if known is None:
            unknown.append(drift)
        else:
            SEEN_KNOWN.append((known, drift.line[:300].decode("utf-8", "replace")))
    if unknown:
        shown = "\n".join(d.describe() for d in unknown[:5])
        more = f"\n(and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise AssertionError(f"the sidecar sent {len(unknown)} line(s) outside the wire contract:\n{shown}{more}")

