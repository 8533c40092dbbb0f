"""AcpTurnHandler: one assistant reply of a ``mode: "acp"`` session, delegated to an agent engine.

The ACP counterpart of GenerationHandler, driven by ChatEngine with the same
GenerationJob (the user message is ``job.parent_id``). A turn:

1. ``stream_start``; the engine (an ``acp-engine`` provider) is started or reused
   (sidecar.acp.engines);
2. the agent session is chosen (``_open_agent_session``): the reply that the user message
   follows names, in ``acp_turns``, the agent session holding the conversation up to it.
   With ``session/fork`` advertised every turn runs on a fork of it (so each reply's agent
   session stays as it was, which is what regenerate and edit-and-resend need); without
   fork the turn continues that session. A session unknown to this engine process is
   reloaded with ``session/load`` when advertised, otherwise the turn starts a new agent
   session and says so in a ``notice`` event; the first turn uses ``session/new``. The
   working directory is the session's ``workspaceDir``, else ``<dataDir>/acp/<sessionId>``;
3. ``session/prompt`` with the user message: text, images (when the agent accepts them),
   files as resource links (embedded text when the agent accepts embedded context);
4. every ``session/update`` goes through UpdateMapper into events and parts, and is kept
   verbatim for ``acp_parts``; ``session/request_permission`` goes through the approval
   flow (ApprovalService.ask: policy ``acp:<engineId>:<kind>``, the engine's autoAllow
   kinds default to auto; ``tool_approval_required`` event; always-options remembered);
5. the stop reason ends the reply: end_turn / max_tokens / max_turn_requests / refusal
   -> ``stream_end`` (finish reason stop / length / max_turn_requests / refusal);
   cancelled -> ``aborted``; the agent's failure or exit -> ``error`` with the partial
   content kept.

Cancellation (chat:abort, a newer send, shutdown) sends ``session/cancel``, answers waiting
permission requests ``cancelled``, keeps mapping updates until the agent ends the prompt,
and after ``cancelTimeoutMs`` ends the turn itself. The next prompt of that agent session
waits (bounded) for the abandoned one: prompts on one agent session are serialised.

Must stay true (as GenerationHandler): ``stream_start`` is the first event; the last
throttled state is flushed before the final event; the partial content and raw updates
are persisted at the settings' interval (a failed write is logged and retried) and at the
end; every ending runs shielded and bounded (``_end``) and gives exactly one final event
(an ending that fails falls back to ``error``); cancellation is re-raised after the
aborted state is written; the ``session/cancel`` cleanup is bounded too (a wedged agent
cannot hold the stop); nothing from the agent fails the turn except the agent's own
failure, and a bug or store failure ends it as ``error``, never escaping the job.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.events import (
    AbortedEvent,
    ErrorEvent,
    NoticeEvent,
    StreamEndEvent,
    StreamStartEvent,
    StreamToolCall,
    ToolApprovalOption,
    ToolApprovalRequiredEvent,
    UsageEvent,
)
from protocol.providers import AcpEngineConfig
from protocol.settings import ChatSettings
from protocol.tools import ToolPolicySetParams
from protocol.types import (
    CodePart,
    ContentPart,
    FilePart,
    ImagePart,
    MessageV2,
    TextPart,
    Usage,
)
from sidecar.acp.client import AcpConnection, PromptCall
from sidecar.acp.engines import AcpEngines
from sidecar.acp.mapping import UpdateMapper
from sidecar.acp.types import (
    AgentFeatures,
    CancelledOutcome,
    EmbeddedResourceBlock,
    ImageBlock,
    PromptBlock,
    RequestPermissionParams,
    RequestPermissionResult,
    ResourceLinkBlock,
    SelectedOutcome,
    TextBlock,
    TextResource,
    prompt_usage,
)
from sidecar.engine.approvals import ApprovalRequest, pick_option
from sidecar.engine.generation import internal_failure
from sidecar.engine.relay import StreamRelay
from sidecar.engine.reply import ReplyBuilder
from sidecar.errors import EngineError, ProviderError, SidecarError
from sidecar.store.store import Store

log = logging.getLogger(__name__)

FINALIZE_TIMEOUT_S = 10.0
FALLBACK_TIMEOUT_S = 3.0
EMBED_MAX_BYTES = 256 * 1024
"""Text files up to this size are embedded in the prompt when the agent accepts embedded context."""
FINISH_REASONS = {
    "end_turn": "stop",
    "max_tokens": "length",
    "max_turn_requests": "max_turn_requests",
    "refusal": "refusal",
}
_json = msgspec.json.Encoder()


class AcpReply(ReplyBuilder):
    """ReplyBuilder plus in-place part changes (ACP tool calls are updated after they start)."""

    def put(self, part: ContentPart) -> int:
        self.parts.append(part)
        self.dirty = True
        return len(self.parts) - 1

    def replace(self, index: int, part: ContentPart) -> None:
        self.parts[index] = part
        self.dirty = True


class _Output:
    """UpdateMapper's Output over a reply and its relay."""

    def __init__(self, reply: AcpReply, relay: StreamRelay) -> None:
        self._reply = reply
        self._relay = relay

    async def delta(self, kind: str, text: str) -> None:
        await self._relay.delta(kind, text)

    async def emit(self, event_type: type, **fields: Any) -> None:
        await self._relay.emit(event_type, **fields)

    async def add_part(self, part: ContentPart) -> int:
        await self._relay.flush()  # deltas that came first stay first in the parts
        return self._reply.put(part)

    def set_part(self, index: int, part: ContentPart) -> None:
        self._reply.replace(index, part)

    def set_usage(self, usage: Usage) -> None:
        self._reply.usage = usage
        self._reply.dirty = True

    def usage(self) -> Usage | None:
        return self._reply.usage


