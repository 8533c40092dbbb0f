"""protocol/generated/ (JSON Schema, TypeScript types and client) must match protocol/: run
`python3 dev.py gen`; and the types must say what the wire really carries."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import msgspec.inspect as mi
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
    monkeypatch.setattr(gen, "OUT_DIR", tmp_path)
    for name, attr in (("schema.json", "SCHEMA_FILE"), ("protocol.ts", "TS_FILE"), ("package.json", "PACKAGE_FILE")):
        monkeypatch.setattr(gen, attr, tmp_path / name)
    assert gen.main(["--no-compile"]) == 0 and gen.main(["--check", "--no-compile"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "schema.json", "protocol.ts", "package.json", "client.ts", "connection.ts", "errors.ts", "streams.ts"
    }
    for name in ("protocol.ts", "client.ts"):
        path = tmp_path / name
        original = path.read_text()
        path.write_text(original + "// edited by hand\n")
        assert gen.main(["--check", "--no-compile"]) == 1
        assert "python3 dev.py gen" in capsys.readouterr().err
        path.write_text(original)


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
        if cls.__name__ == "EmptyParams":
            continue
        if gen.required_when(cls):  # the interface of its fields, and a type saying what requires what
            assert f"export interface {cls.__name__}Fields {{" in ts and f"export type {cls.__name__} = " in ts
            continue
        assert f"export interface {cls.__name__} {{" in ts
    for name in gen.exported_aliases():
        assert f"export type {name} = " in ts
    for name in METHODS:
        assert f'  "{name}": {{ params: ' in ts
    assert 'export interface TextDeltaEvent {\n  type: "text_delta";' in ts
    assert "  sessionId: string;" in ts and "session_id" not in ts


# ---- the types tell the truth about the wire --------------------------------------------


def ts_fields(ts: str, interface: str) -> dict[str, tuple[bool, str]]:
    """Field name -> (required, type) of ``export interface <interface>`` in the .d.ts text."""
    match = re.search(rf"^export interface {interface} {{\n(.*?)^}}", ts, flags=re.MULTILINE | re.DOTALL)
    assert match, f"no interface {interface}"
    fields = {}
    for line in match.group(1).splitlines():
        field = re.match(r"^  (\w+)(\??): (.*);$", line)
        if field:
            fields[field.group(1)] = (field.group(2) == "", field.group(3))
    return fields


def minimal(info: Any) -> Any:
    """A valid value of a msgspec type: required fields only, defaults everywhere else."""
    if isinstance(info, mi.Metadata):  # a bounded type (protocol/limits.py)
        return minimal(info.type)
    if isinstance(info, mi.StructType):
        value = {f.encode_name: minimal(f.type) for f in info.fields if f.required}
        if info.tag_field is not None:
            value[info.tag_field] = info.tag
        return value
    if isinstance(info, mi.UnionType):
        return minimal(next(t for t in info.types if not isinstance(t, mi.NoneType)))
    if isinstance(info, mi.LiteralType):
        return info.values[0]
    if isinstance(info, mi.EnumType):
        return next(iter(info.cls)).value
    if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        return []
    if isinstance(info, mi.DictType):
        return {}
    if isinstance(info, mi.IntType):  # the smallest value its bounds allow (0 when they do)
        low = info.ge if info.ge is not None else (info.gt + 1 if info.gt is not None else None)
        return 0 if low is None or low <= 0 else low
    simple = {mi.StrType: "x", mi.FloatType: 0.0, mi.BoolType: False, mi.NoneType: None}
    for kind, value in simple.items():
        if isinstance(info, kind):
            return value
    return None


def test_what_the_sidecar_sends_is_required_exactly_when_msgspec_writes_it(gen: ModuleType) -> None:
    """For every Struct in results and server notifications: encode one built from its
    required fields only (every other field at its default) and compare the keys msgspec
    writes with the fields the .d.ts marks required."""
    ts = gen.build_ts()
    server_side = gen.sent_by_server()
    checked = 0
    for cls in gen.all_structs():
        if cls.__name__ not in server_side:
            continue
        value = msgspec.convert(minimal(mi.type_info(cls)), cls)
        written = set(json.loads(msgspec.json.encode(value)))
        fields = ts_fields(ts, cls.__name__)
        required = {name for name, (req, _) in fields.items() if req}
        if mi.type_info(cls).tag_field is not None:
            required.add(mi.type_info(cls).tag_field)
        assert written == required, cls.__name__
        # and msgspec writes every field (no omitted defaults in what the sidecar sends)
        unset = {f.encode_name for f in mi.type_info(cls).fields if gen.unset_default(f)}
        assert written == set(fields) - unset | required, cls.__name__
        checked += 1
    assert checked >= 30
    # fields that hold a default are required in what the sidecar sends
    assert ts_fields(ts, "ModelConfig")["supportsTools"] == (True, "boolean")
    assert ts_fields(ts, "StreamStartEvent")["parentId"] == (True, "string | null")
    assert ts_fields(ts, "ErrorEvent")["code"] == (True, "ErrorCode | null")
    session = ts_fields(ts, "SessionV2")
    assert session["title"] == (True, "string") and session["tags"] == (True, "string[]")
    assert session["summary"] == (True, "string | null")
    assert ts_fields(ts, "MessageTreeNode")["children"] == (True, "MessageTreeNode[]")
    assert ts_fields(ts, "SuccessResult")["success"] == (True, "boolean")
    # a factory default msgspec cannot compare is always written
    assert ts_fields(ts, "ToolApprovalRequiredEvent")["decisions"] == (True, "ToolDecision[]")


def test_params_mark_what_may_be_left_out_and_have_lenient_forms_of_stored_shapes(gen: ModuleType) -> None:
    ts = gen.build_ts()
    # baseUrl may be left out only by an acp-engine provider (the schema says it too)
    assert ('export type ProviderUpsertParams = Omit<ProviderUpsertParamsFields, "baseUrl" | "type"> & '
            '({ type: "openai-compat" | "anthropic" | "ollama"; baseUrl: string } | '
            '{ type: Exclude<ProviderKind, "openai-compat" | "anthropic" | "ollama">; baseUrl?: string });') in ts
    upsert = gen.build_schema()["$defs"]["ProviderUpsertParams"]
    assert upsert["allOf"] == [{"if": {"properties": {"type": {"enum": ["openai-compat", "anthropic", "ollama"]}},
                                       "required": ["type"]}, "then": {"required": ["baseUrl"]}}]
    assert ts_fields(ts, "SessionFilter")["limit"] == (False, "number")
    assert ts_fields(ts, "SendParams")["input"] == (True, "UserInput")
    # chat:session:import takes a SessionV2 whose defaulted fields may be missing
    assert ts_fields(ts, "SessionImportParams")["session"] == (True, "SessionV2Input")
    assert ts_fields(ts, "SessionV2Input")["title"] == (False, "string")
    assert ts_fields(ts, "SessionV2Input")["id"] == (True, "string")
    assert ts_fields(ts, "AssistantUpsertParams")["transformers"] == (False, "TransformerOptionsInput")
    assert "export type EmptyParams = Record<string, never>;" in ts
    assert '"provider:list": { params: EmptyParams;' in ts


def test_error_codes_are_a_runtime_object_and_a_union_type(gen: ModuleType) -> None:
    ts = gen.build_ts()
    assert "const enum" not in ts
    assert "export const ErrorCode = Object.freeze({" in ts
    assert "export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];" in ts
    for code in ErrorCode:
        assert f"  {code.name}: {int(code)}," in ts
    assert ts_fields(ts, "ErrorEvent")["code"] == (True, "ErrorCode | null")
    assert "code: ErrorCode;" in ts  # JsonRpcError


def test_enumerated_fields_are_literal_unions(gen: ModuleType) -> None:
    ts = gen.build_ts()
    assert ts_fields(ts, "ToolInfo")["source"] == (True, "ToolSource")
    assert ts_fields(ts, "ToolAuditEntry")["decision"] == (True, "AuditDecision")
    assert ts_fields(ts, "ToolAuditEntry")["actor"] == (True, "AuditActor")
    assert ts_fields(ts, "ToolAuditEntry")["source"] == (True, "ApprovalSource")
    assert ts_fields(ts, "PendingToolCall")["source"] == (True, "ApprovalSource")
    assert ts_fields(ts, "ToolApproveParams")["decision"] == (True, "ToolDecision")
    assert ts_fields(ts, "ToolApprovalRequiredEvent")["source"] == (True, "ApprovalSource")
    assert ts_fields(ts, "NoticeEvent")["code"] == (True, "NoticeCode | null")
    assert 'export type AuditDecision = "answered" | "approved" | "cancelled" | "denied" | "policy:auto"' in ts


def test_user_input_takes_input_parts_and_final_events_have_a_union(gen: ModuleType) -> None:
    ts = gen.build_ts()
    assert ts_fields(ts, "UserInput")["content"] == (True, "string | InputPartInput[]")
    assert "export type InputPart = TextPart | ImagePart | FilePart;" in ts
    assert "export type InputPartInput = TextPart | ImagePartInput | FilePartInput;" in ts
    assert "export type FinalEvent = StreamEndEvent | ErrorEvent | AbortedEvent;" in ts
    assert 'Object.freeze(["stream_end", "error", "aborted"] as const);' in ts
    assert ts_fields(ts, "UnknownStreamEvent")["type"] == (True, "string")
    for envelope in ("JsonRpcRequest", "JsonRpcNotification", "JsonRpcSuccess", "JsonRpcFailure", "JsonRpcError"):
        assert f"export interface {envelope}" in ts
    assert "export type ServerMessage = " in ts


def test_the_generated_package_is_an_es_module_with_every_entry(gen: ModuleType) -> None:
    package = json.loads(gen.build_package())
    assert package["type"] == "module" and "dependencies" not in package
    for entry in package["exports"].values():
        targets = [entry] if isinstance(entry, str) else list(entry.values())
        for target in targets:
            assert (gen.OUT_DIR / target).exists(), target
