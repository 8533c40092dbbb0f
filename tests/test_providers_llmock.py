"""OpenAI and Anthropic adapters against llmock, a real fake provider server on loopback.

llmock runs as a subprocess for the whole module; each test scripts the next replies
through its ``/_llmock`` control API and reads back what it received.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from provider_helpers import text_of

from protocol.types import TextPart
from sidecar.providers import (
    ChatRequest,
    Finish,
    ModelInfo,
    ProviderSettings,
    RequestMessage,
    ToolCallEnd,
    ToolCallStart,
    ToolSpec,
    UsageUpdate,
    create_provider,
)
from sidecar.providers.replay import drain

pytestmark = pytest.mark.anyio

LLMOCK = Path(sys.executable).with_name("llmock")
REPLY = "The quick brown fox jumps over the lazy dog again and again."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def llmock() -> Iterator[str]:
    if not LLMOCK.exists():
        pytest.fail(f"llmock is not installed next to {sys.executable} (pip install -e .[test])")
    port = _free_port()
    proc = subprocess.Popen(
        [str(LLMOCK), "serve", "--host", "127.0.0.1", "--port", str(port), "--response-style", "static", "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llmock exited with {proc.returncode} before answering")
            try:
                if httpx2.get(f"{base}/_llmock/scenario", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llmock did not answer within 20s")
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
async def mock(llmock: str) -> Any:
    async with httpx2.AsyncClient(base_url=llmock, timeout=5) as admin:
        (await admin.post("/_llmock/reset")).raise_for_status()
        yield admin


async def script(admin: httpx2.AsyncClient, *behaviors: dict[str, Any]) -> None:
    (await admin.post("/_llmock/scenario", json={"behaviors": list(behaviors)})).raise_for_status()


async def served(admin: httpx2.AsyncClient) -> list[dict[str, Any]]:
    response = await admin.get("/_llmock/requests")
    response.raise_for_status()
    return list(response.json()["requests"])


KINDS = {
    "openai-compat": ("/v1", "gpt-4o-mini"),
    "anthropic": ("/anthropic", "claude-sonnet-4-5"),
}


def provider_for(llmock: str, kind: str, **kw: Any) -> Any:
    path, _ = KINDS[kind]
    settings = ProviderSettings(
        type=kind,  # type: ignore[arg-type]
        base_url=llmock + path,
        api_key="sk-llmock-test-123456",
        retry_backoff=0.01,
        **kw,
    )
    return create_provider(settings)


def chat(kind: str, tools: list[ToolSpec] | None = None) -> ChatRequest:
    return ChatRequest(
        model=ModelInfo(id=KINDS[kind][1]),
        messages=[RequestMessage(role="user", parts=[TextPart(text="Say something")])],
        tools=tools or [],
    )


both = pytest.mark.parametrize("kind", list(KINDS))


@both
async def test_scripted_reply_streams_text_usage_and_finish(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    await script(mock, {"type": "reply", "text": REPLY})
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        parts, error = await drain(provider.stream(chat(kind)))
    await provider.aclose()
    assert error is None
    assert text_of(parts) == REPLY
    assert any(isinstance(p, UsageUpdate) and p.usage.output_tokens > 0 for p in parts)
    assert parts[-1] == Finish("stop", "stop" if kind == "openai-compat" else "end_turn")
    (record,) = await served(mock)
    assert record["stream"] is True and record["status"] == 200


@both
async def test_scripted_tool_calls(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    calls: list[dict[str, Any]] = [
        {"name": "get_weather", "arguments": {"city": "Paris", "detail": "a fairly long argument to fragment"}},
        {"name": "get_time", "arguments": {"tz": "Europe/Paris"}},
    ]
    await script(mock, {"type": "reply", "tool_calls": calls})
    tools = [ToolSpec(name=c["name"], parameters={"type": "object"}) for c in calls]
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        parts, error = await drain(provider.stream(chat(kind, tools)))
    await provider.aclose()
    assert error is None
    ends = [p for p in parts if isinstance(p, ToolCallEnd)]
    assert [(e.name, json.loads(e.arguments)) for e in ends] == [(c["name"], c["arguments"]) for c in calls]
    assert [p.id for p in parts if isinstance(p, ToolCallStart)] == [e.id for e in ends]
    assert isinstance(parts[-1], Finish) and parts[-1].reason == "tool_calls"


@both
async def test_generate_non_streaming(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    await script(mock, {"type": "reply", "text": REPLY})
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        parts = await provider.generate(chat(kind))
    await provider.aclose()
    assert text_of(parts) == REPLY and parts[-1] == Finish("stop", "stop" if kind == "openai-compat" else "end_turn")
    (record,) = await served(mock)
    assert record["stream"] is False


@both
async def test_429_with_retry_after_is_retried(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    await script(mock, {"type": "fail", "status": 429, "retry_after": 0.05}, {"type": "reply", "text": REPLY})
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        parts, error = await drain(provider.stream(chat(kind)))
    await provider.aclose()
    assert error is None and text_of(parts) == REPLY
    first, second = await served(mock)
    assert (first["status"], second["status"]) == (429, 200)
    assert first["retry_after"] == pytest.approx(0.05)  # retry-after-ms: 50 (retry-after: 1)
    assert first["fingerprint"] == second["fingerprint"]  # the same request, resent
    # we waited what retry-after-ms asked (50 ms), not the 10 ms backoff
    assert second["started_at"] - first["ended_at"] >= 0.04


@both
async def test_500_retried_then_failing(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    await script(mock, {"type": "fail", "status": 500, "retry_after": 0.01, "times": 3, "message": "backend exploded"})
    provider = provider_for(llmock, kind, max_retries=2)
    with anyio.fail_after(10):
        parts, error = await drain(provider.stream(chat(kind)))
    await provider.aclose()
    assert parts == []
    assert error is not None and error.kind == "http" and error.status == 500 and error.retryable
    assert "backend exploded" in error.message
    assert [r["status"] for r in await served(mock)] == [500, 500, 500]


@both
async def test_400_is_not_retried(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    await script(mock, {"type": "fail", "status": 400, "message": "bad field"})
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        _, error = await drain(provider.stream(chat(kind)))
    await provider.aclose()
    assert error is not None and error.status == 400 and not error.retryable and "bad field" in error.message
    assert len(await served(mock)) == 1


@both
@pytest.mark.parametrize("fault", ["disconnect", "truncate", "malformed"])
async def test_mid_stream_fault_ends_with_error_after_partial_text(
    kind: str, fault: str, llmock: str, mock: httpx2.AsyncClient
) -> None:
    await script(mock, {"type": "reply", "text": REPLY}, {"type": "stream_fault", "kind": fault, "after_chunks": 5})
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        parts, error = await drain(provider.stream(chat(kind)))
    await provider.aclose()
    partial = text_of(parts)
    assert partial and REPLY.startswith(partial) and partial != REPLY
    expected = {"disconnect": "disconnect", "truncate": "truncated", "malformed": "malformed"}[fault]
    assert error is not None and error.kind == expected
    assert not any(isinstance(p, Finish) for p in parts)
    assert len(await served(mock)) == 1  # nothing is retried after the first byte


@both
async def test_stall_past_idle_timeout(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    await script(
        mock, {"type": "reply", "text": REPLY}, {"type": "stream_fault", "kind": "stall", "after_chunks": 5, "stall_seconds": 3}
    )
    provider = provider_for(llmock, kind, idle_timeout=0.3)
    with anyio.fail_after(10):
        parts, error = await drain(provider.stream(chat(kind)))
    await provider.aclose()
    assert text_of(parts) and error is not None and error.kind == "stall"


@both
async def test_list_models(kind: str, llmock: str, mock: httpx2.AsyncClient) -> None:
    provider = provider_for(llmock, kind)
    with anyio.fail_after(10):
        models = await provider.list_models()
    await provider.aclose()
    assert models and all(isinstance(m, str) and m for m in models)
    if kind == "anthropic":
        assert "claude-sonnet-4-6" in models
