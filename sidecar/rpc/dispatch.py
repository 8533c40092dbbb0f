"""Calling a handler for one incoming request: the only module that imports jsonrpcserver.

A ``Handler`` pairs a params Struct type with an async function. ``Dispatcher`` turns
(method, raw params) into a ``Reply``: params are decoded by msgspec straight from the
raw JSON into the handler's Struct (jsonrpcserver's jsonschema validator is off), and
errors map to codes in one place:

    unknown method                 -> -32601 METHOD_NOT_FOUND (data: the method name)
    params that do not decode      -> -32602 INVALID_PARAMS, message names the field
    SidecarError raised by handler -> its code, message and data
    any other exception            -> -32603 INTERNAL_ERROR, generic message; traceback to the log

Cancellation is never caught here: it propagates to the peer, which owns each request's
cancel scope and answers REQUEST_CANCELLED.

How jsonrpcserver 5.0.9 is used: for the per-request part of its pipeline — method
lookup (``get_method``), calling the method with exception-to-error mapping
(``async_dispatcher.dispatch_request`` / ``JsonRpcError``) and its ``Success``/``Error``
results. Its top-level ``async_dispatch`` is not used: it runs a batch with
``asyncio.gather`` (bare asyncio tasks outside anyio's cancel scopes, so no per-request
cancellation and no trio), and with the validator off it answers a request without a
``method`` with -32000 "Server error" instead of -32600 and does not check ``"jsonrpc"``.
The envelope checks, batches and cancel scopes live in ``sidecar.rpc.peer``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

import msgspec

from protocol.errors import ErrorCode
from sidecar.errors import InvalidParams, SidecarError
from sidecar.rpc.messages import ABSENT, ErrorObject, OutError, OutResult, Reply, RequestId

with warnings.catch_warnings():
    # jsonrpcserver calls importlib.resources.read_text at import, deprecated since 3.11.
    warnings.filterwarnings("ignore", message=r"(read|open)_text is deprecated", category=DeprecationWarning)
    from jsonrpcserver.async_dispatcher import dispatch_request as _dispatch_request
    from jsonrpcserver.exceptions import JsonRpcError as _JsonRpcError
    from jsonrpcserver.request import Request as _Request
    from jsonrpcserver.result import Success as _Success
    from jsonrpcserver.sentinels import NODATA as _NODATA
    from oslash.either import Left as _Left  # jsonrpcserver's Result is an oslash Either

logger = logging.getLogger(__name__)

P = TypeVar("P")

_EMPTY_OBJECT = b"{}"
_NULL = b"null"


class Handler(Generic[P]):
    """``func(params)`` answers a method whose params decode into ``params_type``.

    The result is encoded with msgspec: a Struct, a list of Structs, plain values, or
    None (``null``).
    """

    __slots__ = ("params_type", "func", "decoder")

    def __init__(self, params_type: type[P], func: Callable[[P], Awaitable[Any]]) -> None:
        self.params_type = params_type
        self.func = func
        self.decoder: msgspec.json.Decoder[P] = msgspec.json.Decoder(params_type)

    def decode_params(self, raw: msgspec.Raw) -> P:
        """Absent or ``null`` params are ``{}``; a mismatch raises InvalidParams naming the field."""
        data = _EMPTY_OBJECT if raw is ABSENT or bytes(raw) == _NULL else raw
        try:
            return self.decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidParams(f"invalid params: {exc}") from None

    def __repr__(self) -> str:
        return f"Handler({self.params_type.__name__}, {getattr(self.func, '__qualname__', self.func)!r})"


Handlers = Mapping[str, Handler[Any]]


def _to_jsonrpc_method(name: str, handler: Handler[Any]) -> Callable[[msgspec.Raw], Awaitable[Any]]:
    async def method(raw_params: msgspec.Raw) -> Any:
        try:
            params = handler.decode_params(raw_params)
            result = await handler.func(params)
        except SidecarError as err:
            raise _JsonRpcError(int(err.code), err.message, _NODATA if err.data is None else err.data) from None
        except Exception:
            logger.exception("unexpected error in %s", name)
            raise _JsonRpcError(int(ErrorCode.INTERNAL_ERROR), f"internal error in {name}") from None
        return _Success(result)

    method.__name__ = name
    return method


class Dispatcher:
    """Maps method names to handlers; ``dispatch`` answers one request."""

    def __init__(self, handlers: Handlers | None = None) -> None:
        self._methods: dict[str, Callable[..., Awaitable[Any]]] = {}
        self._handlers: dict[str, Handler[Any]] = {}
        for name, handler in (handlers or {}).items():
            self.add(name, handler)

    def add(self, name: str, handler: Handler[Any]) -> None:
        self._handlers[name] = handler
        self._methods[name] = _to_jsonrpc_method(name, handler)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    @property
    def handlers(self) -> Mapping[str, Handler[Any]]:
        return self._handlers

    async def dispatch(self, method: str, raw_params: msgspec.Raw, request_id: RequestId) -> Reply:
        # jsonrpcserver passes ``context`` as the one positional argument of the method
        # (params are neither a list nor a dict here), which is how the raw params reach it.
        _, result = await _dispatch_request(self._methods, raw_params, _Request(method, [], request_id))
        if not isinstance(result, _Left):
            return OutResult(id=request_id, result=result._value.result)
        error = result._error
        data = msgspec.UNSET if error.data is _NODATA else error.data
        return OutError(id=request_id, error=ErrorObject(error.code, _message(error.code, error.message, data), data))


def _message(code: int, message: str, data: Any) -> str:
    if code == ErrorCode.METHOD_NOT_FOUND and isinstance(data, str):
        return f"method not found: {data}"
    return message

