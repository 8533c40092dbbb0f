#!/usr/bin/env python3
"""Generate the Electron side's copies of the wire contract from ``protocol/``.

    python3 dev.py gen                      write protocol/generated/ (installs the pinned tsc first)
    python3 tools/gen_protocol.py --check   exit 1 if the committed copies are stale

What lands in ``protocol/generated/`` (a small ES-module package, ``package.json``):

``schema.json``: JSON Schema (2020-12) with one ``$defs`` entry per Struct and per named
union/literal alias, a ``methods`` section (each method -> params and result schema), a
``notifications`` section and the ``errorCodes`` table.

``protocol.ts`` (compiled to ``protocol.d.ts`` + ``protocol.js``): an interface per Struct (camelCase wire names, the tag
as a literal ``type`` field), the tagged unions and Literal aliases as TypeScript unions,
``Methods`` / ``Notifications`` maps, the JSON-RPC envelope types, and the runtime values
(``ErrorCode`` as a frozen object plus a union type of the same name, ``PROTOCOL_VERSION``,
``FINAL_EVENT_TYPES``, ``METHOD_NAMES``, ``isFinalEvent``). A const enum would not do:
a .d.ts has no runtime values, and const enums from declarations break under
``isolatedModules`` / ``verbatimModuleSyntax`` (esbuild, Vite, swc).

Required vs optional (``?``) says what really is on the wire:
- in what the sidecar sends, a field is required when msgspec always writes it, which is
  every field (protocol's base Struct has ``omit_defaults=False``; a test checks that each
  Struct the sidecar sends writes them all) except one whose default is ``msgspec.UNSET``;
- in params, ``?`` marks what may be left out (the field has a default). A stored shape
  that is also sent as params (``chat:session:import``, ``assistant:upsert``) gets a second,
  lenient interface ``<Name>Input`` used in the params positions;
- a params Struct without fields is ``Record<string, never>`` (``{}`` would accept ``42``);
- an update field whose default is ``msgspec.UNSET`` (it may be left out, and ``null`` is a
  value of its own) is optional and ``| null``, and its comment says what each means:
  "absent: keep; null: clear" (also in the JSON Schema's description).

``client.ts`` + ``streams.ts`` + ``errors.ts``: the main-process client, its per-message
event streams and its error type, copied from ``tools/electron/src/`` (their source). Every
``.ts`` here is compiled to ``.js`` and ``.d.ts`` by the TypeScript compiler pinned in
``tools/electron/package-lock.json`` (``npm ci --prefix tools/electron``), so the folder
works imported as is and compiled by an app's own ``tsc`` (``protocol.ts`` holds the
runtime values as real code, not declarations). ``package.json``'s version is the
sidecar's (``sidecar/__init__.py``).

This module is the entry point and owns the JSON Schema, ``package.json``, the copies of
the client sources, their compilation (and its cache) and the ``--check`` command line;
what the protocol contains is tools/protocol_model.py's, the text of ``protocol.ts``
tools/protocol_ts.py's. Tests load this file by path and use the names in ``__all__``
(some of them re-exported from those two modules).

What must stay true: the output depends only on ``protocol/``, ``tools/electron/src/``,
the sidecar's version string and the pinned compiler (sorted, no timestamps, no paths), so it is byte-for-byte reproducible
and tests compare it with the committed copies.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
# the protocol package, and this file's sibling modules when it is loaded by file path
for _path in (ROOT, TOOLS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import msgspec  # noqa: E402
import msgspec.inspect as mi  # noqa: E402

from protocol import METHODS, NOTIFICATIONS, PROTOCOL_VERSION, ErrorCode  # noqa: E402
from protocol_model import (  # noqa: E402
    all_structs,
    exported_aliases,
    field_doc,
    method_types,
    required_when,
    sent_by_server,
    source_docs,
    unset_default,
)
from protocol_ts import render_ts  # noqa: E402

__all__ = [
    "OUT_DIR",
    "SCHEMA_FILE",
    "TS_FILE",
    "PACKAGE_FILE",
    "HEADER",
    "all_structs",
    "exported_aliases",
    "required_when",
    "sent_by_server",
    "unset_default",
    "build_schema",
    "build_ts",
    "build_package",
    "generated",
    "compiled",
    "stale_files",
    "main",
]

OUT_DIR = ROOT / "protocol" / "generated"
SCHEMA_FILE = OUT_DIR / "schema.json"
TS_FILE = OUT_DIR / "protocol.ts"
PACKAGE_FILE = OUT_DIR / "package.json"
NODE_TOOLS = ROOT / "tools" / "electron"
TS_SOURCES = NODE_TOOLS / "src"
CLIENT_SOURCES = ("errors.ts", "streams.ts", "connection.ts", "client.ts")
"""Copied into OUT_DIR; they and protocol.ts are compiled there (each to .js and .d.ts)."""
COMPILED = ("protocol.ts", *CLIENT_SOURCES)
TSC = NODE_TOOLS / "node_modules" / "typescript" / "bin" / "tsc"
HEADER = "Generated by tools/gen_protocol.py from protocol/ - do not edit; run `python3 dev.py gen`."
COMPILER_OPTIONS: dict[str, Any] = {
    "strict": True,
    "isolatedModules": True,
    "verbatimModuleSyntax": True,
    "module": "nodenext",
    "moduleResolution": "nodenext",
    "target": "es2022",
    "lib": ["es2022"],
    "types": ["node"],
    "declaration": True,
    "newLine": "lf",
    "skipLibCheck": False,
    "noUnusedLocals": True,
    "noImplicitOverride": True,
    "exactOptionalPropertyTypes": True,
}
"""How client.ts and errors.ts are compiled (the strictest settings an app may use)."""


# ---- JSON Schema ----------------------------------------------------------------------


def build_schema() -> dict[str, Any]:
    structs = all_structs()
    aliases = exported_aliases()
    docs = source_docs()
    method_list = list(method_types())
    roots: list[Any] = [*structs, *aliases.values(), *method_list]
    schemas, components = msgspec.json.schema_components(roots, ref_template="#/$defs/{name}")
    by_root = dict(enumerate(schemas))

    for cls in structs:
        component = components.get(cls.__name__)
        if component is None:
            continue
        conditions = []
        for field_name, (discriminant, values) in required_when(cls).items():
            names = {f.name: f.encode_name for f in mi.type_info(cls).fields}
            conditions.append({
                "if": {"properties": {names[discriminant]: {"enum": list(values)}}, "required": [names[discriminant]]},
                "then": {"required": [names[field_name]]},
            })
        if conditions:
            component["allOf"] = conditions
        for field in mi.type_info(cls).fields:
            doc = field_doc(docs, cls, field)
            prop = component.get("properties", {}).get(field.encode_name)
            if doc and prop is not None and "description" not in prop:
                prop["description"] = doc

    defs = dict(components)
    alias_start = len(structs)
    alias_refs: dict[int, str] = {}
    for offset, (name, value) in enumerate(aliases.items()):
        if name in defs:
            raise SystemExit(f"alias {name} collides with a Struct name")
        defs[name] = by_root[alias_start + offset]
        alias_refs[id(value)] = name

    def ref_or_schema(typ: Any, index: int) -> Any:
        if id(typ) in alias_refs:
            return {"$ref": f"#/$defs/{alias_refs[id(typ)]}"}
        return by_root[index]

    method_start = alias_start + len(aliases)
    index = method_start
    methods: dict[str, Any] = {}
    notifications: dict[str, Any] = {}
    for table, out in ((METHODS, methods), (NOTIFICATIONS, notifications)):
        for name, spec in table.items():
            entry: dict[str, Any] = {"description": spec.doc, "direction": spec.direction}
            entry["params"] = ref_or_schema(spec.params, index)
            index += 1
            if spec.result is not None:
                entry["result"] = ref_or_schema(spec.result, index)
                index += 1
            out[name] = entry

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "chat-sidecar protocol",
        "description": HEADER,
        "protocolVersion": PROTOCOL_VERSION,
        "methods": dict(sorted(methods.items())),
        "notifications": dict(sorted(notifications.items())),
        "errorCodes": {code.name: int(code) for code in ErrorCode},
        "$defs": dict(sorted(defs.items())),
    }


# ---- protocol.ts and package.json -------------------------------------------------------


def build_ts() -> str:
    """The text of protocol.ts (tools/protocol_ts.py), under this generator's header."""
    return render_ts(HEADER)


