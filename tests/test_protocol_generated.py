"""protocol/generated/ (JSON Schema + TypeScript) must match protocol/: run `python3 dev.py gen`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from protocol import METHODS, NOTIFICATIONS, ErrorCode

ROOT = Path(__file__).resolve().parent.parent
GEN_SCRIPT = ROOT / "tools" / "gen_protocol.py"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protocol", GEN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_copies_are_fresh(gen: ModuleType) -> None:
    stale = [str(p.relative_to(ROOT)) for p in gen.stale_files()]
    assert not stale, f"stale generated files {stale}: run `python3 dev.py gen` and commit protocol/generated/"


def test_check_flag_exits_0_when_fresh() -> None:
    done = subprocess.run([sys.executable, str(GEN_SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_check_flag_exits_1_and_names_the_fix_when_stale(
    gen: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    schema, ts = tmp_path / "schema.json", tmp_path / "protocol.d.ts"
    monkeypatch.setattr(gen, "SCHEMA_FILE", schema)
    monkeypatch.setattr(gen, "TS_FILE", ts)
    monkeypatch.setattr(gen, "OUT_DIR", tmp_path)
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    ts.write_text(ts.read_text() + "// edited by hand\n")
    assert gen.main(["--check"]) == 1
    assert "python3 dev.py gen" in capsys.readouterr().err


def test_output_is_deterministic(gen: ModuleType) -> None:
    assert gen.generated() == gen.generated()


def test_schema_covers_every_method_and_every_ref_resolves(gen: ModuleType) -> None:
    schema = gen.build_schema()
    assert set(schema["methods"]) == set(METHODS)
    assert set(schema["notifications"]) == set(NOTIFICATIONS)
    assert schema["errorCodes"] == {c.name: int(c) for c in ErrorCode}
    defs = schema["$defs"]
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert refs
    missing = {r for r in refs if r.removeprefix("#/$defs/") not in defs}
    assert not missing
    event = defs["ChatStreamEvent"]
    assert event["discriminator"]["propertyName"] == "type"
    # Field docstrings from the source become descriptions.
    assert defs["SendResult"]["properties"]["messageId"]["description"].startswith("The assistant message being generated")
    json.dumps(schema)  # plain JSON all the way down


def test_typescript_declares_every_struct_union_and_method(gen: ModuleType) -> None:
    ts = gen.build_ts()
    for cls in gen.all_structs():
        assert f"export interface {cls.__name__} {{" in ts
    for name in gen.exported_aliases():
        assert f"export type {name} = " in ts
    for name in METHODS:
        assert f'  "{name}": {{ params: ' in ts
    assert 'export interface TextDeltaEvent {\n  type: "text_delta";' in ts
    assert "  sessionId: string;" in ts and "session_id" not in ts
    assert "export declare const enum ErrorCode {" in ts and "  NOT_FOUND = -32001," in ts
