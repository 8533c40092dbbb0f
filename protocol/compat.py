"""``compat:*``: the V1 ``/computer/chat`` HTTP endpoint (off until ``compat:start``).

The endpoint speaks the agent-runner contract the Qiming (nuwax) server's
SandboxAgentClient calls (``POST /computer/chat``, ``GET /computer/progress/{session_id}``
SSE, cancel, status, stop, health), served by the ChatEngine. Its own wire format
(snake_case requests, the HttpResult envelope, SSE frames) is not part of this contract;
README "V1 /computer/chat" describes it.
"""

from __future__ import annotations

from typing import Literal

from protocol.common import EmptyParams, MethodSpec
from protocol.types import Struct

__all__ = [
    "CompatFlavor",
    "CompatAgentCommand",
    "CompatStartParams",
    "CompatStatus",
    "CompatStartResult",
]

CompatFlavor = Literal["electron", "rcoder"]
"""Which V1 server the frames copy byte for byte: the desktop client (``electron``: raw
ACP updates as ``data``, ``acpSessionId``, end reason ``end_turn``, pings every 30 s, the
stream stays open after a turn) or the Rust agent runner (``rcoder``: ``request_id`` in
every ``data``, end reason ``EndTurn``, pings every 15 s, the stream closes after a turn)."""


class CompatAgentCommand(Struct, forbid_unknown_fields=True, kw_only=True):
    """How a requested ``agent_config.agent_server.command`` runs on this machine."""

    command: str | None = None
    """The executable to run instead (a path or a name looked up in PATH); None: the
    requested command as sent."""
    args: list[str] | None = None
    """The arguments it runs with, whatever the request's ``agent_server.args`` say (they
    are ignored). None: no arguments, unless ``requestArgs``."""
    request_args: bool = False
    """True (and ``args`` None): the request's ``agent_server.args`` are passed to the
    command. False (default): a request that sends arguments for this command is refused
    (``VALIDATION_ERROR``), since arguments can make an allowed program run anything
    (``python -c``, ``sh -c``, a flag that skips the agent's permission checks)."""
    request_env: list[str] = []
    """The names of the environment variables a request's ``agent_server.env`` may set for
    this command (exact names, up to 64; never a loader variable such as ``LD_PRELOAD`` or
    ``PATH``). A request that sets any other name is refused (``VALIDATION_ERROR``)."""


class CompatStartParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``compat:start``: listen for V1 requests."""

    host: str = "127.0.0.1"
    """Loopback by default; any other address needs ``allowRemote`` and an explicit ``token``."""
    port: int = 60006
    """0 picks a free port (the result names it). 60006 is V1's default agent port."""
    token: str | None = None
    """The key callers send as ``x-api-key`` (or ``Authorization: Bearer``); 16 to 256
    printable ASCII characters. Omitted: a random one is generated for this start."""
    allow_remote: bool = False
    """Allow a host that is not loopback (the server then reaches us over the network)."""
    flavor: CompatFlavor = "electron"
    cancel_as_error: bool = False
    """A cancelled turn ends with V1 Electron's form, an ``error`` frame whose description
    is ``Session cancelled``, instead of a ``cancelled`` frame."""
    agent_commands: dict[str, CompatAgentCommand] = {}
    """The ``agent_server.command`` values a request may start as an ACP engine, keyed by
    that value. A request naming any other command is refused: the caller chooses a
    program to run on this machine, so each one must be allowed here."""
    trust_agent_mode: bool = False
    """True: a request whose ``agent_server.agent_mode`` is ``yolo`` gets the permission
    requests no ``tool_approval_rules`` rule decided approved (V1's behaviour). False: they
    wait for the user (``tool_approval_required``, ``tool:pending:list``)."""
    trust_approval_rules: bool = False
    """True: a request's ``tool_approval_rules`` rules with action ``allow`` approve the calls
    they match without the user (V1's behaviour: the key holder decides what runs). False
    (default): a request may only narrow, its ``deny`` rules decide and its ``allow`` rules
    leave the call to the user."""
    workspace_dir: str | None = None
    """Absolute path under which ``computer-project-workspace/<user_id>/<agent_work_dir>``
    working directories are made (default ``<dataDir>/compat``)."""
    work_dir_roots: list[str] = []
    """Absolute directories an absolute ``agent_work_dir`` may name (it, or a directory
    below it); the workspace directory always may. Any other absolute path (``/``, a home
    directory) is refused with ``AGENT_WORK_DIR_INVALID``."""
    head_timeout_ms: int = 10_000
    """A connection's request head (request line and headers) must arrive within this
    (1000..120000); then the connection is answered 408 and closed."""
    max_sse_clients: int = 8
    """Progress streams open at once per session (1..64); one more is refused with 429."""
    ping_interval_ms: int | None = None
    """Heartbeat period of a progress stream (1000..600000; default 30000 for electron,
    15000 for rcoder)."""


class CompatStatus(Struct, omit_defaults=False, kw_only=True):
    """``compat:status`` (and ``compat:stop``'s result)."""

    running: bool
    url: str | None = None
    """``http://host:port`` while running."""
    host: str | None = None
    port: int | None = None
    flavor: CompatFlavor | None = None
    started_at: int | None = None
    projects: int = 0
    """Projects (V1 sessions) served since the start."""
    running_turns: int = 0
    sse_clients: int = 0
    connections: int = 0
    """HTTP connections open now."""
    max_connections: int = 0
    """At most this many are open at once (derived from the process's file descriptor
    limit at ``compat:start``, so stdio, the database and providers keep theirs); half of
    them at most may be connections no request with the key came on yet."""


class CompatStartResult(CompatStatus, omit_defaults=False, kw_only=True):
    token: str
    """The key to configure on the caller (generated unless ``token`` was given)."""


METHODS: dict[str, MethodSpec] = {
    "compat:start": MethodSpec(
        CompatStartParams, CompatStartResult, "Start the V1 /computer/chat HTTP endpoint."
    ),
    "compat:stop": MethodSpec(EmptyParams, CompatStatus, "Stop the V1 endpoint (its streams end)."),
    "compat:status": MethodSpec(EmptyParams, CompatStatus, "Whether the V1 endpoint runs, and where."),
}
"""The methods of this domain (see ``protocol.methods``)."""
