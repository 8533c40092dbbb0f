"""What the provider adapter tests share: a user message, the text of a stream, one scripted run."""

from __future__ import annotations

from typing import Any

import anyio

from protocol.types import TextPart
from sidecar.providers import ChatRequest, ProviderSettings, RequestMessage, TextDelta, create_provider
from sidecar.providers.replay import Reply, ScriptedTransport, drain


def user(text: str) -> RequestMessage:
    return RequestMessage(role="user", parts=[TextPart(text=text)])


def text_of(parts: list[Any]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextDelta))


async def run_scripted(
    settings: ProviderSettings, reply: Reply, request: ChatRequest
) -> tuple[list[Any], Any, ScriptedTransport]:
    """Stream ``request`` against a scripted ``reply``: (parts, error or None, transport)."""
    transport = ScriptedTransport(reply)
    provider = create_provider(settings, transport=transport)
    try:
        with anyio.fail_after(5):
            parts, error = await drain(provider.stream(request))
    finally:
        await provider.aclose()
    return parts, error, transport