class _Turn:
    """The TurnSink of one reply: queued updates, permission requests, the prompt call."""

    def __init__(
        self,
        handler: AcpTurnHandler,
        job: Any,
        reply: AcpReply,
        relay: StreamRelay,
        engine_id: str,
        config: AcpEngineConfig | None,
    ) -> None:
        self._handler = handler
        self.job = job
        self.relay = relay
        self.reply = reply
        self.mapper = UpdateMapper(_Output(reply, relay))
        self.engine_id = engine_id
        self.config = config
        self.call: PromptCall | None = None
        self._queue: deque[msgspec.Raw] = deque()
        self._changed = anyio.Event()
        self._permission_scopes: set[anyio.CancelScope] = set()
        self._asked: dict[str, int] = {}
        self.cancelled = False

    # -- TurnSink --------------------------------------------------------------------

    def on_update(self, update: msgspec.Raw) -> None:
        self._queue.append(update)
        self._changed.set()

    def wake(self) -> None:
        self._changed.set()

    def cancel_permissions(self) -> None:
        self.cancelled = True
        for scope in list(self._permission_scopes):
            scope.cancel()

    async def request_permission(self, params: RequestPermissionParams) -> RequestPermissionResult:
        with anyio.CancelScope() as scope:
            self._permission_scopes.add(scope)
            try:
                if not self.cancelled:
                    return await self._handler._permission(self, params)
            finally:
                self._permission_scopes.discard(scope)
        return RequestPermissionResult(outcome=CancelledOutcome())

    def approval_id(self, tool_call_id: str) -> str:
        """A tool call id unique within this reply (an agent may ask twice for one call)."""
        count = self._asked.get(tool_call_id, 0) + 1
        self._asked[tool_call_id] = count
        return tool_call_id if count == 1 else f"{tool_call_id}#{count}"

    # -- consuming -------------------------------------------------------------------

    async def consume(self) -> None:
        """Map queued updates until the prompt call has ended and the queue is empty."""
        assert self.call is not None
        while True:
            self._changed = anyio.Event()
            while self._queue:
                await self.mapper.apply(self._queue.popleft())
            if self.call.done.is_set() and not self._queue:
                return
            if not self._queue:
                await self._changed.wait()


