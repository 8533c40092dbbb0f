"""ProviderProbe: ``provider:test`` and ``provider:models`` against a stored provider or a
configuration being edited.

Owns: turning ``{id | config}`` into connection settings (a ``config`` is validated as
``provider:upsert`` would; with the id of a stored provider, a left-out key and values
sent back masked, headers, body fields, base URL parts, are the stored ones:
``ProviderRepo.edited``, the upsert's own resolution), one throwaway client per call (the engine's
live clients are left alone), and the classification of a failed call into the typed
ProviderTestError (auth, not_found, rate_limited, network, timeout, bad_response,
server_error, bad_request).

``provider:test`` makes exactly one request, never retried (a 429 is reported with its
Retry-After, not waited out): a one-token non-streamed answer of the chosen model (the
given ``modelId``, else the provider's first model), or the model list when no model is
known. ``provider:models`` lists the endpoint's models (sidecar/providers/catalog.py) with the
provider's own retries; a failure is PROVIDER_ERROR whose data is the typed error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from protocol.providers import (
    ListedModel,
    ProviderModelsParams,
    ProviderModelsResult,
    ProviderTestError,
    ProviderTestErrorKind,
    ProviderTestParams,
    ProviderTestResult,
    ProviderUpsertParams,
)
from protocol.types import TextPart
from sidecar.engine.providers import provider_settings
from sidecar.errors import InvalidParams, ProviderError
from sidecar.providers import ProviderCallError, create_provider
from sidecar.providers.base import HttpProvider
from sidecar.providers.catalog import list_catalog
from sidecar.providers.types import ChatRequest, GenerationParams, ModelInfo, ProviderSettings, RequestMessage
from sidecar.store.async_store import AsyncStore
from sidecar.store.providers import ProviderRecord, validate

if TYPE_CHECKING:
    import httpx2

__all__ = ["ProviderProbe", "classify", "TEST_PROMPT"]

TEST_PROMPT = "Reply with one word: pong."


def classify(exc: ProviderCallError) -> ProviderTestError:
    """The typed error of a failed call (see ProviderTestErrorKind)."""
    status = exc.status
    retry_ms = int(exc.retry_after * 1000) if exc.retry_after is not None else None
    kind: ProviderTestErrorKind
    if exc.kind == "http" and status is not None:
        if status in (401, 403):
            kind = "auth"
        elif status == 404:
            kind = "not_found"
        elif status == 429:
            kind = "rate_limited"
        elif status == 408:
            kind = "timeout"
        elif status >= 500:
            kind = "server_error"
        else:
            kind = "bad_request"
    elif exc.kind in ("connect", "disconnect"):
        kind = "network"
    elif exc.kind in ("timeout", "stall"):
        kind = "timeout"
    elif exc.kind in ("malformed", "truncated", "in_stream"):
        kind = "bad_response"
    else:
        kind = "bad_request"
    return ProviderTestError(kind=kind, status=status, message=exc.message, retry_after_ms=retry_ms)


class ProviderProbe:
    def __init__(self, store: AsyncStore, *, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self._store = store
        self._transport = transport

    async def test(self, params: ProviderTestParams) -> ProviderTestResult:
        record = await self._resolve(params.id, params.config)
        settings = msgspec.structs.replace(provider_settings(record), max_retries=0)
        model_id = params.model_id or (record.models[0].id if record.models else None)
        provider = self._client(settings)
        started = time.perf_counter()
        try:
            if model_id is not None:
                await provider.generate(ChatRequest(
                    model=ModelInfo(id=model_id, stream=False),
                    messages=[RequestMessage(role="user", parts=[TextPart(text=TEST_PROMPT)])],
                    params=GenerationParams(max_tokens=1, temperature=0),
                    stream=False,
                ))
            else:
                await list_catalog(provider)
            error = None
        except ProviderCallError as exc:
            error = classify(exc)
        finally:
            latency = int((time.perf_counter() - started) * 1000)
            await provider.aclose()
        return ProviderTestResult(ok=error is None, call="chat" if model_id else "models", model_id=model_id,
                                  latency_ms=latency, error=error)

    async def models(self, params: ProviderModelsParams) -> ProviderModelsResult:
        record = await self._resolve(params.id, params.config)
        provider = self._client(provider_settings(record))
        try:
            listed, notes = await list_catalog(provider)
        except ProviderCallError as exc:
            typed = classify(exc)
            raise ProviderError(exc.message, data=msgspec.to_builtins(typed)) from exc
        finally:
            await provider.aclose()
        configured = {m.id for m in record.models}
        models = [msgspec.structs.replace(m, configured=m.id in configured) for m in listed]
        return ProviderModelsResult(models=sorted(models, key=_order), notes=notes)

    # ---- internals ----------------------------------------------------------------------

    def _client(self, settings: ProviderSettings) -> HttpProvider:
        provider = create_provider(settings, transport=self._transport)
        assert isinstance(provider, HttpProvider)
        return provider

    async def _resolve(self, provider_id: str | None, config: ProviderUpsertParams | None) -> ProviderRecord:
        if (provider_id is None) == (config is None):
            raise InvalidParams("invalid params: give exactly one of id and config - at `$.id`")
        if provider_id is not None:
            record = await self._store.run(lambda s: s.providers.get(provider_id))
            if record.type == "acp-engine":
                raise InvalidParams(
                    f"invalid params: provider {record.name!r} is an ACP agent engine, not an HTTP endpoint - at `$.id`")
            return record
        assert config is not None
        if config.type == "acp-engine":
            raise InvalidParams("invalid params: an acp-engine is not an HTTP endpoint - at `$.config.type`")
        try:
            validate(config)
        except InvalidParams as exc:
            raise InvalidParams(exc.message.replace("at `$.", "at `$.config.")) from None
        # what an upsert would store (masked values sent back are the stored ones), unstored
        return await self._store.run(lambda s: s.providers.edited(config))


def _order(model: ListedModel) -> tuple[bool, str]:
    return (not model.configured, model.id)
