"""Failures around the stream: retries before the first byte, disconnects, stalls,
cancellation, and secrets kept out of every message, log line and repr."""

from __future__ import annotations

import logging
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import anyio
import httpx2
import msgspec
import pytest
from provider_helpers import text_of

from protocol.providers import ProviderUpsertParams
from protocol.types import TextPart
from sidecar.providers import (
    ChatRequest,
    ModelInfo,
    ProviderCallError,
    ProviderSettings,
    RequestMessage,
    TextDelta,
    create_provider,
)
from sidecar.providers.replay import (
    Reply,
    ScriptedTransport,
    drain,
    json_reply,
    sse_reply,
)
from sidecar.providers.transport import parse_retry_after, retry_delay
from sidecar.store import Store

pytestmark = pytest.mark.anyio

SECRET = "sk-live-SECRET-0123456789abcdef"
HEADER_SECRET = "tok-HEADER-abcdef0123"


def settings(type_: str = "openai-compat", **kw: Any) -> ProviderSettings:
    base: dict[str, Any] = {
        "type": type_,
        "base_url": "https://api.example.test/v1",
        "api_key": SECRET,
        "retry_backoff": 0.001,
        "max_retries": 2,
    }
    base.update(kw)
    return ProviderSettings(**base)


REQUEST = ChatRequest(model=ModelInfo(id="gpt-4o-mini"), messages=[RequestMessage(role="user", parts=[TextPart(text="hi")])])


async def stream_with(transport: ScriptedTransport, **kw: Any) -> tuple[list[Any], ProviderCallError | None]:
    provider = create_provider(settings(**kw), transport=transport)
    try:
        with anyio.fail_after(5):
            return await drain(provider.stream(REQUEST))
    finally:
        await provider.aclose()


# -- retries before the first byte ---------------------------------------------------------


async def test_429_with_retry_after_is_retried_then_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "sidecar.providers")
    rate_limited = json_reply(
        {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
        status=429,
        headers={"retry-after": "1", "retry-after-ms": "20"},
    )
    transport = ScriptedTransport(rate_limited, sse_reply("openai/text.sse"))
    parts, error = await stream_with(transport)
    assert error is None and text_of(parts) == "Hello! How can I help you today?"
    assert len(transport.requests) == 2
    # the wait came from retry-after-ms (0.02s), not the backoff (0.001s)
    assert "HTTP 429" in caplog.text and "retry 1/2 in 0.02s" in caplog.text


async def test_500_is_retried_then_fails_with_the_provider_message() -> None:
    boom = json_reply({"error": {"message": "The server had an error", "type": "server_error"}}, status=500)
    transport = ScriptedTransport(boom, boom, boom)
    parts, error = await stream_with(transport)
    assert parts == []
    assert error is not None and error.kind == "http" and error.status == 500 and error.retryable
    assert "The server had an error" in error.message and "HTTP 500" in error.message
    assert len(transport.requests) == 3  # first try + max_retries


@pytest.mark.parametrize("status", [408, 502, 503, 504, 529])
async def test_other_retryable_statuses(status: int) -> None:
    transport = ScriptedTransport(json_reply({"error": "busy"}, status=status), sse_reply("openai/text.sse"))
    parts, error = await stream_with(transport)
    assert error is None and len(transport.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_are_not_retried(status: int) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "messages: text content blocks must be non-empty"}}
    transport = ScriptedTransport(json_reply(body, status=status))
    parts, error = await stream_with(transport, type_="anthropic")
    assert parts == [] and len(transport.requests) == 1
    assert error is not None and error.kind == "http" and error.status == status and not error.retryable
    assert "text content blocks must be non-empty" in error.message
    assert "anthropic" in error.message


async def test_plain_text_error_body_is_quoted() -> None:
    transport = ScriptedTransport(Reply(status=400, headers={"content-type": "text/html"}, chunks=[b"<h1>Bad gateway config</h1>"]))
    _, error = await stream_with(transport)
    assert error is not None and "<h1>Bad gateway config</h1>" in error.message


async def test_connect_errors_are_retried_then_reported() -> None:
    attempts = 0

    def refuse(request: httpx2.Request) -> httpx2.Response:
        nonlocal attempts
        attempts += 1
        raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)

    provider = create_provider(settings(), transport=httpx2.MockTransport(refuse))
    with anyio.fail_after(5):
        parts, error = await drain(provider.stream(REQUEST))
    await provider.aclose()
    assert attempts == 3 and parts == []
    assert error is not None and error.kind == "connect" and error.retryable and "Connection refused" in error.message


