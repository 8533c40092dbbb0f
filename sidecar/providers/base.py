"""The shared shape of an HTTP provider: request in, one stream of parts out.

Owns: ``HttpProvider`` (one httpx2.AsyncClient per instance; ``stream`` /
``generate`` / ``aclose``; headers, custom headers and the custom body merge;
mapping transport failures after the first byte to ProviderCallError) and
``deep_merge``. Each wire format subclasses it with ``endpoint``,
``auth_headers``, ``build_body``, ``parse_stream`` and ``parse_response``.

Must stay true:
- After ``open_response`` hands over a 2xx response nothing is retried; a
  failure ends the step with a ProviderCallError after every part already parsed
  was yielded.
- The custom body is merged LAST, so it may override anything we set; a ``null``
  value in it removes that key (for servers that reject a field we send).
- Custom headers are applied after ours, so they may override them too.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, ClassVar, cast

import httpx2
import msgspec

from sidecar.providers.errors import ErrorKind, ProviderCallError, error_detail
from sidecar.providers.history import resolve_images
from sidecar.providers.redact import Redactor, safe_url
from sidecar.providers.transport import make_client, open_response, read_error_body
from sidecar.providers.types import ChatRequest, ProviderSettings, StreamPart

__all__ = ["HttpProvider", "deep_merge"]

_encode = msgspec.json.Encoder().encode


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Merge ``extra`` into ``base`` in place (dicts recursively); ``None`` deletes a key."""
    for key, value in extra.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = msgspec.json.decode(_encode(value)) if isinstance(value, (dict, list)) else value
    return base


