"""ProviderModelCall: one non-streaming model call for side jobs; and what a model source
looks like to the layers that make such calls (ModelResolver).

Rolling summaries, OCR, titles, memory encoding and consolidation, skill proposals each ask
a model for text; they sit in layers above providers (pipeline, memory, skills, engine), so
this lives here, below all of them. This wraps the engine's provider
service (a ModelResolver: ``await resolve(provider_id, model_id) -> .provider, .model``) into
``await call(provider_id, model_id, messages, max_tokens=..., session_id=..., kind=...) -> str``;
with a ``session_id`` the call's usage is attributed to that session as a side call of
``kind`` (``side:summary``, ``side:ocr``: the engine's SideUsage, sidecar/engine/usage.py).

``json_object(answer)`` is the one reading of a side call asked to answer with a JSON object:
the answer itself, or the first ``{...}`` in it (a model that fenced it or added prose).

Must stay true: a failure is a SidecarError (ProviderError from the adapter, EngineError for
an unknown model, ProviderError for an empty answer or a timeout); never a bare exception.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Protocol

import anyio
import msgspec

from sidecar.errors import ProviderError
from sidecar.providers.types import (
    ChatRequest,
    GenerationParams,
    ModelInfo,
    RequestMessage,
    StreamPart,
    TextDelta,
    UsageUpdate,
)
from protocol.types import Usage

__all__ = ["ProviderModelCall", "ModelResolver", "ResolvedModel", "LiveProvider", "UsageSink", "json_object"]

_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def json_object(answer: str) -> str:
    """The JSON object text of a model's answer (msgspec.DecodeError when there is none)."""
    text = answer.strip()
    if text.startswith("{"):
        return text
    found = _JSON_OBJECT.search(text)
    if found is None:
        raise msgspec.DecodeError("no JSON object in the answer")
    return found.group(0)


class LiveProvider(Protocol):
    """A provider ready for requests (sidecar.providers.Provider, or the engine's counted one)."""

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamPart]: ...

    async def generate(self, request: ChatRequest) -> list[StreamPart]: ...


class ResolvedModel(Protocol):
    @property
    def provider(self) -> LiveProvider: ...

    @property
    def model(self) -> ModelInfo: ...


class ModelResolver(Protocol):
    """Turns a (provider id, model id) pair into a live provider and the model's facts."""

    async def resolve(self, provider_id: str, model_id: str) -> ResolvedModel: ...


class UsageSink(Protocol):
    """Where a side call's usage goes (sidecar.engine.usage.SideUsage)."""

    async def __call__(
        self, session_id: str, provider_id: str, model_id: str, usage: Usage | None, *, kind: str
    ) -> None: ...


class ProviderModelCall:
    def __init__(self, providers: ModelResolver, *, timeout_s: float = 120.0, usage: UsageSink | None = None) -> None:
        self._providers = providers
        self._timeout_s = timeout_s
        self._usage = usage

    async def __call__(
        self,
        provider_id: str,
        model_id: str,
        messages: list[RequestMessage],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        session_id: str | None = None,
        kind: str = "side:call",
        resolved: ResolvedModel | None = None,
    ) -> str:
        """``resolved``: the model when the caller already resolved ``provider_id``/``model_id``."""
        if resolved is None:
            resolved = await self._providers.resolve(provider_id, model_id)
        request = ChatRequest(
            model=resolved.model,
            messages=messages,
            params=GenerationParams(max_tokens=max_tokens, temperature=temperature),
            stream=False,
        )
        try:
            with anyio.fail_after(self._timeout_s):
                parts = await resolved.provider.generate(request)
        except TimeoutError as exc:
            raise ProviderError(f"the model {resolved.model.id} gave no answer within {self._timeout_s:g}s") from exc
        if session_id is not None and self._usage is not None:
            usage = next((p.usage for p in reversed(parts) if isinstance(p, UsageUpdate)), None)
            await self._usage(session_id, provider_id, model_id, usage, kind=kind)
        text = "".join(p.text for p in parts if isinstance(p, TextDelta)).strip()
        if not text:
            raise ProviderError(f"the model {resolved.model.id} returned an empty answer")
        return text
