"""``provider:*``: direct LLM providers (OpenAI-compatible, Anthropic, Ollama) and ACP agent engines, with their models.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocol.limits import Id, Int64, JsonObject, Title
from protocol.types import Struct
from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.common import MethodSpec

__all__ = [
    "ProviderKind",
    "ReasoningLevel",
    "ModelConfig",
    "AcpEngineConfig",
    "ProviderUpsertParams",
    "ProviderInfo",
    "ProviderSetDefaultParams",
    "DefaultModel",
    "ProviderTestParams",
    "ProviderTestErrorKind",
    "ProviderTestError",
    "ProviderTestResult",
    "ProviderModelsParams",
    "ListedModel",
    "ProviderModelsResult",
]

TimeoutSeconds = Annotated[float, msgspec.Meta(gt=0, le=3600)]
Retries = Annotated[int, msgspec.Meta(ge=0, le=10)]


ProviderKind = Literal["openai-compat", "anthropic", "ollama", "acp-engine"]

HTTP_PROVIDER_KINDS = ("openai-compat", "anthropic", "ollama")
"""The provider types that call an HTTP API (every one but ``acp-engine``): they need ``baseUrl``."""


ReasoningLevel = Literal["off", "auto", "low", "medium", "high", "max"]


class ModelConfig(Struct, kw_only=True):
    """A model offered by a provider; prices are USD per million tokens."""

    id: Id
    name: Title | None = None
    context_window: Int64 | None = None
    max_output_tokens: Int64 | None = None
    supports_tools: bool = True
    supports_reasoning: bool = False
    supports_images: bool = False
    input_price: float = 0.0
    output_price: float = 0.0
    cache_read_price: float | None = None
    """Price of a prompt token read from the provider's cache (default: ``inputPrice``)."""
    cache_write_price: float | None = None
    """Price of a prompt token written to the provider's cache (default: ``inputPrice``)."""
    stream: bool = True
    """False: replies are asked for whole (a non-streaming request) and go through the same
    events (the text arrives as one delta). Set by the sidecar itself (and kept) when the
    endpoint answers a streaming request with a 400 saying it cannot stream this model."""


class AcpEngineConfig(Struct, kw_only=True):
    """How to run an agent engine (a provider of type ``acp-engine``).

    The engine is one subprocess speaking the Agent Client Protocol on its stdin/stdout,
    shared by every ``mode: "acp"`` session that uses this provider and started on first use.
    """

    command: str
    """The executable (a path, or a name looked up in PATH)."""
    args: list[str] = []
    env: dict[str, str] = {}
    """Environment of the engine, passed explicitly (only PATH, HOME, USER, LANG and a few
    other variables of the sidecar's own environment are inherited). Never logged;
    ``provider:list`` masks values whose name suggests a secret, and an update that sends
    such a masked value (``***``) back keeps the stored one."""
    cwd: str | None = None
    """Working directory of the engine process (default: the data dir). Each session's
    agent ``cwd`` is its ``workspaceDir``, else ``<dataDir>/acp/<sessionId>``."""
    auto_allow: list[str] = []
    """ACP tool kinds (read, search, think, fetch, edit, delete, move, execute, other) whose
    permission requests are allowed without asking (the stored tool policy
    ``acp:<providerId>:<kind>`` still wins)."""
    startup_timeout_ms: Int64 = 30_000
    """Start + ``initialize`` must finish within this."""
    request_timeout_ms: Int64 = 60_000
    """session/new, load, fork and close must be answered within this."""
    cancel_timeout_ms: Int64 = 5_000
    """After ``session/cancel`` the turn waits this long for the agent to end it, then ends it."""
    shutdown_timeout_ms: Int64 = 2_000
    """Shutdown: after closing stdin, after SIGTERM and after SIGKILL, wait at most this long."""


class ProviderUpsertParams(Struct, kw_only=True):
    """``provider:upsert``: create (no id, or an unknown id) or replace a provider."""

    REQUIRED_WHEN: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {"base_url": ("type", HTTP_PROVIDER_KINDS)}
    """``baseUrl`` is required when ``type`` is an HTTP provider type (the generated types and
    schema say so; sidecar/store/providers.py refuses a missing or non-http(s) one)."""

    id: Id | None = None
    name: Title
    type: ProviderKind
    base_url: str = ""
    """An http(s) URL, required for the HTTP provider types; unused by ``acp-engine``."""
    engine: AcpEngineConfig | None = None
    """Required for ``acp-engine``: the command that runs the agent engine."""
    api_key: str | None | UnsetType = UNSET
    """Stored (sealed), never returned. Left out on update: the stored key is kept; null
    (or "") clears it."""
    api_key_env: str | None = None
    """Name of an environment variable holding the key (used when no key is stored)."""
    headers: dict[str, str] = {}
    body: JsonObject = {}
    """Merged into every request body last (it may override generated fields)."""
    models: list[ModelConfig] = []
    enabled: bool = True
    stream: bool = True
    """False: the endpoint cannot stream; every model of it is asked for whole replies."""
    timeout_s: TimeoutSeconds | None = None
    """Seconds any wait on the endpoint may last: connecting (at most 10), the first byte of an
    answer, the gap between two bytes of a stream, and a whole non-streamed answer. None: the
    defaults (10 s to connect, 60 s between bytes, 600 s for a whole answer)."""
    max_retries: Retries | None = None
    """Retries of a request that failed before any answer (connection errors, 408, 429, 5xx,
    529), with Retry-After honoured. None: 2."""


