"""HTTP plumbing shared by the adapters: the client, the idle watchdog, retries.

Owns: ``make_client`` (one httpx2.AsyncClient per provider), ``IdleTimeoutTransport``
(enforces the read timeout between body chunks for transports that do not, such as
``httpx2.MockTransport``), and ``open_response`` (POST, retrying before the first
byte of the body, yielding a 2xx streaming response).

Must stay true:
- Retries happen only before a 2xx response is handed to the caller: connect
  errors, timeouts and disconnects before any response, and the statuses in
  ``RETRY_STATUSES``. Once the caller holds a response, nothing is retried.
- Waits honour ``retry-after-ms`` then ``retry-after`` (seconds or HTTP date),
  capped at ``retry_after_cap``; otherwise exponential backoff with jitter.
- Cancellation is never swallowed; the response is closed on every exit path,
  in a shielded scope bounded by a timeout.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2

from sidecar.http_fields import headers_problem
from sidecar.providers.errors import ErrorKind, ProviderCallError, error_detail
from sidecar.providers.pacing import pace_client
from sidecar.providers.redact import install_http_log_filter, safe_url
from sidecar.providers.types import ProviderSettings

__all__ = [
    "RETRY_STATUSES",
    "IdleTimeoutTransport",
    "make_client",
    "open_response",
    "retry_delay",
    "close_quietly",
    "read_error_body",
]

log = logging.getLogger("sidecar.providers")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
# An error body is read only to extract the provider's message.
_MAX_ERROR_BODY = 64 * 1024
_CLOSE_TIMEOUT = 5.0


class _Resume:
    """Awaits the rest of a coroutine whose first step already ran (and suspended).

    It forwards what the coroutine yields to the event loop and what the loop sends
    or throws back, exactly as ``await`` would have done from the first step on.
    """

    __slots__ = ("_steps", "_first")

    def __init__(self, steps: Generator[Any, Any, Any], first: Any) -> None:
        self._steps = steps
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self._steps
        value = self._first
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # cancellation included: handed on, never swallowed
                try:
                    value = steps.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = steps.send(sent)
                except StopIteration as stop:
                    return stop.value


class _IdleStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, idle: float, request: httpx2.Request) -> None:
        self._inner = inner
        self._idle = idle
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            # The first step of the read runs bare: when the chunk is already there
            # (in-memory transports, buffered data) it costs no timer at all. Only a
            # read that suspends gets the deadline; arming a cancel scope per chunk
            # would cost more than parsing the chunk.
            steps = chunks.__anext__().__await__()
            try:
                first = steps.send(None)
            except StopIteration as stop:
                chunk = stop.value
            except StopAsyncIteration:
                return
            else:
                # Entered and left between two yields of this generator, never across one.
                with anyio.CancelScope(deadline=anyio.current_time() + self._idle) as scope:
                    try:
                        chunk = await _Resume(steps, first)
                    except StopAsyncIteration:
                        return
                if scope.cancelled_caught:
                    raise httpx2.ReadTimeout(f"no data for {self._idle:g}s", request=self._request)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class IdleTimeoutTransport(httpx2.AsyncBaseTransport):
    """Applies the request's ``read`` timeout to the wait for headers and between chunks.

    httpcore enforces it per socket read already; test transports do not, so
    this makes a stall look the same (httpx2.ReadTimeout) whatever the transport.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts = request.extensions.get("timeout") or {}
        idle = timeouts.get("read")
        if idle is None:
            return await self._inner.handle_async_request(request)
        try:
            with anyio.fail_after(idle):
                response = await self._inner.handle_async_request(request)
        except TimeoutError as exc:
            raise httpx2.ReadTimeout(f"no response for {idle:g}s", request=request) from exc
        stream = response.stream
        if isinstance(stream, httpx2.AsyncByteStream):
            response.stream = _IdleStream(stream, idle, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def make_client(settings: ProviderSettings, transport: httpx2.AsyncBaseTransport | None) -> httpx2.AsyncClient:
    timeout = httpx2.Timeout(
        connect=settings.connect_timeout,
        read=settings.idle_timeout,
        write=settings.idle_timeout,
        pool=settings.connect_timeout,
    )
    if transport is not None and not isinstance(transport, httpx2.AsyncHTTPTransport):
        transport = IdleTimeoutTransport(transport)
    install_http_log_filter()
    client = httpx2.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)
    if transport is None:
        pace_client(client)  # many streams at once: fewer, larger reads (sidecar/providers/pacing.py)
    return client


