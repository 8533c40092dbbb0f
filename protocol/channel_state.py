"""A channel's operation (``channel:*``): the connection the sidecar may own for it, its
credentials, the connection's status and the channel's counters.

Used by ``protocol.channels`` (ChannelConfigUpsertParams, ChannelConfig, the
``channel:connect`` / ``channel:disconnect`` results) and re-exported from there.
"""

from __future__ import annotations

from typing import Literal

from protocol.types import Struct

__all__ = [
    "ConnectionKind",
    "ConnectionState",
    "ChannelConnection",
    "ChannelCredentials",
    "ChannelConnectionStatus",
    "ChannelCounters",
]

ConnectionKind = Literal["host", "telegram_polling", "discord_gateway", "slack_socket"]
"""Who talks to the platform: ``host`` (the host hands messages in with ``channel:message`` and
delivers ``channel:reply``), or a connection the sidecar owns (``channel:connect``): Telegram
long polling (``getUpdates``), the Discord gateway (WebSocket) with its REST API, Slack Socket
Mode (WebSocket) with its Web API. With a connection, replies go out through it and
``channel:message`` / ``channel:ack`` are refused for the channel."""
ConnectionState = Literal["disconnected", "connecting", "connected", "failed"]


class ChannelConnection(Struct, forbid_unknown_fields=True, kw_only=True):
    """A connection the sidecar owns; every endpoint is a base URL (tests and proxies point it
    elsewhere)."""

    kind: ConnectionKind = "host"
    api_base_url: str | None = None
    """Telegram ``https://api.telegram.org`` (methods at ``/bot<token>/<method>``, files at
    ``/file/bot<token>/<path>``); Discord ``https://discord.com/api/v10``; Slack
    ``https://slack.com/api``."""
    gateway_url: str | None = None
    """Discord: the gateway (default: what ``GET /gateway/bot`` answers)."""
    poll_timeout_s: int = 30
    """Telegram: the long poll's ``timeout`` (1..50 s)."""
    intents: int | None = None
    """Discord gateway intents (default: GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES and the
    privileged MESSAGE_CONTENT, 37377)."""


class ChannelCredentials(Struct, forbid_unknown_fields=True, kw_only=True):
    """The platform's credentials, sealed at rest like API keys; shown as ``***``, and ``***``
    sent back keeps the stored value; ``""`` removes it."""

    bot_token: str | None = None
    """Telegram's bot token, Discord's bot token, Slack's bot token (``xoxb-``)."""
    app_token: str | None = None
    """Slack: the app-level token (``xapp-``) Socket Mode connects with."""


class ChannelConnectionStatus(Struct, omit_defaults=False, kw_only=True):
    """The state of a channel's own connection."""

    state: ConnectionState
    error: str | None = None
    """Why the last attempt failed (state ``failed``)."""
    retry_at: int | None = None
    """When the next attempt starts (ms); None in state ``failed``: not retried (the platform
    refused the credentials or the configuration), ``channel:connect`` tries again."""
    since: int | None = None
    """When the current state began (ms)."""
    bot_user_id: str | None = None
    """The bot's own id as the platform told it (its messages are ignored, its mention
    addresses it)."""


class ChannelCounters(Struct, omit_defaults=False, kw_only=True):
    """What a channel has received and done since it was created (kept across restarts)."""

    received: int = 0
    """Messages accepted (duplicates not counted)."""
    replied: int = 0
    ignored: int = 0
    """Stored without a reply or not stored: unaddressed group messages, the bot's own,
    empty ones, loop-guard cool-downs."""
    refused: int = 0
    """Strangers' messages (access rules)."""
    failed: int = 0
    duplicates: int = 0
    """Redeliveries answered ``duplicate``."""
