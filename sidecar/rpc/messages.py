"""The JSON-RPC 2.0 envelope as msgspec Structs, and the rules that classify a message.

Incoming lines decode into ``Envelope`` whose ``params``/``result``/``error`` stay
``msgspec.Raw`` until a handler (or a waiting ``request``) decodes them into its own
type, so the envelope is parsed once and payloads are never decoded twice. Outgoing
messages are the ``Out*`` Structs, encoded compactly by one shared encoder.

``classify`` applies JSON-RPC 2.0's shape rules: method + id = request to us, method
only = notification, id without method = response to us; anything else is an invalid
request. Ids are strings or numbers, as the spec allows (integers of any size, and
fractions, which it discourages but permits), echoed back as the same value (``7.0``
stays ``7.0``); ``null`` is accepted for requests and echoed back; booleans and
structures are invalid ids.
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

import msgspec


JSONRPC: Final = "2.0"
ABSENT: Final = msgspec.Raw()
"""The default of a Raw field: the key was not in the message (``null`` is ``Raw(b"null")``)."""

RequestId = int | float | str | None


class Envelope(msgspec.Struct):
    """Any one JSON-RPC message as received; fields are checked by ``classify``."""

    jsonrpc: Any = msgspec.UNSET
    id: Any = msgspec.UNSET
    method: Any = msgspec.UNSET
    params: msgspec.Raw = ABSENT
    result: msgspec.Raw = ABSENT
    error: msgspec.Raw = ABSENT


class ErrorObject(msgspec.Struct):
    code: int
    message: str
    data: Any = msgspec.UNSET


# ``jsonrpc`` comes first on the wire; UNSET fields (absent params, data) are omitted.
class OutRequest(msgspec.Struct, kw_only=True):
    jsonrpc: str = JSONRPC
    id: int | str
    method: str
    params: Any = msgspec.UNSET


class OutNotification(msgspec.Struct, kw_only=True):
    jsonrpc: str = JSONRPC
    method: str
    params: Any = msgspec.UNSET


class OutResult(msgspec.Struct, kw_only=True):
    jsonrpc: str = JSONRPC
    id: RequestId
    result: Any


class OutError(msgspec.Struct, kw_only=True):
    jsonrpc: str = JSONRPC
    id: RequestId
    error: ErrorObject


Reply = OutResult | OutError

_encoder = msgspec.json.Encoder()
envelope_decoder: Final = msgspec.json.Decoder(Envelope)
error_decoder: Final = msgspec.json.Decoder(ErrorObject)


def encode(message: Any) -> bytes:
    """One compact JSON line, newline included."""
    return _encoder.encode(message) + b"\n"


def error_reply(request_id: RequestId, code: int, message: str, data: Any = None) -> OutError:
    return OutError(id=request_id, error=ErrorObject(int(code), message, msgspec.UNSET if data is None else data))


def valid_id(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


class Incoming(msgspec.Struct, frozen=True):
    """A classified message: ``kind`` is "request", "notification", "response" or
    "invalid" (by ``classify``), or, for a message whose text holds a lone surrogate
    (sidecar.rpc.parse), "invalid_params" (a request is answered INVALID_PARAMS, a
    notification dropped) or "dropped" (a response nobody can be told about)."""

    kind: str
    envelope: Envelope
    reason: str = ""
    """Why an ``invalid``, ``invalid_params`` or ``dropped`` message is refused (goes into
    the error message or the log)."""


def classify(envelope: Envelope) -> Incoming:
    method = envelope.method
    has_id = envelope.id is not msgspec.UNSET
    if method is not msgspec.UNSET:
        if envelope.jsonrpc != JSONRPC:
            return Incoming("invalid", envelope, f"jsonrpc must be \"2.0\", got {show(envelope.jsonrpc)}")
        if not isinstance(method, str):
            return Incoming("invalid", envelope, f"method must be a string, got {show(method)}")
        if has_id and not (valid_id(envelope.id) or envelope.id is None):
            return Incoming("invalid", envelope, f"id must be a string or a number, got {show(envelope.id)}")
        return Incoming("request" if has_id else "notification", envelope)
    if has_id and (envelope.result is not ABSENT or envelope.error is not ABSENT):
        return Incoming("response", envelope)
    return Incoming("invalid", envelope, "a request needs a string method")


def reply_id(envelope: Envelope) -> RequestId:
    """The id to put in an error reply: the request's own if readable, else null."""
    return envelope.id if valid_id(envelope.id) else None


def show(value: Any) -> str:
    """A short JSON excerpt of a value for a message or the log (at most 40 characters)."""
    if value is msgspec.UNSET:
        return "nothing"
    try:
        text = _encoder.encode(value).decode("utf-8", "replace")
    except Exception:  # a value too deep (or odd) to encode is still named
        return f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."



class HeadInfo(NamedTuple):
    """What the start of a discarded (oversized) message shows about it."""

    id: RequestId
    """Its top-level id when readable (a string or a number), else None."""
    has_method: bool
    is_response: bool
    """A top-level "result" or "error" key was seen."""


_STRING = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\.)*"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?(?=[ \t\r\n,}])")
_WS = b" \t\r\n"


def scan_head(head: bytes) -> HeadInfo:
    """Top-level keys of a JSON object from the first bytes of its text, without parsing
    the rest (which was never kept, or was too deep to decode). Linear in ``len(head)``;
    anything unreadable (cut off, malformed) ends the scan with what was found so far. Only
    a complete string or number counts as the id, so a truncated ``"id":12`` is never
    echoed as 1."""
    n = len(head)
    i = 0
    while i < n and head[i] in _WS:
        i += 1
    if head[i : i + 1] != b"{":
        return HeadInfo(None, False, False)
    request_id: RequestId = None
    found_id = has_method = is_response = False
    depth = 0
    while i < n:
        c = head[i]
        if c == 0x22:  # a string: at depth 1 followed by ':' it is a key
            m = _STRING.match(head, i)
            if m is None:
                break
            i = m.end()
            if depth != 1:
                continue
            k = i
            while k < n and head[k] in _WS:
                k += 1
            if k >= n or head[k] != 0x3A:
                continue
            k += 1
            while k < n and head[k] in _WS:
                k += 1
            try:
                key = msgspec.json.decode(m.group())
            except msgspec.DecodeError:
                break
            if key == "id" and not found_id:
                found_id = True
                value = _STRING.match(head, k) or _NUMBER.match(head, k)
                if value is not None:
                    try:
                        decoded = msgspec.json.decode(value.group())
                    except msgspec.DecodeError:
                        decoded = None
                    request_id = decoded if valid_id(decoded) else None
            elif key == "method":
                has_method = True
            elif key in ("result", "error"):
                is_response = True
            i = k
            continue
        if c == 0x7B or c == 0x5B:  # { [
            depth += 1
        elif c == 0x7D or c == 0x5D:  # } ]
            depth -= 1
            if depth <= 0:
                break
        i += 1
    return HeadInfo(request_id, has_method, is_response)
