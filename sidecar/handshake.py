"""The handshake: the one answer to ``sidecar:initialize``.

``check_version`` and ``initialize_result`` are the whole of it: ``Server.initialize``
(sidecar/server.py) answers with them, and so do the early answers (sidecar/coldstart.py)
when the handshake is already waiting before the event loop runs. What must stay true: the
answer is the same whenever it is given; it is given once the store is open and the
secrets key settled on it (``secrets`` is never null), and ``implemented`` is every bound
method (``open_app`` attaches a service for each: tests/test_rpc_server.py). Light on
imports: the handshake's own types and the names of methods and notifications, no other
domain of the protocol and nothing of the server.
"""

from __future__ import annotations

import sidecar
from protocol import PROTOCOL_VERSION
from protocol.errors import ErrorCode
from protocol.lifecycle import InitializeParams, InitializeResult, SecretsInfo, ServerCapabilities, ServerInfo
from protocol.notification_names import SERVER_NOTIFICATIONS
from sidecar.bindings import BINDINGS, LIFECYCLE_METHODS
from sidecar.config import Config
from sidecar.errors import SidecarError
from sidecar.logging_setup import EarlyLogger

logger = EarlyLogger(__name__)

BOUND_METHODS: list[str] = sorted([*LIFECYCLE_METHODS, *BINDINGS])
"""Every method this process answers: the contract's (tests/test_rpc_server.py holds them
equal to ``protocol.METHODS``)."""


def check_version(params: InitializeParams) -> None:
    """Log the client; refuse a client built for another protocol version (BAD_STATE)."""
    client = params.client_info
    logger.info(
        "initialize from %s %s (protocol %s)",
        client.name if client else "unknown client",
        (client.version or "") if client else "",
        params.protocol_version,
    )
    if params.protocol_version is not None and params.protocol_version != PROTOCOL_VERSION:
        # A client built for another version would misread this wire: refuse the
        # handshake (the client shows the error); the process keeps serving.
        raise SidecarError(
            f"protocol version mismatch: the client speaks protocol {params.protocol_version},"
            f" this sidecar speaks protocol {PROTOCOL_VERSION}",
            code=ErrorCode.BAD_STATE,
            data={"expected": PROTOCOL_VERSION, "got": params.protocol_version},
        )


def initialize_result(config: Config, secrets: SecretsInfo) -> InitializeResult:
    return InitializeResult(
        protocol_version=PROTOCOL_VERSION,
        server_info=ServerInfo(name=sidecar.SERVER_NAME, version=sidecar.__version__),
        capabilities=ServerCapabilities(
            methods=BOUND_METHODS,
            implemented=BOUND_METHODS,
            notifications=list(SERVER_NOTIFICATIONS),
            max_line_bytes=config.max_line_bytes,
        ),
        data_dir=config.data_dir,
        secrets=secrets,
    )
