"""Shared steps of the V1 endpoint tests: a sidecar with compat started, raw HTTP on loopback."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from acp_helpers import AGENT
from chat_helpers import configure_provider
from scripted_server import ScriptedServer, scripted_provider
from sidecar_proc import ROOT, SidecarProcess, spawn_sidecar

sys.path.insert(0, str(ROOT))
from fixtures.v1_client import SandboxClient, agent_request  # noqa: E402

AGENT_COMMAND = "scripted-agent"
"""The agent_server.command the tests' requests name; compat:start maps it to the scripted agent."""


class V1:
    def __init__(self, proc: SidecarProcess, info: dict[str, Any], server: ScriptedServer | None) -> None:
        self.proc = proc
        self.info = info
        self.server = server
        self.url: str = info["url"]
        self.port: int = info["port"]
        self.token: str = info["token"]
        self.client = SandboxClient(self.url, self.token)

    def agent(self, prompt: str, *flags: str, project_id: str = "p1", **server: Any) -> dict[str, Any]:
        """An AgentRequest running the scripted ACP agent."""
        agent_server = {"agent_id": "scripted", "command": AGENT_COMMAND, "args": [str(AGENT), *flags], "env": {}, **server}
        return agent_request(prompt, project_id=project_id, agent_config={"agent_server": agent_server})

    def direct(self, prompt: str, *, project_id: str = "d1", **extra: Any) -> dict[str, Any]:
        """An AgentRequest served by the scripted provider as a direct model."""
        assert self.server is not None
        provider = {"id": "12", "name": "Scripted", "base_url": self.server.base_url, "api_key": "sk-v1-SECRET-9",
                    "default_model": "scripted-1", "api_protocol": "openai", "requires_openai_auth": True}
        return agent_request(prompt, project_id=project_id, model_provider=provider, **extra)

    async def status(self) -> dict[str, Any]:
        return await self.proc.call("compat:status", {})

    async def wait_clients(self, count: int, timeout: float = 10) -> None:
        with anyio.fail_after(timeout):
            while (await self.status())["sseClients"] != count:
                await anyio.sleep(0.02)

    async def wait_idle(self, timeout: float = 20) -> None:
        with anyio.fail_after(timeout):
            while (await self.status())["runningTurns"]:
                await anyio.sleep(0.02)


@asynccontextmanager
async def v1_sidecar(
    tmp_path: Path, *, provider: bool = True, env: dict[str, str] | None = None, **start: Any
) -> AsyncIterator[V1]:
    """A sidecar (and the scripted provider as its default) with the V1 endpoint started on
    a free loopback port; the scripted agent is allowed as ``scripted-agent`` (with the
    request's arguments)."""
    start.setdefault("port", 0)
    # the tests choose the scripted agent's flags per request: the host lets them
    start.setdefault("agentCommands", {AGENT_COMMAND: {"command": sys.executable, "requestArgs": True}})
    async with _maybe_provider(provider) as server, spawn_sidecar(tmp_path / "data", env=env) as proc:
        if server is not None:
            await configure_provider(proc, server.base_url)
        else:
            await proc.call("sidecar:initialize", {})
        info = await proc.call("compat:start", start)
        v1 = V1(proc, info, server)
        try:
            yield v1
        finally:
            await v1.client.aclose()


@asynccontextmanager
async def _maybe_provider(wanted: bool) -> AsyncIterator[ScriptedServer | None]:
    if not wanted:
        yield None
        return
    async with scripted_provider() as server:
        yield server


async def raw_http(port: int, request: bytes, *, read_timeout: float = 10) -> bytes:
    """Send ``request`` as is on a new connection and read until the server closes or is quiet."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        return await read_response(stream, read_timeout)


async def read_response(stream: Any, timeout: float = 10) -> bytes:
    """Bytes until the end of one response (Content-Length or close), bounded by ``timeout``."""
    data = b""
    with anyio.move_on_after(timeout):
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length" and len(body) >= int(value):
                        return data
    return data


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]
