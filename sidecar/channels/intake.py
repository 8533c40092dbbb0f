"""What ``channel:message`` decides about a message before anything is stored.

Owns the checks of an incoming message (sizes, ids: InvalidParams naming the field), its
dedup key, the access rules and the decision (``decide``), in this order:

1. the bot's own message (its sender is one of ``botUserIds``), or nothing in it: ``ignored``;
2. a stranger (access below): ``refused`` (only the message log keeps it), or ``store``
   with ``strangers: "store"``;
3. a group message that does not address the bot (no mention of it, no reply to it, no
   ``triggerKeyword``) while the group trigger is ``mention``: ``store``;
4. ``/new`` addressed to the bot: ``new_session``;
5. the chat cooling down (loop guard): ``throttled``;
6. else ``reply``.

Access: a sender is answered when ``allowEveryone`` is on, or the sender's id is in
``allowedUsers``, or the message comes from a group chat listed in ``allowedGroups``.
With none of them set a channel answers nobody: the default, because a reply can use the
tools of this computer (workspace tools, MCP servers, an ACP agent) and a bot's address is
easy to find on every platform.

Must stay true: ``decide`` is a pure function of its inputs (the loop guard's state is
passed in); every decision that is not ``reply`` or ``new_session`` carries the reason the
message log shows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from protocol.channels import ChannelConfig, ChannelMessageParams, MessageAction
from sidecar.channels.inbound import Adapted
from sidecar.errors import InvalidParams

__all__ = [
    "Decision", "decide", "allowed", "dedup_key", "check_sizes", "NEW_SESSION_COMMAND", "MAX_RAW_BYTES",
    "MAX_RAW_DEPTH",
]

NEW_SESSION_COMMAND = "/new"
MAX_RAW_BYTES = 256 * 1024
MAX_RAW_DEPTH = 32
MAX_ID_CHARS = 512
MAX_NAME_CHARS = 512
MAX_MENTIONS = 256
MAX_ATTACHMENTS = 16

_enc = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Decision:
    action: MessageAction
    reason: str | None = None


def allowed(config: ChannelConfig, params: ChannelMessageParams) -> bool:
    if config.allow_everyone:
        return True
    if config.allowed_users and params.sender.id in config.allowed_users:
        return True
    return params.chat_type == "group" and bool(config.allowed_groups) and params.chat_id in (config.allowed_groups or ())


def decide(params: ChannelMessageParams, config: ChannelConfig, adapted: Adapted, *, cooling: bool) -> Decision:
    if params.sender.id in config.bot_user_ids:
        return Decision("ignored", "the bot's own message")
    if adapted.empty:
        return Decision("ignored", "no content")
    if not allowed(config, params):
        where = f"group {params.chat_id}" if params.chat_type == "group" else "a private chat"
        reason = f"sender {params.sender.id} in {where} is not allowed (allowedUsers, allowedGroups)"
        return Decision("store" if config.strangers == "store" else "refused", reason)
    addressed = (
        params.chat_type == "private" or config.group_trigger == "always" or adapted.mentions_bot or adapted.keyword
    )
    if not addressed:
        return Decision("store", "not addressed to the bot (no mention, reply or trigger keyword)")
    if adapted.body.strip().lower() == NEW_SESSION_COMMAND:
        return Decision("new_session")
    if cooling:
        return Decision("throttled", "the chat is cooling down (loop guard)")
    return Decision("reply")


def dedup_key(params: ChannelMessageParams) -> str:
    """The platform message id; without one, a hash of chat, sender, timestamp, type, text
    and attachments (what a redelivery repeats)."""
    if params.message_id:
        return "id:" + params.message_id
    digest = hashlib.sha256()
    for value in (params.chat_id, params.sender.id, str(params.timestamp), params.msg_type, params.text):
        digest.update(value.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    for att in params.attachments:
        digest.update((att.url or "").encode())
        digest.update(hashlib.sha256((att.data or "").encode()).digest())
    # not ``raw``: a redelivered event's envelope (event id, delivery time) differs
    return "hash:" + digest.hexdigest()


def check_sizes(params: ChannelMessageParams, config: ChannelConfig) -> None:
    limit = config.limits.max_inbound_chars or 0
    if len(params.text) > limit:
        raise InvalidParams(
            f"invalid params: text is {len(params.text)} characters, more than the channel's limit"
            f" of {limit} - at `$.text`"
        )
    for field, value in (
        ("chatId", params.chat_id), ("sender.id", params.sender.id), ("messageId", params.message_id),
        ("threadId", params.thread_id),
    ):
        if value is not None and not 0 < len(value) <= MAX_ID_CHARS:
            raise InvalidParams(f"invalid params: {field} must be 1..{MAX_ID_CHARS} characters - at `$.{field}`")
    for field, value in (("chatName", params.chat_name), ("sender.name", params.sender.name)):
        if value is not None and len(value) > MAX_NAME_CHARS:
            raise InvalidParams(f"invalid params: {field} is longer than {MAX_NAME_CHARS} - at `$.{field}`")
    if len(params.mentions) > MAX_MENTIONS:
        raise InvalidParams(f"invalid params: more than {MAX_MENTIONS} mentions - at `$.mentions`")
    for index, mention in enumerate(params.mentions):
        if not 0 < len(mention.id) <= MAX_ID_CHARS or len(mention.name or "") > MAX_NAME_CHARS or len(
            mention.key or ""
        ) > MAX_ID_CHARS:
            raise InvalidParams(f"invalid params: a mention needs an id of 1..{MAX_ID_CHARS} characters - at `$.mentions[{index}]`")
    if len(params.attachments) > MAX_ATTACHMENTS:
        raise InvalidParams(f"invalid params: more than {MAX_ATTACHMENTS} attachments - at `$.attachments`")
    if params.reply_to is not None and len(params.reply_to.text or "") > limit:
        raise InvalidParams(f"invalid params: replyTo.text is longer than {limit} characters - at `$.replyTo.text`")
    if params.raw is not None:
        if len(_enc.encode(params.raw)) > MAX_RAW_BYTES:
            raise InvalidParams(f"invalid params: raw is larger than {MAX_RAW_BYTES} bytes - at `$.raw`")
        if _depth(params.raw) > MAX_RAW_DEPTH:
            raise InvalidParams(f"invalid params: raw is nested deeper than {MAX_RAW_DEPTH} levels - at `$.raw`")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_RAW_DEPTH:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest
