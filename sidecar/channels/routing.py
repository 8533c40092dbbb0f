"""Session routing: which session an IM message belongs to (the real server's ImSession).

Owns: the scope key of a message (by the channel's scope rule) and ``SessionRouter.route``,
which finds the session linked to that key or creates one (``channelId`` = the channel,
``channelMeta`` = platform, chat, chat type, scope and scope key, plus the thread or sender
the scope names), titled "<platform> - <chatType> - <name>" as the real server titles its
IM conversations. ``route(fresh=True)`` (``/new``) always creates a new session and moves
the link to it; the old session stays as it is.

Must stay true: one scope key is linked to one session at a time, also when messages of a
new chat arrive together (a lock per key); a link whose session was deleted counts as no
link.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.channels import ChannelConfig, ChannelMessageParams
from protocol.sessions import CreateSessionOptions
from sidecar.pipeline.locks import KeyedLocks
from sidecar.store.async_store import AsyncStore

__all__ = ["scope_key", "SessionRouter"]


def scope_key(config: ChannelConfig, params: ChannelMessageParams) -> str:
    """Unambiguous text naming the scope of a message (JSON of its parts)."""
    if config.scope == "chat_sender":
        parts = ["chat_sender", params.chat_id, params.sender.id]
    elif config.scope == "thread" and params.thread_id:
        parts = ["thread", params.chat_id, params.thread_id]
    else:
        parts = ["chat", params.chat_id]
    return msgspec.json.encode(parts).decode()


def _title(config: ChannelConfig, params: ChannelMessageParams) -> str:
    if params.chat_type == "private":
        name = params.sender.name or params.chat_name or params.sender.id
    else:
        name = params.chat_name or params.chat_id
        if config.scope == "chat_sender":
            name = f"{name} / {params.sender.name or params.sender.id}"
    if config.scope == "thread" and params.thread_id:
        name = f"{name} (thread)"
    return f"{config.platform} - {params.chat_type} - {name}"[:200]


def _meta(config: ChannelConfig, params: ChannelMessageParams, key: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "platform": config.platform,
        "chatId": params.chat_id,
        "chatType": params.chat_type,
        "scope": config.scope,
        "scopeKey": key,
    }
    if params.chat_name:
        meta["chatName"] = params.chat_name
    if config.scope == "chat_sender" or params.chat_type == "private":
        meta["senderId"] = params.sender.id
    if config.scope == "thread" and params.thread_id:
        meta["threadId"] = params.thread_id
    return meta


class SessionRouter:
    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._locks = KeyedLocks()

    async def route(self, config: ChannelConfig, params: ChannelMessageParams, *, fresh: bool = False) -> str:
        key = scope_key(config, params)
        async with self._locks.hold(f"{config.id}\n{key}"):
            if not fresh:
                linked = await self._store.run(lambda s: s.channels.linked_session(config.id, key))
                if linked is not None:
                    return linked
            opts = CreateSessionOptions(
                title=_title(config, params),
                provider_id=config.provider_id,
                model_id=config.model_id,
                system_prompt=config.system_prompt,
                channel_id=config.id,
                channel_meta=_meta(config, params, key),
            )
            session = await self._store.run(lambda s: s.sessions.create(opts))
            await self._store.run(lambda s: s.channels.link(config.id, key, session.id, params.chat_id))
            return session.id
