"""What the engine hands a provider, and the one stream of parts it gets back.

Owns: ProviderSettings (one configured endpoint), ModelInfo, the request
(ChatRequest with RequestMessage / ToolSpec / GenerationParams) and the
StreamPart union every adapter yields, whatever its wire format.

Must stay true:
- Nothing here ever prints a secret: ``ProviderSettings.__repr__`` masks the
  API key and every custom header value (headers often carry tokens).
- ``UsageUpdate.usage`` is the CUMULATIVE total so far: the consumer replaces
  its copy, it never adds. ``input_tokens`` counts every prompt token, cached
  ones included (OpenAI's ``prompt_tokens`` meaning); ``cache_read_tokens`` /
  ``cache_write_tokens`` are parts of it. Anthropic reports cache tokens apart
  from ``input_tokens``; its adapter adds them in so the meaning is the same
  for every provider. ``output_tokens`` includes reasoning tokens.
- Every ToolCallStart is followed (unless the step fails) by exactly one
  ToolCallEnd with the same id, whose ``arguments`` is the whole JSON text as
  the model produced it: the concatenated ToolCallDelta fragments, or ``{}`` when
  there were none. It may be invalid JSON (for instance when the reply was cut by
  ``length``): validating it is the tool layer's job.
- A successful step ends with exactly one Finish, last.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from protocol.events import FinishReason
from protocol.types import ContentPart, Usage
from sidecar.providers.redact import safe_url

__all__ = [
    "ProviderType",
    "ReasoningLevel",
    "ProviderSettings",
    "ModelInfo",
    "ToolSpec",
    "RequestMessage",
    "GenerationParams",
    "ChatRequest",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallStart",
    "ToolCallDelta",
    "ToolCallEnd",
    "UsageUpdate",
    "Finish",
    "StreamPart",
]

ProviderType = Literal["openai-compat", "anthropic", "ollama"]
ReasoningLevel = Literal["off", "auto", "low", "medium", "high", "max"]


class ProviderSettings(msgspec.Struct, kw_only=True):
    """One configured endpoint. ``body`` is deep-merged into every request body LAST."""

    type: ProviderType
    base_url: str
    api_key: str | None = None
    headers: dict[str, str] = {}
    body: dict[str, Any] = {}
    connect_timeout: float = 10.0
    idle_timeout: float = 60.0
    """A stream that sends no byte for this long fails with kind ``stall``."""
    max_retries: int = 2
    retry_backoff: float = 0.5
    retry_after_cap: float = 30.0
    request_timeout: float = 600.0
    """How long a non-streaming ``generate`` may wait for its whole answer."""
    name: str = ""
    """Display name used in error messages (defaults to the type)."""

    def __repr__(self) -> str:
        key = "None" if self.api_key is None else "'***'"
        headers = {name: "***" for name in self.headers}
        return (
            f"ProviderSettings(type={self.type!r}, name={self.name!r}, base_url={safe_url(self.base_url)!r}, "
            f"api_key={key}, headers={headers!r}, body_keys={sorted(self.body)!r})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        # msgspec's own would list the key (rich, pretty-printers, debuggers).
        return [
            ("type", self.type),
            ("name", self.name),
            ("base_url", safe_url(self.base_url)),
            ("api_key", None if self.api_key is None else "***"),
            ("headers", {name: "***" for name in self.headers}),
        ]


class ModelInfo(msgspec.Struct, kw_only=True):
    id: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    supports_tools: bool = True
    supports_reasoning: bool = False
    supports_images: bool = False
    stream: bool = True
    """False: ask for whole replies (``generate``); the endpoint or model cannot stream."""


class ToolSpec(msgspec.Struct, kw_only=True):
    name: str
    description: str = ""
    parameters: dict[str, Any] = {}
    """JSON Schema of the arguments object."""


class RequestMessage(msgspec.Struct, kw_only=True):
    """One message of the request copy. Assistant messages hold their tool calls
    and results in order (ToolUsePart / ToolResultPart), as stored (seed 000 §8)."""

    role: Literal["system", "user", "assistant"]
    parts: list[ContentPart]


class GenerationParams(msgspec.Struct, kw_only=True):
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    reasoning: ReasoningLevel | None = None


class ChatRequest(msgspec.Struct, kw_only=True):
    model: ModelInfo
    messages: list[RequestMessage]
    tools: list[ToolSpec] = []
    params: GenerationParams = msgspec.field(default_factory=GenerationParams)
    stream: bool = True


# -- the internal stream -------------------------------------------------------
# gc=False: these hold only strings/ints/a Usage and are created per chunk.


class TextDelta(msgspec.Struct, tag=True, gc=False):
    text: str


class ThinkingDelta(msgspec.Struct, tag=True, gc=False):
    """Reasoning text. A ``signature`` (Anthropic) belongs to the thinking block in
    progress and closes it: streamed, it comes as a last delta with empty ``text``;
    from ``generate`` it comes with the block's whole text. Store it on that block's
    ThinkingPart: the API needs the block back, unchanged, when a tool-use turn
    continues; the Anthropic adapter sends signed thinking parts back."""

    text: str
    signature: str | None = None


class ToolCallStart(msgspec.Struct, tag=True, gc=False):
    id: str
    name: str


class ToolCallDelta(msgspec.Struct, tag=True, gc=False):
    id: str
    arguments: str
    """A fragment of the JSON text; the fragments concatenate to ToolCallEnd.arguments."""


class ToolCallEnd(msgspec.Struct, tag=True, gc=False):
    id: str
    name: str
    arguments: str


class UsageUpdate(msgspec.Struct, tag=True, gc=False):
    usage: Usage
    """Cumulative totals so far: replace, do not add."""


class Finish(msgspec.Struct, tag=True, gc=False):
    reason: FinishReason
    raw_reason: str | None = None
    """The provider's own word (``end_turn``, ``tool_calls``, ``length``...)."""


StreamPart = Union[TextDelta, ThinkingDelta, ToolCallStart, ToolCallDelta, ToolCallEnd, UsageUpdate, Finish]