def build_package() -> str:
    package = {
        "name": "chat-sidecar-client",
        "version": sidecar_version(),
        "description": "Generated TypeScript client and types of the chat-sidecar wire contract. " + HEADER,
        "private": True,
        "license": "MIT",
        "type": "module",
        "main": "./client.js",
        "types": "./client.d.ts",
        "exports": {
            ".": {"types": "./client.d.ts", "default": "./client.js"},
            "./errors": {"types": "./errors.d.ts", "default": "./errors.js"},
            "./protocol": {"types": "./protocol.d.ts", "default": "./protocol.js"},
            "./schema.json": "./schema.json",
        },
        "sideEffects": False,
        "engines": {"node": ">=18"},
    }
    return json.dumps(package, indent=2) + "\n"


def sidecar_version() -> str:
    """The version the sidecar reports (``sidecar.__version__``), read without importing it."""
    tree = ast.parse((ROOT / "sidecar" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    raise SystemExit("gen_protocol: sidecar/__init__.py has no __version__ string")


# ---- the client sources and their compiled form ------------------------------------------


def client_sources() -> dict[str, str]:
    out = {}
    for name in CLIENT_SOURCES:
        text = (TS_SOURCES / name).read_text(encoding="utf-8")
        out[name] = f"// {HEADER}\n// Source: tools/electron/src/{name}\n{text}"
    return out


def tsc_available() -> bool:
    return TSC.exists() and shutil.which("node") is not None


COMPILE_CACHE_ENV = "GEN_PROTOCOL_COMPILE_CACHE"
"""A directory (set by tests/conftest.py for one test run): ``compile_client`` keeps its output
there by a hash of everything it depends on (the sources, the options, the compiler's
version), so the several tests that check the compiled client compile it once per run."""


def _compile_key(texts: dict[str, str], options: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    compiler = NODE_TOOLS / "node_modules" / "typescript" / "package.json"
    for part in (json.dumps([sorted(texts.items()), options, list(COMPILED), HEADER], sort_keys=True),
                 compiler.read_text(encoding="utf-8")):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def compile_client(texts: dict[str, str]) -> dict[str, str]:
    """Compile client.ts/errors.ts next to protocol.d.ts in a scratch dir; name -> text of
    every .js and .d.ts produced. Raises SystemExit when the compiler fails."""
    if not tsc_available():
        raise SystemExit(
            "gen_protocol: the TypeScript compiler is not installed: run `python3 dev.py gen`"
            " (or `npm ci --prefix tools/electron`); node and npm must be on PATH"
        )
    cache = os.environ.get(COMPILE_CACHE_ENV)
    if not cache:
        return _compile(texts)
    options = {**COMPILER_OPTIONS, "typeRoots": [str(NODE_TOOLS / "node_modules" / "@types")]}
    kept = Path(cache) / f"{_compile_key(texts, options)}.json"
    try:
        return dict(json.loads(kept.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    produced = _compile(texts)
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(produced), encoding="utf-8")
    os.replace(partial, kept)  # whole or absent, whoever reads it meanwhile
    return produced


def _compile(texts: dict[str, str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="gen-protocol-") as tmp:
        work = Path(tmp)
        for name, text in texts.items():
            (work / name).write_text(text, encoding="utf-8", newline="\n")
        options = {**COMPILER_OPTIONS, "typeRoots": [str(NODE_TOOLS / "node_modules" / "@types")]}
        config = {"compilerOptions": options, "files": list(COMPILED)}
        (work / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
        done = subprocess.run(
            ["node", str(TSC), "-p", str(work / "tsconfig.json")],
            capture_output=True, text=True, timeout=300, cwd=work,
        )
        if done.returncode != 0:
            raise SystemExit(f"gen_protocol: tsc failed on the client sources:\n{done.stdout}{done.stderr}")
        produced = {}
        for source in COMPILED:
            stem = source.removesuffix(".ts")
            for name in (f"{stem}.js", f"{stem}.d.ts"):
                text = (work / name).read_text(encoding="utf-8")
                header = f"// {HEADER}\n"
                produced[name] = text if text.startswith(header) else header + text  # tsc drops it from .d.ts
        return produced


# ---- entry point -------------------------------------------------------------------------


def generated() -> dict[Path, str]:
    """The files made here in Python (no compiler needed)."""
    schema = json.dumps(build_schema(), indent=2, ensure_ascii=False) + "\n"
    files = {SCHEMA_FILE: schema, TS_FILE: build_ts(), PACKAGE_FILE: build_package()}
    for name, text in client_sources().items():
        files[OUT_DIR / name] = text
    return files


def compiled(files: dict[Path, str]) -> dict[Path, str]:
    """The compiler's output for ``files`` (the result of ``generated()``)."""
    texts = {path.name: text for path, text in files.items() if path.suffix in (".ts", ".js", ".json")}
    return {OUT_DIR / name: text for name, text in compile_client(texts).items()}


def everything() -> dict[Path, str]:
    files = generated()
    return {**files, **compiled(files)}


def _stale(files: dict[Path, str]) -> list[Path]:
    return [
        path for path, text in files.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def stale_files() -> list[Path]:
    """Generated files that differ from what protocol/ gives (compiled ones too when tsc is installed)."""
    return _stale(everything() if tsc_available() else generated())


def _show(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files are stale")
    parser.add_argument(
        "--no-compile", action="store_true", help="leave client.js/.d.ts alone (no TypeScript compiler needed)"
    )
    args = parser.parse_args(argv)
    compile_too = not args.no_compile and (tsc_available() or not args.check)
    files = everything() if compile_too else generated()
    if args.check:
        stale = _stale(files)
        for path in stale:
            print(f"{_show(path)} is stale: run `python3 dev.py gen`", file=sys.stderr)
        if not compile_too:
            print("gen_protocol: tsc not installed, compiled client files not checked", file=sys.stderr)
        return 1 if stale else 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for path in _stale(files):
        path.write_text(files[path], encoding="utf-8", newline="\n")
        print(f"wrote {_show(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
