"""LLM provider adapters: one HTTP wire format in, one internal stream of parts out.

    create_provider(settings, transport=None) -> Provider
        "openai-compat" -> OpenAICompatProvider   POST {base}/chat/completions  (SSE)
        "anthropic"     -> AnthropicProvider      POST {base}/v1/messages       (SSE)
        "ollama"        -> OllamaProvider         POST {base}/api/chat          (NDJSON)

Every provider owns one httpx2.AsyncClient (close it with ``aclose``). ``stream``
is an async generator of StreamPart (types.py); consume it inside
``contextlib.aclosing`` so that stopping early closes the HTTP response at once.
``generate`` sends ``stream: false`` and returns the same parts as a list;
``list_models`` asks the endpoint which model ids it offers.
Failures are ``ProviderCallError`` (errors.py: ``kind``/``status``/``retryable``).
Retries happen inside the adapter only before the first byte of a response body.

Layout: types (request, settings, parts) · errors · redact (secrets) · transport
(client, idle watchdog, retries) · history (tool history splitting, images) ·
reasoning (level tables) · base (shared flow) · one module per wire format.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.providers.errors import ErrorKind, ProviderCallError
from sidecar.providers.types import (
    ChatRequest,
    Finish,
    GenerationParams,
    ModelInfo,
    ProviderSettings,
    ProviderType,
    ReasoningLevel,
    RequestMessage,
    StreamPart,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
)

__all__ = [
    "Provider",
    "create_provider",
    "ProviderCallError",
    "ErrorKind",
    "HttpProvider",
    "OpenAICompatProvider",
    "AnthropicProvider",
    "OllamaProvider",
    "ChatRequest",
    "Finish",
    "GenerationParams",
    "ModelInfo",
    "ProviderSettings",
    "ProviderType",
    "ReasoningLevel",
    "RequestMessage",
    "StreamPart",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolSpec",
    "UsageUpdate",
]


if TYPE_CHECKING:
    import httpx2

    from sidecar.providers.anthropic import AnthropicProvider
    from sidecar.providers.base import HttpProvider
    from sidecar.providers.ollama import OllamaProvider
    from sidecar.providers.openai_compat import OpenAICompatProvider

# The adapters (and httpx2, ~100 ms to import) load on first use, not at sidecar start-up:
# importing this package for its types must stay cheap.
_LAZY = {
    "AnthropicProvider": "sidecar.providers.anthropic",
    "HttpProvider": "sidecar.providers.base",
    "OllamaProvider": "sidecar.providers.ollama",
    "OpenAICompatProvider": "sidecar.providers.openai_compat",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


class Provider(Protocol):
    def stream(self, request: ChatRequest) -> AsyncGenerator[StreamPart, None]: ...

    async def generate(self, request: ChatRequest) -> list[StreamPart]: ...

    async def list_models(self) -> list[str]: ...

    async def aclose(self) -> None: ...


_ADAPTERS: dict[str, str] = {
    "openai-compat": "OpenAICompatProvider",
    "anthropic": "AnthropicProvider",
    "ollama": "OllamaProvider",
}


def create_provider(settings: ProviderSettings, *, transport: httpx2.AsyncBaseTransport | None = None) -> Provider:
    adapter = _ADAPTERS.get(settings.type)
    if adapter is None:
        raise ProviderCallError(f"unknown provider type {settings.type!r}", kind="bad_request")
    cls: type[HttpProvider] = __getattr__(adapter)
    return cls(settings, transport)