def parse_retry_after(headers: httpx2.Headers, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, or None when it did not say (or said nonsense)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        value = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, value)
    return value if math.isfinite(value) and value >= 0 else None


def retry_delay(settings: ProviderSettings, attempt: int, headers: httpx2.Headers | None = None) -> float:
    """The wait before retry number ``attempt + 1``."""
    asked = parse_retry_after(headers) if headers is not None else None
    if asked is not None:
        return min(asked, settings.retry_after_cap)
    base = settings.retry_backoff * float(2**attempt)
    # Jitter spreads clients that failed together; never below 3/4 of the base.
    return min(base * (0.75 + 0.25 * random.random()), settings.retry_after_cap)


async def close_quietly(response: httpx2.Response) -> None:
    # Shielded: a cancelled task must still release the connection.
    with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
        await response.aclose()


async def read_error_body(response: httpx2.Response) -> bytes:
    """At most ~_MAX_ERROR_BODY bytes of a body read only for its error message."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= _MAX_ERROR_BODY:
            break
    return bytes(data)


def _transport_failure(exc: httpx2.TransportError) -> tuple[ErrorKind, str]:
    if isinstance(exc, httpx2.UnsupportedProtocol):
        return "bad_request", "unsupported URL"
    if isinstance(exc, (httpx2.ConnectTimeout, httpx2.PoolTimeout)):
        return "connect", "connect timeout"
    if isinstance(exc, httpx2.TimeoutException):
        return "timeout", "no response in time"
    if isinstance(exc, httpx2.ConnectError):
        return "connect", "cannot connect"
    if isinstance(exc, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)):
        return "disconnect", "connection closed before a response"
    return "connect", "transport error"


@asynccontextmanager
async def open_response(
    client: httpx2.AsyncClient,
    *,
    url: httpx2.URL,
    body: bytes | None,
    headers: dict[str, str],
    settings: ProviderSettings,
    describe: Callable[[str], str],
    timeout: httpx2.Timeout | None = None,
    method: str = "POST",
) -> AsyncIterator[httpx2.Response]:
    """Send ``body`` and yield the 2xx response, unread, retrying what is safe to retry.

    ``describe`` turns a detail into a full, redacted message naming the provider.
    """
    if problem := headers_problem(headers):
        # a key from an environment variable, or stored before keys were checked
        raise ProviderCallError(describe(f"{problem}; check the API key, its environment variable and the headers"),
                                kind="bad_request", provider=settings.type)
    attempt = 0
    while True:
        try:
            request = client.build_request(
                method, url, content=body, headers=headers, timeout=timeout or client.timeout
            )
        except httpx2.InvalidURL as exc:
            raise ProviderCallError(describe(f"invalid URL ({exc})"), kind="bad_request", provider=settings.type) from exc
        failure: ProviderCallError
        delay_headers: httpx2.Headers | None = None
        try:
            response = await client.send(request, stream=True)
        except httpx2.TransportError as exc:
            kind, what = _transport_failure(exc)
            failure = ProviderCallError(
                describe(f"{what} ({type(exc).__name__}: {exc})"),
                kind=kind,
                retryable=kind != "bad_request",
                provider=settings.type,
            )
            cause: BaseException = exc
        else:
            if 200 <= response.status_code < 300:
                try:
                    yield response
                finally:
                    await close_quietly(response)
                return
            try:
                try:
                    detail = error_detail(await read_error_body(response))
                except httpx2.TransportError:
                    detail = "(error body unreadable)"
            finally:
                await close_quietly(response)
            status = response.status_code
            location = response.headers.get("location")
            if 300 <= status < 400 and location:
                # Redirects are not followed (a POST would be replayed elsewhere): say where.
                detail = f"redirected to {safe_url(location)}; check the base URL"
            failure = ProviderCallError(
                describe(f"HTTP {status} {response.reason_phrase}: {detail}"),
                kind="http",
                status=status,
                retryable=status in RETRY_STATUSES,
                provider=settings.type,
                retry_after=parse_retry_after(response.headers),
            )
            delay_headers = response.headers
            cause = failure
        if not failure.retryable or attempt >= settings.max_retries:
            if cause is failure:
                raise failure
            raise failure from cause
        delay = retry_delay(settings, attempt, delay_headers)
        attempt += 1
        log.warning("%s; retry %d/%d in %.2fs", failure.message, attempt, settings.max_retries, delay)
        await anyio.sleep(delay)
