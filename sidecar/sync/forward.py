"""ServerTurnHandler: the replies of ``mode: "server"`` sessions, forwarded to the Qiming server.

The forwarded turn is a ReplyLifecycle driver (sidecar/engine/lifecycle/: the row, seq,
events, persistence and the ending are the lifecycle's, as for every reply); ChatEngine
runs it for the replies of server sessions (the user message is ``job.parent_id``). A turn:

1. the account (ServerAccount.open): not configured, logged out, ``auth_required`` or a
   locked token fail the turn before anything is sent;
2. the chat API the server has (``server:configure chatApi``):
   - ``conversation``: the session's linked conversation; a session without one (made by
     ``chat:session:create {mode: "server"}``) gets one first (``/create {agentId}`` with
     the account's agent, linked at once); ``POST /chat`` with a TryReqDto (the user
     message's text, its http(s) files as attachments, the account's ``agentMode``);
   - ``computer``: ``POST /api/computer/chat`` (``project_id`` the linked conversation, else
     the session; ``session_id`` the runner session of the session's previous turn, kept in
     ``sync_forward``), then its progress stream;
   local files cannot be sent (the server has no upload for them here): a notice says so;
3. the events, followed across drops and silences (sidecar/sync/chatstream.py) and mapped
   into the reply (sidecar/sync/events.py); a permission request goes through the approval
   flow (ApprovalService.ask, source ``acp``, policy key ``server:<kind>``: visible in
   ``tool:pending:list``, decided with ``chat:tool:approve``) in a task of the turn while
   the stream goes on, and the decision is sent with ``/chat/permission-request/response``
   (computer: ``/api/computer/notify-resolved``); the questions of a turn that ended are
   cancelled;
4. a stream lost for good: the conversation API catches up from the stored message (the
   text after what was streamed, and how it ended); otherwise the turn fails with the
   partial content kept;
5. once the turn ended (conversation API), its user and assistant messages are mapped to
   the server's copies (``sync_messages``, one ``/message/list``, bounded by MAP_TIMEOUT_S)
   before the reply's final event, so a pull never imports them again; then, a side task
   of the handler: a conversation without a topic gets one from the first message
   (``/update firstMessage``, the server's model writes it) and the session's title
   follows while it is still the default (``chat:session:updated``).

Stop (``chat:abort``, a newer send, shutdown): ``/chat/stop/{conversationId}`` (computer:
``/api/computer/cancel``), then the rest of the turn is drained by re-attaching for at
most STOP_GRACE_S, at shutdown its share of the deadline left (``cancel_grace``), shielded
and bounded; the reply ends ``aborted`` with its content (``job.stop_grace`` lets a stop
wait that long).

Must stay true: nothing is sent to the server for a turn the account cannot make; a turn
is started on the server at most once; every wait is bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any, Protocol

import anyio
import anyio.abc

from protocol.errors import ErrorCode
from protocol.events import NoticeCode, StreamToolCall
from protocol.settings import ChatSettings
from protocol.types import FilePart, ImagePart, MessageV2, SessionV2, TextPart
from sidecar.engine.acp_turn import cancel_grace
from sidecar.engine.approvals import ApprovalRequest, ApprovalService, pick_option
from sidecar.engine.lifecycle import Ending, Failed, ReplyDriver, ReplyFeed, ReplyJob
from sidecar.engine.titles import DEFAULT_TITLES
from sidecar.errors import EngineError, SidecarError
from sidecar.store import AsyncStore, Store
from sidecar.store.ids import now_ms
from sidecar.supervision import SHUTDOWN_CLOCK
from sidecar.sync.account import ServerAccount, usable_account
from sidecar.sync.chatstream import Follower, canonical_key, stop_and_drain
from sidecar.sync.client import ChatAttachment, ComputerChatBody, QimingClient, TryReqDto
from sidecar.sync.errors import AuthRequired, ChatFailed, QimingError, ServerMalformed
from sidecar.sync.events import (
    ComputerEvents,
    ConversationEvents,
    PermissionAsk,
    ending_of_message,
    frame_ends,
    frame_key,
)
from sidecar.sync.mapping import conversation_title, normalize_messages
from sidecar.sync.run import AccountConfig
from sidecar.sync.wire import AgentOutputDto, ChatMessageDto, SessionFrame, to_int, to_ms
from sidecar.notify import Notifier
from protocol.notifications import SESSION_UPDATED

__all__ = ["ServerTurnHandler", "STOP_GRACE_S"]

log = logging.getLogger(__name__)


STOP_GRACE_S = 5.0
"""After the stop call, how long the rest of a stopped turn is drained."""
STOP_CALL_S = 5.0
"""The stop call itself."""
AFTER_TURN_S = 30.0
"""The topic side task after a turn gives up after this long."""
MAP_TIMEOUT_S = 5.0
"""Mapping a turn's messages to the server's (before its final event) gives up after this."""
CATCH_UP_PAGE = 20
"""Newest messages read to catch up with a turn whose stream was lost."""
READ_MARGIN_S = 5.0
"""The HTTP read timeout of a turn's stream is its idle timeout plus this (the idle timer
of the follower decides first)."""


class _TurnApi(Protocol):
    """What a driver needs from one chat API for one turn."""

    follower: Follower[Any]
    notices: list[tuple[str, NoticeCode | None]]

    def mapper(self, reply: ReplyFeed, on_permission: Callable[[PermissionAsk], None]) -> _Mapper: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def answer(self, ask: PermissionAsk, option_id: str, outcome: str) -> None: ...

    async def lost(self, mapper: _Mapper, error: QimingError) -> Ending: ...


class _Mapper(Protocol):
    stopping: bool

    async def apply(self, item: Any) -> Ending | None: ...


# ---- the two chat APIs ----------------------------------------------------------------------


def _dto_key(dto: AgentOutputDto) -> bytes | None:
    kind = (dto.event_type or "").upper()
    if kind == "HEART_BEAT":
        return None
    return canonical_key(f"{kind}|{dto.error or ''}", bytes(dto.data))


def _dto_ends(dto: AgentOutputDto) -> bool:
    return dto.completed or (dto.event_type or "").upper() == "ERROR"


class _ConversationApi:
    """``POST /chat`` and ``/chat/sub`` of one conversation."""

    def __init__(
        self, client: QimingClient, conversation_id: int, request: TryReqDto, idle_s: float,
        notices: list[tuple[str, NoticeCode | None]],
    ) -> None:
        self._client = client
        self.conversation_id = conversation_id
        self._request = request
        self.text_sent = request.message
        self.notices = notices
        read = idle_s + READ_MARGIN_S
        self.follower: Follower[AgentOutputDto] = Follower(
            open_first=lambda: client.chat(request, read_timeout_s=read),
            open_again=lambda: client.chat_sub(conversation_id, read_timeout_s=read),
            key=_dto_key,
            ends=_dto_ends,
            idle_s=idle_s,
            what=f"conversation {conversation_id}",
        )
        self.events: ConversationEvents | None = None

    def mapper(self, reply: ReplyFeed, on_permission: Callable[[PermissionAsk], None]) -> _Mapper:
        self.events = ConversationEvents(reply, on_permission)
        return self.events

    async def start(self) -> None:
        return None  # POST /chat is the follower's first stream

    async def stop(self) -> None:
        await self._client.chat_stop(self.conversation_id)

    async def answer(self, ask: PermissionAsk, option_id: str, outcome: str) -> None:
        await self._client.permission_response(self.conversation_id, ask.tool_call_id, option_id, outcome=outcome)

    async def lost(self, mapper: _Mapper, error: QimingError) -> Ending:
        """The stream is gone for good, or the turn ended while it was away: the stored
        assistant message tells the rest (the text after what was streamed) and the end."""
        events = self.events
        assert events is not None and mapper is events
        try:
            page = await self._client.list_messages(self.conversation_id, size=CATCH_UP_PAGE)
        except QimingError as exc:
            log.warning("conversation %s: cannot catch up (%s)", self.conversation_id, exc.message)
            return Failed(error, close_open=True)
        found = _our_reply(page, events.request_id, self._request.message)
        if found is None:
            if not _sent(page, self._request.message):
                return Failed(ChatFailed("the server did not take the turn"), close_open=True)
            return ending_of_message(None)
        stored = normalize_messages([found], now_ms())
        text = stored[0].text if stored else (found.text or "")
        if text.startswith(events.text) and len(text) > len(events.text):
            await events.add_text(text[len(events.text):])
        elif events.text and not text.startswith(events.text):
            log.info("conversation %s: the stored reply differs from the streamed one; kept the streamed text",
                     self.conversation_id)
        return ending_of_message(found)


def _sent(page: list[ChatMessageDto], text: str) -> bool:
    return any((m.role or "").upper() == "USER" and (m.text or "").strip() == text.strip() for m in page)


def _our_reply(page: list[ChatMessageDto], request_id: str | None, text: str) -> ChatMessageDto | None:
    """The turn's stored assistant message: the one with the turn's id (the server names its
    reply after the request), else the assistant message after the last matching user one."""
    if request_id:
        for m in page:
            if (m.role or "").upper() == "ASSISTANT" and m.id is not None and str(m.id) == request_id:
                return m
    ordered = sorted(page, key=lambda m: to_int(m.index) or 0)
    last_user = None
    for i, m in enumerate(ordered):
        if (m.role or "").upper() == "USER" and (m.text or "").strip() == text.strip():
            last_user = i
    if last_user is None:
        return None
    after = [m for m in ordered[last_user + 1:] if (m.role or "").upper() == "ASSISTANT"]
    return after[0] if after else None


class _ComputerApi:
    """``/api/computer/chat`` and its progress stream, for one turn."""

    def __init__(
        self, client: QimingClient, body: ComputerChatBody, idle_s: float, notices: list[tuple[str, NoticeCode | None]],
        store: AsyncStore, session_id: str,
    ) -> None:
        self._client = client
        self._body = body
        self._store = store
        self._session_id = session_id
        self.notices = notices
        self.remote_session_id: str | None = None
        self._read_s = idle_s + READ_MARGIN_S
        self.follower: Follower[SessionFrame] = Follower(
            open_first=self._progress,
            open_again=self._progress,
            key=frame_key,
            ends=frame_ends,
            idle_s=idle_s,
            what=f"computer session of {session_id}",
            first_starts=False,
        )

    def _progress(self) -> Any:
        assert self.remote_session_id is not None
        return self._client.computer_progress(self.remote_session_id, read_timeout_s=self._read_s)

    def mapper(self, reply: ReplyFeed, on_permission: Callable[[PermissionAsk], None]) -> _Mapper:
        return ComputerEvents(reply, on_permission)

    async def start(self) -> None:
        answer = await self._client.computer_chat(self._body)
        if not answer.session_id:
            raise ServerMalformed("/api/computer/chat answered without a session id")
        self.remote_session_id = str(answer.session_id)
        session_id, remote = self._session_id, self.remote_session_id
        await self._store.run(lambda s: s.sync.set_remote_session(session_id, "computer", remote, now_ms()))

    async def stop(self) -> None:
        if self.remote_session_id is not None:
            await self._client.computer_cancel(
                user_id=self._body.user_id, project_id=self._body.project_id, session_id=self.remote_session_id
            )

    async def answer(self, ask: PermissionAsk, option_id: str, outcome: str) -> None:
        assert self.remote_session_id is not None
        await self._client.computer_permission(
            user_id=self._body.user_id, project_id=self._body.project_id, session_id=self.remote_session_id,
            tool_call_id=ask.tool_call_id, option_id=option_id, outcome=outcome,
        )

    async def lost(self, mapper: _Mapper, error: QimingError) -> Ending:
        return Failed(error, close_open=True)


# ---- the driver -------------------------------------------------------------------------------


class _ServerTurn(ReplyDriver):
    doing = "forwarding the turn to the server"

    def __init__(self, handler: ServerTurnHandler, job: ReplyJob) -> None:
        self._handler = handler
        self.job = job
        self._reply: ReplyFeed | None = None
        self._api: _TurnApi | None = None
        self._asks: anyio.abc.TaskGroup | None = None

    async def drive(self, reply: ReplyFeed) -> Ending:
        handler, job = self._handler, self.job
        self._reply = reply
        try:
            client, account = await handler.account.open()
            user = await handler.store.run(lambda s: s.messages.get(job.parent_id))
            api = await handler.api_for(client, account, job.session, user)
            await api.start()
        except AuthRequired as exc:
            await handler.account.auth_expired(exc)
            return Failed(exc, close_open=False)
        except SidecarError as exc:
            return Failed(exc, close_open=False)
        self._api = api
        job.stop_grace = STOP_GRACE_S + STOP_CALL_S + 1
        for text, code in api.notices:
            await reply.notice(text, code)
        mapper = api.mapper(reply, self._permission)
        try:
            async with anyio.create_task_group() as tg:
                self._asks = tg
                ending = await self._follow(api, mapper)
                tg.cancel_scope.cancel()  # a question of a turn that is over has no answer
        except anyio.get_cancelled_exc_class():
            grace = cancel_grace(STOP_GRACE_S)
            with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_CLOCK.bound(grace + STOP_CALL_S + 1)):
                await self._stop(api, mapper, grace)
                with anyio.move_on_after(SHUTDOWN_CLOCK.bound(MAP_TIMEOUT_S)):
                    await handler.map_turn(client, account, job, user, api)
            handler.after_turn(client, account, job, user, api)
            raise
        with anyio.move_on_after(MAP_TIMEOUT_S):
            await handler.map_turn(client, account, job, user, api)
        handler.after_turn(client, account, job, user, api)
        return ending

    async def _follow(self, api: _TurnApi, mapper: _Mapper) -> Ending:
        follower = api.follower
        try:
            async with aclosing(follower.events()) as events:
                async for item in events:
                    ending = await mapper.apply(item)
                    if ending is None:
                        continue
                    if isinstance(item, AgentOutputDto) and (item.event_type or "").upper() == "ERROR" \
                            and follower.reattached:
                        # /chat/sub after the turn's end: the stored message has the rest
                        return await api.lost(mapper, ChatFailed(item.error or "the turn is not running"))
                    return ending
        except AuthRequired as exc:
            await self._handler.account.auth_expired(exc)
            return Failed(exc, close_open=True)
        except QimingError as exc:
            if follower.recorded or follower.reattached:
                return await api.lost(mapper, exc)
            return Failed(exc, close_open=False)
        return await api.lost(mapper, ChatFailed("the turn's stream ended without its end"))

    async def _stop(self, api: _TurnApi, mapper: _Mapper, grace: float) -> None:
        """Stop the turn on the server, then keep mapping what it still sends, at most ``grace``."""
        ended = await stop_and_drain(
            api.stop, api.follower, mapper, stop_call_s=SHUTDOWN_CLOCK.bound(STOP_CALL_S), grace_s=grace,
            what=f"the server turn of {self.job.message_id}",
        )
        if not ended:
            self.job.abort_reason = (self.job.abort_reason or "aborted") + (
                f" (the server did not end the turn within {grace:g} s; it was ended without it)"
            )

    # -- permissions -----------------------------------------------------------------------

    def _permission(self, ask: PermissionAsk) -> None:
        if self._asks is not None:
            self._asks.start_soon(self._ask, ask)

    async def _ask(self, ask: PermissionAsk) -> None:
        api, reply, approvals = self._api, self._reply, self._handler.approvals
        assert api is not None and reply is not None
        approved: bool
        option_id: str | None
        if approvals is None:
            log.warning("no approval flow: the server's permission request %s is rejected", ask.tool_call_id)
            approved, option_id = False, pick_option(ask.options, False, False)
        else:
            request = ApprovalRequest(
                session_id=self.job.session.id, message_id=self.job.message_id, tool_call_id=ask.tool_call_id,
                tool_name=ask.title, arguments=ask.arguments, source="acp", policy_key=f"server:{ask.kind}",
                default_policy="ask", options=ask.options,
            )

            async def announce(req: ApprovalRequest) -> None:
                await reply.approval_required(
                    StreamToolCall(id=req.tool_call_id, name=req.tool_name, arguments=req.arguments),
                    decisions=["approved", "denied"], options=ask.options, source="acp",
                )

            try:
                decision = await approvals.ask(request, announce=announce)
            except SidecarError as exc:
                log.warning("permission request %s could not be asked: %s", ask.tool_call_id, exc.message)
                return
            if decision.decision == "cancelled":
                return
            approved = decision.decision == "approved"
            option_id = decision.option_id or pick_option(ask.options, approved, False)
        outcome = "selected"
        if option_id is None:  # a denial without a reject option: what the web client sends
            option_id, outcome = "reject", "cancelled"
        try:
            with anyio.fail_after(STOP_CALL_S * 2):
                await api.answer(ask, option_id, outcome)
        except (QimingError, TimeoutError) as exc:
            message = exc.message if isinstance(exc, QimingError) else "no answer in time"
            log.warning("the permission answer for %s failed: %s", ask.tool_call_id, message)
            await reply.notice(f"The permission answer did not reach the server: {message}")


# ---- the handler ------------------------------------------------------------------------------


class ServerTurnHandler:
    """The drivers of server replies, and what they share (the account, approvals, side tasks)."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        account: ServerAccount,
        approvals: ApprovalService | None,
        task_group: anyio.abc.TaskGroup,
        notify: Notifier,
    ) -> None:
        self.store = store
        self.account = account
        self.approvals = approvals
        self._tg = task_group
        self._notify = notify
        self.closing = False

    def driver(self, job: ReplyJob, settings: ChatSettings) -> ReplyDriver:
        return _ServerTurn(self, job)

    def check(self, s: Store, session: SessionV2, *, branching: bool) -> None:
        """Whether a turn of ``session`` can be forwarded now (in the store's worker thread,
        before anything is stored): typed errors otherwise."""
        if branching:
            raise SidecarError(
                "a server conversation is linear: chat:regenerate and chat:editResend are not available"
                " in server mode (send a new message instead)",
                code=ErrorCode.NOT_IMPLEMENTED,
            )
        row, config = usable_account(s)
        if config.chat_api != "conversation":
            return
        link = s.sync.link_of_session(row.account_key, session.id)
        if link is None:
            if config.agent_id is None:
                raise EngineError(
                    "this server session is not linked to a conversation: link one with server:session:create"
                    " {conversationId}, or set the server agent new conversations use (server:configure agentId)"
                )
        elif link.state not in ("linked", "creating"):
            raise EngineError(f"the linked conversation {link.conversation_id} was deleted on the server")

    async def api_for(self, client: QimingClient, account: AccountConfig, session: SessionV2, user: MessageV2) -> _TurnApi:
        text, attachments, dropped = _request_content(user)
        notices: list[tuple[str, NoticeCode | None]] = []
        if dropped:
            notices.append(("Not sent to the server: " + "; ".join(dropped) + ".", "acp_content_not_sent"))
        if account.chat_api == "computer":
            link = await self.store.run(lambda s: s.sync.link_of_session(account.account_key, session.id))
            remote = await self.store.run(lambda s: s.sync.remote_session(session.id, "computer"))
            body = ComputerChatBody(
                user_id=str(account.user_id or ""),
                project_id=str(link.conversation_id) if link is not None else session.id,
                session_id=remote, prompt=text, original_user_prompt=text, request_id=user.id,
            )
            return _ComputerApi(client, body, account.chat_idle_timeout_s, notices, self.store, session.id)
        cid = await self._conversation(client, account, session)
        request = TryReqDto(conversation_id=cid, message=text, attachments=attachments, agent_mode=account.agent_mode)
        return _ConversationApi(client, cid, request, account.chat_idle_timeout_s, notices)

    async def _conversation(self, client: QimingClient, account: AccountConfig, session: SessionV2) -> int:
        key = account.account_key
        link = await self.store.run(lambda s: s.sync.link_of_session(key, session.id))
        if link is not None:
            if link.state not in ("linked", "creating"):
                raise EngineError(f"the linked conversation {link.conversation_id} was deleted on the server")
            return link.conversation_id
        if account.agent_id is None:
            raise EngineError("no server agent is configured for new conversations (server:configure agentId)")
        created = await client.create_conversation(account.agent_id)
        cid = to_int(created.id)
        if cid is None:
            raise ServerMalformed("/create answered without a conversation id")
        agent_id, modified = account.agent_id, to_ms(created.modified)
        await self.store.run(lambda s: s.sync.link_forwarded(
            account_key=key, session_id=session.id, conversation_id=cid, agent_id=agent_id,
            server_modified=modified, now=now_ms(),
        ))
        return cid

    # -- after a turn ------------------------------------------------------------------------

    def after_turn(self, client: QimingClient, account: AccountConfig, job: ReplyJob, user: MessageV2, api: _TurnApi) -> None:
        if self.closing or not isinstance(api, _ConversationApi):
            return
        self._tg.start_soon(self._after, client, account, job, user, api)

    async def _after(
        self, client: QimingClient, account: AccountConfig, job: ReplyJob, user: MessageV2, api: _ConversationApi
    ) -> None:
        try:
            with anyio.fail_after(AFTER_TURN_S):
                await self._topic(client, account, job.session.id, api.conversation_id, user)
        except (SidecarError, TimeoutError) as exc:
            log.info("after the server turn %s: %s", job.message_id, exc)

    async def map_turn(
        self, client: QimingClient, account: AccountConfig, job: ReplyJob, user: MessageV2, api: _TurnApi
    ) -> None:
        """Pair the turn's user and assistant messages with the server's copies (a failure is
        logged: a later pull then adds the server's copies as a branch, nothing is lost)."""
        if not isinstance(api, _ConversationApi):
            return
        try:
            await self._map(client, account, job, user, api)
        except SidecarError as exc:
            log.info("the messages of server turn %s were not mapped: %s", job.message_id, exc.message)

    async def _map(
        self, client: QimingClient, account: AccountConfig, job: ReplyJob, user: MessageV2, api: _ConversationApi
    ) -> None:
        cid = api.conversation_id
        page = await client.list_messages(cid, size=CATCH_UP_PAGE)
        request_id = api.events.request_id if api.events is not None else None
        reply_dto = _our_reply(page, request_id, api.text_sent)
        normalized = {m.index: m for m in normalize_messages(page, now_ms())}
        pairs: list[tuple[str, int, str | None, str]] = []
        user_dto = None
        if reply_dto is not None:
            reply_index = to_int(reply_dto.index)
            before = [m for m in page if (m.role or "").upper() == "USER" and (to_int(m.index) or 0) < (reply_index or 0)
                      and (m.text or "").strip() == api.text_sent.strip()]
            user_dto = max(before, key=lambda m: to_int(m.index) or 0) if before else None
            if reply_index is not None and reply_index in normalized:
                server = normalized[reply_index]
                pairs.append((job.message_id, server.index, server.server_id, server.digest))
        if user_dto is not None:
            user_index = to_int(user_dto.index)
            if user_index is not None and user_index in normalized:
                server = normalized[user_index]
                pairs.append((user.id, server.index, server.server_id, server.digest))
        if pairs:
            key, session_id = account.account_key, job.session.id
            await self.store.run(lambda s: s.sync.map_forwarded(key, cid, session_id, pairs))

    async def _topic(self, client: QimingClient, account: AccountConfig, session_id: str, cid: int, user: MessageV2) -> None:
        """A conversation this device created has no topic yet: the server makes one from the
        first message (and only then lists it); the session's title follows while it is
        still the default."""
        key = account.account_key
        link = await self.store.run(lambda s: s.sync.link_of_session(key, session_id))
        if link is None or link.server_topic is not None:
            return
        updated = await client.update_conversation(cid, first_message=user.text_content or "")
        if to_int(updated.id) != cid or updated.topic is None:
            return
        title, modified = conversation_title(updated), to_ms(updated.modified)

        def note(s: Store) -> SessionV2 | None:
            session = s.sessions.get(session_id)
            follow = session.title in DEFAULT_TITLES
            s.sync.note_server_topic(key, cid, topic=title, modified=modified,
                                     local_title=title if follow else None, now=now_ms())
            return s.sessions.get(session_id) if follow else None

        session = await self.store.run(note)
        if session is not None:
            await self._notify(SESSION_UPDATED, session)


def _request_content(user: MessageV2) -> tuple[str, list[ChatAttachment], list[str]]:
    """The text and http(s) attachments of a user message; what cannot be sent is named."""
    texts: list[str] = []
    attachments: list[ChatAttachment] = []
    dropped: list[str] = []
    for part in user.parts or []:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, (FilePart, ImagePart)):
            uri = part.uri if isinstance(part, FilePart) else (part.url or "")
            name = part.name if isinstance(part, FilePart) else None
            if uri.lower().startswith(("http://", "https://")):
                attachments.append(ChatAttachment(file_url=uri, file_name=name, mime_type=part.mime_type))
            else:
                dropped.append(f"{name or part.mime_type or 'a file'} (only http(s) files can be sent)")
        else:
            dropped.append(f"a {type(part).__name__.removesuffix('Part').lower()} part")
    text = "\n\n".join(t for t in texts if t) if user.parts else (user.text_content or "")
    return text, attachments, dropped

