"""Shared steps of the chat end-to-end tests: configure the scripted provider, wait for a reply."""

from __future__ import annotations

from typing import Any

import msgspec

from sidecar_proc import SidecarProcess

FINAL_TYPES = ("stream_end", "error", "aborted")
API_KEY = "sk-test-SECRET-7f3a9c"


async def configure_provider(proc: SidecarProcess, base_url: str, **extra: Any) -> dict[str, Any]:
    """Initialize the sidecar and make the scripted server the default provider."""
    await proc.call("sidecar:initialize", {"protocolVersion": 1})
    provider = await proc.call(
        "provider:upsert",
        {
            "name": "Scripted",
            "type": "openai-compat",
            "baseUrl": base_url,
            "apiKey": API_KEY,
            "models": [
                {"id": "scripted-1", "contextWindow": 32000, "inputPrice": 1.0, "outputPrice": 2.0}
            ],
            **extra,
        },
    )
    await proc.call("provider:setDefault", {"providerId": provider["id"], "modelId": "scripted-1"})
    return provider


async def wait_final(proc: SidecarProcess, message_id: str, timeout: float = 20) -> dict[str, Any]:
    """The final chat:stream event (stream_end, error or aborted) of a message."""
    _, message = await proc.wait_for(
        lambda m: isinstance(m, dict)
        and m.get("method") == "chat:stream"
        and m["params"]["messageId"] == message_id
        and m["params"]["type"] in FINAL_TYPES,
        timeout=timeout,
    )
    return message["params"]


def events_of(proc: SidecarProcess, message_id: str) -> list[dict[str, Any]]:
    return [e for e in proc.notifications("chat:stream") if e["messageId"] == message_id]


def assert_well_ordered(events: list[dict[str, Any]]) -> None:
    """seq 1..n without gaps, stream_start first, exactly one final event, last."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), [e["seq"] for e in events]
    assert events[0]["type"] == "stream_start"
    finals = [e for e in events if e["type"] in FINAL_TYPES]
    assert len(finals) == 1 and events[-1] is finals[0], [e["type"] for e in events]


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "text_delta")


def usage(input_tokens: int, output_tokens: int, **given: int | None) -> dict[str, int | None]:
    """A Usage as the sidecar sends it: every field, the ones a provider did not report null."""
    fields: dict[str, int | None] = {"inputTokens": input_tokens, "outputTokens": output_tokens, "cacheReadTokens": None,
                                     "cacheWriteTokens": None, "reasoningTokens": None, "contextUsed": None, "contextSize": None}
    fields.update(given)
    return fields


def model_config(model_id: str, **given: object) -> dict[str, object]:
    """A ModelConfig as the sidecar sends it (every field, defaults too)."""
    from protocol import ModelConfig

    return msgspec.to_builtins(msgspec.convert({"id": model_id, **given}, ModelConfig))
