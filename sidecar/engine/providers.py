"""ProviderService: provider:* methods, the default model, and resolving a session's model.

``resolve(provider_id, model_id)`` turns stored configuration into a live Provider (one
httpx client per provider configuration, reused across requests and replaced when the
configuration changes) and the ModelInfo the request builder needs. API keys come from the
stored key or the named environment variable and never leave this module except inside
the provider adapter's own headers.

A replaced or deleted provider's client is retired: it is closed once no stream or call
uses it and RETIRE_GRACE_S have passed (a request resolved just before the change still
gets to start on it); checked whenever a model is resolved and when a call on it ends.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.providers import ModelConfig, ProviderInfo, ProviderSetDefaultParams, ProviderUpsertParams
from protocol.types import Usage
from sidecar.errors import EngineError, InvalidParams, NotFound, SecretsLocked
from sidecar.providers import Provider, create_provider
from sidecar.providers.types import ChatRequest, ModelInfo, ProviderSettings, StreamPart
from sidecar.store.async_store import AsyncStore
from sidecar.store.providers import ProviderRecord
from sidecar.store.settings import DEFAULT_MODEL_KEY, DEFAULT_PROVIDER_KEY

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger(__name__)

RETIRE_GRACE_S = 30.0
CONNECT_TIMEOUT_S = 10.0


class _CountedStream:
    """The provider's stream, counted as running until it is closed.

    Not an async generator wrapping the provider's: ``__anext__`` hands out the provider
    generator's own awaitable, so counting costs nothing per chunk (the stream is the hot
    path). Consumers close it (``aclosing``), which is when the count drops.
    """

    __slots__ = ("_parts", "_on_close", "_closed")

    def __init__(self, parts: AsyncGenerator[StreamPart, None], on_close: Callable[[], Awaitable[None]]) -> None:
        self._parts = parts
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> _CountedStream:
        return self

    def __anext__(self) -> Awaitable[StreamPart]:
        return self._parts.__anext__()

    async def aclose(self) -> None:
        try:
            await self._parts.aclose()
        finally:
            if not self._closed:
                self._closed = True
                await self._on_close()


class _Live:
    """A provider's client with a count of the streams and calls running on it."""

    def __init__(self, provider: Provider, version: int, service: ProviderService) -> None:
        self.provider = provider
        self.version = version
        self.busy = 0
        self.retired_at: float | None = None
        self._service = service

    def stream(self, request: ChatRequest) -> _CountedStream:
        self.busy += 1
        return _CountedStream(self.provider.stream(request), self._stream_closed)

    async def _stream_closed(self) -> None:
        self.busy -= 1
        await self._service._close_retired()

    async def generate(self, request: ChatRequest) -> list[StreamPart]:
        self.busy += 1
        try:
            return await self.provider.generate(request)
        finally:
            self.busy -= 1
            await self._service._close_retired()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)


class ResolvedModel(msgspec.Struct, kw_only=True):
    provider: _Live
    model: ModelInfo
    record: ProviderRecord


