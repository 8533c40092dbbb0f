"""The error tree of the process; converted to JSON-RPC errors in one place (sidecar/rpc).

    SidecarError                 code: protocol.ErrorCode, message, data
    ├── InvalidParams            -32602, message names the field
    ├── RpcError                 transport / peer failures (sidecar/rpc)
    │   ├── PeerClosed           the other side went away; pending requests fail with it
    │   └── RemoteError          the peer answered one of our requests with an error
    ├── StoreError               database failures and bad references (sidecar/store)
    │   └── NotFound             unknown session / message / provider id
    ├── ProviderError            LLM provider failures (sidecar/providers)
    │   └── ProviderCallError    an adapter's failed call: kind, status, retryable (providers/errors.py)
    └── EngineError              state errors of the chat engine (sidecar/engine)

Each layer raises its own type, wrapping lower errors with ``raise ... from exc``.
Anything that is not a SidecarError reaching the RPC layer is a bug: it is logged
with its traceback and answered as INTERNAL_ERROR without details.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import ErrorCode


class SidecarError(Exception):
    code: int = ErrorCode.INTERNAL_ERROR
    """An ErrorCode; only an error answered to a peer in that peer's protocol carries the
    peer's own number (ACP's AcpErrorCode), and a RemoteError the number the peer sent."""

    def __init__(self, message: str, *, code: int | None = None, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.data = data


class InvalidParams(SidecarError):
    code = ErrorCode.INVALID_PARAMS


class RpcError(SidecarError):
    code = ErrorCode.INTERNAL_ERROR


class PeerClosed(RpcError):
    code = ErrorCode.INTERNAL_ERROR


class RemoteError(RpcError):
    """The peer answered our request with a JSON-RPC error (code/message/data as received)."""


class StoreError(SidecarError):
    code = ErrorCode.STORE_ERROR


class NotFound(StoreError):
    code = ErrorCode.NOT_FOUND


class ProviderError(SidecarError):
    code = ErrorCode.PROVIDER_ERROR


class EngineError(SidecarError):
    code = ErrorCode.BAD_STATE
