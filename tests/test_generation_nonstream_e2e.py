"""Non-streaming replies over the real server (seed 000 section 6): a model with
``stream: false`` is asked with whole requests and its answers go through the same events
and message model (tool calls and the step loop included); an abort cancels the request in
flight; an endpoint that refuses to stream switches the model once, with a notice, and the
switch is remembered. Against the scripted OpenAI-compatible provider and llmock (Anthropic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from chat_helpers import assert_well_ordered, model_config, usage, wait_final
from generation_helpers import (
    events_for,
    eventually,
    llmock_requests,
    llmock_script,
    llmock_server,
    setup,
)
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

pytestmark = pytest.mark.anyio


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_a_non_streaming_model_runs_tools_over_two_steps_with_the_same_events(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, models=[{"id": "whole-1", "stream": False}])
        listed = await proc.call("provider:list")
        assert listed[0]["models"][0]["stream"] is False and listed[0]["stream"] is True
        await server.script(
            {"text": "Let me look.", "thinking": "The user wants the time.",
             "tool_calls": [{"id": "call_t", "name": "get_current_time", "arguments": {"timezone": "UTC"}}],
             "usage": {"prompt_tokens": 30, "completion_tokens": 7}},
            {"text": "It is the time the tool said.", "usage": {"prompt_tokens": 60, "completion_tokens": 9}},
        )
        session = await proc.call("chat:session:create", {})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "What time is it?"}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "stream_end", final
        events = events_for(proc, sent["messageId"])
        assert_well_ordered(events)
        seen = types(events)
        # the same events a streamed reply has: start, thinking, text, the call, its result,
        # the second step's text, usage, end
        for kind in ("stream_start", "thinking_delta", "text_delta", "tool_call_start", "tool_result", "usage"):
            assert kind in seen, seen
        assert seen.index("tool_result") < len(seen) - 1 - seen[::-1].index("text_delta")
        assert final["usage"] == usage(90, 16)
        bodies = await server.requests()
        assert [b["stream"] for b in bodies] == [False, False]
        assert "stream_options" not in bodies[0]
        second = bodies[1]["messages"]
        assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_t"
        assert any(m["role"] == "assistant" and m.get("tool_calls") for m in second)
        (_, reply) = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        kinds = [p["type"] for p in reply["parts"]]
        assert kinds == ["thinking", "text", "tool_use", "tool_result", "text"], kinds
        assert reply["status"] == "completed" and reply["textContent"] == "Let me look.It is the time the tool said."
        await proc.close()


async def test_abort_cancels_a_whole_request_in_flight(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url, models=[{"id": "whole-1", "stream": False}])
        await server.script({"text": "never sent", "delay_ms": 60_000})
        session = await proc.call("chat:session:create", {})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "take your time"}})
        await eventually(server.requests, lambda bodies: len(bodies) == 1)
        assert (await proc.call("chat:abort", {"sessionId": session["id"]}))["success"] is True
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "aborted"
        # the provider saw its client go away: the request was cancelled, not left to run
        assert await eventually(server.cancelled, lambda numbers: numbers == [1]) == [1]
        (_, reply) = await proc.call("chat:messages:get", {"sessionId": session["id"]})
        assert reply["status"] == "aborted"
        await proc.close()


async def test_an_endpoint_that_cannot_stream_switches_the_model_once_and_remembers(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await setup(proc, server.base_url, models=[{"id": "o1-like", "contextWindow": 64000}])
        await server.config(streaming=False)
        await server.script({"text": "Whole answer one."}, {"text": "Whole answer two."})
        session = await proc.call("chat:session:create", {})
        first = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "one"}})
        final = await wait_final(proc, first["messageId"])
        assert final["type"] == "stream_end", final
        events = events_for(proc, first["messageId"])
        assert_well_ordered(events)
        notices = [e for e in events if e["type"] == "notice"]
        assert [n["code"] for n in notices] == ["stream_unsupported"]
        assert "".join(e["text"] for e in events if e["type"] == "text_delta") == "Whole answer one."
        bodies = await server.requests()
        assert [b["stream"] for b in bodies] == [True, False]  # refused once, then asked whole
        (listed,) = [p for p in await proc.call("provider:list") if p["id"] == provider["id"]]
        assert listed["models"] == [model_config("o1-like", contextWindow=64000, stream=False)]

        second = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "two"}})
        assert (await wait_final(proc, second["messageId"]))["type"] == "stream_end"
        assert not [e for e in events_for(proc, second["messageId"]) if e["type"] == "notice"]
        assert [b["stream"] for b in await server.requests()] == [True, False, False]
        await proc.close()

    # remembered across a restart (it is the stored model configuration)
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await proc.call("sidecar:initialize", {"protocolVersion": 1})
        await proc.call("provider:upsert", {**{k: v for k, v in listed.items() if k in (
            "id", "name", "type", "baseUrl", "models")}, "baseUrl": server.base_url})
        await server.script({"text": "Whole answer three."})
        third = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "three"}})
        assert (await wait_final(proc, third["messageId"]))["type"] == "stream_end"
        assert [b["stream"] for b in await server.requests()] == [False]
        await proc.close()


async def test_other_400s_are_errors_not_a_switch(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        await setup(proc, server.base_url)
        await server.script({"status": 400, "text": "max_tokens is too large for this model"})
        session = await proc.call("chat:session:create", {})
        sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "hi"}})
        final = await wait_final(proc, sent["messageId"])
        assert final["type"] == "error" and "max_tokens is too large" in final["error"]
        assert len(await server.requests()) == 1
        assert (await proc.call("provider:list"))[0]["models"] == [model_config("scripted-1")]
        await proc.close()


async def test_anthropic_on_llmock_refuses_to_stream_then_tools_run_whole(tmp_path: Path) -> None:
    with llmock_server() as base:
        await llmock_script(
            base,
            {"type": "fail", "status": 400, "message": "streaming is not supported for this deployment"},
            {"type": "reply", "tool_calls": [{"name": "get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"type": "reply", "text": "Done: the time is known."},
        )
        async with spawn_sidecar(tmp_path / "data") as proc:
            await proc.call("sidecar:initialize", {"protocolVersion": 1})
            provider = await proc.call("provider:upsert", {
                "name": "Claude on llmock", "type": "anthropic", "baseUrl": f"{base}/anthropic",
                "apiKey": "sk-llmock-test-123456", "models": [{"id": "claude-sonnet-4-5", "maxOutputTokens": 1024}],
            })
            await proc.call("provider:setDefault", {"providerId": provider["id"], "modelId": "claude-sonnet-4-5"})
            await proc.call("settings:update", {"generateTitles": False})
            session = await proc.call("chat:session:create", {})
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": "time please"}})
            with anyio.fail_after(30):
                final = await wait_final(proc, sent["messageId"], timeout=30)
            assert final["type"] == "stream_end", final
            events = events_for(proc, sent["messageId"])
            assert_well_ordered(events)
            seen = types(events)
            assert "notice" in seen and "tool_call_start" in seen and "tool_result" in seen, seen
            served = await llmock_requests(base)
            assert [r["stream"] for r in served] == [True, False, False]
            assert served[0]["status"] == 400 and served[1]["status"] == served[2]["status"] == 200
            (_, reply) = await proc.call("chat:messages:get", {"sessionId": session["id"]})
            assert [p["type"] for p in reply["parts"]] == ["tool_use", "tool_result", "text"]
            use, result = reply["parts"][0], reply["parts"][1]
            assert use["name"] == "get_current_time" and use["input"] == {"timezone": "UTC"}
            assert not result.get("isError") and "T" in result["content"]  # an ISO 8601 time
            assert reply["textContent"] == "Done: the time is known."
            (stored,) = await proc.call("provider:list")
            assert stored["models"][0]["stream"] is False
            await proc.close()


async def test_a_provider_that_cannot_stream_asks_every_model_whole(tmp_path: Path) -> None:
    async with scripted_provider() as server, spawn_sidecar(tmp_path / "data") as proc:
        provider = await setup(proc, server.base_url, models=[{"id": "a"}, {"id": "b"}], stream=False)
        assert provider["stream"] is False and provider["models"] == [model_config("a"), model_config("b")]
        await server.script({"text": "whole a"}, {"text": "whole b"})
        session = await proc.call("chat:session:create", {})
        for model in ("a", "b"):
            sent = await proc.call("chat:send", {"sessionId": session["id"], "input": {"content": model},
                                                 "options": {"modelId": model}})
            final = await wait_final(proc, sent["messageId"])
            assert final["type"] == "stream_end"
            assert [e["text"] for e in events_for(proc, sent["messageId"]) if e["type"] == "text_delta"] == [
                f"whole {model}"
            ]
        bodies = await server.requests()
        assert [(b["model"], b["stream"]) for b in bodies] == [("a", False), ("b", False)]
        await proc.close()
