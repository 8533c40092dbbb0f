"""ConnectionManager: the connections the sidecar owns, one supervisor per connected channel.

Owns ``connect`` / ``disconnect`` (``channel:connect`` / ``channel:disconnect``: the wish is
stored, so a restart connects the same channels again: ``load``), the status shown by
``channel:config:list``, ``reconfigure`` (a saved channel's connection starts again with its
new settings, or stops when it no longer has one) and the senders deliveries go out through
(``sender``: a channel whose connection kind is not ``host`` always sends through its
platform's API, connected or not). The bot ids a connection learns (Telegram ``getMe``,
Discord READY, Slack ``auth.test``) are kept in ``identity``: the channel treats them as
``botUserIds``.

Must stay true: at most one supervisor per channel, and a replacing one starts only after
the previous one is done (one poll or one gateway session per bot at a time); credentials are
read from the sealed store when a link or sender is built, never kept in a config; every
supervisor stops when the manager closes (its task group is cancelled).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import httpx2
import msgspec

from protocol.channels import ChannelConfig, ChannelConnectionStatus, ChannelMessageParams
from sidecar.channels.connections.base import ConnectionSupervisor, Link, PlatformSender
from sidecar.errors import EngineError
from sidecar.providers.redact import install_http_log_filter
from sidecar.store.async_store import AsyncStore
from sidecar.store.attachments import AttachmentStore

__all__ = ["ConnectionManager", "BOT_TOKEN", "APP_TOKEN", "REQUIRED"]

log = logging.getLogger(__name__)

BOT_TOKEN = "credentials.botToken"
APP_TOKEN = "credentials.appToken"
REQUIRED: dict[str, tuple[str, ...]] = {
    "telegram_polling": (BOT_TOKEN,),
    "discord_gateway": (BOT_TOKEN,),
    "slack_socket": (BOT_TOKEN, APP_TOKEN),
}
"""The secrets each kind of connection needs."""
STOP_WAIT_S = 10.0

Receive = Callable[[str, ChannelMessageParams], Awaitable[object]]


class ConnectionManager:
    def __init__(
        self, store: AsyncStore, attachments: AttachmentStore, task_group: anyio.abc.TaskGroup, receive: Receive,
    ) -> None:
        self._store = store
        self._attachments = attachments
        self._tg = task_group
        self._receive = receive
        self._supervisors: dict[str, ConnectionSupervisor] = {}
        self._senders: dict[str, tuple[ChannelConfig, PlatformSender]] = {}
        self._http: httpx2.AsyncClient | None = None
        self.identity: dict[str, list[str]] = {}

    @property
    def http(self) -> httpx2.AsyncClient:
        if self._http is None:
            install_http_log_filter()  # its request lines hold a Telegram token in the path
            self._http = httpx2.AsyncClient(follow_redirects=False)
        return self._http

    async def aclose(self) -> None:
        for supervisor in self._supervisors.values():
            supervisor.stop()
        if self._http is not None:
            await self._http.aclose()

    async def _secret(self, channel_id: str, name: str) -> str | None:
        return await self._store.run(lambda s: s.channels.secret(channel_id, name))

    # ---- control ------------------------------------------------------------------------

    async def load(self, configs: dict[str, ChannelConfig]) -> None:
        for channel_id in await self._store.run(lambda s: s.channels.wanted_connections()):
            config = configs.get(channel_id)
            if config is not None and config.enabled and config.connection.kind != "host":
                try:
                    await self._start(config)
                except EngineError as exc:
                    log.warning("channel %s: not connected at start: %s", channel_id, exc.message)

    async def connect(self, config: ChannelConfig) -> ChannelConnectionStatus:
        if config.connection.kind == "host":
            raise EngineError(f"channel {config.id!r} has no connection of its own (connection.kind is host)")
        if not config.enabled:
            raise EngineError(f"channel {config.id!r} is disabled")
        await self._start(config)  # EngineError (no credentials) before the wish is stored
        await self._store.run(lambda s: s.channels.set_connection(config.id, connect=True))
        return self.status(config.id) or ChannelConnectionStatus(state="connecting")

    async def disconnect(self, channel_id: str) -> ChannelConnectionStatus:
        await self._store.run(lambda s: s.channels.set_connection(channel_id, connect=False))
        await self._stop(channel_id)
        return ChannelConnectionStatus(state="disconnected")

    async def reconfigure(self, config: ChannelConfig) -> None:
        """A channel was saved: its sender is built again; a running connection restarts with
        the new settings (or stops, when the channel has none or is disabled)."""
        self._senders.pop(config.id, None)
        if config.id not in self._supervisors:
            return
        if config.connection.kind == "host" or not config.enabled:
            await self._stop(config.id)
            return
        await self._start(config)

    async def forget(self, channel_id: str) -> None:
        self._senders.pop(channel_id, None)
        self.identity.pop(channel_id, None)
        await self._stop(channel_id)

    def status(self, channel_id: str) -> ChannelConnectionStatus | None:
        supervisor = self._supervisors.get(channel_id)
        return supervisor.status() if supervisor is not None else None

    async def _stop(self, channel_id: str) -> None:
        supervisor = self._supervisors.pop(channel_id, None)
        if supervisor is None:
            return
        supervisor.stop()
        with anyio.move_on_after(STOP_WAIT_S):
            await supervisor.done.wait()

    async def _start(self, config: ChannelConfig) -> None:
        link = await self._link(config)  # EngineError before anything stops: the old one keeps running
        previous = self._supervisors.pop(config.id, None)
        if previous is not None:
            previous.stop()
            with anyio.move_on_after(STOP_WAIT_S):
                await previous.done.wait()
        supervisor = ConnectionSupervisor(config.id, link)
        self._supervisors[config.id] = supervisor
        self._tg.start_soon(supervisor.run)

    # ---- links and senders -------------------------------------------------------------------

    async def _tokens(self, config: ChannelConfig) -> dict[str, str]:
        tokens: dict[str, str] = {}
        for name in REQUIRED[config.connection.kind]:
            value = await self._secret(config.id, name)
            if not value:
                field = name.split(".", 1)[1]
                raise EngineError(f"channel {config.id!r} needs credentials.{field} for its {config.connection.kind} connection")
            tokens[name] = value
        return tokens

    def _identity(self, channel_id: str) -> Callable[[list[str]], None]:
        def learned(ids: list[str]) -> None:
            self.identity[channel_id] = [i for i in ids if i]

        return learned

    async def _link(self, config: ChannelConfig) -> Link:
        tokens = await self._tokens(config)
        connection = config.connection
        base = connection.api_base_url or ""
        channel_id = config.id

        async def on_message(params: ChannelMessageParams) -> object:
            return await self._receive(channel_id, params)

        if connection.kind == "telegram_polling":
            from sidecar.channels.connections.telegram import TelegramApi, TelegramPoller

            async def load_offset() -> int | None:
                _, resume = await self._store.run(lambda s: s.channels.connection_state(channel_id))
                return int(resume) if resume and resume.isdigit() else None

            async def save_offset(offset: int) -> None:
                await self._store.run(lambda s: s.channels.set_connection(channel_id, resume=str(offset)))

            return TelegramPoller(
                api=TelegramApi(self.http, base, tokens[BOT_TOKEN]), http=self.http, channel=channel_id,
                poll_timeout_s=connection.poll_timeout_s, on_message=on_message, load_offset=load_offset,
                save_offset=save_offset, on_identity=self._identity(channel_id),
            )
        if connection.kind == "discord_gateway":
            from sidecar.channels.connections.discord import DiscordGateway, DiscordRest

            _, stored = await self._store.run(lambda s: s.channels.connection_state(channel_id))
            try:
                resume: Any = msgspec.json.decode(stored) if stored else None
            except msgspec.DecodeError:
                resume = None

            async def save_resume(state: dict[str, Any] | None) -> None:
                text = msgspec.json.encode(state).decode() if state is not None else None
                await self._store.run(lambda s: s.channels.set_connection(channel_id, resume=text))

            assert connection.intents is not None
            return DiscordGateway(
                rest=DiscordRest(self.http, base, tokens[BOT_TOKEN]), token=tokens[BOT_TOKEN], intents=connection.intents,
                gateway_url=connection.gateway_url, channel=channel_id, on_message=on_message,
                resume=resume if isinstance(resume, dict) else None, save_resume=save_resume,
                on_identity=self._identity(channel_id),
            )
        from sidecar.channels.connections.slack import SlackApi, SlackSocket

        return SlackSocket(
            api=SlackApi(self.http, base), http=self.http, bot_token=tokens[BOT_TOKEN], app_token=tokens[APP_TOKEN],
            channel=channel_id, on_message=on_message, on_identity=self._identity(channel_id),
        )

    async def sender(self, config: ChannelConfig) -> PlatformSender | None:
        """How the channel's deliveries go out (None: to the host, as channel:reply)."""
        if config.connection.kind == "host":
            return None
        cached = self._senders.get(config.id)
        if cached is not None and cached[0] is config:
            return cached[1]
        token = await self._secret(config.id, BOT_TOKEN)
        if not token:
            raise EngineError(f"channel {config.id!r} needs credentials.botToken to send")
        base = config.connection.api_base_url or ""
        sender: PlatformSender
        if config.connection.kind == "telegram_polling":
            from sidecar.channels.connections.telegram import TelegramApi, TelegramSender

            sender = TelegramSender(TelegramApi(self.http, base, token), self._attachments)
        elif config.connection.kind == "discord_gateway":
            from sidecar.channels.connections.discord import DiscordRest, DiscordSender

            sender = DiscordSender(DiscordRest(self.http, base, token), self._attachments,
                                   allow_mentions=config.allow_mentions)
        else:
            from sidecar.channels.connections.slack import SlackApi, SlackSender

            sender = SlackSender(SlackApi(self.http, base), self.http, token, self._attachments)
        self._senders[config.id] = (config, sender)
        return sender

