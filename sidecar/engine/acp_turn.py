"""AcpTurnHandler: the replies of ``mode: "acp"`` sessions, delegated to an agent engine.

The agent turn is a ReplyLifecycle driver (sidecar/engine/lifecycle/: the row, seq,
events, persistence and the ending are the lifecycle's); ChatEngine runs it for the
replies of ACP sessions (the user message is ``job.parent_id``). A turn:

1. the engine (an ``acp-engine`` provider) is started or reused (sidecar.acp.engines);
2. the agent session is chosen (``_open_agent_session``): the reply that the user message
   follows names, in ``acp_turns``, the agent session it ran on. When that reply is the
   agent session's newest turn (its head: a plain next turn) the turn continues that
   session; otherwise (a regenerate, an edit-and-resend, a send on an older branch) the
   session has gone on past that reply, and the turn runs on a ``session/fork`` of it: the
   agent cannot go back, so its context keeps the later turns, and a ``notice``
   (``acp_history_kept``) says so (no fork: the session is continued, with the same notice;
   regenerate and edit need fork, ChatEngine checks). Agent sessions no reply runs on any
   more (a deleted session or branch) are closed with ``session/close`` where advertised,
   also after an engine restart (``reap_released``). A session unknown to this engine
   process is reloaded with ``session/load`` when advertised, otherwise the turn starts a
   new agent session and says so in a ``notice`` event; the first turn uses
   ``session/new``. The working directory is the session's ``workspaceDir``, else
   ``<dataDir>/acp/<sessionId>`` (owned by the session: removed with it);
3. ``session/prompt`` with the user message: text, images (when the agent accepts them),
   files as resource links (embedded text when the agent accepts embedded context);
4. every ``session/update`` goes through UpdateMapper into the reply (its parts and their
   events), and is kept verbatim for ``acp_parts`` (appended with the reply's row at each
   persistence tick, only what arrived since the last: the driver's ``persisted`` hook;
   joined at the ending); ``session/request_permission`` goes through the approval
   flow (ApprovalService.ask: policy ``acp:<engineId>:<kind>``, the engine's autoAllow
   kinds default to auto; ``tool_approval_required`` event; always-options remembered)
   while the turn waits for it;
5. the stop reason ends the reply: end_turn / max_tokens / max_turn_requests / refusal
   -> ``stream_end`` (finish reason stop / length / max_turn_requests / refusal);
   cancelled -> ``aborted``; the agent's failure or exit -> ``error`` with the partial
   content kept.

Cancellation (chat:abort, a newer send, shutdown) sends ``session/cancel``, answers waiting
permission requests ``cancelled``, keeps mapping updates until the agent ends the prompt,
and after ``cancelTimeoutMs`` ends the turn itself (``job.stop_grace`` lets a stop wait that
long). At shutdown the wait is shorter: a share of what is left of the shutdown deadline
(``cancel_grace``), so the turn still ends ``aborted``, its row stored and its final event
sent, before the process must exit. The next prompt of that agent session waits (bounded)
for the abandoned one: prompts on one agent session are serialised.

Must stay true: the ``session/cancel`` cleanup is bounded (a wedged agent cannot hold the
stop); nothing from the agent fails the turn except the agent's own failure.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import msgspec

from protocol.errors import ErrorCode
from protocol.events import FinishReason, NoticeCode, StreamToolCall, ToolApprovalOption
from protocol.providers import AcpEngineConfig
from protocol.settings import ChatSettings
from protocol.tools import ToolPolicySetParams
from protocol.types import (
    CodePart,
    ContentPart,
    FilePart,
    ImagePart,
    MessageV2,
    SessionV2,
    TextPart,
    Usage,
)
from sidecar import datadir
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
from sidecar.engine.approvals import ApprovalRequest, ApprovalService, Policy, pick_option
from sidecar.engine.lifecycle import (
    Aborted,
    Completed,
    Ending,
    Failed,
    ReplyDriver,
    ReplyFeed,
    ReplyJob,
    StoreWrite,
)
from sidecar.errors import EngineError, ProviderError, SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.store.providers import ProviderRecord
from sidecar.supervision import SHUTDOWN_CLOCK

log = logging.getLogger(__name__)

EMBED_MAX_BYTES = 256 * 1024
"""Text files up to this size are embedded in the prompt when the agent accepts embedded context."""
FINISH_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "max_tokens": "length",
    "max_turn_requests": "max_turn_requests",
    "refusal": "refusal",
}
SHUTDOWN_CANCEL_SHARES = 4
"""At shutdown the cancel wait is one of this many shares of the deadline left: the rest is
for the reply's ending, the engines' stop (stdin, SIGTERM, SIGKILL) and the exit."""
_json = msgspec.json.Encoder()


_SAFE_DIR = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _dir_name(session_id: str) -> str:
    """The default workspace folder of a session: its id, or a digest of an id (an imported
    one) that is not a plain file name."""
    if _SAFE_DIR.match(session_id):
        return session_id
    return "s-" + hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()[:40]


def cancel_grace(cancel_timeout_s: float) -> float:
    """How long a cancelled turn waits for the agent to end its prompt: the engine's
    ``cancelTimeoutMs``, or at shutdown at most its share of the shutdown deadline left."""
    if SHUTDOWN_CLOCK.started:
        return SHUTDOWN_CLOCK.share(cancel_timeout_s, SHUTDOWN_CANCEL_SHARES)
    return cancel_timeout_s


class _AcpTurn(ReplyDriver):
    """The driver of one ACP reply, and the TurnSink of its agent session while it runs."""

    doing = "running the agent turn"

    def __init__(self, handler: AcpTurnHandler, job: ReplyJob) -> None:
        self._handler = handler
        self.job = job
        self.engine_id = job.provider_id
        self.config: AcpEngineConfig | None = None
        self.reply: ReplyFeed | None = None
        self.mapper: UpdateMapper | None = None
        self.call: PromptCall | None = None
        self._queue: deque[msgspec.Raw] = deque()
        self._changed = anyio.Event()
        self._permission_scopes: set[anyio.CancelScope] = set()
        self._asked: dict[str, int] = {}
        self._raw_saved = 0
        """Raw updates handed to a persisted write so far (the next chunk starts here)."""
        self._raw_id_saved = False
        self.cancelled = False

    # -- the driver ----------------------------------------------------------------------

    async def drive(self, reply: ReplyFeed) -> Ending:
        """Prepare the agent session, run the prompt, map its updates; cancellation
        propagates after session/cancel (bounded)."""
        self.reply = reply
        self.mapper = UpdateMapper(reply)
        handler = self._handler
        job = self.job
        try:
            record = await handler._providers.engine(job.provider_id)
            config = record.engine
            if config is None:  # engine() only returns acp-engine records, which have one
                raise EngineError(f"provider {record.name!r} has no engine configuration")
            self.config = config
            job.stop_grace = config.cancel_timeout_ms / 1000 + 1  # _cancel's bound, see below
            self.engine_id = record.id
            conn = await handler._engines.connect(record.id, record.name, record.updated_at, config)
            handler._reap_soon()  # agent sessions released while this engine was not running
            user = await handler._store.run(lambda s: s.messages.get(job.parent_id))
            agent_sid, notices = await handler._open_agent_session(conn, job, user)
            prompt, dropped = await handler._prompt_blocks(conn, user)
            await conn.wait_prompt_slot(agent_sid, config.cancel_timeout_ms / 1000)
        except SidecarError as exc:
            return Failed(exc, close_open=False)
        except Exception as exc:  # a bug: keep serving, report it as internal
            log.exception("preparing ACP turn %s failed", job.message_id)
            return Failed(
                SidecarError(f"internal error while preparing the agent turn: {type(exc).__name__}"), close_open=False
            )
        for code, text in notices:
            await reply.notice(text, code)
        if dropped:
            await reply.notice(dropped, "acp_content_not_sent")
        conn.attach(agent_sid, self)
        try:
            self.call = conn.start_prompt(agent_sid, prompt, self.wake)
            await self.consume()
        except anyio.get_cancelled_exc_class():
            grace = cancel_grace(config.cancel_timeout_ms / 1000)
            # bounded: session/cancel itself can wait on a wedged agent's full write queue
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_CLOCK.bound(grace + 1)):
                await self._cancel(conn, agent_sid, grace)
            raise
        finally:
            self.cancel_permissions()  # a question of a turn that is over has no answer
            conn.detach(agent_sid, self)
        call = self.call
        assert call is not None
        if call.error is not None:
            return Failed(call.error, close_open=False)
        assert call.result is not None
        usage = prompt_usage(call.result)
        if usage is not None:
            current = reply.content.usage or Usage()
            await reply.report_usage(msgspec.structs.replace(
                current,
                input_tokens=usage.input_tokens or current.input_tokens,
                output_tokens=usage.output_tokens or current.output_tokens,
                reasoning_tokens=usage.thought_tokens if usage.thought_tokens is not None else current.reasoning_tokens,
                cache_read_tokens=usage.cached_read_tokens if usage.cached_read_tokens is not None else current.cache_read_tokens,
                cache_write_tokens=usage.cached_write_tokens if usage.cached_write_tokens is not None else current.cache_write_tokens,
            ))
        stop = call.result.stop_reason
        if stop == "cancelled":
            return Aborted("the agent cancelled the turn")
        return Completed(FINISH_REASONS.get(stop, "other"))

    def persisted(self) -> StoreWrite | None:
        """The raw session/update updates that arrived since the last call, as one chunk
        (idempotent: the chunk is keyed by its first update's number)."""
        mapper = self.mapper
        if mapper is None or not mapper.raw_dirty:
            return None
        mapper.raw_dirty = False
        first, end = self._raw_saved, len(mapper.raw)
        acp_id = mapper.acp_message_id if not self._raw_id_saved else None
        if first == end and acp_id is None:
            return None
        self._raw_saved = end
        self._raw_id_saved = self._raw_id_saved or acp_id is not None
        message_id, chunk = self.job.message_id, mapper.raw[first:end]
        return lambda s: s.acp.append_raw(message_id, first, chunk, acp_id)

    def final_write(self, outcome: str) -> StoreWrite | None:
        """The chunks joined into acp_parts, in the transaction of the final row."""
        message_id = self.job.message_id
        return lambda s: s.acp.finish_raw(message_id)

    async def _cancel(self, conn: AcpConnection, agent_sid: str, grace: float) -> None:
        """session/cancel, then map updates until the agent ends the prompt or ``grace`` passes."""
        call = self.call
        try:
            await conn.cancel(agent_sid)
        except Exception:
            log.exception("session/cancel to %s failed", conn.name)
        if call is None:
            return
        with anyio.move_on_after(grace):
            await self.consume()
        if not call.done.is_set():
            log.warning(
                "engine %s did not end the prompt of %s within %.1f s after session/cancel; ending the turn",
                conn.name, agent_sid, grace,
            )
            self.job.abort_reason = (self.job.abort_reason or "aborted") + (
                f" (the agent did not stop within {grace:g} s; the turn was ended without it)"
            )

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

    async def consume(self) -> None:
        """Map queued updates until the prompt call has ended and the queue is empty."""
        assert self.call is not None and self.mapper is not None
        while True:
            self._changed = anyio.Event()
            while self._queue:
                await self.mapper.apply(self._queue.popleft())
            if self.call.done.is_set() and not self._queue:
                return
            if not self._queue:
                await self._changed.wait()


class EngineSource(Protocol):
    """The stored agent engines (sidecar.engine.providers.ProviderService)."""

    async def engine(self, provider_id: str) -> ProviderRecord: ...


class AcpTurnHandler:
    """The drivers of ACP replies, and what they share: the engines, prompts, permissions."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        providers: EngineSource,
        engines: AcpEngines,
        attachments: AttachmentStore,
        data_dir: Path,
        approvals: ApprovalService | None = None,
        mcp_servers: Callable[[AgentFeatures], Awaitable[list[Any]]] | None = None,
    ) -> None:
        self._store = store
        self._providers = providers
        self._engines = engines
        self._attachments = attachments
        self._data_dir = data_dir
        self._approvals = approvals
        self._mcp_servers = mcp_servers
        self._background: anyio.abc.TaskGroup | None = None
        self._released_left = True
        """Released agent sessions may wait for an engine that was not running (unknown at
        start): the next turn that starts an engine closes them, in the background."""
        self._reaping = False

    def start_background(self, task_group: anyio.abc.TaskGroup) -> None:
        """Where closing released agent sessions runs when a turn starts an engine."""
        self._background = task_group

    def _reap_soon(self) -> None:
        if self._background is None or not self._released_left or self._reaping:
            return
        self._reaping = True

        async def reap() -> None:
            try:
                await self.reap_released()
            except anyio.get_cancelled_exc_class():
                raise
            except Exception:
                log.exception("closing released agent sessions failed")
            finally:
                self._reaping = False

        self._background.start_soon(reap)

    def driver(self, job: ReplyJob, settings: ChatSettings) -> ReplyDriver:
        return _AcpTurn(self, job)

    # -- agent sessions ----------------------------------------------------------------

    async def _open_agent_session(
        self, conn: AcpConnection, job: ReplyJob, user: MessageV2
    ) -> tuple[str, list[tuple[NoticeCode, str]]]:
        cwd = await self._workspace(job.session)
        mcp = await self._mcp_servers(conn.features) if self._mcp_servers is not None else []
        base = None
        if user.parent_id is not None:
            parent_id = user.parent_id
            base = await self._store.run(lambda s: s.acp.turn(parent_id))
        notices: list[tuple[NoticeCode, str]] = []
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
            engine_id, base_sid = conn.engine_id, base.agent_session_id
            head = await self._store.run(lambda s: s.acp.head(engine_id, base_sid))
            if head == base.message_id:  # a plain next turn: the session holds exactly the branch
                agent_sid = base_sid
            else:
                # the session went on past this reply (a regenerate, an edit, an older branch):
                # the agent cannot go back; a fork leaves the other branch's session as it is
                if conn.features.fork_session:
                    agent_sid = await conn.fork_session(base_sid, cwd, mcp)
                else:
                    agent_sid = base_sid
                notices.append((
                    "acp_history_kept",
                    "The agent cannot go back to this point of its session: the later turns of the "
                    "conversation stay in its context.",
                ))
        if agent_sid is None:
            agent_sid = await conn.new_session(cwd, mcp)
        await self._store.run(lambda s: s.acp.record_turn(job.message_id, job.session.id, conn.engine_id, agent_sid))
        return agent_sid, notices

    async def _ensure_open(
        self, conn: AcpConnection, agent_sid: str, cwd: str, mcp: list[Any], notices: list[tuple[NoticeCode, str]]
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

    async def _workspace(self, session: SessionV2) -> str:
        """The session's ``workspaceDir``, else its default one in the data dir, owned by
        the session (recorded before it is created: removed with the session)."""
        configured = session.workspace_dir
        path = Path(configured) if configured else self._data_dir / "acp" / _dir_name(session.id)
        if not configured and not await anyio.to_thread.run_sync(path.is_dir):
            session_id = session.id
            await self._store.run(lambda s: s.files.own(session_id, None, path, "workspace"))

        def make() -> str:
            if configured:  # the user's folder: made as any program would
                path.mkdir(parents=True, exist_ok=True)
            else:  # in the data dir: the user's alone (sidecar/datadir.py)
                datadir.make_dirs(path)
            return str(path.resolve())

        try:
            return await anyio.to_thread.run_sync(make)
        except OSError as exc:
            raise EngineError(f"the session's working directory {str(path)!r} is not usable: {exc.strerror or exc}") from exc

    async def require_fork(self, session: SessionV2) -> None:
        """Regenerate / edit-and-resend need ``session/fork``: EngineError if the engine lacks it."""
        record = await self._providers.engine(session.provider_id)
        if record.engine is None:  # engine() only returns acp-engine records, which have one
            raise EngineError(f"provider {record.name!r} has no engine configuration")
        conn = await self._engines.connect(record.id, record.name, record.updated_at, record.engine)
        if not conn.features.fork_session:
            raise SidecarError(
                f"the agent engine {record.name!r} does not offer session/fork, so chat:regenerate and "
                "chat:editResend are not available in this ACP session (send a new message instead)",
                code=ErrorCode.NOT_IMPLEMENTED,
            )

    async def reap_released(self) -> None:
        """Close the agent sessions no reply runs on any more (a deleted session or branch,
        an import that replaced a session), with ``session/close`` where the engine offers
        it, also sessions of an earlier engine process (an agent that keeps its sessions
        knows them by id). Engines that are not running keep theirs until they run again."""
        released = await self._store.run(lambda s: s.acp.released())
        self._released_left = bool(released)
        if not released:
            return
        done: list[tuple[str, str]] = []
        for engine_id, agent_sid in released:
            conn = self._engines.live(engine_id)
            if conn is None:
                continue
            if conn.features.close_session:
                try:
                    await conn.close_session(agent_sid)
                except SidecarError as exc:  # unknown to the agent: nothing is left to close
                    log.info("engine %s: closing session %s failed: %s", conn.name, agent_sid, exc.message)
            done.append((engine_id, agent_sid))
        await self._store.run(lambda s: s.acp.forget_released(done))
        self._released_left = len(done) < len(released)

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

    async def _permission(self, turn: _AcpTurn, params: RequestPermissionParams) -> RequestPermissionResult:
        approvals = self._approvals
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

        reply = turn.reply
        assert reply is not None  # asked only while the turn's prompt runs

        async def announce(req: ApprovalRequest) -> None:
            await reply.approval_required(
                StreamToolCall(id=req.tool_call_id, name=req.tool_name, arguments=req.arguments),
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
            policy: Policy = "auto" if chosen.kind == "allow_always" else "deny"
            await approvals.set_policy(ToolPolicySetParams(key=policy_key, policy=policy))
        return RequestPermissionResult(outcome=SelectedOutcome(option_id=chosen.option_id))
