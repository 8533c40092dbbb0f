"""AcpConnection: the client side of one running ACP engine, on our own JsonRpcPeer.

Owns the conversation with one agent process: ``initialize`` and what it advertised
(``features``), the agent sessions opened in this process (``opened``) and the working
directory of each (for fs requests), prompts (``PromptCall``: one at a time per agent
session), ``session/cancel``, and the routing of what the agent sends us:

    session/update              -> the TurnSink attached to that agent session (else dropped)
    session/request_permission  -> that sink's approval flow (no sink: ``cancelled``)
    fs/read_text_file           -> sidecar.acp.fs, confined to the session's working dir
    fs/write_text_file          -> idem
    anything else               -> -32601 (we advertise no terminal capability)

Must stay true:
- ``TurnSink.on_update`` is called synchronously, in arrival order, before the response
  that followed the updates on the wire is processed: with an AgentProcess the line
  filter hands each update over as it reads it (sidecar/acp/lines.py, the fast path);
  without one (in-memory tests) the peer starts one task per notification in arrival
  order and the handler enqueues before any await, and those tasks run before the task
  waiting for the response. The turn therefore sees every update of a prompt before it
  sees the prompt's result;
- prompts run in the connection's task group, not in the caller's: a turn that is
  cancelled can still send ``session/cancel`` and wait (bounded) for the agent's answer;
- when the agent goes away every pending request fails at once (JsonRpcPeer), every
  running PromptCall ends with a ProviderError that says how the agent ended, and
  every pending permission request is answered ``cancelled``;
- errors raised to callers are SidecarErrors (ProviderError for the agent's failures).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import anyio.abc
import msgspec

from sidecar.acp import fs
from sidecar.acp.process import AgentProcess
from sidecar.acp.types import (
    PROTOCOL_VERSION,
    AgentFeatures,
    CancelledOutcome,
    ClientCapabilities,
    EmptyResult,
    ForkSessionParams,
    FsCapability,
    Implementation,
    InitializeParams,
    LoadSessionParams,
    NewSessionParams,
    PromptBlock,
    PromptParams,
    PromptResult,
    ReadTextFileParams,
    ReadTextFileResult,
    RequestPermissionParams,
    RequestPermissionResult,
    SessionIdParams,
    SessionIdResult,
    SessionNotification,
    WriteTextFileParams,
    notification_decoder,
)
from sidecar.errors import (
    InvalidParams,
    PeerClosed,
    ProviderError,
    RemoteError,
    RpcError,
    SidecarError,
)
from sidecar.rpc import Handler, JsonRpcPeer

log = logging.getLogger(__name__)


def agent_error_data(exc: RemoteError) -> dict[str, Any]:
    """``data`` of the PROVIDER_ERROR for an agent's error answer: the shape every
    PROVIDER_ERROR has (``kind``, ``status``, ``retryable``), the agent's own data inside."""
    return {"kind": "agent", "status": None, "retryable": False, "agentData": exc.data}


CLIENT_CAPABILITIES = ClientCapabilities(
    fs=FsCapability(read_text_file=True, write_text_file=True), terminal=False
)


class TurnSink(Protocol):
    """What a running turn offers the connection for its agent session."""

    def on_update(self, update: msgspec.Raw) -> None:
        """One ``session/update`` payload, verbatim; must not block or await."""

    async def request_permission(self, params: RequestPermissionParams) -> RequestPermissionResult:
        """Ask the user (or the remembered rules); answered ``cancelled`` on abort."""
        ...

    def cancel_permissions(self) -> None:
        """Answer every pending permission request of this sink ``cancelled`` now."""


class PromptCall:
    """One ``session/prompt`` in flight; ``done`` is set with ``result`` or ``error``."""

    def __init__(self, session_id: str, on_done: Callable[[], None]) -> None:
        self.session_id = session_id
        self.done = anyio.Event()
        self.result: PromptResult | None = None
        self.error: SidecarError | None = None
        self.scope = anyio.CancelScope()
        self._on_done = on_done

    def abandon(self) -> None:
        """Stop waiting for the agent's answer (it is dropped when it comes)."""
        self.scope.cancel()

    async def _run(self, conn: AcpConnection, params: PromptParams) -> None:
        try:
            with self.scope:
                self.result = await conn.peer.request("session/prompt", params, result_type=PromptResult)
        except PeerClosed:
            self.error = ProviderError(await conn.describe_end())
        except RemoteError as exc:
            self.error = ProviderError(f"the agent failed the prompt: {exc.message}", data=agent_error_data(exc))
        except RpcError as exc:
            self.error = ProviderError(f"bad answer to session/prompt: {exc.message}")
        finally:
            if self.result is None and self.error is None:
                self.error = ProviderError("the agent's answer was not awaited any longer")
            self.done.set()
            self._on_done()


