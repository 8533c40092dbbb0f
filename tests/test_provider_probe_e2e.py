"""provider:test and provider:models over the real server against loopback fakes of
the three wire formats (fixtures/model_endpoints.py): their model lists (Anthropic's pages
followed, Ollama's context sizes from /api/show), a one-token test call, and their error
shapes typed (401 bodies, 404, 429 with Retry-After, malformed JSON, timeouts, no
connection); per-provider timeoutS and maxRetries honoured."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from loopback_fixture import fixture_port
from sidecar_proc import CallError, SidecarProcess, spawn_sidecar

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
GOOD = "sk-good"


class Endpoints:
    def __init__(self, port: int) -> None:
        self.root = f"http://127.0.0.1:{port}"

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        async with httpx2.AsyncClient() as client:
            (await client.post(self.root + path, json=body)).raise_for_status()

    async def fault(self, path: str, **fault: Any) -> None:
        await self._post("/_fault", {"path": path, **fault})

    async def reset(self) -> None:
        await self._post("/_reset", {})

    async def requests(self) -> list[dict[str, Any]]:
        async with httpx2.AsyncClient() as client:
            return (await client.get(self.root + "/_requests")).json()


@asynccontextmanager
async def model_endpoints() -> AsyncIterator[Endpoints]:
    async with fixture_port(ROOT / "fixtures" / "model_endpoints.py") as port:
        yield Endpoints(port)


def config(fake: Endpoints, kind: str, **extra: Any) -> dict[str, Any]:
    prefix = {"openai-compat": "/openai/v1", "anthropic": "/anthropic", "ollama": "/ollama"}[kind]
    return {"name": f"{kind} fake", "type": kind, "baseUrl": fake.root + prefix, **extra}


async def upsert(proc: SidecarProcess, fake: Endpoints, kind: str, **extra: Any) -> str:
    extra.setdefault("apiKey", GOOD)
    return str((await proc.call("provider:upsert", config(fake, kind, **extra)))["id"])


async def test_models_of_the_three_formats_with_their_context_sizes(tmp_path: Path) -> None:
    async with model_endpoints() as fake, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        openai = await upsert(proc, fake, "openai-compat", models=[{"id": "gpt-4o"}])
        listed = await proc.call("provider:models", {"id": openai})
        assert [(m["id"], m["contextWindow"], m["configured"], m["ownedBy"]) for m in listed["models"]] == [
            ("gpt-4o", 128000, True, "system"), ("gpt-4o-mini", 128000, False, "system"),
            ("text-embedding-3-small", None, False, "system")]
        assert listed["models"][0]["createdAt"] == 1715367049000
        anthropic = await upsert(proc, fake, "anthropic")
        listed = await proc.call("provider:models", {"id": anthropic})
        assert [(m["id"], m["name"], m["contextWindow"], m["maxOutputTokens"]) for m in listed["models"]] == [
            ("claude-haiku-4-5", "Claude Haiku 4 5", 200000, 64000),
            ("claude-opus-4-1", "Claude Opus 4 1", 200000, 64000),
            ("claude-sonnet-4-5", "Claude Sonnet 4 5", 200000, 64000)]
        pages = [r for r in await fake.requests() if r["path"] == "/anthropic/v1/models"]
        assert len(pages) == 2 and all(r["auth"] == GOOD for r in pages)  # has_more followed
        ollama = await upsert(proc, fake, "ollama", apiKey=None)
        await fake.fault("/ollama/api/show", status=400, body={"error": "boom"})
        listed = await proc.call("provider:models", {"id": ollama})
        contexts = {m["id"]: m["contextWindow"] for m in listed["models"]}
        assert set(contexts) == {"llama3.2:latest", "qwen3:8b"}
        # one /api/show failed: that model is listed without its size, and the notes say so
        assert sorted(contexts.values(), key=str) in ([131072, None], [40960, None])
        assert len(listed["notes"]) == 1 and "no details" in listed["notes"][0]
        listed = await proc.call("provider:models", {"id": ollama})
        assert {m["id"]: m["contextWindow"] for m in listed["models"]} == {
            "llama3.2:latest": 131072, "qwen3:8b": 40960}
        # a configuration being edited, not stored yet
        unsaved = await proc.call("provider:models", {"config": config(fake, "anthropic", apiKey=GOOD)})
        assert len(unsaved["models"]) == 3
        await proc.close()


async def test_a_test_call_per_format_and_every_error_typed(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    async with model_endpoints() as fake, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        ids = {
            "openai-compat": await upsert(proc, fake, "openai-compat", models=[{"id": "gpt-4o-mini"}]),
            "anthropic": await upsert(proc, fake, "anthropic", models=[{"id": "claude-haiku-4-5"}]),
            "ollama": await upsert(proc, fake, "ollama", apiKey=None, models=[{"id": "qwen3:8b"}]),
        }
        for kind, provider_id in ids.items():
            result = await proc.call("provider:test", {"id": provider_id})
            assert result["ok"] and result["call"] == "chat" and result["error"] is None, (kind, result)
            assert result["latencyMs"] >= 0 and result["modelId"]
        chats = [r["path"] for r in await fake.requests() if not r["path"].endswith(("models", "tags", "show"))]
        assert chats == ["/openai/v1/chat/completions", "/anthropic/v1/messages", "/ollama/api/chat"]

        async def error(params: dict[str, Any]) -> dict[str, Any]:
            result = await proc.call("provider:test", params)
            assert result["ok"] is False, result
            assert GOOD not in str(result)
            return result["error"]

        # wrong keys: each format's 401 body
        for kind, needle in (("openai-compat", "Incorrect API key"), ("anthropic", "invalid x-api-key")):
            bad = await error({"config": config(fake, kind, apiKey="sk-bad", models=[{"id": "m"}])})
            assert (bad["kind"], bad["status"]) == ("auth", 401) and needle in bad["message"], bad
        # an unknown model: 404 in each format
        for kind, provider_id in ids.items():
            missing = await error({"id": provider_id, "modelId": "no-such-model"})
            assert (missing["kind"], missing["status"]) == ("not_found", 404), (kind, missing)
        # 429 with Retry-After: reported, not waited out, one request only
        await fake.reset()
        await fake.fault("/openai/v1/chat/completions", status=429, headers={"retry-after": "7"},
                         body={"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})
        limited = await error({"id": ids["openai-compat"]})
        assert (limited["kind"], limited["status"], limited["retryAfterMs"]) == ("rate_limited", 429, 7000)
        assert "Rate limit reached" in limited["message"]
        assert len(await fake.requests()) == 1
        # malformed JSON answers
        await fake.fault("/anthropic/v1/messages", status=200, raw="{not json")
        assert (await error({"id": ids["anthropic"]}))["kind"] == "bad_response"
        await fake.fault("/openai/v1/models", status=200, raw="<html>proxy</html>")
        garbled = await error({"config": config(fake, "openai-compat", apiKey=GOOD)})  # no model: the list is asked
        assert garbled["kind"] == "bad_response"
        # the provider's timeoutS bounds the wait
        await fake.fault("/ollama/api/chat", hang_s=3.0, status=200, body={})
        slow = await error({"config": config(fake, "ollama", models=[{"id": "qwen3:8b"}], timeoutS=0.4)})
        assert slow["kind"] == "timeout" and slow["status"] is None
        # nobody listening
        down = await error({"config": {"name": "down", "type": "ollama", "baseUrl": f"http://127.0.0.1:{closed}",
                                       "models": [{"id": "m"}]}})
        assert down["kind"] == "network"
        # a stored provider being edited: the key left out is the stored one
        edited = await proc.call("provider:test", {"config": config(fake, "anthropic", id=ids["anthropic"],
                                                                    models=[{"id": "claude-opus-4-1"}])})
        assert edited["ok"] and edited["modelId"] == "claude-opus-4-1"
        # bad params
        for params, field in (({}, "id"), ({"id": ids["ollama"], "config": config(fake, "ollama")}, "id"),
                              ({"config": {**config(fake, "ollama"), "baseUrl": "ftp://x"}}, "config.baseUrl"),
                              ({"config": {**config(fake, "ollama"), "timeoutS": 0}}, "timeoutS")):
            with pytest.raises(CallError) as err:
                await proc.call("provider:test", params)
            assert err.value.code == -32602 and field in err.value.message, err.value.message
        with pytest.raises(CallError) as err:
            await proc.call("provider:test", {"id": "nope"})
        assert err.value.code == -32001
        await proc.close()
    proc.assert_all_jsonrpc()


async def test_max_retries_and_timeouts_are_the_providers_own(tmp_path: Path) -> None:
    async with model_endpoints() as fake, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        patient = await upsert(proc, fake, "openai-compat", maxRetries=2)
        info = next(p for p in await proc.call("provider:list") if p["id"] == patient)
        assert (info["maxRetries"], info["timeoutS"]) == (2, None)
        throttled = {"status": 429, "headers": {"retry-after": "0"}, "body": {"error": {"message": "slow down"}}}
        await fake.fault("/openai/v1/models", times=2, **throttled)
        listed = await proc.call("provider:models", {"id": patient})
        assert len(listed["models"]) == 3 and len(await fake.requests()) == 3  # two retries, then the list
        await fake.reset()
        hasty = await upsert(proc, fake, "openai-compat", maxRetries=0, timeoutS=30)
        await fake.fault("/openai/v1/models", times=2, **throttled)
        with pytest.raises(CallError) as err:
            await proc.call("provider:models", {"id": hasty})
        assert err.value.code == -32004 and err.value.data["kind"] == "rate_limited"
        assert err.value.data["status"] == 429 and len(await fake.requests()) == 1
        # a model list that does not come within timeoutS
        short = await upsert(proc, fake, "openai-compat", timeoutS=0.4, maxRetries=0)
        await fake.reset()
        await fake.fault("/openai/v1/models", hang_s=3.0, status=200, body={"data": []})
        with pytest.raises(CallError) as err:
            await proc.call("provider:models", {"id": short})
        assert err.value.code == -32004 and err.value.data["kind"] == "timeout"
        await proc.close()
