"""ChannelService: the ``channel:*`` methods and the life of an IM message.

The flow (seed 004 §4.1: PreProcessor 6 adapts the message, PostProcessor 5 replies):

1. ``channel:message``: the channel must exist and be enabled; sizes are checked; the
   message is adapted (inbound/) and decided (intake.py: ignored, refused, store,
   new_session, throttled or reply, with the access rules). The session is found or created
   by the scope rule and the channel's route (routing.py, routes.py); the message is stored
   in the inbox under its chat and dedup key (the platform message id, else a hash of chat,
   sender, timestamp and content: the same id in another chat is another message), which
   answers a redelivery with ``duplicate`` and does nothing else, also after a restart.
   Attachments are written to the data dir before the answer.
2. and 3. (running the turn, rendering, delivering): runner.py and delivery.py.

``channel:messages`` reads the inbox as the channel's message log; the channel's counters
(``channel:config:list``) are kept by the store with every change of an inbox row.

A channel with a connection of its own (``connection.kind``; ``channel:connect`` /
``channel:disconnect``: connections/manager.py) gets its messages from that connection,
through the same ``receive``, and sends its replies through it; ``channel:message`` and
``channel:ack`` are the host's path only and are refused for it. Its credentials are sealed
channel secrets, shown as ``***``.

Must stay true: bad input is an error naming the field and changes nothing; the host never
gets two replies for one platform message; a remote agent's token is stored sealed and
never shown (``***``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.abc
import msgspec

from protocol.channels import (
    AcpRoute,
    AssistantRoute,
    ChannelAckParams,
    ChannelConfig,
    ChannelConnectionStatus,
    ChannelCounters,
    ChannelCredentials,
    ChannelConfigUpsertParams,
    ChannelMessageParams,
    ChannelMessageResult,
    ChannelMessagesParams,
    ChannelMessagesResult,
    RemoteAgentRoute,
)
from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.types import MessageV2
from sidecar.channels.connections.manager import APP_TOKEN, BOT_TOKEN, ConnectionManager
from sidecar.channels.delivery import Outbox
from sidecar.channels.inbound import adapt
from sidecar.channels.intake import check_sizes, decide, dedup_key
from sidecar.channels.platforms import resolve_config
from sidecar.channels.ratelimit import LoopGuard
from sidecar.channels.routes import MASKED, REMOTE_TOKEN
from sidecar.channels.routing import SessionRouter
from sidecar.channels.runner import QueuedTurn, TurnRunner
from sidecar.channels.stream import ReplyAddress
from sidecar.channels.watch import ChatTurns, ReplyWatcher
from sidecar.engine.events import EventHub
from sidecar.errors import EngineError, InvalidParams, NotFound
from sidecar.http_fields import token_problem
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.store.channels import LOG_TEXT_CHARS, ChannelRepo, InboxRow
from sidecar.store.ids import new_id
from sidecar.store.store import Store
from sidecar.notify import Notifier

__all__ = ["ChannelService"]

log = logging.getLogger(__name__)

T = TypeVar("T")

PRUNE_EVERY_S = 600.0
MAX_LOG_PAGE = 500

_enc = msgspec.json.Encoder()


class ChannelService:
    """The methods the server binds as ``channels.<name>``."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        chat: ChatTurns,
        events: EventHub,
        notify: Notifier,
        attachments: AttachmentStore,
        task_group: anyio.abc.TaskGroup,
        remote_agents: bool = False,
    ) -> None:
        self._store = store
        self._now = store.blocking.channels.now
        """The store's clock (no database call)."""
        self._attachments = attachments
        self._configs: dict[str, ChannelConfig] = {}
        self._router = SessionRouter(store)
        self._guard = LoopGuard()
        self._connections = ConnectionManager(store, attachments, task_group, self._from_connection)
        self._outbox = Outbox(store, notify, task_group, self._configs.get, self._connections.sender)
        self._turns = TurnRunner(
            store=store, watcher=ReplyWatcher(events, store, chat), outbox=self._outbox, attachments=attachments,
            config_of=self._configs.get, task_group=task_group,
        )
        self._remote_agents = remote_agents
        """Whether the chat engine runs mode 'remote' replies (the remote-agent route)."""
        self._pruned: dict[str, float] = {}

    async def _db(self, fn: Callable[[ChannelRepo], T]) -> T:
        return await self._store.run(lambda s: fn(s.channels))

    def config(self, channel_id: str) -> ChannelConfig | None:
        return self._configs.get(channel_id)

    async def load(self) -> None:
        """Read the configs and resume what a previous run left open (turns, deliveries)."""
        for config in await self._db(lambda r: r.list_configs()):
            self._configs[config.id] = config
        for session_id in await self._db(lambda r: r.open_sessions()):
            self._turns.kick(session_id)
        for channel_id, chat_id in await self._db(lambda r: r.open_chats()):
            self._outbox.kick(channel_id, chat_id)
        for config in self._configs.values():
            await self._prune(config, force=True)
        await self._connections.load(self._configs)

    async def aclose(self) -> None:
        await self._connections.aclose()

    # ---- channel:config:* -----------------------------------------------------------

    async def list_configs(self, params: EmptyParams) -> list[ChannelConfig]:
        def read(r: ChannelRepo) -> list[ChannelConfig]:
            counters = r.counters()
            return [self._shown(c, counters) for c in r.list_configs()]

        return await self._db(read)

    async def get_config(self, params: IdParams) -> ChannelConfig:
        config = self._configs.get(params.id)
        if config is None:
            raise NotFound(f"no channel {params.id!r}")
        counters = await self._db(lambda r: r.counters())
        return self._shown(config, counters)

    def _shown(self, config: ChannelConfig, counters: dict[str, ChannelCounters]) -> ChannelConfig:
        status = self._connections.status(config.id)
        if status is None and config.connection.kind != "host":
            status = ChannelConnectionStatus(state="disconnected")
        return msgspec.structs.replace(config, counters=counters.get(config.id), status=status)

    async def upsert_config(self, params: ChannelConfigUpsertParams) -> ChannelConfig:
        config = resolve_config(params, self._now())
        route = config.route
        token: str | None = None
        if isinstance(route, RemoteAgentRoute):
            if not self._remote_agents:
                raise EngineError("the remote-agent route is not available in this process")
            if route.auth is not None:
                token = route.auth.token
                config = msgspec.structs.replace(
                    config, route=msgspec.structs.replace(route, auth=msgspec.structs.replace(route.auth, token=MASKED))
                )

        secrets = {
            **credential_changes(config),
            REMOTE_TOKEN: token if token is not None else "",  # no auth: no token kept
        }
        config = msgspec.structs.replace(config, credentials=ChannelCredentials())

        def write(s: Store) -> ChannelConfig:
            _check_target(s, config)
            names = s.channels.secret_names(config.id)
            for name, value in secrets.items():
                if value == MASKED and name not in names:
                    field = "route.auth.token" if name == REMOTE_TOKEN else name
                    raise InvalidParams(f"invalid params: {field}: no stored value to keep - at `$.{field}`")
            kept = (names - {n for n, v in secrets.items() if not v}) | {n for n, v in secrets.items() if v}
            masked = ChannelCredentials(**{field: MASKED for field, name in CREDENTIAL_FIELDS.items() if name in kept})
            with s.transaction():  # the config first: its secrets reference it
                stored = s.channels.upsert_config(msgspec.structs.replace(config, credentials=masked))
                for name, value in secrets.items():
                    if value != MASKED:
                        s.channels.set_secret(config.id, name, value or None)
            return stored

        stored = await self._store.run(write)
        self._configs[stored.id] = stored
        await self._connections.reconfigure(stored)
        counters = await self._db(lambda r: r.counters())
        return self._shown(stored, counters)

    async def delete_config(self, params: IdParams) -> SuccessResult:
        deleted = await self._db(lambda r: r.delete_config(params.id))
        if not deleted:
            raise NotFound(f"no channel {params.id!r}")
        self._configs.pop(params.id, None)
        self._outbox.forget(params.id)
        self._turns.forget(params.id)
        await self._connections.forget(params.id)
        return SuccessResult(success=True)

    # ---- channel:connect / channel:disconnect ------------------------------------------

    async def connect(self, params: IdParams) -> ChannelConnectionStatus:
        config = self._configs.get(params.id)
        if config is None:
            raise NotFound(f"no channel {params.id!r}")
        return await self._connections.connect(config)

    async def disconnect(self, params: IdParams) -> ChannelConnectionStatus:
        if params.id not in self._configs:
            raise NotFound(f"no channel {params.id!r}")
        return await self._connections.disconnect(params.id)

    async def _from_connection(self, channel_id: str, params: ChannelMessageParams) -> object:
        config = self._configs.get(channel_id)
        if config is None or not config.enabled:
            return None
        learned = [i for i in self._connections.identity.get(channel_id, ()) if i not in config.bot_user_ids]
        if learned:
            config = msgspec.structs.replace(config, bot_user_ids=[*config.bot_user_ids, *learned])
        return await self.receive(config, params)

    # ---- channel:messages -------------------------------------------------------------

    async def messages(self, params: ChannelMessagesParams) -> ChannelMessagesResult:
        if params.channel not in self._configs:
            raise NotFound(f"no channel {params.channel!r}")
        if not 1 <= params.limit <= MAX_LOG_PAGE:
            raise InvalidParams(f"invalid params: limit must be 1..{MAX_LOG_PAGE} - at `$.limit`")
        for field, value in (("before", params.before), ("chatId", params.chat_id)):
            if value is not None and not 0 < len(value) <= 512:
                raise InvalidParams(f"invalid params: {field} must be 1..512 characters - at `$.{field}`")
        entries, after = await self._db(
            lambda r: r.log(
                params.channel, status=params.status, chat_id=params.chat_id, before=params.before, limit=params.limit
            )
        )
        return ChannelMessagesResult(entries=entries, next_before=after)

    # ---- channel:message ------------------------------------------------------------

    async def message(self, params: ChannelMessageParams) -> ChannelMessageResult:
        config = self._configs.get(params.channel)
        if config is None:
            raise NotFound(f"unknown channel {params.channel!r} (configure it with channel:config:upsert)")
        if not config.enabled:
            raise EngineError(f"channel {params.channel!r} is disabled")
        if config.connection.kind != "host":
            raise EngineError(
                f"channel {params.channel!r} gets its messages from its own {config.connection.kind} connection:"
                " channel:message is for the host's"
            )
        return await self.receive(config, params)

    async def receive(self, config: ChannelConfig, params: ChannelMessageParams) -> ChannelMessageResult:
        """One message of the channel, from the host or from a connection the sidecar owns."""
        check_sizes(params, config)
        quoted = None
        quote = params.reply_to
        quoted_id = quote.message_id if quote is not None and not quote.text else None
        if quoted_id:
            quoted = await self._db(lambda r: r.known_text(config.id, params.chat_id, quoted_id))
        adapted = adapt(params, config, quoted)
        key = dedup_key(params)
        chat = (config.id, params.chat_id)
        decision = decide(params, config, adapted, cooling=self._guard.cooling(chat))
        await self._prune(config)

        window = config.limits.dedup_window_ms
        assert window is not None  # resolved with the config
        now = self._now()
        session_id: str | None = None
        queued: QueuedTurn | None = None
        if decision.action not in ("ignored", "refused"):
            existing = await self._db(lambda r: r.find_received(config.id, params.chat_id, key, window))
            if existing is not None:
                await self._db(lambda r: r.note_duplicate(config.id))
                return ChannelMessageResult(action="duplicate", inbox_id=existing.id, session_id=existing.session_id)
            session_id = await self._router.route(config, params, fresh=decision.action == "new_session")
            if decision.action != "new_session":
                stored = await anyio.to_thread.run_sync(self._attachments.store_input, adapted.turn)
                queued = QueuedTurn(
                    content_type=stored.content_type, text_content=stored.text_content, parts=stored.parts
                )
        row = InboxRow(
            id=new_id(), channel_id=config.id, dedup_key=key, chat_id=params.chat_id, chat_type=params.chat_type,
            thread_id=params.thread_id, platform_message_id=params.message_id, session_id=session_id,
            action=decision.action, state="done" if session_id is None else "queued",
            input=_enc.encode(queued).decode() if queued is not None else None,
            received_at=now, updated_at=now, sender_id=params.sender.id, sender_name=params.sender.name,
            text_preview=adapted.body[:LOG_TEXT_CHARS] or None, reason=decision.reason,
        )
        # from here to the worker's kick nothing may be cut off by a cancelled request: a
        # stored row without a worker would wait for the next start
        with anyio.CancelScope(shield=True):
            result = await self._accept(config, row, window, chat)
        return result

    async def _accept(
        self, config: ChannelConfig, row: InboxRow, window: int, chat: tuple[str, str]
    ) -> ChannelMessageResult:
        row, fresh = await self._db(lambda r: r.receive(row, window))
        if not fresh:
            return ChannelMessageResult(action="duplicate", inbox_id=row.id, session_id=row.session_id)
        action = row.action
        if action == "reply":
            rate = config.rate
            assert rate.loop_max_events is not None and rate.loop_window_ms is not None
            assert rate.loop_cooldown_ms is not None
            if self._guard.record(chat, rate.loop_max_events, rate.loop_window_ms, rate.loop_cooldown_ms):
                log.warning("channel %s chat %s: more than %d replies in %d ms; cooling down",
                            config.id, row.chat_id, rate.loop_max_events, rate.loop_window_ms)
                action = "throttled"
                await self._db(
                    lambda r: r.update_inbox(row.id, action="throttled", reason="the chat is cooling down (loop guard)")
                )
        if row.session_id is not None:
            self._turns.kick(row.session_id)
        return ChannelMessageResult(action=action, inbox_id=row.id, session_id=row.session_id)

    async def _prune(self, config: ChannelConfig, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._pruned.get(config.id, float("-inf")) < PRUNE_EVERY_S:
            return
        self._pruned[config.id] = now
        window = config.limits.dedup_window_ms
        assert window is not None
        gone = await self._db(lambda r: r.prune_inbox(config.id, window))
        if gone:
            log.info("channel %s: forgot %d messages older than the dedup window", config.id, gone)

    # ---- replies nobody asked for ------------------------------------------------------

    async def deliver_reply(
        self, channel_id: str, chat_id: str, message: MessageV2, *, thread_id: str | None = None
    ) -> None:
        """Hand a finished reply that no IM message asked for (a scheduled task's) to a chat:
        rendered, split and sent like any reply (through the channel's own connection when
        it has one), with the same notice for one that did not complete. NOT_FOUND / an
        engine error for a missing or disabled channel."""
        config = self._configs.get(channel_id)
        if config is None:
            raise NotFound(f"unknown channel {channel_id!r}")
        if not config.enabled:
            raise EngineError(f"channel {channel_id!r} is disabled")
        address = ReplyAddress(
            channel=channel_id, chat_id=chat_id, thread_id=thread_id, reply_to=None, session_id=message.session_id,
            message_id=message.id, inbox_id=None,
        )
        await self._turns.deliver_reply(config, address, message)

    # ---- channel:ack ----------------------------------------------------------------

    async def ack(self, params: ChannelAckParams) -> SuccessResult:
        await self._outbox.ack(params)
        return SuccessResult(success=True)


def _check_target(s: Store, config: ChannelConfig) -> None:
    """The assistant or ACP engine a route names exists (InvalidParams naming the field)."""
    route = config.route
    if isinstance(route, AssistantRoute) and not s.assistants.exists(route.assistant_id):
        raise InvalidParams(
            f"invalid params: route.assistantId: no assistant {route.assistant_id!r} - at `$.route.assistantId`"
        )
    if isinstance(route, AcpRoute):
        try:
            record = s.providers.get(route.provider_id)
        except NotFound:
            record = None
        if record is None or record.type != "acp-engine":
            raise InvalidParams(
                f"invalid params: route.providerId: {route.provider_id!r} is not an acp-engine provider"
                " - at `$.route.providerId`"
            )


CREDENTIAL_FIELDS = {"bot_token": BOT_TOKEN, "app_token": APP_TOKEN}
"""ChannelCredentials fields -> the channel secrets holding them."""
MAX_CREDENTIAL_CHARS = 4_096


def credential_changes(config: ChannelConfig) -> dict[str, str]:
    """The channel secrets an upsert sets ("": removed, ``***``: kept); a field left out
    keeps its secret too. InvalidParams naming the field for an unusable value."""
    changes: dict[str, str] = {}
    kind = config.connection.kind
    for field, name in CREDENTIAL_FIELDS.items():
        value = getattr(config.credentials, field)
        if value is None:
            continue
        # ``name`` is the field's wire path (credentials.botToken): errors name it
        if value and kind == "host":
            raise InvalidParams(f"invalid params: {name} is for a channel with a connection of its own - at `$.{name}`")
        if value and field == "app_token" and kind != "slack_socket":
            raise InvalidParams(f"invalid params: {name} is for slack_socket connections - at `$.{name}`")
        if len(value) > MAX_CREDENTIAL_CHARS or token_problem(value):
            raise InvalidParams(
                f"invalid params: {name} must be at most {MAX_CREDENTIAL_CHARS} printable ASCII characters"
                f" without spaces - at `$.{name}`"
            )
        changes[name] = value
    return changes
