"""What each IM platform allows, and a channel's configuration with every default filled in.

Owns: the per-platform defaults (dialect, message size and its unit, Slack block limits,
rate, whether sent messages can be edited) and ``resolve_config``, which checks an upsert and
returns the ChannelConfig in effect. Must stay true: every value the delivery path reads is
set on the stored config (nothing is looked up from the platform table later), and a value
outside its range is an InvalidParams naming the field, never clamped silently.

Defaults, from the platforms' documented limits:
- Slack: 40,000 characters per message, 3,000 per section block, 50 blocks per message;
  about one message per second per channel (60/min, bursts of 3).
- WeCom (group robot Markdown): 4,096 UTF-8 bytes; 20 messages per minute per robot.
- DingTalk (robot Markdown): 20,000 UTF-8 bytes; 20 messages per minute per robot, after
  which the robot is blocked for minutes.
- Feishu/Lark: a card or post request body up to 30 KB (a text message up to 150 KB), so
  28,000 bytes of JSON-escaped text for cards and posts, 148,000 for plain text; 5 messages
  per second per chat (300/min, bursts of 5).
- WeChat: 2,048 UTF-8 bytes of plain text; 60/min, bursts of 5.
- Telegram (Bot API): 4,096 characters of text after entity parsing (counted in UTF-16 code
  units); about 30 messages per second for the bot, one per second into one chat and 20 per
  minute into one group (the Bots FAQ); a 429 says how long to wait (``retry_after``).
- Discord: 2,000 characters of ``content``; 50 requests per second for the bot and about
  five messages per five seconds into one channel (the route's bucket; the X-RateLimit
  headers and a 429's ``retry_after`` say the rest).
- plain: 4,000 characters, no rate limit.
Platforms that can edit a sent message (reply mode ``stream``): Feishu/Lark (message and card
update), Slack (chat.update), DingTalk (AI card streaming update), Telegram
(editMessageText), Discord (PATCH of the channel message), plain (the host decides).

A channel's access rules, trigger keyword and concurrency are checked here too; its route
by routes.py.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import msgspec

from protocol.channels import (
    ChannelConfig,
    ChannelConfigUpsertParams,
    ChannelConnection,
    ChannelCredentials,
    ChannelDeliveryPolicy,
    ChannelDialect,
    ChannelLimits,
    ChannelPlatform,
    ChannelRate,
    LocalRoute,
    SizeUnit,
)
from sidecar.channels.routes import check_route
from sidecar.errors import InvalidParams

__all__ = ["PlatformDefaults", "PLATFORMS", "resolve_config", "CHANNEL_ID_RE", "DAY_MS"]

DAY_MS = 24 * 3600 * 1000
CHANNEL_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class PlatformDefaults(msgspec.Struct, frozen=True, kw_only=True):
    dialect: ChannelDialect
    can_edit: bool
    messages_per_minute: int
    burst: int
    chat_per_minute: int = 0
    group_per_minute: int = 0
    chat_burst: int = 100


PLATFORMS: dict[ChannelPlatform, PlatformDefaults] = {
    "feishu": PlatformDefaults(dialect="feishu_card", can_edit=True, messages_per_minute=300, burst=5),
    "lark": PlatformDefaults(dialect="feishu_card", can_edit=True, messages_per_minute=300, burst=5),
    "dingtalk": PlatformDefaults(dialect="dingtalk_md", can_edit=True, messages_per_minute=20, burst=20),
    "wecom": PlatformDefaults(dialect="wecom_md", can_edit=False, messages_per_minute=20, burst=20),
    "wechat": PlatformDefaults(dialect="plain", can_edit=False, messages_per_minute=60, burst=5),
    "slack": PlatformDefaults(dialect="slack_blocks", can_edit=True, messages_per_minute=60, burst=3),
    "telegram": PlatformDefaults(
        dialect="telegram_md", can_edit=True, messages_per_minute=1800, burst=30, chat_per_minute=60,
        group_per_minute=20, chat_burst=3,
    ),
    "discord": PlatformDefaults(
        dialect="discord_md", can_edit=True, messages_per_minute=3000, burst=50, chat_per_minute=60,
        group_per_minute=60, chat_burst=5,
    ),
    "plain": PlatformDefaults(dialect="plain", can_edit=True, messages_per_minute=0, burst=10),
}

# (platform, dialect) -> (size, unit); a pair not listed uses the dialect's own default.
_SIZES: dict[tuple[str, str], tuple[int, SizeUnit]] = {
    ("feishu", "plain"): (148_000, "json_bytes"),
    ("lark", "plain"): (148_000, "json_bytes"),
    ("wechat", "plain"): (2_048, "utf8_bytes"),
    ("telegram", "plain"): (4_096, "utf16_units"),
    ("discord", "plain"): (2_000, "utf16_units"),
}
_DIALECT_SIZES: dict[str, tuple[int, SizeUnit]] = {
    "feishu_card": (28_000, "json_bytes"),
    "feishu_post": (28_000, "json_bytes"),
    "dingtalk_md": (20_000, "utf8_bytes"),
    "wecom_md": (4_096, "utf8_bytes"),
    "slack_mrkdwn": (40_000, "chars"),
    "slack_blocks": (40_000, "chars"),
    "telegram_md": (4_096, "utf16_units"),
    "discord_md": (2_000, "utf16_units"),
    "plain": (4_000, "chars"),
}

DEFAULT_INBOUND_CHARS = 64_000
DEFAULT_DEDUP_WINDOW_MS = 2 * DAY_MS
DEFAULT_EDIT_INTERVAL_MS = 1_000
DEFAULT_LOOP_MAX_EVENTS = 20
DEFAULT_LOOP_WINDOW_MS = 60_000
DEFAULT_LOOP_COOLDOWN_MS = 300_000
DEFAULT_ACK_TIMEOUT_MS = 30_000
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_RETRY_BACKOFF_MS = 2_000
SLACK_SECTION_CHARS = 3_000
SLACK_MAX_BLOCKS = 50
MAX_ALLOWED = 1_000
MAX_KEYWORD_CHARS = 64


def _pick(field: str, value: int | None, default: int, low: int, high: int) -> int:
    chosen = default if value is None else value
    if isinstance(chosen, bool) or not low <= chosen <= high:
        raise InvalidParams(f"invalid params: {field} must be {low}..{high} - at `$.{field}`")
    return chosen


def _text(field: str, value: str | None, limit: int) -> str | None:
    if value is None:
        return None
    if len(value) > limit:
        raise InvalidParams(f"invalid params: {field} is longer than {limit} characters - at `$.{field}`")
    return value or None


def resolve_config(params: ChannelConfigUpsertParams, now: int) -> ChannelConfig:
    """The ChannelConfig in effect for an upsert (InvalidParams naming the field when not)."""
    if not CHANNEL_ID_RE.match(params.id):
        raise InvalidParams("invalid params: id must be 1..64 of A-Za-z0-9._:- - at `$.id`")
    platform = PLATFORMS[params.platform]
    dialect: ChannelDialect = params.dialect or platform.dialect
    if params.reply_mode == "stream" and not platform.can_edit:
        raise InvalidParams(
            f"invalid params: replyMode stream needs a platform that can edit sent messages;"
            f" {params.platform} cannot - at `$.replyMode`"
        )
    if len(params.bot_user_ids) > 32 or any(not b or len(b) > 256 for b in params.bot_user_ids):
        raise InvalidParams("invalid params: botUserIds: at most 32 ids of 1..256 characters - at `$.botUserIds`")
    lim = params.limits or ChannelLimits()
    size, unit = _SIZES.get((params.platform, dialect), _DIALECT_SIZES[dialect])
    max_size = _pick("limits.maxMessageSize", lim.max_message_size, size, 256, 1_000_000)
    slack = dialect == "slack_blocks"
    if not slack and (lim.max_section_chars is not None or lim.max_blocks is not None):
        raise InvalidParams(
            "invalid params: maxSectionChars and maxBlocks apply to the slack_blocks dialect only"
            " - at `$.limits`"
        )
    limits = ChannelLimits(
        max_message_size=max_size,
        size_unit=lim.size_unit or unit,
        max_section_chars=_pick(
            "limits.maxSectionChars", lim.max_section_chars, min(SLACK_SECTION_CHARS, max_size), 256, max_size
        ) if slack else None,
        max_blocks=_pick("limits.maxBlocks", lim.max_blocks, SLACK_MAX_BLOCKS, 1, SLACK_MAX_BLOCKS) if slack else None,
        max_inbound_chars=_pick("limits.maxInboundChars", lim.max_inbound_chars, DEFAULT_INBOUND_CHARS, 1, 1_000_000),
        dedup_window_ms=_pick(
            "limits.dedupWindowMs", lim.dedup_window_ms, DEFAULT_DEDUP_WINDOW_MS, DAY_MS, 30 * DAY_MS
        ),
    )
    r = params.rate or ChannelRate()
    rate = ChannelRate(
        messages_per_minute=_pick("rate.messagesPerMinute", r.messages_per_minute, platform.messages_per_minute, 0, 6_000),
        burst=_pick("rate.burst", r.burst, platform.burst, 1, 100),
        edit_interval_ms=_pick("rate.editIntervalMs", r.edit_interval_ms, DEFAULT_EDIT_INTERVAL_MS, 200, 60_000),
        loop_max_events=_pick("rate.loopMaxEvents", r.loop_max_events, DEFAULT_LOOP_MAX_EVENTS, 1, 10_000),
        loop_window_ms=_pick("rate.loopWindowMs", r.loop_window_ms, DEFAULT_LOOP_WINDOW_MS, 1_000, DAY_MS),
        loop_cooldown_ms=_pick("rate.loopCooldownMs", r.loop_cooldown_ms, DEFAULT_LOOP_COOLDOWN_MS, 0, DAY_MS),
        chat_messages_per_minute=_pick(
            "rate.chatMessagesPerMinute", r.chat_messages_per_minute, platform.chat_per_minute, 0, 6_000
        ),
        group_messages_per_minute=_pick(
            "rate.groupMessagesPerMinute", r.group_messages_per_minute, platform.group_per_minute, 0, 6_000
        ),
        chat_burst=_pick("rate.chatBurst", r.chat_burst, platform.chat_burst, 1, 100),
    )
    d = params.delivery or ChannelDeliveryPolicy()
    delivery = ChannelDeliveryPolicy(
        ack_timeout_ms=_pick("delivery.ackTimeoutMs", d.ack_timeout_ms, DEFAULT_ACK_TIMEOUT_MS, 100, 600_000),
        max_attempts=_pick("delivery.maxAttempts", d.max_attempts, DEFAULT_MAX_ATTEMPTS, 1, 20),
        retry_backoff_ms=_pick("delivery.retryBackoffMs", d.retry_backoff_ms, DEFAULT_RETRY_BACKOFF_MS, 0, 600_000),
    )
    return ChannelConfig(
        id=params.id,
        platform=params.platform,
        name=_text("name", params.name, 200),
        enabled=params.enabled,
        scope=params.scope,
        reply_mode=params.reply_mode,
        group_trigger=params.group_trigger,
        dialect=dialect,
        bot_user_ids=list(params.bot_user_ids),
        allow_mentions=params.allow_mentions,
        provider_id=_text("providerId", params.provider_id, 200),
        model_id=_text("modelId", params.model_id, 200),
        system_prompt=_text("systemPrompt", params.system_prompt, 100_000),
        limits=limits,
        rate=rate,
        delivery=delivery,
        route=check_route(params.route or LocalRoute()),
        allowed_users=_ids("allowedUsers", params.allowed_users),
        allowed_groups=_ids("allowedGroups", params.allowed_groups),
        allow_everyone=params.allow_everyone,
        strangers=params.strangers,
        trigger_keyword=_keyword(params.trigger_keyword),
        max_concurrent=_pick("maxConcurrent", params.max_concurrent, 5, 1, 64),
        connection=_connection(params.platform, params.connection or ChannelConnection()),
        credentials=params.credentials or ChannelCredentials(),
        can_edit=platform.can_edit,
        created_at=now,
        updated_at=now,
    )


def _ids(field: str, values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    if len(values) > MAX_ALLOWED or any(not v or len(v) > 512 for v in values):
        raise InvalidParams(f"invalid params: {field}: at most {MAX_ALLOWED} ids of 1..512 characters - at `$.{field}`")
    return list(dict.fromkeys(values))


def _keyword(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip() or len(value) > MAX_KEYWORD_CHARS or not value.isprintable():
        raise InvalidParams(
            f"invalid params: triggerKeyword must be 1..{MAX_KEYWORD_CHARS} printable characters - at `$.triggerKeyword`"
        )
    return value.strip()


CONNECTION_PLATFORM = {"telegram_polling": "telegram", "discord_gateway": "discord", "slack_socket": "slack"}
"""The platform each kind of connection is for."""
DEFAULT_API = {
    "telegram_polling": "https://api.telegram.org",
    "discord_gateway": "https://discord.com/api/v10",
    "slack_socket": "https://slack.com/api",
}
DEFAULT_INTENTS = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15)
"""GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT."""


def _base_url(field: str, value: str | None, default: str | None, schemes: tuple[str, ...]) -> str | None:
    if value is None:
        return default
    parts = urlsplit(value.strip()) if len(value) <= 2_000 else None
    if parts is None or parts.scheme not in schemes or not parts.hostname or parts.query or parts.fragment \
            or parts.username or parts.password:
        raise InvalidParams(
            f"invalid params: {field} must be a {'/'.join(schemes)} URL without credentials, query or fragment"
            f" - at `$.{field}`"
        )
    return value.strip().rstrip("/")


def _connection(platform: ChannelPlatform, connection: ChannelConnection) -> ChannelConnection:
    kind = connection.kind
    if kind == "host":
        if connection != ChannelConnection():
            raise InvalidParams("invalid params: connection settings need a connection kind - at `$.connection`")
        return connection
    if CONNECTION_PLATFORM[kind] != platform:
        raise InvalidParams(
            f"invalid params: connection.kind {kind} is for {CONNECTION_PLATFORM[kind]} channels - at `$.connection.kind`"
        )
    if kind != "discord_gateway" and (connection.gateway_url is not None or connection.intents is not None):
        raise InvalidParams("invalid params: gatewayUrl and intents are for discord_gateway - at `$.connection`")
    if not 1 <= connection.poll_timeout_s <= 50:
        raise InvalidParams("invalid params: connection.pollTimeoutS must be 1..50 - at `$.connection.pollTimeoutS`")
    intents = connection.intents
    if intents is not None and not 0 <= intents < 1 << 31:
        raise InvalidParams("invalid params: connection.intents must be 0..2^31-1 - at `$.connection.intents`")
    return ChannelConnection(
        kind=kind,
        api_base_url=_base_url("connection.apiBaseUrl", connection.api_base_url, DEFAULT_API[kind], ("http", "https")),
        gateway_url=_base_url("connection.gatewayUrl", connection.gateway_url, None, ("ws", "wss")),
        poll_timeout_s=connection.poll_timeout_s,
        intents=(DEFAULT_INTENTS if intents is None else intents) if kind == "discord_gateway" else None,
    )
