"""Session routing: which session an IM message belongs to (the real server's ImSession).

Owns: the scope key of a message (by the channel's scope rule) and ``SessionRouter.route``,
which finds the session linked to that key or creates one (``channelId`` = the channel,
``channelMeta`` = platform, chat, chat type, scope and scope key, plus the thread or sender
the scope names), titled "<platform> - <chatType> - <name>" as the real server titles its
IM conversations. ``route(fresh=True)`` (``/new``) always creates a new session and moves
the link to it; the old session stays as it is. A session is made for the channel's route
(routes.py: its mode, provider, assistant profile, working directory), and its meta records
the route's key (``route``); a linked session made for another route counts as no link, so
a chat whose channel changed its route starts a new session.

Must stay true: one scope key is linked to one session at a time, also when messages of a
new chat arrive together (a lock per key); a link whose session was deleted counts as no
link.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.channels import ChannelConfig, ChannelMessageParams
from protocol.sessions import CreateSessionOptions
from sidecar.channels.routes import plan_for, route_key
from sidecar.locks import KeyedLocks
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store

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
        "route": route_key(config.route),
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
            wanted = route_key(config.route)
            if not fresh:
                linked = await self._store.run(lambda s: _linked(s, config.id, key, wanted))
                if linked is not None:
                    return linked
            plan = plan_for(config)
            opts = CreateSessionOptions(
                title=_title(config, params),
                provider_id=plan.provider_id,
                model_id=plan.model_id,
                system_prompt=plan.system_prompt,
                mode=plan.mode,
                channel_id=config.id,
                channel_meta=_meta(config, params, key),
                workspace_dir=plan.workspace_dir,
            )

            def create(s: Store) -> str:
                session = s.sessions.create(opts)
                if plan.assistant_id is not None:
                    s.context.set_session_settings(session.id, assistant_id=plan.assistant_id, truncation_strategy=None)
                s.channels.link(config.id, key, session.id, params.chat_id)
                return session.id

            return await self._store.run(create)


def _linked(s: Store, channel_id: str, key: str, route: str) -> str | None:
    """The session linked to the scope, if it exists and was made for this route."""
    session_id = s.channels.linked_session(channel_id, key)
    if session_id is None:
        return None
    meta = s.sessions.get(session_id).channel_meta or {}
    return session_id if meta.get("route", "local") == route else None
