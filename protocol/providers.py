"""``provider:*``: direct LLM providers (OpenAI-compatible, Anthropic, Ollama) and ACP agent engines, with their models.
"""

from __future__ import annotations

from typing import ClassVar, Literal

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
]


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
    created_at: Int64
    updated_at: Int64


class ProviderSetDefaultParams(Struct, kw_only=True):
    provider_id: Id
    model_id: Id


class DefaultModel(Struct, omit_defaults=False, kw_only=True):
    provider_id: Id
    model_id: Id


METHODS: dict[str, MethodSpec] = {
    "provider:list": MethodSpec(EmptyParams, list[ProviderInfo], "Configured providers (keys never shown)."),
    "provider:upsert": MethodSpec(
        ProviderUpsertParams, ProviderInfo, "Create or replace a provider and its models."
    ),
    "provider:delete": MethodSpec(IdParams, SuccessResult, "Delete a provider."),
    "provider:setDefault": MethodSpec(
        ProviderSetDefaultParams, SuccessResult, "Provider and model for new sessions."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
