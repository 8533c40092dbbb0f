"""What one input line holds: a message, a batch of messages, or the error it is answered with.

The one place where a peer's input text becomes classified JSON-RPC messages
(sidecar.rpc.peer routes them). ``parse_line`` applies these rules, in order:

- an empty line is nothing;
- bytes that are not UTF-8: -32700, ``id: null`` (msgspec leaves ``Raw`` params unchecked
  until a handler decodes them, so the encoding is checked here, for the whole line);
- an object is one message (``messages.classify``); an array is a batch of at most
  ``protocol.limits.MAX_BATCH_ITEMS`` items: one more is -32600 with ``id: null``, found
  without reading the rest of the line (a 10 MB line of five million tiny items must not
  become five million replies); ``[]`` is -32600; any other JSON value is -32600;
- text nested deeper than ``ENVELOPE_DEPTH`` levels: -32700 with the id its first KiB
  shows (``Unreadable``: the peer settles the caller's request, or fails ours for a
  response; a batch that deep is one -32700 with ``id: null``). Up to that depth a message,
  alone or in a batch, is read whatever the depth of the caller's stack (``_with_room``),
  so deep ``params`` reach their handler, whose decoding names the field
  (sidecar/rpc/dispatch.py);
- text that is not JSON: -32700, ``id: null`` (nothing of it can be read);
- a lone UTF-16 surrogate escape (``"\\ud800"``, see sidecar.rpc.surrogates): the JSON is
  well-formed, so it is never -32700; the message is read with the surrogate masked and
  refused with its id: in ``params`` -32602 naming the field, in ``method`` or ``jsonrpc``
  -32600; in the ``id`` itself -32600 with ``id: null`` (an id that is not Unicode text
  cannot be echoed); in a response's ``result`` or ``error``, the request it answers
  fails; in a member JSON-RPC does not define, nothing (the member is ignored anyway).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import msgspec.structs

from protocol.errors import ErrorCode
from protocol.limits import MAX_BATCH_ITEMS
from sidecar.jsondepth import json_text_too_deep
from sidecar.rpc import surrogates
from sidecar.rpc.bounds import format_path
from sidecar.rpc.framing import OVERSIZED_HEAD_BYTES
from sidecar.rpc.messages import (
    Envelope,
    ErrorObject,
    Incoming,
    Reply,
    classify,
    encode,
    envelope_decoder,
    error_reply,
    scan_head,
)

__all__ = ["Unreadable", "Parsed", "BatchItem", "parse_line", "TOO_DEEP", "ENVELOPE_DEPTH"]

TOO_DEEP = "parse error: nesting too deep"
ENVELOPE_DEPTH = 2048
"""The deepest line whose messages are read, a batch's array counted (their ``params``,
``result`` and ``error`` are ``Raw``, but msgspec skips over them by recursion, against
Python's recursion limit)."""
T = TypeVar("T")
NOT_UNICODE = "holds a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a pair), which is not Unicode text"


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A message that cannot be read whole: answered with the id its ``head`` shows."""

    head: bytes
    code: ErrorCode
    message: str


BatchItem = Incoming | Reply
"""A batch item: a classified message, or the error that answers it at once."""
Parsed = Incoming | list[BatchItem] | Reply | Unreadable | None


def parse_line(line: bytes) -> Parsed:
    stripped = line.strip()
    if not stripped:
        return None
    try:
        stripped.decode("utf-8")
    except UnicodeDecodeError as exc:
        return error_reply(None, ErrorCode.PARSE_ERROR, f"parse error: invalid UTF-8 at byte {exc.start}")
    first = stripped[:1]
    if first == b"{":
        return _message(stripped)
    if first == b"[":
        return _batch(stripped)
    try:
        msgspec.json.decode(stripped)
    except (msgspec.DecodeError, RecursionError) as exc:
        return _parse_error(exc)
    return error_reply(None, ErrorCode.INVALID_REQUEST, "invalid request: expected a JSON object or array")


def _message(text: bytes) -> Incoming | Reply | Unreadable:
    masked = False
    try:
        try:
            envelope = _envelope(text)
        except msgspec.DecodeError:
            retry = surrogates.mask(text)
            if retry is None:
                raise
            text, masked = retry, True
            envelope = _envelope(text)
    except RecursionError:
        return Unreadable(text[:OVERSIZED_HEAD_BYTES], ErrorCode.PARSE_ERROR, TOO_DEEP)
    except msgspec.DecodeError as exc:
        return _parse_error(exc)
    incoming = classify(envelope)
    return _unmasked(incoming) if masked else incoming


def _envelope(text: bytes | msgspec.Raw) -> Envelope:
    """The envelope of one message (``_with_room``)."""
    return _with_room(envelope_decoder.decode, text)


def _with_room(decode: Callable[[bytes | msgspec.Raw], T], text: bytes | msgspec.Raw) -> T:
    """``decode(text)`` the same however deep the caller's stack is: when msgspec runs out
    of recursion on text nested at most ENVELOPE_DEPTH levels (a message, or a batch and
    its items), it is decoded again with that much more room. msgspec holds the GIL while
    it decodes, so another thread can run under the raised limit only between the calls
    around it, where the limit only lets it recurse further before its own RecursionError.
    RecursionError when the text is deeper still."""
    try:
        return decode(text)
    except RecursionError:
        if json_text_too_deep(bytes(text).decode("utf-8", "replace"), ENVELOPE_DEPTH):
            raise
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + ENVELOPE_DEPTH)
    try:
        return decode(text)
    finally:
        sys.setrecursionlimit(limit)


def _batch(text: bytes) -> list[BatchItem] | Reply:
    masked = False
    try:
        try:
            items = _batch_items(text)
        except msgspec.ValidationError:
            raise  # too many items: answered below, the rest never read
        except msgspec.DecodeError:
            retry = surrogates.mask(text)
            if retry is None:
                raise
            text, masked = retry, True
            items = _batch_items(text)
    except msgspec.ValidationError:
        return error_reply(
            None, ErrorCode.INVALID_REQUEST, f"invalid request: a batch holds at most {MAX_BATCH_ITEMS} items"
        )
    except (msgspec.DecodeError, RecursionError) as exc:
        return _parse_error(exc)
    if not items:
        return error_reply(None, ErrorCode.INVALID_REQUEST, "invalid request: empty batch")
    out: list[BatchItem] = []
    for raw in items:
        try:
            envelope = _envelope(raw)
        except RecursionError:
            out.append(error_reply(scan_head(bytes(raw)[:OVERSIZED_HEAD_BYTES]).id, ErrorCode.PARSE_ERROR, TOO_DEEP))
            continue
        except msgspec.DecodeError:  # ValidationError included
            out.append(error_reply(None, ErrorCode.INVALID_REQUEST, "invalid request: a batch item must be an object"))
            continue
        incoming = classify(envelope)
        out.append(_unmasked(incoming) if masked else incoming)
    return out


_batch_decoder: msgspec.json.Decoder[Any] | None = None


def _batch_items(text: bytes) -> list[msgspec.Raw]:
    """The items of a batch as Raw text; ValidationError past MAX_BATCH_ITEMS.

    A length constraint on ``list[Raw]`` is checked only once the whole list is built (a
    second and 450 MB for five million items, measured); an array-like Struct with
    MAX_BATCH_ITEMS fields that forbids more stops at the first item too many. Built at
    the first batch (a thousand fields cost nothing until then)."""
    global _batch_decoder
    if _batch_decoder is None:
        fields = [(f"i{n}", msgspec.Raw, msgspec.Raw()) for n in range(MAX_BATCH_ITEMS)]
        kind = msgspec.defstruct("BatchItems", fields, array_like=True, forbid_unknown_fields=True)
        _batch_decoder = msgspec.json.Decoder(kind)
    decoded = _with_room(_batch_decoder.decode, text)
    return [raw for raw in msgspec.structs.astuple(decoded) if len(raw)]


def _unmasked(incoming: Incoming) -> Incoming:
    """A message read with its lone surrogates masked, refused where they are."""
    envelope = incoming.envelope
    if surrogates.holds(envelope.id):
        if incoming.kind == "response":
            return Incoming("dropped", envelope, f"a response whose id {NOT_UNICODE}")
        return Incoming("invalid", msgspec.structs.replace(envelope, id=None), f"the id {NOT_UNICODE}")
    if incoming.kind == "response":
        if surrogates.MASK_ESCAPE in bytes(envelope.result) or surrogates.MASK_ESCAPE in bytes(envelope.error):
            error = ErrorObject(int(ErrorCode.PARSE_ERROR), f"the response {NOT_UNICODE}")
            return Incoming("response", Envelope(id=envelope.id, error=msgspec.Raw(encode(error)[:-1])))
        return incoming
    for member in ("method", "jsonrpc"):
        if surrogates.holds(getattr(envelope, member)):
            return Incoming("invalid", envelope, f"{member} {NOT_UNICODE}")
    if incoming.kind == "invalid" or surrogates.MASK_ESCAPE not in bytes(envelope.params):
        return incoming  # refused for another reason, or masked only in a member JSON-RPC does not define
    try:
        path = surrogates.first_path(msgspec.json.decode(envelope.params))
    except (msgspec.DecodeError, RecursionError):
        path = None
    where = f" - at `{format_path(path)}`" if path is not None else ""
    return Incoming("invalid_params", envelope, f"invalid params: a string {NOT_UNICODE}{where}")


def _parse_error(exc: Exception) -> Reply:
    if isinstance(exc, RecursionError):  # msgspec raises it for deeply nested input
        return error_reply(None, ErrorCode.PARSE_ERROR, TOO_DEEP)
    return error_reply(None, ErrorCode.PARSE_ERROR, f"parse error: {exc}")
