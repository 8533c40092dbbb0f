"""How a call to the Qiming server fails.

    sidecar.errors.SidecarError
    └── QimingError             code PROVIDER_ERROR; ``kind`` says what happened
        ├── ServerUnreachable    kind "network" or "timeout": no answer (retried first)
        ├── ServerHttpError      kind "http": an HTTP error status (5xx/429 retried first)
        ├── ServerMalformed      kind "malformed": not the envelope (an HTML page, broken JSON,
        │   │                    data of the wrong shape)
        │   └── BadServerData    a value outside what the wire contract allows (an id or an
        │                        index past int64, a date past year 9999, nesting past the
        │                        decoder): the conversation holding it is skipped, not retried
        ├── ServerRejected       kind "envelope": the envelope's code is not "0000"
        │   ├── AuthRequired     kind "auth_required": 4010/4011 (never retried)
        │   └── ConversationGone kind "not_found": "Conversation not found"
        ├── ChatFailed           kind "chat_failed": a forwarded turn the server ended with
        │                        an error (FINAL_RESULT success false, an ERROR event)
        └── NotConfigured        code BAD_STATE, kind "not_configured": no server account

``retryable`` says whether the same call could succeed later without the user doing
anything (network trouble, 5xx); AuthRequired needs a new token first. ``data`` on the
wire carries ``kind``, ``status``, ``code`` (the server's envelope code) and ``retryable``.
Must stay true: messages never contain the token (the client redacts what the server
echoes).
"""

from __future__ import annotations

from typing import Literal

from protocol.errors import ErrorCode
from sidecar.errors import SidecarError

__all__ = [
    "ErrorKind",
    "QimingError",
    "ServerUnreachable",
    "ServerHttpError",
    "ServerMalformed",
    "BadServerData",
    "ServerRejected",
    "AuthRequired",
    "ConversationGone",
    "NotConfigured",
    "ChatFailed",
    "CONVERSATION_NOT_FOUND",
]

ErrorKind = Literal[
    "network", "timeout", "http", "malformed", "envelope", "auth_required", "not_found", "not_configured",
    "chat_failed",
]

CONVERSATION_NOT_FOUND = "Conversation not found"
"""The real server's message (ReqResult.error) for a conversation that does not exist."""


class QimingError(SidecarError):
    code = ErrorCode.PROVIDER_ERROR
    kind: ErrorKind = "network"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        server_code: str | None = None,
        retryable: bool = False,
    ) -> None:
        self.status = status
        self.server_code = server_code
        self.retryable = retryable
        super().__init__(
            message,
            data={"kind": self.kind, "status": status, "code": server_code, "retryable": retryable},
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, status={self.status!r}, message={self.message!r})"


class ServerUnreachable(QimingError):
    kind: ErrorKind = "network"

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        if timeout:
            self.kind = "timeout"
        super().__init__(message, retryable=True)


class ServerHttpError(QimingError):
    kind: ErrorKind = "http"


class ServerMalformed(QimingError):
    kind: ErrorKind = "malformed"


class BadServerData(ServerMalformed):
    """Well-formed JSON the bounds refuse; ``field`` names where (``$.modified``), when known.
    The same answer would be refused again: a pull skips the conversation and reports it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message, status=200)


class ServerRejected(QimingError):
    kind: ErrorKind = "envelope"


class AuthRequired(ServerRejected):
    kind: ErrorKind = "auth_required"


class ConversationGone(ServerRejected):
    kind: ErrorKind = "not_found"


class ChatFailed(QimingError):
    kind: ErrorKind = "chat_failed"


class NotConfigured(QimingError):
    code = ErrorCode.BAD_STATE
    kind: ErrorKind = "not_configured"