class AcpTurnHandler:
    def __init__(
        self,
        *,
        store: Any,
        notify: Callable[[str, Any], Awaitable[None]],
        providers: Any,
        engines: AcpEngines,
        attachments: Any,
        settings: Callable[[], ChatSettings],
        data_dir: Path,
        approvals: Callable[[], Any] = lambda: None,
        mcp_servers: Callable[[AgentFeatures], Awaitable[list[Any]]] | None = None,
    ) -> None:
        self._store = store
        self._notify = notify
        self._providers = providers
        self._engines = engines
        self._attachments = attachments
        self._settings = settings
        self._data_dir = data_dir
        self._approvals = approvals
        self._mcp_servers = mcp_servers

    # -- the job -----------------------------------------------------------------------

    async def run(self, job: Any) -> None:
        settings = self._settings()
        reply = AcpReply()
        relay = StreamRelay(
            self._notify,
            job.session.id,
            job.message_id,
            coalesce_s=max(0, settings.delta_coalesce_ms) / 1000,
            on_delta=reply.add_delta,
        )
        job.live = (reply, relay)
        started = time.monotonic()
        turn = _Turn(self, job, reply, relay, job.provider_id, None)
        try:
            await relay.emit(
                StreamStartEvent, parent_id=job.parent_id, model_id=job.model_id, provider_id=job.provider_id
            )
            failure, stop = await self._drive(turn, settings)
        except anyio.get_cancelled_exc_class():
            await self._end(turn, started, "aborted", reason=job.abort_reason)
            raise
        except Exception as exc:  # a store failure or a bug (the task group wraps it)
            log.exception("ACP turn %s failed", job.message_id)
            failure, stop = internal_failure(exc, "running the agent turn"), ""
        if failure is not None:
            await self._end(turn, started, "error", failure=failure)
        elif stop == "cancelled":
            await self._end(turn, started, "aborted", reason="the agent cancelled the turn")
        else:
            await self._end(turn, started, "completed", stop=stop)

    async def _drive(self, turn: _Turn, settings: ChatSettings) -> tuple[SidecarError | None, str]:
        """Run the prompt; returns (failure, stop reason). Cancellation propagates."""
        job = turn.job
        try:
            record = await self._providers.engine(job.provider_id)
            config: AcpEngineConfig = record.engine
            turn.config = config
            job.stop_grace = config.cancel_timeout_ms / 1000 + 1  # _cancel's bound, see below
            turn.engine_id = record.id
            conn = await self._engines.connect(record.id, record.name, record.updated_at, config)
            user = await self._store.run(lambda s: s.messages.get(job.parent_id))
            agent_sid, notices = await self._open_agent_session(conn, job, user)
            prompt, dropped = await self._prompt_blocks(conn, user)
            await conn.wait_prompt_slot(agent_sid, config.cancel_timeout_ms / 1000)
        except SidecarError as exc:
            return exc, ""
        except Exception as exc:  # a bug: keep serving, report it as internal
            log.exception("preparing ACP turn %s failed", job.message_id)
            return SidecarError(f"internal error while preparing the agent turn: {type(exc).__name__}"), ""
        for code, text in notices:
            await turn.relay.emit(NoticeEvent, notice=text, code=code)
        if dropped:
            await turn.relay.emit(NoticeEvent, notice=dropped, code="acp_content_not_sent")
        conn.attach(agent_sid, turn)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(turn.relay.run_flusher)
                tg.start_soon(self._persist_loop, turn, settings)
                turn.call = conn.start_prompt(agent_sid, prompt, turn.wake)
                try:
                    await turn.consume()
                finally:
                    tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            grace = config.cancel_timeout_ms / 1000
            # bounded: session/cancel itself can wait on a wedged agent's full write queue
            with anyio.CancelScope(shield=True), anyio.move_on_after(grace + 1):
                await self._cancel(conn, agent_sid, turn, grace)
            raise
        finally:
            turn.cancel_permissions()  # a question of a turn that is over has no answer
            conn.detach(agent_sid, turn)
        call = turn.call
        assert call is not None
        if call.error is not None:
            return call.error, ""
        assert call.result is not None
        usage = prompt_usage(call.result)
        if usage is not None:
            current = turn.reply.usage or Usage()
            turn.reply.usage = msgspec.structs.replace(
                current,
                input_tokens=usage.input_tokens or current.input_tokens,
                output_tokens=usage.output_tokens or current.output_tokens,
                reasoning_tokens=usage.thought_tokens if usage.thought_tokens is not None else current.reasoning_tokens,
                cache_read_tokens=usage.cached_read_tokens if usage.cached_read_tokens is not None else current.cache_read_tokens,
                cache_write_tokens=usage.cached_write_tokens if usage.cached_write_tokens is not None else current.cache_write_tokens,
            )
        return None, call.result.stop_reason

    async def _cancel(self, conn: AcpConnection, agent_sid: str, turn: _Turn, grace: float) -> None:
        """session/cancel, then map updates until the agent ends the prompt or ``grace`` passes."""
        call = turn.call
        try:
            await conn.cancel(agent_sid)
        except Exception:
            log.exception("session/cancel to %s failed", conn.name)
        if call is None:
            return
        with anyio.move_on_after(grace):
            await turn.consume()
        if not call.done.is_set():
            log.warning(
                "engine %s did not end the prompt of %s within %.1f s after session/cancel; ending the turn",
                conn.name, agent_sid, grace,
            )
            turn.job.abort_reason = (turn.job.abort_reason or "aborted") + (
                f" (the agent did not stop within {grace:g} s; the turn was ended without it)"
            )

    # -- agent sessions ----------------------------------------------------------------

    async def _open_agent_session(
        self, conn: AcpConnection, job: Any, user: MessageV2
    ) -> tuple[str, list[tuple[str, str]]]:
        cwd = await self._workspace(job.session)
        mcp = await self._mcp_servers(conn.features) if self._mcp_servers is not None else []
        base = None
        if user.parent_id is not None:
            parent_id = user.parent_id
            base = await self._store.run(lambda s: s.acp.turn(parent_id))
        notices: list[tuple[str, str]] = []
        if base is not None and base.engine_id != conn.engine_id:
            notices.append((
                "acp_history_unavailable",
                "The earlier turns ran on another agent engine: this agent starts without them.",
            ))
            base = None
        elif base is None and user.parent_id is not None:
            notices.append((
                "acp_history_unavailable",
                "The agent has no session for the earlier turns of this branch: it starts without them.",
            ))
        agent_sid: str | None = None
        if base is not None and await self._ensure_open(conn, base.agent_session_id, cwd, mcp, notices):
            if conn.features.fork_session:
                agent_sid = await conn.fork_session(base.agent_session_id, cwd, mcp)
            else:
                agent_sid = base.agent_session_id
        if agent_sid is None:
            agent_sid = await conn.new_session(cwd, mcp)
        await self._store.run(lambda s: s.acp.record_turn(job.message_id, job.session.id, conn.engine_id, agent_sid))
        return agent_sid, notices

    async def _ensure_open(
        self, conn: AcpConnection, agent_sid: str, cwd: str, mcp: list[Any], notices: list[tuple[str, str]]
    ) -> bool:
        if agent_sid in conn.opened:
            return True
        if conn.features.load_session:
            try:
                await conn.load_session(agent_sid, cwd, mcp)
                return True
            except ProviderError as exc:
                log.warning("engine %s could not load session %s: %s", conn.name, agent_sid, exc.message)
                notices.append((
                    "acp_session_replaced",
                    f"The agent could not reload the earlier conversation ({exc.message}); "
                    "it continues in a new agent session without the earlier turns.",
                ))
                return False
        notices.append((
            "acp_session_replaced",
            "The agent engine was restarted and cannot reload conversations (it does not offer "
            "session/load): this turn starts a new agent session without the earlier turns.",
        ))
        return False

    async def _workspace(self, session: Any) -> str:
        configured = getattr(session, "workspace_dir", None)
        path = Path(configured) if configured else self._data_dir / "acp" / session.id

        def make() -> str:
            path.mkdir(parents=True, exist_ok=True)
            return str(path.resolve())

        try:
            return await anyio.to_thread.run_sync(make)
        except OSError as exc:
            raise EngineError(f"the session's working directory {str(path)!r} is not usable: {exc.strerror or exc}") from exc

    async def require_fork(self, session: Any) -> None:
        """Regenerate / edit-and-resend need ``session/fork``: EngineError if the engine lacks it."""
        record = await self._providers.engine(session.provider_id)
        conn = await self._engines.connect(record.id, record.name, record.updated_at, record.engine)
        if not conn.features.fork_session:
            raise SidecarError(
                f"the agent engine {record.name!r} does not offer session/fork, so chat:regenerate and "
                "chat:editResend are not available in this ACP session (send a new message instead)",
                code=ErrorCode.NOT_IMPLEMENTED,
            )

    async def close_session(self, session_id: str) -> None:
        """Close the agent sessions of a chat session that is being deleted (where supported)."""
        pairs = await self._store.run(lambda s: s.acp.agent_sessions(session_id))
        for engine_id, agent_sid in pairs:
            conn = self._engines.live(engine_id)
            if conn is None or not conn.features.close_session or agent_sid not in conn.opened:
                continue
            try:
                await conn.close_session(agent_sid)
            except SidecarError as exc:
                log.info("engine %s: closing session %s failed: %s", conn.name, agent_sid, exc.message)

    # -- prompt ------------------------------------------------------------------------

    async def _prompt_blocks(self, conn: AcpConnection, user: MessageV2) -> tuple[list[PromptBlock], str]:
        features = conn.features
        parts: list[ContentPart] = list(user.parts or [])
        if not parts:
            parts = [TextPart(text=user.text_content or "")]
        blocks: list[PromptBlock] = []
        dropped: list[str] = []
        for part in parts:
            if isinstance(part, TextPart):
                blocks.append(TextBlock(text=part.text))
            elif isinstance(part, CodePart):
                blocks.append(TextBlock(text=f"```{part.language}\n{part.code}\n```"))
            elif isinstance(part, ImagePart):
                if not features.prompt_image:
                    dropped.append("an image (the agent does not accept images)")
                    continue
                data = part.base64
                if data is None and part.url:
                    data = await anyio.to_thread.run_sync(self._attachments.load_base64, part.url)
                if data is None:
                    dropped.append("an image whose file is missing")
                    continue
                blocks.append(ImageBlock(data=data, mime_type=part.mime_type))
            elif isinstance(part, FilePart):
                blocks.append(await self._file_block(part, features.prompt_embedded_context))
        if not blocks:
            blocks.append(TextBlock(text=user.text_content or ""))
        note = ""
        if dropped:
            note = "Not sent to the agent: " + "; ".join(dropped) + "."
        return blocks, note

    async def _file_block(self, part: FilePart, embed: bool) -> PromptBlock:
        name = part.name or Path(part.uri).name or "file"
        mime = part.mime_type or ""
        if embed and (mime.startswith("text/") or mime in ("application/json", "application/xml")):
            data = await anyio.to_thread.run_sync(lambda: self._attachments.load_bytes(part.uri, EMBED_MAX_BYTES + 1))
            if data is not None and len(data) <= EMBED_MAX_BYTES:
                return EmbeddedResourceBlock(
                    resource=TextResource(uri=part.uri, text=data.decode("utf-8", "replace"), mime_type=mime or None)
                )
        return ResourceLinkBlock(uri=part.uri, name=name, mime_type=part.mime_type)

    # -- permissions -------------------------------------------------------------------

    async def _permission(self, turn: _Turn, params: RequestPermissionParams) -> RequestPermissionResult:
        approvals = self._approvals()
        call = params.tool_call
        kind = call.kind if isinstance(call.kind, str) and call.kind else "other"
        options = [ToolApprovalOption(option_id=o.option_id, name=o.name, kind=o.kind) for o in params.options]
        if approvals is None or not options:
            log.warning("engine %s: permission request answered cancelled (no approval flow or no options)", turn.engine_id)
            return RequestPermissionResult(outcome=CancelledOutcome())
        name = call.title if isinstance(call.title, str) and call.title else kind
        raw_input = call.raw_input if call.raw_input is not msgspec.UNSET else {}
        arguments = _json.encode(raw_input).decode()
        policy_key = f"acp:{turn.engine_id}:{kind}"
        auto = turn.config is not None and kind in turn.config.auto_allow
        request = ApprovalRequest(
            session_id=turn.job.session.id,
            message_id=turn.job.message_id,
            tool_call_id=turn.approval_id(call.tool_call_id),
            tool_name=name,
            arguments=arguments,
            source="acp",
            policy_key=policy_key,
            default_policy="auto" if auto else "ask",
            options=options,
        )

        async def announce(req: Any) -> None:
            await turn.relay.emit(
                ToolApprovalRequiredEvent,
                tool_call=StreamToolCall(id=req.tool_call_id, name=req.tool_name, arguments=req.arguments),
                decisions=["approved", "denied"],
                options=options,
                source="acp",
            )

        decision = await approvals.ask(request, announce=announce)
        if decision.decision == "cancelled":
            return RequestPermissionResult(outcome=CancelledOutcome())
        option_id = decision.option_id or pick_option(options, decision.decision == "approved", False)
        chosen = next((o for o in options if o.option_id == option_id), None)
        if chosen is None:
            return RequestPermissionResult(outcome=CancelledOutcome())
        if chosen.kind in ("allow_always", "reject_always") and not decision.remember and decision.actor == "user":
            # the user picked an "always" option by id: remember it per engine and tool kind
            policy = "auto" if chosen.kind == "allow_always" else "deny"
            await approvals.set_policy(ToolPolicySetParams(key=policy_key, policy=policy))
        return RequestPermissionResult(outcome=SelectedOutcome(option_id=chosen.option_id))

    # -- persistence and endings ---------------------------------------------------------

    async def _persist_loop(self, turn: _Turn, settings: ChatSettings) -> None:
        job = turn.job
        interval = max(20, settings.persist_interval_ms) / 1000
        unwritten = True  # the status becomes streaming at once, before the agent answers
        failures = 0
        while True:
            try:
                if unwritten:
                    seq = turn.relay.seq
                    await self._store.run(lambda s: s.messages.update_partial(
                        job.message_id, text_content="", parts=None, status="streaming", seq=seq
                    ))
                    unwritten = False
                elif turn.reply.dirty or turn.mapper.raw_dirty:
                    await self._write_partial(turn)
            except SidecarError as exc:
                # the content stays in memory: the next tick and the final row write it
                failures += 1
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "could not store the partial reply %s (%d times): %s", job.message_id, failures, exc.message,
                )
                turn.reply.dirty = True
                turn.mapper.raw_dirty = True
            await anyio.sleep(interval)

    async def _write_partial(self, turn: _Turn) -> None:
        snap = turn.reply.snapshot()
        raw = list(turn.mapper.raw)
        turn.mapper.raw_dirty = False
        job = turn.job
        acp_id = turn.mapper.acp_message_id
        seq = turn.relay.seq

        def write(store: Store) -> None:
            store.messages.update_partial(
                job.message_id, text_content=snap.text_content, parts=snap.parts, status="streaming", seq=seq
            )
            store.acp.write_raw(job.message_id, acp_id, raw)

        await self._store.run(write)

    async def _end(
        self,
        turn: _Turn,
        started: float,
        outcome: str,
        *,
        stop: str = "",
        reason: str | None = None,
        failure: SidecarError | None = None,
    ) -> None:
        """The turn's one ending, shielded (a stop arriving meanwhile waits for it) and
        bounded; if it fails or runs out of time before its final event, ``error``."""
        job = turn.job
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(FINALIZE_TIMEOUT_S):
                try:
                    await self._finish(turn, started, outcome, stop=stop, reason=reason, failure=failure)
                except Exception:
                    log.exception("ending the ACP turn %s failed", job.message_id)
            if job.outcome is not None:
                return
            with anyio.move_on_after(FALLBACK_TIMEOUT_S):
                try:
                    await self._finish(
                        turn, started, "error", failure=SidecarError("internal error while ending the agent turn")
                    )
                except Exception:
                    log.exception("the fallback ending of %s failed too", job.message_id)

    async def _finish(
        self,
        turn: _Turn,
        started: float,
        outcome: str,
        *,
        stop: str = "",
        reason: str | None = None,
        failure: SidecarError | None = None,
    ) -> None:
        job = turn.job
        relay = turn.relay
        relay.close()
        await relay.flush()
        reply = turn.reply
        if outcome == "completed" and reply.usage is not None:
            await relay.emit(UsageEvent, usage=reply.usage)
        snap = reply.snapshot()
        raw = list(turn.mapper.raw)
        status = outcome
        seq = relay.seq + 1

        def write(store: Store) -> None:
            store.messages.finish(
                job.message_id,
                status=status,
                text_content=snap.text_content,
                parts=snap.parts,
                usage=reply.usage,
                latency_ms=int((time.monotonic() - started) * 1000),
                model_id=job.model_id or None,
                error=failure.message if failure is not None else None,
                seq=seq,
            )
            store.acp.write_raw(job.message_id, turn.mapper.acp_message_id, raw)

        try:
            await self._store.run(write)
            if outcome == "completed" and reply.usage is not None:
                tokens = reply.usage.input_tokens + reply.usage.output_tokens
                if tokens:
                    await self._store.run(lambda s: s.sessions.add_usage(job.session.id, tokens, 0.0))
        except Exception:  # the final event still goes out (restart recovery ends the row)
            log.exception("could not store the %s state of %s", outcome, job.message_id)
        job.outcome = outcome
        if outcome == "completed":
            await relay.emit(StreamEndEvent, finish_reason=FINISH_REASONS.get(stop, "other"), usage=reply.usage)
        elif outcome == "aborted":
            await relay.emit(AbortedEvent, reason=reason)
        else:
            assert failure is not None
            code = int(failure.code) if failure.code != ErrorCode.INTERNAL_ERROR else None
            await relay.emit(ErrorEvent, error=failure.message, code=code)
