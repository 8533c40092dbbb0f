"""The TypeScript rendering of the wire contract: the text of ``protocol/generated/protocol.ts``.

Owns how Python types become TypeScript (``TsRenderer``: Structs as interfaces with
camelCase wire names and the tag as a literal ``type`` field, tagged unions and Literal
aliases as unions, ``<Name>Input`` in params positions), the doc comments, the hand-written
parts (``UNKNOWN_EVENT_TS``, the JSON-RPC envelope ``ENVELOPE_TS``) and the runtime values
(``ErrorCode``, ``PROTOCOL_VERSION``, ``FINAL_EVENT_TYPES``, ``METHOD_NAMES``...).
``render_ts(header)`` is the whole file; tools/gen_protocol.py gives it the header line and
writes it.

What must stay true: a field without ``?`` is always present in what the sidecar sends and
``?`` in params marks what may be left out (the rules in tools/gen_protocol.py's docstring;
what the protocol contains comes from tools/protocol_model.py); the text depends only on
``protocol/`` and the header (sorted, no timestamps, no paths), so it is byte-for-byte
reproducible and compiles under the strictest tsc settings (``COMPILER_OPTIONS`` there).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import msgspec.inspect as mi

from protocol import METHODS, NOTIFICATIONS, PROTOCOL_VERSION, ErrorCode
from protocol_model import (
    alias_docs,
    all_structs,
    always_sent,
    class_doc,
    exported_aliases,
    field_doc,
    final_event_types,
    input_variants,
    required_when,
    sent_by_client,
    sent_by_server,
    source_docs,
)


class TsRenderer:
    """Python types (msgspec.inspect infos) -> TypeScript type expressions.

    ``params=True`` renders a params position: Structs with a lenient form become
    ``<Name>Input``.
    """

    def __init__(self, variants: set[str]) -> None:
        self.variants = variants
        self.aliases = [(name, mi.type_info(value)) for name, value in exported_aliases().items()]
        # Bigger unions first, so ContentPart is recognised inside "ContentPart | null".
        self.union_aliases = sorted(
            ((n, i) for n, i in self.aliases if isinstance(i, mi.UnionType)), key=lambda a: -len(a[1].types)
        )

    def type(self, info: Any, *, params: bool = False) -> str:
        if isinstance(info, mi.Metadata):  # extra JSON Schema (e.g. x-maxDepth) has no TypeScript form
            return self.type(info.type, params=params)
        for name, alias_info in self.aliases:
            if info == alias_info:
                return self.alias_name(name, params=params)
        if isinstance(info, mi.UnionType):
            members = list(info.types)
            parts: list[str] = []
            for name, alias_info in self.union_aliases:
                if all(t in members for t in alias_info.types):
                    members = [t for t in members if t not in alias_info.types]
                    parts.append(self.alias_name(name, params=params))
            parts += [self.type(t, params=params) for t in members if not isinstance(t, mi.NoneType)]
            if any(isinstance(t, mi.NoneType) for t in info.types):
                parts.append("null")
            return " | ".join(dict.fromkeys(parts))  # int | float are both "number"
        return self.member(info, params=params)

    def has_input_form(self, info: Any) -> bool:
        """A union alias with a member that has a lenient params form gets ``<Alias>Input``."""
        return isinstance(info, mi.UnionType) and any(
            isinstance(t, mi.StructType) and t.cls.__name__ in self.variants for t in info.types
        )

    def alias_name(self, name: str, *, params: bool) -> str:
        info = dict(self.aliases)[name]
        return f"{name}Input" if params and self.has_input_form(info) else name

    def alias_body(self, info: Any, *, params: bool = False) -> str:
        """The definition of an alias: its members one by one (no other alias folded in)."""
        if isinstance(info, mi.UnionType):
            return " | ".join(self.member(t, params=params) for t in info.types)
        return self.member(info, params=params)

    def member(self, info: Any, *, params: bool = False) -> str:
        if isinstance(info, mi.StructType):
            name = info.cls.__name__
            return f"{name}Input" if params and name in self.variants else name
        if isinstance(info, mi.LiteralType):
            return " | ".join(json.dumps(v, ensure_ascii=False) for v in info.values)
        if isinstance(info, mi.EnumType):
            if info.cls is ErrorCode:
                return "ErrorCode"
            return " | ".join(json.dumps(m.value) for m in info.cls)
        if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
            inner = self.type(info.item_type, params=params)
            return f"({inner})[]" if " " in inner else f"{inner}[]"
        if isinstance(info, mi.TupleType):
            return "[" + ", ".join(self.type(t, params=params) for t in info.item_types) + "]"
        if isinstance(info, mi.DictType):
            return f"Record<{self.type(info.key_type)}, {self.type(info.value_type, params=params)}>"
        if isinstance(info, mi.UnionType):
            return self.type(info, params=params)
        simple = {
            mi.StrType: "string",
            mi.IntType: "number",
            mi.FloatType: "number",
            mi.BoolType: "boolean",
            mi.NoneType: "null",
            mi.AnyType: "unknown",
            mi.RawType: "unknown",
            mi.BytesType: "string",
            mi.DateTimeType: "string",
        }
        for kind, ts in simple.items():
            if isinstance(info, kind):
                return ts
        raise SystemExit(f"gen_protocol: no TypeScript mapping for {info!r}")


def _comment(doc: str | None, indent: str = "") -> list[str]:
    if not doc:
        return []
    lines = doc.replace("*/", "* /").splitlines()
    if len(lines) == 1:
        return [f"{indent}/** {lines[0]} */"]
    return [f"{indent}/**", *[f"{indent} * {line}".rstrip() for line in lines], f"{indent} */"]


UNKNOWN_EVENT_TS = '''
/**
 * What every ``chat:stream`` event has, whatever its ``type``: the shape to give an event of
 * a type this copy of the contract does not know (a newer sidecar's, see docs/protocol.md:
 * protocolVersion). ChatStreamEvent lists the known ones, so in the ``default`` branch of a
 * ``switch (event.type)`` write ``const other: UnknownStreamEvent = event;`` (no cast: it
 * compiles whether or not the cases cover every known type) and ignore or log ``other.type``.
 */
export interface UnknownStreamEvent {
  type: string;
  sessionId: string;
  messageId: string;
  timestamp: number;
  seq: number;
}
'''

ENVELOPE_TS = '''\
/** A JSON-RPC request id (the generated client uses integers). */
export type RequestId = number | string;
export type MethodParams<M extends MethodName> = Methods[M]["params"];
export type MethodResult<M extends MethodName> = Methods[M]["result"];
/** Notifications the sidecar sends (``chat:stream``, ``chat:session:updated``...). */
export type ServerNotificationName = {
  [N in NotificationName]: Notifications[N]["direction"] extends "server->client" ? N : never;
}[NotificationName];
/** Notifications the client may send (``$/cancelRequest``). */
export type ClientNotificationName = Exclude<NotificationName, ServerNotificationName>;

/** A request: one JSON document on one line of the sidecar's stdin. */
export interface JsonRpcRequest<M extends MethodName = MethodName> {
  jsonrpc: "2.0";
  id: RequestId;
  method: M;
  params?: MethodParams<M>;
}
/** A notification: no id, never answered. */
export interface JsonRpcNotification<N extends NotificationName = NotificationName> {
  jsonrpc: "2.0";
  method: N;
  params: Notifications[N]["params"];
}
/** The error object of a failed request. */
export interface JsonRpcError {
  code: ErrorCode;
  message: string;
  /** Details for some errors (e.g. ``{expected, got}`` of a protocol version mismatch). */
  data?: unknown;
}
export interface JsonRpcSuccess<M extends MethodName = MethodName> {
  jsonrpc: "2.0";
  id: RequestId;
  result: MethodResult<M>;
}
export interface JsonRpcFailure {
  jsonrpc: "2.0";
  /** null when the line could not be read as a request (parse error, invalid request, too large). */
  id: RequestId | null;
  error: JsonRpcError;
}
export type JsonRpcResponse<M extends MethodName = MethodName> = JsonRpcSuccess<M> | JsonRpcFailure;
/** Any request of the contract, discriminated by ``method``. */
export type AnyRequest = { [M in MethodName]: JsonRpcRequest<M> }[MethodName];
/** Any notification the sidecar sends, discriminated by ``method``. */
export type AnyServerNotification = { [N in ServerNotificationName]: JsonRpcNotification<N> }[ServerNotificationName];
/** One line of the sidecar's stdout: a response, a batch of responses, or a notification. */
export type ServerMessage = JsonRpcResponse | JsonRpcResponse[] | AnyServerNotification;
'''


def render_ts(header: str) -> str:
    """The text of protocol.ts, its first line ``// {header}``."""
    variants = input_variants()
    render = TsRenderer(variants)
    docs = source_docs()
    adocs = alias_docs()
    from_client, from_server = sent_by_client(), sent_by_server()
    out: list[str] = [
        f"// {header}",
        "// Fields without `?` are always present in what the sidecar sends; in params, `?` marks",
        "// what may be left out. `<Name>Input` is the params form of a shape the sidecar also sends.",
        "// Compiled to protocol.js (the runtime values: ErrorCode, PROTOCOL_VERSION, FINAL_EVENT_TYPES,",
        "// METHOD_NAMES...) and protocol.d.ts; an app may compile this file itself instead.",
        "",
        "/** The wire contract version this copy was generated for (see docs/protocol.md: protocolVersion). */",
        f"export type ProtocolVersion = {PROTOCOL_VERSION};",
        f"export const PROTOCOL_VERSION: ProtocolVersion = {PROTOCOL_VERSION};",
        "",
    ]
    out += _comment(class_doc(ErrorCode))
    out.append("export const ErrorCode = Object.freeze({")
    for code in ErrorCode:
        out += _comment(docs.get(("ErrorCode", code.name)), "  ")
        out.append(f"  {code.name}: {int(code)},")
    out += [
        "} as const);",
        "/** One of the ErrorCode values. */",
        "export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];",
        "export type ErrorCodeName = keyof typeof ErrorCode;",
        "/** The same union as ErrorCode. */",
        "export type ErrorCodeValue = ErrorCode;",
        "",
    ]

    for name, value in exported_aliases().items():
        out += _comment(adocs.get(name))
        out.append(f"export type {name} = {render.alias_body(mi.type_info(value))};")
        if render.has_input_form(mi.type_info(value)):
            out += _comment(f"{name} as params accept it (members whose defaulted fields may be left out).")
            out.append(f"export type {name}Input = {render.alias_body(mi.type_info(value), params=True)};")
    out.append(UNKNOWN_EVENT_TS)

    def interface(cls: type[msgspec.Struct], *, params: bool) -> list[str]:
        info = mi.type_info(cls)
        name = cls.__name__ + ("Input" if params and cls.__name__ in variants else "")
        if params and cls.__name__ in variants:
            lines = _comment(f"{cls.__name__} as params accept it: fields with a default may be left out.")
        else:
            lines = _comment(class_doc(cls))
        if params and not info.fields and info.tag_field is None:
            return [*lines, f"export type {name} = Record<string, never>;", ""]
        lines.append(f"export interface {name} {{")
        if info.tag_field is not None:
            lines.append(f"  {info.tag_field}: {json.dumps(info.tag)};")
        conditional = required_when(cls) if params else {}
        for field in info.fields:
            lines += _comment(field_doc(docs, cls, field), "  ")
            required = field.required if params else always_sent(cls, field)
            lines.append(f"  {_ts_key(field.encode_name)}{'' if required else '?'}: {render.type(field.type, params=params)};")
        lines += ["}", ""]
        if not conditional:
            return lines
        # ``Name`` requires some fields for some values of another: the interface above is
        # ``NameFields``, and ``Name`` says which values require what
        lines[lines.index(f"export interface {name} {{")] = f"export interface {name}Fields {{"
        by_name = {f.name: f for f in info.fields}
        cases, omitted = [], set()
        for field_name, (discriminant, values) in conditional.items():
            wire, key = by_name[field_name].encode_name, by_name[discriminant].encode_name
            kind = render.type(by_name[discriminant].type, params=True)
            listed = " | ".join(json.dumps(v) for v in values)
            field_type = render.type(by_name[field_name].type, params=True)
            cases.append(f"{{ {key}: {listed}; {wire}: {field_type} }}")
            cases.append(f"{{ {key}: Exclude<{kind}, {listed}>; {wire}?: {field_type} }}")
            omitted |= {wire, key}
        keys = " | ".join(json.dumps(k) for k in sorted(omitted))
        return [*lines, *_comment(class_doc(cls)), f"export type {name} = Omit<{name}Fields, {keys}> & ({' | '.join(cases)});", ""]

    for cls in all_structs():
        name = cls.__name__
        params_only = name in from_client and name not in from_server
        out += interface(cls, params=params_only)
        if name in variants:
            out += interface(cls, params=True)

    def entry_type(typ: Any, *, params: bool) -> str:
        return render.type(mi.type_info(typ), params=params)

    out.append("/** Requests the client sends (params) and what they answer (result). */")
    out.append("export interface Methods {")
    for name, spec in sorted(METHODS.items()):
        out += _comment(spec.doc, "  ")
        out.append(
            f"  {json.dumps(name)}: {{ params: {entry_type(spec.params, params=True)};"
            f" result: {entry_type(spec.result, params=False)} }};"
        )
    out += ["}", "export type MethodName = keyof Methods;", ""]

    out.append("/** Notifications (no reply); ``direction`` says who sends them. */")
    out.append("export interface Notifications {")
    for name, spec in sorted(NOTIFICATIONS.items()):
        out += _comment(spec.doc, "  ")
        from_us = spec.direction == "client->server"
        out.append(
            f"  {json.dumps(name)}: {{ params: {entry_type(spec.params, params=from_us)};"
            f" direction: {json.dumps(spec.direction)} }};"
        )
    out += ["}", "export type NotificationName = keyof Notifications;", ""]
    out.append(ENVELOPE_TS)
    server = sorted(n for n, s in NOTIFICATIONS.items() if s.direction == "server->client")
    out += [
        "/** The ``type`` of each event that ends a message's stream. */",
        'export const FINAL_EVENT_TYPES: readonly FinalEvent["type"][] = Object.freeze('
        f"{json.dumps(final_event_types())} as const);",
        "/** True for the last event of a message (stream_end, error, aborted). */",
        "export function isFinalEvent(event: ChatStreamEvent): event is FinalEvent {",
        "  return (FINAL_EVENT_TYPES as readonly string[]).includes(event.type);",
        "}",
        "/** Every method of the contract (e.g. a preload's allow-list). */",
        f"export const METHOD_NAMES: readonly MethodName[] = Object.freeze({json.dumps(sorted(METHODS))} as const);",
        "/** The notifications the sidecar sends. */",
        "export const SERVER_NOTIFICATIONS: readonly ServerNotificationName[] = Object.freeze("
        f"{json.dumps(server)} as const);",
        "",
    ]
    return "\n".join(out)


def _ts_key(name: str) -> str:
    return name if name.isidentifier() else json.dumps(name)