class ProviderService:
    def __init__(self, store: AsyncStore, *, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self._store = store
        self._transport = transport  # tests and benchmarks inject an httpx2 transport
        self._records: dict[str, ProviderRecord] = {}
        """Records read for generation, dropped on upsert/delete (this process is the only writer)."""
        self._live: dict[str, _Live] = {}
        self._retired: list[_Live] = []

    # -- provider:* methods ----------------------------------------------------------

    async def list_providers(self, params: EmptyParams | None = None) -> list[ProviderInfo]:
        records = await self._store.run(lambda s: s.providers.list())
        default = await self._setting(DEFAULT_PROVIDER_KEY)
        return [r.to_info(is_default=r.id == default) for r in records]

    async def upsert_provider(self, params: ProviderUpsertParams) -> ProviderInfo:
        record = await self._store.run(lambda s: s.providers.upsert(params))
        self._records.pop(record.id, None)
        # retired here, not by comparing updated_at (two upserts in one millisecond share it)
        live = self._live.pop(record.id, None)
        if live is not None:
            self._retire(live)
            await self._close_retired()
        default = await self._setting(DEFAULT_PROVIDER_KEY)
        return record.to_info(is_default=record.id == default)

    async def delete_provider(self, params: IdParams) -> SuccessResult:
        await self._store.run(lambda s: s.providers.delete(params.id))
        self._records.pop(params.id, None)
        live = self._live.pop(params.id, None)
        if live is not None:
            self._retire(live)
            await self._close_retired()
        if await self._setting(DEFAULT_PROVIDER_KEY) == params.id:
            await self._set(DEFAULT_PROVIDER_KEY, None)
            await self._set(DEFAULT_MODEL_KEY, None)
        return SuccessResult()

    async def set_default(self, params: ProviderSetDefaultParams) -> SuccessResult:
        try:
            record = await self._store.run(lambda s: s.providers.get(params.provider_id))
        except NotFound as exc:
            raise InvalidParams(f"invalid params: {exc.message} - at `$.providerId`") from exc
        if record.models and record.model(params.model_id) is None:
            raise InvalidParams(
                f"invalid params: provider {record.name!r} has no model {params.model_id!r} - at `$.modelId`"
            )
        await self._set(DEFAULT_PROVIDER_KEY, record.id)
        await self._set(DEFAULT_MODEL_KEY, params.model_id)
        return SuccessResult()

    # -- for the engine --------------------------------------------------------------

    async def resolve(self, provider_id: str, model_id: str) -> ResolvedModel:
        if not provider_id:
            provider_id = await self._setting(DEFAULT_PROVIDER_KEY) or ""
            model_id = model_id or await self._setting(DEFAULT_MODEL_KEY) or ""
        if not provider_id:
            raise EngineError(
                "no provider is configured: add one with provider:upsert and choose it with "
                "provider:setDefault (or set the session's providerId)"
            )
        record = await self._record(provider_id, "the session's provider")
        if not record.enabled:
            raise EngineError(f"provider {record.name!r} is disabled")
        if record.type == "acp-engine":
            raise EngineError(
                f"provider {record.name!r} is an ACP agent engine: use it from a session created with mode 'acp'"
            )
        if not model_id:
            if not record.models:
                raise EngineError(f"provider {record.name!r} has no models and no model was chosen")
            model_id = record.models[0].id
        provider = self._provider(record)
        await self._close_retired()
        return ResolvedModel(provider=provider, model=_model_info(record, model_id), record=record)

    async def disable_streaming(self, provider_id: str, model_id: str) -> None:
        """Remember that ``model_id`` of this provider must be asked for whole replies (its
        endpoint refused to stream it): its ModelConfig gets ``stream: false``. An empty
        ``provider_id`` is the default provider, as for ``resolve``."""
        if not provider_id:
            provider_id = await self._setting(DEFAULT_PROVIDER_KEY) or ""
        record = await self._store.run(lambda s: s.providers.set_model_stream(provider_id, model_id, False))
        # the cached record goes; the live client stays (the same endpoint, only the flag changed)
        self._records[provider_id] = record
        live = self._live.get(provider_id)
        if live is not None:
            live.version = record.updated_at

    async def engine(self, provider_id: str) -> ProviderRecord:
        """The configuration of an ``acp-engine`` provider (for ACP sessions)."""
        if not provider_id:
            raise EngineError(
                "this ACP session has no engine: set its providerId to a provider of type acp-engine"
            )
        record = await self._record(provider_id, "the session's engine")
        if record.type != "acp-engine" or record.engine is None:
            raise EngineError(
                f"provider {record.name!r} is not an ACP agent engine (type {record.type!r}); "
                "a session in mode 'acp' needs a provider of type acp-engine"
            )
        if not record.enabled:
            raise EngineError(f"engine {record.name!r} is disabled")
        if record.secrets_locked:
            raise _locked(record)
        return record

    async def connection(self, provider_id: str) -> tuple[ProviderRecord, ProviderSettings]:
        """The record and connection settings (key included) of an enabled HTTP provider, for
        the other clients of a provider's endpoint (the knowledge bases' embedding calls)."""
        record = await self._record(provider_id, "provider")
        if not record.enabled:
            raise EngineError(f"provider {record.name!r} is disabled")
        if record.type == "acp-engine":
            raise EngineError(f"provider {record.name!r} is an ACP agent engine, not an HTTP provider")
        return record, provider_settings(record)

    async def cost(self, provider_id: str, model_id: str, usage: Usage) -> float:
        """USD cost of ``usage`` from the model's prices (0 when unknown); cached prompt
        tokens at the model's cache read/write prices (default: its input price)."""
        try:
            resolved = await self.resolve(provider_id, model_id)
        except (EngineError, NotFound):
            return 0.0
        model = resolved.record.model(resolved.model.id)
        if model is None:
            return 0.0
        return usage_cost(model, usage)

    async def aclose(self) -> None:
        providers = [live.provider for live in self._live.values()] + [live.provider for live in self._retired]
        self._live.clear()
        self._retired.clear()
        for provider in providers:
            with anyio.CancelScope(shield=True):
                await provider.aclose()

    # -- internals -------------------------------------------------------------------

    async def _record(self, provider_id: str, what: str) -> ProviderRecord:
        """The stored record (cached until upsert/delete); EngineError naming ``what`` if absent."""
        record = self._records.get(provider_id)
        if record is None:
            try:
                record = await self._store.run(lambda s: s.providers.get(provider_id))
            except NotFound:
                raise EngineError(f"{what} {provider_id!r} does not exist") from None
            self._records[provider_id] = record
        return record

    async def _setting(self, key: str) -> str | None:
        return await self._store.run(lambda s: s.settings.get(key))

    async def _set(self, key: str, value: str | None) -> None:
        await self._store.run(lambda s: s.settings.set(key, value))

    def _retire(self, live: _Live) -> None:
        live.retired_at = time.monotonic()
        self._retired.append(live)

    async def _close_retired(self) -> None:
        now = time.monotonic()
        done = [
            live for live in self._retired
            if live.busy == 0 and live.retired_at is not None and now - live.retired_at >= RETIRE_GRACE_S
        ]
        if not done:
            return
        self._retired = [live for live in self._retired if live not in done]
        for live in done:
            try:
                with anyio.CancelScope(shield=True):
                    await live.provider.aclose()
            except Exception:  # closing a client must never fail a request
                log.exception("closing a retired provider client failed")

    def _provider(self, record: ProviderRecord) -> _Live:
        if record.secrets_locked:
            raise _locked(record)
        live = self._live.get(record.id)
        if live is not None and live.version == record.updated_at:
            return live
        if live is not None:
            # a running stream may still use the old client: closed once unused
            self._retire(live)
        live = _Live(create_provider(provider_settings(record), transport=self._transport), record.updated_at, self)
        self._live[record.id] = live
        return live


def usage_cost(model: ModelConfig, usage: Usage) -> float:
    """USD of ``usage`` at the model's prices (per million tokens). ``input_tokens`` counts
    every prompt token, cached ones included (sidecar/providers/types.py): the cached ones
    are priced apart."""
    read = max(0, usage.cache_read_tokens or 0)
    written = max(0, usage.cache_write_tokens or 0)
    plain = max(0, usage.input_tokens - read - written)
    read_price = model.cache_read_price if model.cache_read_price is not None else model.input_price
    write_price = model.cache_write_price if model.cache_write_price is not None else model.input_price
    return (
        plain * model.input_price + read * read_price + written * write_price + usage.output_tokens * model.output_price
    ) / 1e6


def _locked(record: ProviderRecord) -> SecretsLocked:
    return SecretsLocked(
        f"the stored secrets of provider {record.name!r} were sealed with another key: start the sidecar "
        "with that key (sidecar:initialize secretKey) or enter them again with provider:upsert"
    )


def provider_settings(record: ProviderRecord) -> ProviderSettings:
    """The connection settings of a stored HTTP provider (its key, else its key variable's
    value); EngineError for an ACP agent engine, SecretsLocked when its secrets cannot be read."""
    if record.secrets_locked:
        raise _locked(record)
    if record.type == "acp-engine":  # resolve() and connection() refuse these before
        raise EngineError(f"provider {record.name!r} is an ACP agent engine")
    api_key = record.api_key or (os.environ.get(record.api_key_env) if record.api_key_env else None)
    settings = ProviderSettings(
        type=record.type,
        base_url=record.base_url,
        api_key=api_key,
        headers=record.headers,
        body=record.body,
    )
    return _with_limits(settings, record.timeout_s, record.max_retries)


def _with_limits(settings: ProviderSettings, timeout_s: float | None, max_retries: int | None) -> ProviderSettings:
    """``settings`` with a provider's ``timeoutS`` (every wait on the endpoint: connecting,
    at most CONNECT_TIMEOUT_S of it, the first byte, between bytes, a whole answer) and
    ``maxRetries``; None keeps the transport's default."""
    changes: dict[str, Any] = {}
    if timeout_s is not None:
        changes.update(connect_timeout=min(CONNECT_TIMEOUT_S, timeout_s), idle_timeout=timeout_s,
                       request_timeout=timeout_s)
    if max_retries is not None:
        changes["max_retries"] = max_retries
    return msgspec.structs.replace(settings, **changes) if changes else settings


def _model_info(record: ProviderRecord, model_id: str) -> ModelInfo:
    model = record.model(model_id)
    if model is None:
        # a model the user typed but did not describe: safe defaults, no images
        return ModelInfo(id=model_id, stream=record.stream)
    return ModelInfo(
        id=model.id,
        context_window=model.context_window,
        max_output_tokens=model.max_output_tokens,
        supports_tools=model.supports_tools,
        supports_reasoning=model.supports_reasoning,
        supports_images=model.supports_images,
        stream=record.stream and model.stream,
    )