class AcpConnection:
    def __init__(
        self,
        *,
        peer: JsonRpcPeer,
        agent: AgentProcess | None,
        task_group: anyio.abc.TaskGroup,
        engine_id: str,
        name: str,
        request_timeout_s: float = 60.0,
    ) -> None:
        self.peer = peer
        self.agent = agent
        self.engine_id = engine_id
        self.name = name
        self.request_timeout_s = request_timeout_s
        self.features = AgentFeatures()
        self.opened: set[str] = set()
        """Agent sessions created, loaded or forked in this process."""
        self._tg = task_group
        self._cwd: dict[str, str] = {}
        self._sinks: dict[str, TurnSink] = {}
        self._prompts: dict[str, PromptCall] = {}
        self._stopping = False
        dispatcher = peer.dispatcher
        dispatcher.add("session/update", Handler(SessionNotification, self._on_update))
        if agent is not None:
            # the hot path: updates go from the line filter straight to the sink (lines.py)
            agent.json_lines.fast["session/update"] = self._on_update_params
        dispatcher.add("session/request_permission", Handler(RequestPermissionParams, self._on_permission))
        dispatcher.add("fs/read_text_file", Handler(ReadTextFileParams, self._on_read))
        dispatcher.add("fs/write_text_file", Handler(WriteTextFileParams, self._on_write))

    # -- state -----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self._stopping and not self.peer.closed.is_set()

    async def describe_end(self) -> str:
        if self.agent is None:
            return f"the agent engine {self.name!r} closed its connection"
        with anyio.move_on_after(1.0):  # EOF usually comes a moment before the exit status
            await self.agent.exited.wait()
        return self.agent.describe_exit()

    def closing(self) -> None:
        """The connection is going away: nothing new starts, waiting approvals end."""
        self._stopping = True
        for sink in list(self._sinks.values()):
            sink.cancel_permissions()

    # -- requests to the agent ---------------------------------------------------------

    async def call(self, method: str, params: Any, result_type: Any = None, *, timeout: float | None = None) -> Any:
        if not self.alive:
            raise ProviderError(await self.describe_end() if self.peer.closed.is_set() else f"the agent engine {self.name!r} is stopping")
        try:
            return await self.peer.request(
                method, params, result_type=result_type, timeout=timeout or self.request_timeout_s
            )
        except PeerClosed:
            raise ProviderError(await self.describe_end()) from None
        except RemoteError as exc:
            raise ProviderError(
                f"the agent engine {self.name!r} failed {method}: {exc.message}", data=agent_error_data(exc)
            ) from exc
        except RpcError as exc:
            raise ProviderError(f"the agent engine {self.name!r} sent a bad answer to {method}: {exc.message}") from exc
        except TimeoutError:
            raise ProviderError(
                f"the agent engine {self.name!r} did not answer {method} within {timeout or self.request_timeout_s:g} s"
            ) from None

    async def initialize(self, client_name: str, client_version: str, timeout: float) -> AgentFeatures:
        result = await self.call(
            "initialize",
            InitializeParams(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=CLIENT_CAPABILITIES,
                client_info=Implementation(name=client_name, version=client_version),
            ),
            timeout=timeout,
        )
        self.features = AgentFeatures.from_result(result)
        if self.features.protocol_version != PROTOCOL_VERSION:
            log.warning(
                "engine %s speaks ACP version %s, we speak %s",
                self.name, self.features.protocol_version, PROTOCOL_VERSION,
            )
        return self.features

    async def new_session(self, cwd: str, mcp_servers: list[Any]) -> str:
        result = await self.call("session/new", NewSessionParams(cwd=cwd, mcp_servers=mcp_servers), SessionIdResult)
        self._opened(result.session_id, cwd)
        return str(result.session_id)

    async def load_session(self, session_id: str, cwd: str, mcp_servers: list[Any]) -> None:
        # registered first: fs requests during the replay must find the directory
        previous = self._cwd.get(session_id)
        self._cwd[session_id] = cwd
        try:
            await self.call("session/load", LoadSessionParams(session_id=session_id, cwd=cwd, mcp_servers=mcp_servers))
        except BaseException:
            # a session that did not load serves no fs requests (one opened before keeps its own)
            if previous is None:
                self._cwd.pop(session_id, None)
            else:
                self._cwd[session_id] = previous
            raise
        self._opened(session_id, cwd)

    async def fork_session(self, session_id: str, cwd: str, mcp_servers: list[Any]) -> str:
        result = await self.call(
            "session/fork", ForkSessionParams(session_id=session_id, cwd=cwd, mcp_servers=mcp_servers), SessionIdResult
        )
        self._opened(result.session_id, cwd)
        return str(result.session_id)

    async def close_session(self, session_id: str) -> None:
        self.opened.discard(session_id)
        self._cwd.pop(session_id, None)
        await self.call("session/close", SessionIdParams(session_id=session_id), timeout=min(10.0, self.request_timeout_s))

    def _opened(self, session_id: str, cwd: str) -> None:
        self.opened.add(session_id)
        self._cwd[session_id] = cwd

    # -- prompts -----------------------------------------------------------------------

    async def wait_prompt_slot(self, session_id: str, timeout: float) -> None:
        """Wait until no prompt of ``session_id`` is running (prompts are serialised)."""
        previous = self._prompts.get(session_id)
        if previous is None or previous.done.is_set():
            return
        with anyio.move_on_after(timeout):
            await previous.done.wait()
        if not previous.done.is_set():
            raise ProviderError(
                f"the agent engine {self.name!r} has not finished the previous prompt of this session "
                "(it did not stop after session/cancel)"
            )

    def start_prompt(self, session_id: str, prompt: list[PromptBlock], on_done: Callable[[], None]) -> PromptCall:
        call = PromptCall(session_id, on_done)
        self._prompts[session_id] = call
        self._tg.start_soon(call._run, self, PromptParams(session_id=session_id, prompt=prompt))
        return call

    async def cancel(self, session_id: str) -> None:
        """``session/cancel`` (a notification) and ``cancelled`` for waiting permissions."""
        sink = self._sinks.get(session_id)
        if sink is not None:
            sink.cancel_permissions()
        if self.alive:
            await self.peer.notify("session/cancel", SessionIdParams(session_id=session_id))

    # -- sinks -------------------------------------------------------------------------

    def attach(self, session_id: str, sink: TurnSink) -> None:
        self._sinks[session_id] = sink

    def detach(self, session_id: str, sink: TurnSink) -> None:
        if self._sinks.get(session_id) is sink:
            del self._sinks[session_id]

    # -- requests from the agent -------------------------------------------------------

    def _on_update_params(self, params: msgspec.Raw) -> None:
        try:
            note = notification_decoder.decode(params)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("engine %s: malformed session/update dropped: %s", self.name, exc)
            return
        self._route_update(note)

    async def _on_update(self, note: SessionNotification) -> None:
        self._route_update(note)

    def _route_update(self, note: SessionNotification) -> None:
        sink = self._sinks.get(note.session_id)
        if sink is None:
            # replays of session/load and late updates after a turn ended land here: dropped
            return
        sink.on_update(note.update)

    async def _on_permission(self, params: RequestPermissionParams) -> RequestPermissionResult:
        sink = self._sinks.get(params.session_id)
        if sink is None or self._stopping:
            log.info("engine %s: permission request outside a turn answered cancelled", self.name)
            return RequestPermissionResult(outcome=CancelledOutcome())
        return await sink.request_permission(params)

    def _root(self, session_id: str) -> str:
        root = self._cwd.get(session_id)
        if root is None:
            raise InvalidParams(f"invalid params: unknown session {session_id!r} - at `$.sessionId`")
        return root

    async def _on_read(self, params: ReadTextFileParams) -> ReadTextFileResult:
        root = self._root(params.session_id)
        return ReadTextFileResult(content=await fs.read_text_file(root, params.path, params.line, params.limit))

    async def _on_write(self, params: WriteTextFileParams) -> EmptyResult:
        root = self._root(params.session_id)
        await fs.write_text_file(root, params.path, params.content)
        return EmptyResult()