class HttpProvider(abc.ABC):
    kind: ClassVar[str]
    accept: ClassVar[str] = "application/json"

    def __init__(self, settings: ProviderSettings, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self._redactor = Redactor(settings.api_key, settings.headers, settings.base_url)
        self._label = f"{settings.name or settings.type} ({safe_url(settings.base_url)})"
        try:
            self._base_url = httpx2.URL(settings.base_url)
        except httpx2.InvalidURL as exc:
            raise self.error(f"invalid base URL ({exc})", kind="bad_request") from exc
        if self._base_url.scheme not in ("http", "https"):
            raise self.error("the base URL must start with http:// or https://", kind="bad_request")
        # Path without its trailing slash; the query (Azure's api-version...) is kept.
        self._base = self._base_url.path.rstrip("/")
        self._client = make_client(settings, transport)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._label}>"

    # -- for subclasses ---------------------------------------------------------

    @abc.abstractmethod
    def endpoint(self) -> httpx2.URL: ...

    def _at(self, path: str) -> httpx2.URL:
        """The base URL with ``path`` appended to its path (query and userinfo kept)."""
        return self._base_url.copy_with(path=f"{self._base}{path}")

    @abc.abstractmethod
    def auth_headers(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def build_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]: ...

    @abc.abstractmethod
    def parse_stream(self, response: httpx2.Response) -> AsyncGenerator[StreamPart, None]: ...

    @abc.abstractmethod
    def parse_response(self, raw: bytes) -> list[StreamPart]: ...

    @abc.abstractmethod
    def models_endpoint(self) -> httpx2.URL: ...

    async def sse_events(self, response: httpx2.Response) -> AsyncGenerator[httpx2.ServerSentEvent, None]:
        """The server-sent events of ``response`` (httpx2's own SSE parser)."""
        content_type = response.headers.get("content-type", "")
        if content_type.partition(";")[0].strip().lower() != "text/event-stream":
            # Typically a JSON error (or a whole answer) from a server that ignored stream=true;
            # read only for the message, so bounded.
            raw = await read_error_body(response)
            raise self.error(
                f"expected an event stream, got {content_type or 'no content type'!r}: {error_detail(raw)}",
                kind="malformed",
            )
        source = cast(AsyncGenerator[httpx2.ServerSentEvent, None], httpx2.EventSource(response).__aiter__())
        async with aclosing(source) as events:
            async for event in events:
                yield event

    def describe(self, detail: str) -> str:
        """A full message naming this provider, with every secret masked."""
        return self._redactor.redact(f"{self._label}: {detail}")

    def error(self, detail: str, *, kind: ErrorKind, status: int | None = None, retryable: bool = False) -> ProviderCallError:
        return ProviderCallError(
            self.describe(detail), kind=kind, status=status, retryable=retryable, provider=self.settings.type
        )

    # -- the Provider API ---------------------------------------------------------

    def request_body(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body that would be sent (custom body merged), for tests and logs."""
        return deep_merge(self.build_body(request, stream=stream), self.settings.body)

    def request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": self.accept}
        headers.update(self.auth_headers())
        headers.update(self.settings.headers)
        return headers

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamPart, None]:
        """Stream one model step. Close it (``aclosing``) if you stop early."""
        request = await resolve_images(request, self.describe)
        body = _encode(self.request_body(request, stream=True))
        async with open_response(
            self._client,
            url=self.endpoint(),
            body=body,
            headers=self.request_headers(),
            settings=self.settings,
            describe=self.describe,
        ) as response:
            try:
                async with aclosing(self.parse_stream(response)) as parts:
                    async for part in parts:
                        yield part
            except httpx2.TimeoutException as exc:
                raise self.error(
                    f"stream stalled: no data for {self.settings.idle_timeout:g}s", kind="stall", retryable=True
                ) from exc
            except httpx2.SSEError as exc:
                raise self.error(f"bad event stream: {exc}", kind="malformed") from exc
            except httpx2.DecodingError as exc:
                raise self.error(f"undecodable response body: {exc}", kind="malformed") from exc
            except httpx2.TransportError as exc:
                raise self.error(
                    f"connection lost mid-stream ({type(exc).__name__}: {exc})", kind="disconnect", retryable=True
                ) from exc

    async def generate(self, request: ChatRequest) -> list[StreamPart]:
        """One non-streaming request (``stream: false``), mapped onto the same parts."""
        request = await resolve_images(request, self.describe)
        body = _encode(self.request_body(request, stream=False))
        timeout = httpx2.Timeout(
            connect=self.settings.connect_timeout,
            read=self.settings.request_timeout,
            write=self.settings.idle_timeout,
            pool=self.settings.connect_timeout,
        )
        async with open_response(
            self._client,
            url=self.endpoint(),
            body=body,
            headers=self.request_headers(),
            settings=self.settings,
            describe=self.describe,
            timeout=timeout,
        ) as response:
            try:
                raw = await response.aread()
            except httpx2.TimeoutException as exc:
                raise self.error(
                    f"no complete answer within {self.settings.request_timeout:g}s", kind="timeout", retryable=True
                ) from exc
            except httpx2.DecodingError as exc:
                raise self.error(f"undecodable response body: {exc}", kind="malformed") from exc
            except httpx2.TransportError as exc:
                raise self.error(
                    f"connection lost mid-response ({type(exc).__name__}: {exc})", kind="disconnect", retryable=True
                ) from exc
        return self.parse_response(raw)

    async def fetch(self, url: httpx2.URL, *, body: Any = None) -> bytes:
        """One GET (a POST when ``body`` is given, as JSON) of a document beside the chat
        endpoint (model lists and details), with this provider's headers, timeouts and
        retries; its bytes (ProviderCallError as for any call)."""
        headers = self.request_headers()
        if body is None:
            del headers["content-type"]
        headers["accept"] = "application/json"
        async with open_response(
            self._client,
            url=url,
            body=_encode(body) if body is not None else None,
            headers=headers,
            settings=self.settings,
            describe=self.describe,
            method="GET" if body is None else "POST",
        ) as response:
            try:
                return await response.aread()
            except httpx2.TimeoutException as exc:
                raise self.error(f"no complete answer within {self.settings.idle_timeout:g}s", kind="timeout",
                                 retryable=True) from exc
            except httpx2.TransportError as exc:
                raise self.error(f"answer unreadable ({type(exc).__name__}: {exc})", kind="disconnect") from exc

    async def list_models(self) -> list[str]:
        """The model ids the endpoint offers (OpenAI/Anthropic ``data[].id``, Ollama ``models[].name``)."""
        raw = await self.fetch(self.models_endpoint())
        try:
            listing = _model_list.decode(raw)
        except msgspec.DecodeError as exc:
            raise self.error(f"malformed model list ({exc})", kind="malformed") from exc
        entries = listing.data if listing.data is not None else listing.models or []
        return [entry.id or entry.name for entry in entries if entry.id or entry.name]

    async def aclose(self) -> None:
        await self._client.aclose()


class _ModelEntry(msgspec.Struct):
    id: str = ""
    name: str = ""


class _ModelList(msgspec.Struct):
    data: list[_ModelEntry] | None = None
    models: list[_ModelEntry] | None = None


_model_list = msgspec.json.Decoder(_ModelList)
