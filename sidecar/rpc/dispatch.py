"""Calling a handler for one incoming request: Handler, Dispatcher and the error mapping.

A ``Handler`` pairs a params Struct type with an async function. ``Dispatcher`` turns
(method, raw params) into a ``Reply``: params are decoded by msgspec straight from the
raw JSON into the handler's Struct, and errors map to codes in this one place:

    unknown method                 -> -32601 METHOD_NOT_FOUND (data: the method name)
    params that do not decode      -> -32602 INVALID_PARAMS, message names the field
    free-form JSON nested too deep -> -32602 INVALID_PARAMS, message names the field
    SidecarError raised by handler -> its code, message and data
    any other exception            -> -32603 INTERNAL_ERROR, generic message; traceback to the log

Params are bounded here, once for every method, from the params type: msgspec checks the
typed fields and their ``protocol.limits`` constraints (int64, string lengths, page sizes),
and ``bounds.DepthCheck`` the nesting of every free-form field (MAX_JSON_DEPTH). Params
larger than THREAD_DECODE_BYTES are decoded and checked in a worker thread, so a huge
import does not hold up the streams of running replies. Error messages and data going
out are bounded too (``bounded_message``/``bounded_data``): an error never echoes a huge
value the caller sent (a 10 MB id), only an excerpt of it.

Cancellation is never caught here: it propagates to the peer, which owns each request's
cancel scope and answers REQUEST_CANCELLED.

Why jsonrpcserver 5.0.9 is not used (DESIGN.md section 6 planned it for dispatch; the
first version of this module used its per-request pipeline, see git history). Measured
on the 2-core dev machine:
- its import (jsonschema, referencing, oslash, http.server) adds ~85 ms to start-up even
  with asyncio/logging already loaded, about a third of the 250 ms start-up budget, and
  it cannot be deferred: the first request (``sidecar:initialize``) needs the dispatcher;
- its per-request path (Either monad, ``inspect.signature(...).bind`` on every call) cost
  28 us per dispatch against 0.6 us for the direct call below, ~30% of the 100 us a
  request may take at the 10,000 requests/s target;
- what it would do is small and the rest does not fit: ``async_dispatch`` runs a batch
  with ``asyncio.gather`` (bare asyncio tasks outside anyio's cancel scopes: no
  per-request cancellation, no trio); with the validator off a request without
  ``method`` becomes -32000 "Server error" instead of -32600 and ``"jsonrpc"`` is not
  checked; unexpected exceptions put ``str(exc)`` on the wire as ``data``.
So the envelope checks, batches and cancel scopes live in ``sidecar.rpc.peer`` and the
method call with its error mapping lives here, in ~40 lines.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.limits import MAX_JSON_DEPTH
from sidecar.errors import InvalidParams, SidecarError, excerpt
from sidecar.logging_setup import EarlyLogger
from sidecar.rpc.bounds import DepthCheck, format_path
from sidecar.rpc.messages import ABSENT, OutResult, Reply, RequestId, error_reply

logger = EarlyLogger(__name__)

P = TypeVar("P")

_EMPTY_OBJECT = b"{}"
_NULL = b"null"
THREAD_DECODE_BYTES = 1024 * 1024
"""Params at least this large are decoded in a worker thread."""
MAX_ERROR_MESSAGE_CHARS = 2000
"""An error message longer than this keeps its start and end around an elision."""
MAX_ERROR_DATA_BYTES = 8192
"""Error data larger than this (encoded) has its long strings cut to excerpts, or is dropped."""


class Handler(Generic[P]):
    """``func(params)`` answers a method whose params decode into ``params_type``.

    The result is encoded with msgspec: a Struct, a list of Structs, plain values, or
    None (``null``). The decoder and the depth check are built at the first decode: a
    method table of two hundred handlers costs nothing at start-up, and a method never
    called never pays for its params type.
    """

    __slots__ = ("params_type", "func", "_decoder", "_depth")

    def __init__(self, params_type: type[P], func: Callable[[P], Awaitable[Any]]) -> None:
        self.params_type = params_type
        self.func = func
        self._decoder: msgspec.json.Decoder[P] | None = None
        self._depth: DepthCheck | None = None

    @classmethod
    def for_params(cls, params_type: type[P]) -> Handler[P]:
        """A Handler used only to decode params (``decode``, ``decode_params``)."""
        return cls(params_type, _not_called)

    @property
    def decoder(self) -> msgspec.json.Decoder[P]:
        # Built at most a few times if threads race here: each build is the same decoder.
        if self._decoder is None:
            self._decoder = msgspec.json.Decoder(self.params_type)
        return self._decoder

    @property
    def depth(self) -> DepthCheck:
        if self._depth is None:
            self._depth = DepthCheck.for_type(self.params_type)
        return self._depth

    async def decode(self, raw: msgspec.Raw) -> P:
        """``decode_params``, in a worker thread when the params are large."""
        if len(raw) >= THREAD_DECODE_BYTES:
            return await anyio.to_thread.run_sync(self.decode_params, raw)
        return self.decode_params(raw)

    def decode_params(self, raw: msgspec.Raw) -> P:
        """Absent or ``null`` params are ``{}``; a mismatch, a bound exceeded or free-form
        JSON nested too deep raises InvalidParams naming the field."""
        data = _EMPTY_OBJECT if raw is ABSENT or (len(raw) == 4 and bytes(raw) == _NULL) else raw
        try:
            params = self.decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidParams(f"invalid params: {exc}") from None
        except RecursionError:
            # Deeper than msgspec can decode: only a free-form field can be (typed levels
            # are few), so name it from the text.
            path = self.depth.raw_path(bytes(data))
            where = f" - at `{format_path(path)}`" if path else ""
            raise InvalidParams(f"invalid params: nested deeper than {MAX_JSON_DEPTH} levels{where}") from None
        if self.depth.needed and _may_nest(data):
            try:
                path = self.depth.check(params)
            except RecursionError:  # a recursive params type nested past the stack
                path = self.depth.raw_path(bytes(data)) or ()
            if path is not None:
                raise InvalidParams(
                    f"invalid params: nested deeper than {MAX_JSON_DEPTH} levels - at `{format_path(path)}`"
                )
        return params

    def __repr__(self) -> str:
        return f"Handler({self.params_type.__name__}, {getattr(self.func, '__qualname__', self.func)!r})"


async def _not_called(params: Any) -> Any:
    raise AssertionError("a Handler made by for_params only decodes")


def _may_nest(data: msgspec.Raw | bytes) -> bool:
    """False when the text has too few brackets to nest past the limit (no walk needed)."""
    text = data if isinstance(data, bytes) else bytes(data)
    return text.count(b"{") + text.count(b"[") > MAX_JSON_DEPTH


def bounded_message(message: str) -> str:
    """``message``, or its start and end around an elision when it is too long."""
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return excerpt(message, MAX_ERROR_MESSAGE_CHARS)


def bounded_data(data: Any) -> Any:
    """``data`` if it encodes small; else long strings (also in a dict or list) become
    excerpts; None if it is still too large or cannot be encoded."""
    if data is None:
        return None
    try:
        if len(msgspec.json.encode(data)) <= MAX_ERROR_DATA_BYTES:
            return data
    except Exception:  # anything that cannot be encoded never goes out
        logger.warning("error data of type %s cannot be encoded; dropped", type(data).__name__)
        return None
    shrunk = _shrink(data)
    try:
        if len(msgspec.json.encode(shrunk)) <= MAX_ERROR_DATA_BYTES:
            return shrunk
    except Exception:
        pass
    return None


def _shrink(value: Any) -> Any:
    if isinstance(value, str):
        return excerpt(value)
    if isinstance(value, dict):
        return {excerpt(str(k), 100): _shrink(v) for k, v in list(value.items())[:50]}
    if isinstance(value, (list, tuple)):
        return [_shrink(v) for v in value[:50]]
    return value


Handlers = Mapping[str, Handler[Any]]


class Dispatcher:
    """Maps method names to handlers; ``dispatch`` answers one request."""

    def __init__(self, handlers: Handlers | None = None) -> None:
        self._handlers: dict[str, Handler[Any]] = dict(handlers or {})

    def add(self, name: str, handler: Handler[Any]) -> None:
        self._handlers[name] = handler

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    @property
    def handlers(self) -> Mapping[str, Handler[Any]]:
        return self._handlers

    async def dispatch(self, method: str, raw_params: msgspec.Raw, request_id: RequestId) -> Reply:
        handler = self._handlers.get(method)
        if handler is None:
            return error_reply(request_id, ErrorCode.METHOD_NOT_FOUND, f"method not found: {method}", method)
        try:
            params = await handler.decode(raw_params)
            result = await handler.func(params)
        except SidecarError as err:
            return error_reply(request_id, err.code, bounded_message(err.message), bounded_data(err.data))
        except Exception:
            logger.exception("unexpected error in %s", method)
            return error_reply(request_id, ErrorCode.INTERNAL_ERROR, f"internal error in {method}")
        return OutResult(id=request_id, result=result)

