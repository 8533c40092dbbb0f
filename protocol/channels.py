"""``channel:*``: IM conversations (Feishu/Lark, DingTalk, WeCom, WeChat, Slack, Telegram, Discord,
a plain host).

The sidecar never talks to an IM platform. The host (the Electron main process or a gateway)
receives the platform's events and hands each message in with ``channel:message``; the
sidecar adapts it, routes it to the session of its chat (by the channel's scope rule), runs
the turn, renders and splits the reply for the platform and sends it back as
``channel:reply`` notifications, which the host delivers and acknowledges with
``channel:ack``. ``channel:config:*`` configures one channel (one bot on one platform).

Every params Struct here forbids unknown fields: a typo is an invalid-params error, not a
setting silently ignored. ``raw`` (the platform's own payload) is the one free-form field;
it is bounded in size and nesting.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from protocol.channel_state import (
    ChannelConnection,
    ChannelConnectionStatus,
    ChannelCounters,
    ChannelCredentials,
    ConnectionKind,
    ConnectionState,
)
from protocol.common import EmptyParams, IdParams, MethodSpec, SuccessResult
from protocol.types import Struct

__all__ = [
    "ChannelPlatform",
    "ChatType",
    "ChannelScope",
    "ReplyMode",
    "GroupTrigger",
    "ChannelDialect",
    "SizeUnit",
    "InboundType",
    "AttachmentKind",
    "DeliveryKind",
    "MessageAction",
    "ChannelLimits",
    "ChannelRate",
    "ChannelDeliveryPolicy",
    "ChannelConfigUpsertParams",
    "ChannelConfig",
    "ChannelSender",
    "ChannelMention",
    "ChannelAttachment",
    "ChannelQuote",
    "ChannelMessageParams",
    "ChannelMessageResult",
    "SlackText",
    "SlackSectionBlock",
    "ReplyTextChunk",
    "ReplyBlocksChunk",
    "ReplyImageChunk",
    "ReplyFileChunk",
    "ReplyChunk",
    "ChannelReplyParams",
    "ChannelAckParams",
    "StrangerAction",
    "LogStatus",
    "RemoteAgentAuth",
    "LocalRoute",
    "AssistantRoute",
    "AcpRoute",
    "RemoteAgentRoute",
    "ChannelRoute",
    "ChannelCounters",
    "ChannelMessagesParams",
    "ChannelLogEntry",
    "ChannelMessagesResult",
    "ConnectionKind",
    "ConnectionState",
    "ChannelConnection",
    "ChannelCredentials",
    "ChannelConnectionStatus",
]

ChannelPlatform = Literal[
    "feishu", "lark", "dingtalk", "wecom", "wechat", "slack", "telegram", "discord", "plain"
]
"""``plain``: any other host (a terminal, a test gateway) that takes plain text."""
ChatType = Literal["private", "group"]
ChannelScope = Literal["chat", "chat_sender", "thread"]
"""Which messages share a session: the whole chat, each sender in a chat, or each thread of a
chat (messages without a thread id fall back to the chat)."""
ReplyMode = Literal["once", "stream"]
"""``once``: the reply is sent when it is finished. ``stream``: one message is sent early and
edited in place while the reply streams (platforms that can edit messages only)."""
GroupTrigger = Literal["mention", "always"]
"""In group chats: answer only messages that mention the bot (others are stored without a
reply), or answer every message."""
ChannelDialect = Literal[
    "feishu_card", "feishu_post", "dingtalk_md", "wecom_md", "slack_mrkdwn", "slack_blocks", "telegram_md",
    "discord_md", "plain",
]
"""What a reply's Markdown is rendered to: Feishu card (JSON 2.0 rich text) or post ``md``
Markdown, DingTalk Markdown, WeCom Markdown, Slack mrkdwn (text) or mrkdwn section blocks,
Telegram MarkdownV2 (send with ``parse_mode: "MarkdownV2"``), Discord Markdown, plain text."""
SizeUnit = Literal["chars", "utf8_bytes", "json_bytes", "utf16_units"]
"""How a chunk's size is measured: characters, UTF-8 bytes, the UTF-8 bytes of the chunk as
a JSON string (escapes counted; Feishu's limit is on the request body), or UTF-16 code units
(what JavaScript's ``length`` counts: Telegram and Discord)."""
InboundType = Literal["text", "rich", "card", "image", "file", "audio", "video", "sticker", "other"]
AttachmentKind = Literal["image", "file", "audio", "video"]
DeliveryKind = Literal["send", "edit", "delete"]
"""``send`` a new platform message; ``edit`` (stream mode) replace the content of the message
sent by delivery ``editOf``; ``delete`` recall that message (a streamed message the final
reply no longer needs)."""
MessageAction = Literal["reply", "store", "new_session", "duplicate", "throttled", "ignored", "refused"]
"""What ``channel:message`` does with a message: answer it; store it without a reply (a group
message that does not address the bot, or a stranger's with ``strangers: "store"``); start a
new session (``/new``); nothing (already received); store it without a reply because the chat
is cooling down (loop guard); nothing (the bot's own message, or no content); nothing but
the message log (a stranger's message, ``strangers: "refuse"``)."""
StrangerAction = Literal["refuse", "store"]
"""A message from someone the channel does not answer (not in ``allowedUsers``, not in an
``allowedGroups`` chat): ``refuse`` keeps it only in the message log (``channel:messages``);
``store`` also stores it in the chat's session without a reply (the model sees it as part of
the conversation when an allowed user asks)."""
LogStatus = Literal["received", "replied", "ignored", "refused", "failed"]
"""A logged message: ``received`` (queued or being answered), ``replied`` (answered; the
reply's own delivery state is on the reply message), ``ignored`` (stored without a reply or
not stored, ``reason`` says why), ``refused`` (a stranger's), ``failed`` (not answered:
``reason``)."""


class ChannelLimits(Struct, forbid_unknown_fields=True, kw_only=True):
    """Sizes; an omitted field takes the platform's default (``channel:config:get`` shows the
    effective values)."""

    max_message_size: int | None = None
    """The largest chunk (one platform message), in ``sizeUnit``; 256..1,000,000."""
    size_unit: SizeUnit | None = None
    max_section_chars: int | None = None
    """slack_blocks: the largest section block (Slack: 3,000); 256..maxMessageSize."""
    max_blocks: int | None = None
    """slack_blocks: section blocks per message (Slack: 50); 1..50."""
    max_inbound_chars: int | None = None
    """The longest incoming text accepted (longer is invalid params); 1..1,000,000."""
    dedup_window_ms: int | None = None
    """How long a received message id is remembered (redeliveries inside it are dropped);
    24 h..30 days, default 48 h."""


class ChannelRate(Struct, forbid_unknown_fields=True, kw_only=True):
    """Outgoing rate and the loop guard; an omitted field takes the platform's default."""

    messages_per_minute: int | None = None
    """Platform messages (chunks, edits) per minute for the whole channel; 0 = unlimited."""
    burst: int | None = None
    """Messages that may go at once (and the most chunks one delivery carries); 1..100."""
    edit_interval_ms: int | None = None
    """stream mode: at least this long between two edits of a streaming reply; 200..60,000."""
    loop_max_events: int | None = None
    """Loop guard: more replies than this in ``loopWindowMs`` in one chat start a cooldown."""
    loop_window_ms: int | None = None
    loop_cooldown_ms: int | None = None
    """While a chat cools down its messages are stored without a reply."""
    chat_messages_per_minute: int | None = None
    """Platform messages per minute into one private chat, on top of the channel's rate;
    0 = no limit of its own (Telegram: 60, one a second)."""
    group_messages_per_minute: int | None = None
    """The same for one group chat (Telegram: 20; Discord: 60, five per five seconds)."""
    chat_burst: int | None = None
    """Messages that may go at once into one chat; 1..100."""


class ChannelDeliveryPolicy(Struct, forbid_unknown_fields=True, kw_only=True):
    """Acknowledgements and retries of ``channel:reply`` deliveries."""

    ack_timeout_ms: int | None = None
    """A delivery not acknowledged within this is sent again; 100..600,000 (default 30 s)."""
    max_attempts: int | None = None
    """Sends of one delivery before it is marked failed; 1..20 (default 4)."""
    retry_backoff_ms: int | None = None
    """Wait before the second attempt, doubled for each further one (capped at 5 min);
    0..600,000 (default 2 s)."""


class RemoteAgentAuth(Struct, forbid_unknown_fields=True, kw_only=True):
    """How the remote agent service is authenticated (05-CHANNELS ``auth``). The token is
    sealed at rest like an API key; the sidecar shows it as ``***``, and ``***`` sent back
    keeps the stored one."""

    type: Literal["bearer", "api-key", "custom-header"]
    """``bearer``: ``Authorization: Bearer <token>``; ``api-key``: ``x-api-key: <token>``
    (what the V1 endpoint and the Qiming server's SandboxAgentClient use);
    ``custom-header``: ``<headerName>: <token>``."""
    token: str
    header_name: str | None = None
    """``custom-header`` only: an HTTP header name (not Host, Content-Length and the like)."""


class _Route(Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """Base of the ChannelRoute union (tagged by ``type``)."""


class LocalRoute(_Route, tag="local", forbid_unknown_fields=True, kw_only=True):
    """The local chat engine with the channel's ``providerId``/``modelId``/``systemPrompt``
    (the default)."""


class AssistantRoute(_Route, tag="assistant", forbid_unknown_fields=True, kw_only=True):
    """An assistant profile (``assistant:*``): the channel's sessions get its system prompt,
    knowledge bases, memory, Soul.md and tools."""

    assistant_id: str


class AcpRoute(_Route, tag="acp", forbid_unknown_fields=True, kw_only=True):
    """An ACP agent engine (a provider of type ``acp-engine``) runs every turn."""

    provider_id: str
    workspace_dir: str | None = None
    """The agent's working directory (absolute); default: the data dir's own."""


class RemoteAgentRoute(_Route, tag="remote-agent", forbid_unknown_fields=True, kw_only=True):
    """Another agent service's V1 API (05-CHANNELS §4.1): ``POST {serviceUrl}{chatEndpoint}``,
    then its progress stream ``GET {serviceUrl}{progressEndpoint}`` (SSE)."""

    service_url: str
    """http(s) base URL of the service, e.g. ``https://testagent.example.com``."""
    auth: RemoteAgentAuth | None = None
    chat_endpoint: str = "/computer/chat"
    progress_endpoint: str = "/computer/progress/{session_id}"
    """The placeholder in braces (as in the default) is replaced by the session id the chat
    call answered."""
    cancel_endpoint: str = "/computer/agent/session/cancel"
    """Called (the V1 user, project and session ids in the query) when the reply is aborted."""
    idle_timeout_ms: int = 120_000
    """A progress stream silent this long is re-attached (the V1 endpoint pings every 30 s);
    10,000..3,600,000."""


ChannelRoute = Union[LocalRoute, AssistantRoute, AcpRoute, RemoteAgentRoute]
"""Where a channel's messages go (``route``)."""


class ChannelConfigUpsertParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``channel:config:upsert``: create or replace a channel (one bot on one platform)."""

    id: str
    """Chosen by the host, used as ``channel`` in messages and replies (1..64 of
    ``A-Za-z0-9._:-``)."""
    platform: ChannelPlatform
    name: str | None = None
    enabled: bool = True
    scope: ChannelScope = "chat"
    reply_mode: ReplyMode = "once"
    group_trigger: GroupTrigger = "mention"
    dialect: ChannelDialect | None = None
    """Default per platform: feishu/lark feishu_card, dingtalk dingtalk_md, wecom wecom_md,
    slack slack_blocks, wechat and plain plain."""
    bot_user_ids: list[str] = []
    """The bot's own ids on the platform: a mention of one of them mentions the bot, and a
    message sent by one of them is the bot's own (ignored)."""
    allow_mentions: bool = False
    """Whether a reply may mention people. Off (the default): the mention syntax in a reply
    (Feishu/Lark ``<at ...>``, Slack/WeCom ``<@...>``, Slack ``<!here>``-style tags, and
    ``@all``, ``@everyone``, ``@here``, ``@channel``, ``@所有人``...) is sent with a full-width
    ``＜`` or ``＠`` so no platform turns it into a mention (a reply is model output). On:
    the reply's text is sent as rendered."""
    provider_id: str | None = None
    """Provider and model of the sessions this channel creates (default: provider:setDefault);
    routes ``local`` and ``assistant`` (the assistant's own model otherwise)."""
    model_id: str | None = None
    system_prompt: str | None = None
    limits: ChannelLimits | None = None
    rate: ChannelRate | None = None
    delivery: ChannelDeliveryPolicy | None = None
    route: ChannelRoute | None = None
    """Where the messages go (default ``{"type": "local"}``). A chat whose session was made
    for another route gets a new session at its next message."""
    allowed_users: list[str] | None = None
    """Sender ids answered in any chat (at most 1,000)."""
    allowed_groups: list[str] | None = None
    """Group chat ids in which everyone is answered (at most 1,000)."""
    allow_everyone: bool = False
    """Answer everyone. Off by default: a channel answers only ``allowedUsers`` and the
    members of ``allowedGroups`` (with neither: nobody), because a reply can use the tools
    of this computer (workspace, MCP servers, an ACP agent)."""
    strangers: StrangerAction = "refuse"
    trigger_keyword: str | None = None
    """In groups, a message containing this word addresses the bot as a mention does
    (case-insensitive; taken out of the text when the message starts with it); 1..64
    characters."""
    max_concurrent: int = 5
    """Replies of this channel running at once (others wait, in arrival order, also across a
    restart); 1..64."""
    connection: ChannelConnection | None = None
    """Default ``{"kind": "host"}``."""
    credentials: ChannelCredentials | None = None


class ChannelConfig(Struct, omit_defaults=False, kw_only=True):
    """A stored channel with every limit, rate and delivery value in effect."""

    id: str
    platform: ChannelPlatform
    name: str | None = None
    enabled: bool = True
    scope: ChannelScope = "chat"
    reply_mode: ReplyMode = "once"
    group_trigger: GroupTrigger = "mention"
    dialect: ChannelDialect
    bot_user_ids: list[str] = []
    allow_mentions: bool = False
    provider_id: str | None = None
    model_id: str | None = None
    system_prompt: str | None = None
    limits: ChannelLimits
    rate: ChannelRate
    delivery: ChannelDeliveryPolicy
    route: ChannelRoute = msgspec.field(default_factory=LocalRoute)
    allowed_users: list[str] | None = None
    allowed_groups: list[str] | None = None
    allow_everyone: bool = False
    strangers: StrangerAction = "refuse"
    trigger_keyword: str | None = None
    max_concurrent: int = 5
    can_edit: bool = False
    """Whether the platform can edit sent messages (reply mode ``stream`` needs it)."""
    connection: ChannelConnection = msgspec.field(default_factory=ChannelConnection)
    credentials: ChannelCredentials = msgspec.field(default_factory=ChannelCredentials)
    """Set ones as ``***``."""
    counters: ChannelCounters | None = None
    """``channel:config:list`` and ``channel:config:get``: the channel's counts."""
    status: ChannelConnectionStatus | None = None
    """``channel:config:list`` and ``channel:config:get``, for a channel with a connection of
    its own."""
    created_at: int
    updated_at: int


class ChannelSender(Struct, forbid_unknown_fields=True, kw_only=True):
    id: str
    name: str | None = None
    """Display name; in group chats it is put into the user turn so the model knows who spoke."""
    is_bot: bool = False


class ChannelMention(Struct, forbid_unknown_fields=True, kw_only=True):
    """One mention of the message. ``key`` is the placeholder the text holds for it, when the
    platform uses one (Feishu ``@_user_1``)."""

    id: str
    name: str | None = None
    key: str | None = None
    is_self: bool = False
    """The host knows this mention is the bot (else: ``id`` in the channel's botUserIds)."""


class ChannelAttachment(Struct, forbid_unknown_fields=True, kw_only=True):
    """An attachment the host downloaded: ``data`` (base64 bytes, stored in the data dir), or an
    ``http(s)`` ``url`` a model can fetch."""

    kind: AttachmentKind
    name: str | None = None
    mime_type: str | None = None
    data: str | None = None
    url: str | None = None


class ChannelQuote(Struct, forbid_unknown_fields=True, kw_only=True):
    """The message this one replies to (a quoted reply)."""

    message_id: str | None = None
    text: str | None = None
    sender_name: str | None = None


class ChannelMessageParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``channel:message``: one incoming IM message, as the host received it."""

    channel: str
    """The channel's id (``channel:config:upsert``)."""
    chat_id: str
    chat_type: ChatType
    chat_name: str | None = None
    """The group's name (titles of new sessions)."""
    thread_id: str | None = None
    """The platform's thread (Feishu thread_id/root_id, Slack thread_ts): scope ``thread``."""
    sender: ChannelSender
    message_id: str | None = None
    """The platform's message id: the dedup key (not the event id, which changes on
    redelivery). Without it the key is a hash of chat, sender, timestamp and content."""
    msg_type: InboundType = "text"
    text: str = ""
    """The text as the platform gave it, markup included (mentions, emoji codes, Slack
    ``<@U1>``...)."""
    mentions: list[ChannelMention] = []
    mention_all: bool = False
    """The host saw an @all/@everyone (markup in the text is detected too)."""
    attachments: list[ChannelAttachment] = []
    reply_to: ChannelQuote | None = None
    timestamp: int
    """When the platform says the message was sent (ms)."""
    raw: dict[str, Any] | None = None
    """The platform's own message payload (Feishu message object or its content, DingTalk or
    WeCom callback body, Slack event); used to read rich text, cards and mentions. At most
    256 KiB as JSON, nesting at most 32 levels."""


class ChannelMessageResult(Struct, omit_defaults=False, kw_only=True):
    action: MessageAction
    inbox_id: str
    """The received message's record (the same for a duplicate as for the original)."""
    session_id: str | None = None
    """The session it went (or goes) to; None when ignored."""


class SlackText(Struct, kw_only=True, omit_defaults=False):
    type: Literal["mrkdwn"] = "mrkdwn"
    text: str


class SlackSectionBlock(Struct, kw_only=True, omit_defaults=False):
    """A Slack ``section`` block, in Slack's own JSON shape (the host passes it through)."""

    type: Literal["section"] = "section"
    text: SlackText


class _Chunk(Struct, tag_field="type", kw_only=True):
    """Base of the ReplyChunk union (tagged by ``type``)."""


class ReplyTextChunk(_Chunk, tag="text", kw_only=True):
    """One platform message of rendered text."""

    text: str
    format: ChannelDialect


class ReplyBlocksChunk(_Chunk, tag="blocks", kw_only=True):
    """One Slack message: section blocks plus the same content as ``text`` (notifications)."""

    text: str
    blocks: list[SlackSectionBlock]


class ReplyImageChunk(_Chunk, tag="image", kw_only=True):
    """An image sent as a message of its own: an ``http(s)`` URL or a ``file://`` URI in the
    data dir (the host uploads it)."""

    url: str
    mime_type: str | None = None
    alt: str | None = None


class ReplyFileChunk(_Chunk, tag="file", kw_only=True):
    uri: str
    name: str | None = None
    mime_type: str | None = None


ReplyChunk = Union[ReplyTextChunk, ReplyBlocksChunk, ReplyImageChunk, ReplyFileChunk]


class ChannelReplyParams(Struct, omit_defaults=False, kw_only=True):
    """``channel:reply`` (sidecar -> host): send these chunks, in order, to the chat, then
    answer ``channel:ack {deliveryId}``. A delivery not acknowledged in time is sent again
    with the same ``deliveryId`` (``attempt`` counts up): the host must treat it as an
    idempotency key."""

    delivery_id: str
    channel: str
    chat_id: str
    thread_id: str | None = None
    reply_to: str | None = None
    """The platform message id this answers (to quote or thread the reply)."""
    chat_type: ChatType | None = None
    """The chat's type (per-chat rate limits differ for groups)."""
    session_id: str
    message_id: str | None = None
    """The assistant message in the session (None for a command's confirmation)."""
    seq: int
    """1, 2, 3... per reply, in the order the host must deliver them."""
    final: bool
    """The last delivery of this reply."""
    kind: DeliveryKind = "send"
    edit_of: str | None = None
    """kind edit/delete: the delivery whose platform message to change."""
    attempt: int = 1
    chunks: list[ReplyChunk]
    """Platform messages, in order (kind edit: exactly one, the new content; delete: none)."""


class ChannelAckParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``channel:ack``: the host delivered (``ok``) or could not deliver a ``channel:reply``."""

    delivery_id: str
    ok: bool
    error: str | None = None
    retryable: bool = True
    """``ok: false`` with ``retryable: false`` (e.g. the bot left the chat) fails the delivery
    at once instead of retrying it."""
    platform_message_id: str | None = None
    """The platform's id of the (first) message sent, kept for the record."""


class ChannelMessagesParams(Struct, forbid_unknown_fields=True, kw_only=True):
    """``channel:messages``: a channel's message log, newest first."""

    channel: str
    status: LogStatus | None = None
    chat_id: str | None = None
    before: str | None = None
    """``nextBefore`` of the previous page."""
    limit: int = 50
    """1..500."""


class ChannelLogEntry(Struct, omit_defaults=False, kw_only=True):
    """One received message (kept for the channel's dedup window, at least 24 h)."""

    inbox_id: str
    chat_id: str
    chat_type: ChatType | None = None
    thread_id: str | None = None
    message_id: str | None = None
    """The platform's message id."""
    sender_id: str | None = None
    sender_name: str | None = None
    text: str | None = None
    """The start of the message's clean text (at most 500 characters)."""
    action: MessageAction
    status: LogStatus
    reason: str | None = None
    """Why it was ignored, refused or failed."""
    session_id: str | None = None
    user_message_id: str | None = None
    reply_message_id: str | None = None
    received_at: int
    updated_at: int


class ChannelMessagesResult(Struct, omit_defaults=False, kw_only=True):
    entries: list[ChannelLogEntry]
    next_before: str | None = None
    """Pass as ``before`` for the next (older) page; None: no more."""


METHODS: dict[str, MethodSpec] = {
    "channel:message": MethodSpec(
        ChannelMessageParams, ChannelMessageResult,
        "An incoming IM message: deduplicated, routed to its chat's session, answered by channel:reply.",
    ),
    "channel:ack": MethodSpec(
        ChannelAckParams, SuccessResult, "The host delivered (or failed to deliver) a channel:reply."
    ),
    "channel:config:list": MethodSpec(
        EmptyParams, list[ChannelConfig], "Configured channels."
    ),
    "channel:config:get": MethodSpec(IdParams, ChannelConfig, "One channel with its effective limits."),
    "channel:config:upsert": MethodSpec(
        ChannelConfigUpsertParams, ChannelConfig, "Create or replace a channel (platform, scope, reply mode, limits)."
    ),
    "channel:config:delete": MethodSpec(
        IdParams, SuccessResult, "Delete a channel; its open deliveries fail, its sessions stay."
    ),
    "channel:connect": MethodSpec(
        IdParams, ChannelConnectionStatus,
        "Open the channel's own connection (kept across restarts until channel:disconnect).",
    ),
    "channel:disconnect": MethodSpec(IdParams, ChannelConnectionStatus, "Close the channel's own connection."),
    "channel:messages": MethodSpec(
        ChannelMessagesParams, ChannelMessagesResult,
        "A channel's message log (received, replied, ignored, refused, failed, with reasons), paged.",
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
