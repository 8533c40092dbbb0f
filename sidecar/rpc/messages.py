"""The JSON-RPC 2.0 envelope as msgspec Structs, and the rules that classify a message.

Incoming lines decode into ``Envelope`` whose ``params``/``result``/``error`` stay
``msgspec.Raw`` until a handler (or a waiting ``request``) decodes them into its own
type, so the envelope is parsed once and payloads are never decoded twice. Outgoing
messages are the ``Out*`` Structs, encoded compactly by one shared encoder.

``classify`` applies JSON-RPC 2.0's shape rules: method + id = request to us, method
only = notification, id without method = response to us; anything else is an invalid
request. Ids are strings or integers (``null`` is accepted for requests, as the spec
allows, and echoed back); booleans, floats and structures are invalid ids.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec


JSONRPC: Final = "2.0"
ABSENT: Final = msgspec.Raw()
"""The default of a Raw field: the key was not in the message (``null`` is ``Raw(b"null")``)."""

RequestId = int | str | None


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
batch_decoder: Final = msgspec.json.Decoder(list[msgspec.Raw])
error_decoder: Final = msgspec.json.Decoder(ErrorObject)


def encode(message: Any) -> bytes:
    """One compact JSON line, newline included."""
    return _encoder.encode(message) + b"\n"


def error_reply(request_id: RequestId, code: int, message: str, data: Any = None) -> OutError:
    return OutError(id=request_id, error=ErrorObject(int(code), message, msgspec.UNSET if data is None else data))


def valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


class Incoming(msgspec.Struct, frozen=True):
    """A classified message: ``kind`` is "request", "notification", "response" or "invalid"."""

    kind: str
    envelope: Envelope
    reason: str = ""
    """Why an ``invalid`` message is invalid (goes into the error message)."""


def classify(envelope: Envelope) -> Incoming:
    method = envelope.method
    has_id = envelope.id is not msgspec.UNSET
    if method is not msgspec.UNSET:
        if envelope.jsonrpc != JSONRPC:
            return Incoming("invalid", envelope, f"jsonrpc must be \"2.0\", got {_show(envelope.jsonrpc)}")
        if not isinstance(method, str):
            return Incoming("invalid", envelope, f"method must be a string, got {_show(method)}")
        if has_id and not (valid_id(envelope.id) or envelope.id is None):
            return Incoming("invalid", envelope, f"id must be a string or an integer, got {_show(envelope.id)}")
        return Incoming("request" if has_id else "notification", envelope)
    if has_id and (envelope.result is not ABSENT or envelope.error is not ABSENT):
        return Incoming("response", envelope)
    return Incoming("invalid", envelope, "a request needs a string method")


def reply_id(envelope: Envelope) -> RequestId:
    """The id to put in an error reply: the request's own if readable, else null."""
    return envelope.id if valid_id(envelope.id) else None


def _show(value: Any) -> str:
    if value is msgspec.UNSET:
        return "nothing"
    text = _encoder.encode(value).decode("utf-8", "replace")
    return text if len(text) <= 40 else text[:37] + "..."

