"""ProviderCallError: how a provider call fails, and reading a provider's error body.

    sidecar.errors.ProviderError                  the provider layer's error (any failure)
    └── sidecar.providers.errors.ProviderCallError  an adapter's call: kind / status / retryable / provider

``kind`` says what happened:

    connect      could not connect (DNS, refused, TLS, connect timeout)
    timeout      no response headers within the idle timeout
    http         the provider answered with an HTTP error status (``status`` set)
    in_stream    the provider reported an error inside a 2xx stream
    malformed    a chunk that is not valid JSON or not the expected shape
    truncated    the stream ended cleanly but without its terminator
    disconnect   the connection dropped mid-response
    stall        no byte for ``idle_timeout`` seconds mid-stream
    bad_request  the request could not be built (for example an unreadable image)

``retryable`` says whether a fresh request could succeed (429, 5xx, overload,
network trouble). The adapters retry by themselves only BEFORE the first byte
of a response body; after it, retrying is the engine's decision, since parts
were already yielded.

Must stay true: messages never contain the API key or an Authorization value
(they pass through ``Redactor``); ``repr`` shows kind/status/message only.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from sidecar.errors import ProviderError

__all__ = ["ErrorKind", "ProviderCallError", "error_detail"]

ErrorKind = Literal[
    "connect", "timeout", "http", "in_stream", "malformed", "truncated", "disconnect", "stall", "bad_request"
]

# An error body longer than this is not a useful message.
_MAX_DETAIL = 500


class ProviderCallError(ProviderError):
    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind,
        status: int | None = None,
        retryable: bool = False,
        provider: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, data={"kind": kind, "status": status, "retryable": retryable})
        self.kind: ErrorKind = kind
        self.status = status
        self.retryable = retryable
        self.provider = provider
        self.retry_after = retry_after
        """Seconds the endpoint asked to wait (``retry-after-ms`` / ``retry-after``), if it said."""

    def __repr__(self) -> str:
        return f"ProviderCallError(kind={self.kind!r}, status={self.status!r}, message={self.message!r})"


class _ErrorObject(msgspec.Struct):
    message: Any = None
    type: Any = None
    code: Any = None


class _ErrorEnvelope(msgspec.Struct):
    # OpenAI/Anthropic: {"error": {...}}; Ollama: {"error": "..."}; others: message/detail.
    error: _ErrorObject | str | None = None
    message: Any = None
    detail: Any = None


_envelope = msgspec.json.Decoder(_ErrorEnvelope)


def error_detail(body: bytes) -> str:
    """The provider's own error message from an error body, best effort, bounded."""
    text = body.decode("utf-8", "replace").strip()
    try:
        env = _envelope.decode(body)
    except msgspec.DecodeError:
        return _clip(text)
    if isinstance(env.error, str):
        return _clip(env.error)
    if env.error is not None:
        return _describe(env.error)
    for value in (env.message, env.detail):
        if isinstance(value, str) and value:
            return _clip(value)
    return _clip(text)


def describe_error_object(error: Any) -> str:
    """``message`` (with its ``type``/``code``) of an in-stream error value of any shape."""
    if isinstance(error, str):
        return _clip(error)
    if isinstance(error, dict):
        return _describe(_ErrorObject(error.get("message"), error.get("type"), error.get("code")))
    return _clip(str(error))


def _describe(obj: _ErrorObject) -> str:
    message = obj.message if isinstance(obj.message, str) else ""
    label = obj.type if isinstance(obj.type, str) else obj.code if isinstance(obj.code, (str, int)) else None
    if label is not None and message:
        return _clip(f"{message} ({label})")
    return _clip(message or (str(label) if label is not None else "no details"))


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 1] + "…"