class ProviderInfo(Struct, omit_defaults=False, kw_only=True):
    """A provider as ``provider:list`` shows it: the key itself is never included."""

    id: str
    name: str
    type: ProviderKind
    base_url: str
    has_api_key: bool
    secrets_locked: bool = False
    """A stored secret (the key, a secret header or env value) was sealed with a key this
    process was not given (see ``sidecar:initialize {secretKey}``): calls that need it fail
    with SECRETS_LOCKED until the key is given again or the secret is re-entered."""
    engine: AcpEngineConfig | None = None
    """For ``acp-engine``: env values whose name suggests a secret are masked (``***``)."""
    api_key_env: str | None = None
    headers: dict[str, str] = {}
    """Header values whose name suggests a secret (auth, key, token, secret) are masked."""
    body: JsonObject = {}
    models: list[ModelConfig] = []
    enabled: bool = True
    stream: bool = True
    """False: the endpoint cannot stream (see ProviderUpsertParams.stream)."""
    is_default: bool = False
    timeout_s: float | None = None
    max_retries: int | None = None
    created_at: Int64
    updated_at: Int64


class ProviderSetDefaultParams(Struct, kw_only=True):
    provider_id: Id
    model_id: Id


class DefaultModel(Struct, omit_defaults=False, kw_only=True):
    provider_id: Id
    model_id: Id


class ProviderTestParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``provider:test``: exactly one of ``id`` (a stored provider) and ``config`` (one being
    edited: ``config.id`` of a stored one keeps its stored key and masked header values
    when they are left out / sent back masked, as ``provider:upsert`` would)."""

    id: Id | None = None
    config: ProviderUpsertParams | None = None
    model_id: Id | None = None
    """The model of the test call (default: the provider's first model; none at all: the
    model list is asked for instead)."""


ProviderTestErrorKind = Literal[
    "auth", "not_found", "rate_limited", "network", "timeout", "bad_response", "server_error", "bad_request"
]
"""``auth``: 401/403 (a wrong or missing key); ``not_found``: 404 (a model or path that does
not exist: check the model id and the base URL); ``rate_limited``: 429 (``retryAfterMs`` when
the endpoint said); ``network``: no connection, or it dropped; ``timeout``: no answer within
``timeoutS``; ``bad_response``: an answer that is not the format's JSON; ``server_error``:
5xx / 529; ``bad_request``: another 4xx, or a request that cannot be built (a bad URL)."""


class ProviderTestError(Struct, omit_defaults=False, kw_only=True):
    kind: ProviderTestErrorKind
    status: int | None = None
    """The HTTP status, when the endpoint answered with one."""
    message: str
    """The endpoint's own message (keys masked)."""
    retry_after_ms: Int64 | None = None


class ProviderTestResult(Struct, omit_defaults=False, kw_only=True):
    ok: bool
    call: Literal["chat", "models"]
    """What was asked: a one-token answer of ``modelId``, or the model list."""
    model_id: str | None = None
    latency_ms: Int64
    """From sending the request to the whole answer (or the failure)."""
    error: ProviderTestError | None = None


class ProviderModelsParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``provider:models``: exactly one of ``id`` and ``config`` (as for ``provider:test``)."""

    id: Id | None = None
    config: ProviderUpsertParams | None = None


class ListedModel(Struct, omit_defaults=False, kw_only=True):
    id: str
    name: str | None = None
    """A display name, when the endpoint gives one (Anthropic)."""
    context_window: Int64 | None = None
    """Tokens of context, when the endpoint says (Anthropic ``max_input_tokens``, Ollama
    ``/api/show``, OpenAI-compatible servers that add ``context_length``)."""
    max_output_tokens: Int64 | None = None
    owned_by: str | None = None
    created_at: Int64 | None = None
    configured: bool = False
    """The provider's ``models`` has it already."""


class ProviderModelsResult(Struct, omit_defaults=False, kw_only=True):
    models: list[ListedModel]
    notes: list[str] = []
    """What could not be read (an Ollama model whose details did not come...)."""


METHODS: dict[str, MethodSpec] = {
    "provider:list": MethodSpec(EmptyParams, list[ProviderInfo], "Configured providers (keys never shown)."),
    "provider:upsert": MethodSpec(
        ProviderUpsertParams, ProviderInfo, "Create or replace a provider and its models."
    ),
    "provider:delete": MethodSpec(IdParams, SuccessResult, "Delete a provider."),
    "provider:setDefault": MethodSpec(
        ProviderSetDefaultParams, SuccessResult, "Provider and model for new sessions."
    ),
    "provider:test": MethodSpec(
        ProviderTestParams, ProviderTestResult, "One cheap real call: its latency, or its error, typed."
    ),
    "provider:models": MethodSpec(
        ProviderModelsParams, ProviderModelsResult, "The models the endpoint offers, with their context sizes."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
