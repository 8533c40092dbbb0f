"""Shared steps of the generation end-to-end tests: llmock as a subprocess, bounded polling
of a peer's state, and a sidecar with the scripted provider configured."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2

from chat_helpers import API_KEY, FINAL_TYPES
from sidecar_proc import SidecarProcess

T = TypeVar("T")
LLMOCK = Path(sys.executable).with_name("llmock")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def llmock_server() -> Iterator[str]:
    """llmock on loopback (its own process) for one test; yields its base URL."""
    if not LLMOCK.exists():
        raise AssertionError(f"llmock is not installed next to {sys.executable} (pip install -e .[test])")
    port = _free_port()
    proc = subprocess.Popen(
        [str(LLMOCK), "serve", "--host", "127.0.0.1", "--port", str(port), "--response-style", "static",
         "--log-level", "warning"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"llmock exited with {proc.returncode} before answering")
            try:
                if httpx2.get(f"{base}/_llmock/scenario", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("llmock did not answer within 30s")
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def llmock_script(base: str, *behaviors: dict[str, Any]) -> None:
    async with httpx2.AsyncClient(base_url=base, timeout=5) as admin:
        (await admin.post("/_llmock/reset")).raise_for_status()
        (await admin.post("/_llmock/scenario", json={"behaviors": list(behaviors)})).raise_for_status()


async def llmock_requests(base: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=base, timeout=5) as admin:
        response = await admin.get("/_llmock/requests")
        response.raise_for_status()
        return list(response.json()["requests"])


async def eventually(probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], timeout: float = 20) -> T:
    """Poll ``probe`` until ``accept`` holds (for peer state nothing announces); bounded."""
    with anyio.fail_after(timeout):
        while True:
            value = await probe()
            if accept(value):
                return value
            await anyio.sleep(0.05)


async def setup(proc: SidecarProcess, base_url: str, *, models: list[dict[str, Any]] | None = None,
                settings: dict[str, Any] | None = None, **provider: Any) -> dict[str, Any]:
    """Handshake, the scripted (OpenAI-compatible) provider as default, titles off unless
    ``settings`` says otherwise; returns the provider."""
    await proc.call("sidecar:initialize", {"protocolVersion": 1})
    models = models or [{"id": "scripted-1"}]
    created = await proc.call("provider:upsert", {
        "name": "Scripted", "type": "openai-compat", "baseUrl": base_url, "apiKey": API_KEY, "models": models,
        **provider,
    })
    await proc.call("provider:setDefault", {"providerId": created["id"], "modelId": models[0]["id"]})
    await proc.call("settings:update", {"generateTitles": False, **(settings or {})})
    return created


def events_for(proc: SidecarProcess, message_id: str) -> list[dict[str, Any]]:
    return [e for e in proc.notifications("chat:stream") if e["messageId"] == message_id]


def final_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    finals = [e for e in events if e["type"] in FINAL_TYPES]
    assert len(finals) == 1, [e["type"] for e in events]
    return finals[0]
