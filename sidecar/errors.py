"""The error tree of the process; converted to JSON-RPC errors in one place (sidecar/rpc).

    SidecarError                 code: protocol.ErrorCode, message, data
    ├── InvalidParams            -32602, message names the field
    ├── RpcError                 transport / peer failures (sidecar/rpc)
    │   ├── PeerClosed           the other side went away; pending requests fail with it
    │   └── RemoteError          the peer answered one of our requests with an error
    ├── StoreError               database failures and bad references (sidecar/store)
    │   └── NotFound             unknown session / message / provider id
    ├── SecretsLocked            a stored secret sealed with a key we were not given (sidecar/secrets)
    ├── ProviderError            LLM provider failures (sidecar/providers)
    │   └── ProviderCallError    an adapter's failed call: kind, status, retryable (providers/errors.py)
    └── EngineError              state errors of the chat engine (sidecar/engine)

Each layer raises its own type, wrapping lower errors with ``raise ... from exc``.
Anything that is not a SidecarError reaching the RPC layer is a bug: it is logged
with its traceback and answered as INTERNAL_ERROR without details.

Which code a StoreError carries (sidecar/store/db.py maps SQLite's errors): STORE_ERROR
only when the database itself failed (I/O, disk full, corruption, locked); a row that
vanished under the request (a foreign key to a deleted row) is NOT_FOUND, a duplicate key
BAD_STATE, and input SQLite refuses (a value out of range, a pattern too complex, a value
too big) INVALID_PARAMS. Messages that quote a value the caller sent use ``excerpt``.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import ErrorCode


EXCERPT_CHARS = 200


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and end around a
    note of how much was left out (so an error never echoes a huge value whole)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head = keep * 2 // 3
    tail = keep - head
    return f"{text[:head]}...[{len(text) - head - tail} characters]...{text[len(text) - tail:]}"


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


class SecretsLocked(SidecarError):
    """A stored secret cannot be opened: it was sealed with a key this process does not have."""

    code = ErrorCode.SECRETS_LOCKED


class ProviderError(SidecarError):
    code = ErrorCode.PROVIDER_ERROR


class EngineError(SidecarError):
    code = ErrorCode.BAD_STATE
