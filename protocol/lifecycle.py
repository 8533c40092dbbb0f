"""The process's own methods: ``sidecar:initialize`` (handshake) and ``sidecar:shutdown``.
"""

from __future__ import annotations

from typing import Literal

from protocol.limits import Int64
from protocol.types import Struct
from protocol.common import EmptyParams, SuccessResult
from protocol.common import MethodSpec

__all__ = [
    "SecretsState",
    "SecretKeySource",
    "SecretsInfo",
    "ClientInfo",
    "ServerInfo",
    "ServerCapabilities",
    "InitializeParams",
    "InitializeResult",
]


class ClientInfo(Struct, kw_only=True):
    name: str
    version: str | None = None


class ServerInfo(Struct, omit_defaults=False, kw_only=True):
    name: str
    version: str


class ServerCapabilities(Struct, omit_defaults=False, kw_only=True):
    methods: list[str]
    """Every method this process answers (including not-implemented ones)."""
    implemented: list[str]
    """The methods that are implemented (the others answer NOT_IMPLEMENTED)."""
    notifications: list[str]
    """Notifications this process sends."""
    max_line_bytes: Int64
    """Input lines longer than this are rejected with MESSAGE_TOO_LARGE."""


class InitializeParams(Struct, kw_only=True):
    protocol_version: Int64 | None = None
    """The contract version the client was built for; another one than the sidecar's is
    refused with BAD_STATE, data ``{expected, got}``."""
    client_info: ClientInfo | None = None
    secret_key: str | None = None
    """The host's key for secrets at rest: base64 of 32 random bytes, generated once by the
    host and kept with Electron ``safeStorage``; pass the same key at every start. Without
    it the sidecar keeps its own key (OS keychain, else ``<dataDir>/secret.key``). Given
    later, or changed, the stored secrets are re-sealed with it."""


SecretsState = Literal["ready", "locked"]
SecretKeySource = Literal["host", "keychain", "file"]


class SecretsInfo(Struct, omit_defaults=False, kw_only=True):
    """How stored secrets (API keys, tokens, secret headers and env values) are protected."""

    state: SecretsState
    """``locked``: some were sealed with a key this process was not given (another host
    key); the calls that need them fail with SECRETS_LOCKED, nothing is lost."""
    source: SecretKeySource
    """Where the key that seals new secrets comes from."""
    locked: int = 0
    """How many stored secret values cannot be opened."""


class InitializeResult(Struct, omit_defaults=False, kw_only=True):
    protocol_version: Int64
    server_info: ServerInfo
    capabilities: ServerCapabilities
    data_dir: str
    secrets: SecretsInfo | None = None
    """Known once the store is open: always with ``secretKey``, which waits for it; without
    it, null when the handshake came first (the key is then settled when the store opens)."""


METHODS: dict[str, MethodSpec] = {
    "sidecar:initialize": MethodSpec(
        InitializeParams, InitializeResult, "Handshake: protocol version, server info, capabilities, data dir."
    ),
    "sidecar:shutdown": MethodSpec(
        EmptyParams, SuccessResult, "Finish running work, answer, then exit 0."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