async def test_connect_error_then_success() -> None:
    calls = 0
    body = sse_reply("openai/text.sse")

    def flaky(request: httpx2.Request) -> httpx2.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx2.ConnectError("refused", request=request)
        return httpx2.Response(200, headers=body.headers, content=b"".join(body.chunks))

    provider = create_provider(settings(), transport=httpx2.MockTransport(flaky))
    with anyio.fail_after(5):
        parts, error = await drain(provider.stream(REQUEST))
    await provider.aclose()
    assert error is None and calls == 2 and text_of(parts).startswith("Hello")


def test_retry_after_parsing_and_cap() -> None:
    s = settings(retry_backoff=0.5, retry_after_cap=30.0)
    assert parse_retry_after(httpx2.Headers({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert parse_retry_after(httpx2.Headers({"retry-after": "2"})) == 2.0
    now = time.time()
    dated = httpx2.Headers({"retry-after": formatdate(now + 10, usegmt=True)})
    assert 8.0 <= (parse_retry_after(dated, now=now) or 0) <= 10.0
    assert parse_retry_after(httpx2.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx2.Headers({"retry-after": "-3"})) is None
    assert retry_delay(s, 0, httpx2.Headers({"retry-after": "3600"})) == 30.0
    assert retry_delay(s, 0, httpx2.Headers({"retry-after": "0"})) == 0.0
    # exponential backoff with jitter in [0.75, 1] of the base when the server is silent
    assert 0.375 <= retry_delay(s, 0) <= 0.5
    assert 1.5 <= retry_delay(s, 2) <= 2.0


# -- after the first byte: no retry ---------------------------------------------------------


@pytest.mark.parametrize("type_", ["openai-compat", "anthropic"])
async def test_disconnect_mid_stream_keeps_partial_and_is_not_retried(type_: str) -> None:
    fixture = "openai/text.sse" if type_ == "openai-compat" else "anthropic/text.sse"
    transport = ScriptedTransport(sse_reply(fixture, fault="disconnect", fault_after=5), sse_reply(fixture))
    parts, error = await stream_with(transport, type_=type_)
    assert text_of(parts) != "" and len(transport.requests) == 1
    assert error is not None and error.kind == "disconnect" and error.retryable
    assert "RemoteProtocolError" in error.message


async def test_ndjson_disconnect() -> None:
    from sidecar.providers.replay import ndjson_reply

    transport = ScriptedTransport(ndjson_reply("ollama/text.ndjson", fault="disconnect", fault_after=2))
    parts, error = await stream_with(transport, type_="ollama", base_url="http://127.0.0.1:11434")
    assert text_of(parts) == "The sky"
    assert error is not None and error.kind == "disconnect"


async def test_stall_past_idle_timeout() -> None:
    transport = ScriptedTransport(sse_reply("openai/text.sse", fault="stall", fault_after=3))
    parts, error = await stream_with(transport, idle_timeout=0.2)
    assert text_of(parts) == "Hello!"
    assert error is not None and error.kind == "stall" and "0.2s" in error.message
    # the response was closed
    assert transport.bodies[0].closed.is_set()


async def test_slow_stream_within_idle_timeout_is_fine() -> None:
    # every read suspends here, so the watchdog is armed for each chunk and must not fire
    transport = ScriptedTransport(sse_reply("openai/text.sse", pause=0.01))
    parts, error = await stream_with(transport, idle_timeout=1.0)
    assert error is None and text_of(parts) == "Hello! How can I help you today?"


async def test_no_response_headers_within_idle_timeout_is_a_retryable_timeout() -> None:
    async def hang(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    provider = create_provider(settings(idle_timeout=0.05, max_retries=1), transport=httpx2.MockTransport(hang))
    with anyio.fail_after(5):
        parts, error = await drain(provider.stream(REQUEST))
    await provider.aclose()
    assert parts == [] and error is not None and error.kind == "timeout" and error.retryable


async def test_cancellation_propagates_and_closes_the_response() -> None:
    transport = ScriptedTransport(sse_reply("openai/text.sse", fault="stall", fault_after=2))
    provider = create_provider(settings(idle_timeout=60), transport=transport)
    got: list[Any] = []
    with anyio.fail_after(5):
        with anyio.CancelScope() as scope:
            async for part in provider.stream(REQUEST):
                got.append(part)
                if len(got) == 1:
                    scope.cancel()
        assert scope.cancelled_caught
        await transport.bodies[0].closed.wait()
    assert got == [TextDelta("Hello")]
    await provider.aclose()


async def test_closing_the_stream_early_closes_the_response() -> None:
    transport = ScriptedTransport(sse_reply("openai/text.sse"))
    provider = create_provider(settings(), transport=transport)
    stream = provider.stream(REQUEST)
    with anyio.fail_after(5):
        first = await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
        await transport.bodies[0].closed.wait()
    assert first == TextDelta("Hello")
    await provider.aclose()


async def test_cancelled_while_waiting_to_retry() -> None:
    transport = ScriptedTransport(json_reply({"error": "slow down"}, status=429, headers={"retry-after": "20"}))
    provider = create_provider(settings(retry_after_cap=30), transport=transport)
    with anyio.fail_after(5):
        with anyio.move_on_after(0.1) as scope:
            await drain(provider.stream(REQUEST))
    assert scope.cancelled_caught and len(transport.requests) == 1
    await provider.aclose()


# -- secrets ---------------------------------------------------------------------------------


async def test_api_key_never_in_errors_logs_or_reprs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET}. Header was {HEADER_SECRET}", "type": "invalid_request_error"}}
    retry_echo = json_reply({"error": {"message": f"overloaded for key {SECRET}"}}, status=503)
    transport = ScriptedTransport(retry_echo, json_reply(echo, status=401))
    s = settings(headers={"X-Custom-Token": HEADER_SECRET}, base_url="https://api.example.test/v1?api-version=2024-06-01&key=querysecret1")
    provider = create_provider(s, transport=transport)
    with anyio.fail_after(5):
        parts, error = await drain(provider.stream(REQUEST))
    assert error is not None and error.status == 401
    # the secrets really were sent, and really were echoed back
    sent = transport.requests[0]
    assert sent.headers["authorization"] == f"Bearer {SECRET}" and sent.headers["x-custom-token"] == HEADER_SECRET
    assert str(sent.url) == "https://api.example.test/v1/chat/completions?api-version=2024-06-01&key=querysecret1"
    with_userinfo = settings(base_url="https://user:hunter2pass@api.example.test/v1")
    texts = [error.message, str(error), repr(error), repr(error.data), repr(s), str(s), repr(provider), caplog.text]
    texts += [repr(with_userinfo), repr(create_provider(with_userinfo, transport=ScriptedTransport()))]
    texts += [repr(list(s.__rich_repr__())), repr(list(with_userinfo.__rich_repr__()))]
    for text in texts:
        for secret in (SECRET, HEADER_SECRET, "hunter2pass", "querysecret1"):
            assert secret not in text, (secret, text)
    assert "Incorrect API key provided: ***" in error.message
    assert "retry 1/2" in caplog.text  # the 503 was logged, redacted
    assert "HTTP Request: POST https://api.example.test/v1/chat/completions" in caplog.text
    await provider.aclose()


def test_stored_secret_headers_survive_a_masked_round_trip_and_stay_out_of_reprs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        params = ProviderUpsertParams(
            name="P", type="openai-compat", base_url="https://api.example.test/v1", api_key=SECRET,
            headers={"X-Api-Token": HEADER_SECRET, "X-Session-Id": "sess-secret-1", "X-Trace": "t"},
        )
        record = store.providers.upsert(params)
        info = record.to_info(is_default=False)
        # every value is masked, whatever its name
        assert info.headers == {"X-Api-Token": "***", "X-Session-Id": "***", "X-Trace": "***"}
        # provider:list -> edit -> upsert sends the masks back: the stored values stay
        edited = msgspec.structs.replace(params, id=record.id, headers={**info.headers, "X-Trace": "u"})
        again = store.providers.upsert(edited)
        assert again.headers == {"X-Api-Token": HEADER_SECRET, "X-Session-Id": "sess-secret-1", "X-Trace": "u"}
        assert store.providers.get(record.id).headers == again.headers
        # a new value replaces the stored one; a header not sent is gone
        replaced = store.providers.upsert(msgspec.structs.replace(edited, headers={"X-Api-Token": "new-token-1"}))
        assert replaced.headers == {"X-Api-Token": "new-token-1"}
        for text in (repr(again), str(again), repr(list(again.__rich_repr__()))):
            for secret in (SECRET, HEADER_SECRET, "sess-secret-1"):
                assert secret not in text, (secret, text)
    finally:
        store.close()


async def test_errors_carry_kind_status_retryable_in_data() -> None:
    transport = ScriptedTransport(json_reply({"error": {"message": "nope"}}, status=400))
    _, error = await stream_with(transport)
    assert error is not None
    assert error.data == {"kind": "http", "status": 400, "retryable": False}
    from sidecar.errors import ProviderError as BaseProviderError

    assert isinstance(error, BaseProviderError)


async def test_redirect_is_reported_not_followed() -> None:
    moved = Reply(status=301, headers={"location": "https://api.example.test/v1/chat/completions?key=abcdefgh1"})
    transport = ScriptedTransport(moved)
    _, error = await stream_with(transport)
    assert error is not None and error.status == 301 and not error.retryable and len(transport.requests) == 1
    assert "redirected to https://api.example.test/v1/chat/completions; check the base URL" in error.message
    assert error.provider == "openai-compat"


@pytest.mark.parametrize("location", ["http://evil:99999/x", "http://[::1/x", "http://h:port/x"])
async def test_a_redirect_to_a_malformed_url_is_a_provider_error(location: str) -> None:
    transport = ScriptedTransport(Reply(status=302, headers={"location": location}))
    _, error = await stream_with(transport)
    assert error is not None and error.status == 302 and "check the base URL" in error.message
    assert "evil" not in error.message  # not echoed half-parsed


async def test_a_non_stream_answer_is_read_only_up_to_the_error_body_cap() -> None:
    # a server that ignored stream=true and never ends its (JSON) body: only its head is read
    chunk = b'{"error": "' + b"x" * 16374
    endless = Reply(headers={"content-type": "application/json"}, chunks=[chunk] * 8, fault="stall", fault_after=8)
    _, error = await stream_with(ScriptedTransport(endless))  # bounded by fail_after(5)
    assert error is not None and error.kind == "malformed" and "expected an event stream" in error.message


def test_bad_base_url_is_a_bad_request() -> None:
    for url in ("ftp://example.test", "not a url", "http://[::1"):
        with pytest.raises(ProviderCallError) as info:
            create_provider(settings(base_url=url))
        assert info.value.kind == "bad_request"


@pytest.mark.parametrize("headers, api_key, named", [
    ({}, "sk-漢字-0123", "the value of header 'authorization'"),  # a key from an environment variable
    ({"X-Token": "a\r\nX-Injected: 1"}, SECRET, "the value of header 'X-Token'"),
    ({"X-Token": "tok\x00"}, SECRET, "the value of header 'X-Token'"),
    ({"X Token": "tok-value-1"}, SECRET, "header name 'X Token' must be letters, digits"),
])
async def test_a_key_or_header_that_http_cannot_carry_is_a_bad_request_sent_nowhere(
    headers: dict[str, str], api_key: str, named: str
) -> None:
    transport = ScriptedTransport(json_reply({"choices": []}))
    _, error = await stream_with(transport, headers=headers, api_key=api_key)
    assert error is not None and error.kind == "bad_request" and not error.retryable, error
    assert named in error.message and "check the API key, its environment variable and the headers" in error.message
    assert transport.requests == []  # nothing left the process, no retry
    for secret in (api_key, *headers.values()):
        assert secret not in error.message


def test_upsert_refuses_a_key_or_header_that_http_cannot_carry(tmp_path: Path) -> None:
    from sidecar.errors import InvalidParams

    store = Store(tmp_path)
    try:
        base = ProviderUpsertParams(name="P", type="openai-compat", base_url="https://api.example.test/v1", api_key=SECRET)
        for changes, where in (
            ({"api_key": "sk-é-0123"}, "$.apiKey"),
            ({"api_key": "sk-1\n"}, "$.apiKey"),
            ({"headers": {"X-Token": "a\r\nb"}}, "$.headers"),
            ({"headers": {"X-Token": "漢"}}, "$.headers"),
            ({"headers": {"X:Token": "v"}}, "$.headers"),
            ({"headers": {"": "v"}}, "$.headers"),
        ):
            with pytest.raises(InvalidParams) as err:
                store.providers.upsert(msgspec.structs.replace(base, **changes))
            assert where in err.value.message and "a\r\nb" not in err.value.message and "é" not in err.value.message
        assert store.providers.list() == []
        kept = store.providers.upsert(msgspec.structs.replace(base, headers={"X-Token": "tok\tv ok", "X_t.1~": "v"}))
        assert kept.headers == {"X-Token": "tok\tv ok", "X_t.1~": "v"}
    finally:
        store.close()
