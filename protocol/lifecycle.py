"""The process's own methods: ``sidecar:initialize`` (handshake) and ``sidecar:shutdown``.
"""

from __future__ import annotations

from protocol.types import Struct
from protocol.common import EmptyParams, SuccessResult
from protocol.common import MethodSpec

__all__ = [
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
    max_line_bytes: int
    """Input lines longer than this are rejected with MESSAGE_TOO_LARGE."""


class InitializeParams(Struct, kw_only=True):
    protocol_version: int | None = None
    """The contract version the client was built for; another one than the sidecar's is
    refused with BAD_STATE, data ``{expected, got}``."""
    client_info: ClientInfo | None = None


class InitializeResult(Struct, omit_defaults=False, kw_only=True):
    protocol_version: int
    server_info: ServerInfo
    capabilities: ServerCapabilities
    data_dir: str


METHODS: dict[str, MethodSpec] = {
    "sidecar:initialize": MethodSpec(
        InitializeParams, InitializeResult, "Handshake: protocol version, server info, capabilities, data dir."
    ),
    "sidecar:shutdown": MethodSpec(
        EmptyParams, SuccessResult, "Finish running work, answer, then exit 0."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
