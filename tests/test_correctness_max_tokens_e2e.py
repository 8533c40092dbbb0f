"""The output the context budget reserves is the output the request asks for, over a real
sidecar subprocess: OpenAI-compatible providers get it as ``max_tokens`` (reasoning models
as ``max_completion_tokens``), Ollama as ``options.num_predict``; a user's ``maxTokens`` is
bounded by the model's ``maxOutputTokens``; a model with neither a window nor a maximum
output gets no limit (the provider's default), as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat_helpers import wait_final
from generation_helpers import setup
from scripted_server import scripted_provider
from sidecar_proc import SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio


async def sent_body(proc: SidecarProcess, server: Any, provider_id: str, model_id: str) -> dict[str, Any]:
    """The body of the request one send made with ``provider/model``, checked against the
    budget ``chat:context:get`` reports for it."""
    session = await proc.call("chat:session:create", {"providerId": provider_id, "modelId": model_id})
    before = len(await server.requests())
    sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hello"}})
    assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"
    (body,) = (await server.requests())[before:]
    context = await proc.call("chat:context:get", {"sessionId": session["id"]})
    body["_reserved"] = context["lastRequest"]["reservedOutput"]
    return body


async def test_the_reserved_output_is_sent_as_the_output_limit(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await setup(proc, server.base_url, models=[
            {"id": "windowed", "contextWindow": 8000},
            {"id": "capped", "contextWindow": 100_000, "maxOutputTokens": 1000},
            {"id": "o3-mini", "contextWindow": 200_000, "maxOutputTokens": 3000},
            {"id": "plain"},
        ])
        pid = provider["id"]

        body = await sent_body(proc, server, pid, "windowed")  # a quarter of the window
        assert body["max_tokens"] == 2000 == body["_reserved"]

        body = await sent_body(proc, server, pid, "o3-mini")  # the model's maximum, as that family takes it
        assert body["max_completion_tokens"] == 3000 == body["_reserved"] and "max_tokens" not in body

        body = await sent_body(proc, server, pid, "plain")  # nothing reserved: the provider's default
        assert "max_tokens" not in body and "max_completion_tokens" not in body

        # the user's maxTokens, at most what the model can give
        await proc.call("settings:update", {"maxTokens": 5000})
        body = await sent_body(proc, server, pid, "capped")
        assert body["max_tokens"] == 1000 == body["_reserved"]
        body = await sent_body(proc, server, pid, "windowed")
        assert body["max_tokens"] == 5000 == body["_reserved"]
        await proc.call("settings:update", {"maxTokens": None})

        ollama = await proc.call("provider:upsert", {
            "name": "Local", "type": "ollama", "baseUrl": server.root,
            "models": [{"id": "llama3", "contextWindow": 4096}],
        })
        body = await sent_body(proc, server, ollama["id"], "llama3")
        assert body["options"]["num_predict"] == 1024 == body["_reserved"]
        await proc.close()
