"""ProviderModelCall: one non-streaming model call for the pipeline's side jobs.

Rolling summaries and OCR each ask a model for text. This wraps the engine's provider
service (anything with ``await resolve(provider_id, model_id) -> .provider, .model``) into
``await call(provider_id, model_id, messages, max_tokens=...) -> str``.

Must stay true: a failure is a SidecarError (ProviderError from the adapter, EngineError for
an unknown model, ProviderError for an empty answer or a timeout); never a bare exception.
"""

from __future__ import annotations

from typing import Any

import anyio

from sidecar.errors import ProviderError
from sidecar.providers.types import (
    ChatRequest,
    GenerationParams,
    RequestMessage,
    TextDelta,
)

__all__ = ["ProviderModelCall"]


class ProviderModelCall:
    def __init__(self, providers: Any, *, timeout_s: float = 120.0) -> None:
        self._providers = providers
        self._timeout_s = timeout_s

    async def __call__(
        self, provider_id: str, model_id: str, messages: list[RequestMessage], *, max_tokens: int | None = None
    ) -> str:
        resolved = await self._providers.resolve(provider_id, model_id)
        request = ChatRequest(
            model=resolved.model,
            messages=messages,
            params=GenerationParams(max_tokens=max_tokens),
            stream=False,
        )
        try:
            with anyio.fail_after(self._timeout_s):
                parts = await resolved.provider.generate(request)
        except TimeoutError as exc:
            raise ProviderError(f"the model {resolved.model.id} gave no answer within {self._timeout_s:g}s") from exc
        text = "".join(p.text for p in parts if isinstance(p, TextDelta)).strip()
        if not text:
            raise ProviderError(f"the model {resolved.model.id} returned an empty answer")
        return text
