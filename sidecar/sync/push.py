"""SyncPush: the push half of a sync run (seed 004 section 7.1), local sessions -> the server.

Sessions created here (with messages, no open reply) get ``/create {agentId}`` then
``/update {id, topic, firstMessage}`` (only then do they show in ``/list``); the link is
recorded between the two calls, so a crash never creates a second conversation. Changed
titles go out with ``/update``. Messages: the real ``/create`` takes none, so every session
with messages only here is listed in ``notPushed``; with ``messagesOnCreate`` the active
branch is sent with ``/create`` and read back with ``/message/list``, and only the messages
the server returned are marked as synced. Local deletions of linked sessions are sent with
``/delete/{id}`` unless the conversation changed on the server since (then it is kept there
and reported). A link is marked synced only after the server answered.

Any AuthRequired stops the run at once; other failures are reported per session and the
run goes on. Reading a conversation's messages and carrying a server-side deletion over
are the pull's (sidecar.sync.adapter), given here as callables.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from protocol.sync import NotPushed, SyncConflict
from protocol.types import FINAL_MESSAGE_STATUSES, MessageV2
from sidecar.errors import SidecarError
from sidecar.store.ids import now_ms
from sidecar.store.sync_records import PushCandidate, SyncLink
from sidecar.sync.errors import AuthRequired, ConversationGone, ServerMalformed
from sidecar.sync.mapping import conversation_title, normalize_messages
from sidecar.sync.run import RunContext
from sidecar.sync.wire import ChatMessageDto, to_int, to_ms

__all__ = ["SyncPush", "NO_MESSAGE_IMPORT", "NO_APPEND"]

NO_MESSAGE_IMPORT = (
    "the server's /create takes no messages (there is no API to import them): they stay on this device"
)
NO_APPEND = "the server takes messages only when a conversation is created: these stay on this device"

FetchMessages = Callable[[RunContext, int, "int | None"], Awaitable[list[ChatMessageDto]]]
MarkServerDeleted = Callable[[RunContext, SyncLink], Awaitable[None]]


class SyncPush:
    def __init__(self, *, fetch: FetchMessages, server_deleted: MarkServerDeleted) -> None:
        self._fetch_messages = fetch
        self._mark_server_deleted = server_deleted

    async def push(self, ctx: RunContext) -> None:
        candidates = await ctx.db(lambda s: s.sync.push_candidates(ctx.account.account_key))
        ctx.done, ctx.total = 0, len(candidates)
        await ctx.report(f"{len(candidates)} sessions to push", force=True)
        missing_agent = 0
        for candidate in candidates:
            session_id = candidate.session.id if candidate.session else (
                candidate.link.session_id if candidate.link else None
            )
            conversation_id = candidate.link.conversation_id if candidate.link else None
            try:
                if candidate.session is None:
                    await self._push_deletion(ctx, candidate)
                elif candidate.link is None:
                    if ctx.account.agent_id is None:
                        missing_agent += 1
                    else:
                        await self._push_new(ctx, candidate)
                elif candidate.link.state == "creating":
                    await self._finish_create(ctx, candidate, candidate.link.conversation_id)
                else:
                    await self._push_changes(ctx, candidate)
            except AuthRequired:
                raise
            except SidecarError as exc:
                ctx.issue("delete" if candidate.session is None else "push", exc, session_id=session_id,
                          conversation_id=conversation_id)
            ctx.done += 1
            await ctx.report(f"{ctx.done} of {ctx.total} sessions")
        if missing_agent:
            ctx.note(
                "push", "no_agent",
                f"{missing_agent} sessions were not pushed: no server agent is configured (server:configure agentId)",
            )

    async def _push_deletion(self, ctx: RunContext, candidate: PushCandidate) -> None:
        link = candidate.link
        assert link is not None
        key = ctx.account.account_key
        cid = link.conversation_id
        try:
            dto = await ctx.client.get_conversation(cid)
        except ConversationGone:
            await ctx.db(lambda s: s.sync.set_link_state(key, cid, "deleted", now_ms()))
            return
        modified = to_ms(dto.modified)
        if link.state == "linked" and link.server_modified is not None and modified is not None \
                and modified > link.server_modified:
            ctx.conflict(SyncConflict(
                kind="deleted_locally", session_id=link.session_id, conversation_id=cid, winner="server",
                message=f"conversation {cid} was deleted here but changed on the server since: not deleted there",
            ))
            return
        await ctx.client.delete_conversation(cid)
        await ctx.db(lambda s: s.sync.set_link_state(key, cid, "deleted", now_ms()))
        ctx.result.deleted += 1

    async def _push_new(self, ctx: RunContext, candidate: PushCandidate) -> None:
        session = candidate.session
        assert session is not None and ctx.account.agent_id is not None
        if ctx.account.messages_on_create:
            path = await ctx.db(lambda s: s.sync.active_path(session.id))
            sent = _pushable(path)
            created = await ctx.client.create_conversation(
                ctx.account.agent_id, title=session.title, messages=[(role, text) for _, role, text in sent],
            )
        else:
            created = await ctx.client.create_conversation(ctx.account.agent_id)
        cid = to_int(created.id)
        if cid is None:
            raise ServerMalformed("/create answered without a conversation id")
        key, session_id, agent_id = ctx.account.account_key, session.id, ctx.account.agent_id
        modified = to_ms(created.modified)
        await ctx.db(lambda s: s.sync.record_creating(
            account_key=key, session_id=session_id, conversation_id=cid, agent_id=agent_id,
            server_modified=modified, server_topic=None, now=now_ms(),
        ))
        await self._finish_create(ctx, candidate, cid)

    async def _finish_create(self, ctx: RunContext, candidate: PushCandidate, cid: int) -> None:
        session = candidate.session
        assert session is not None
        updated = await ctx.client.update_conversation(
            cid, topic=session.title, first_message=candidate.first_user_text or session.title
        )
        if to_int(updated.id) != cid:
            raise ConversationGone(f"conversation {cid} is gone on the server: its topic could not be set")
        mapped: list[tuple[str, int, str | None, str]] = []
        if ctx.account.messages_on_create:
            path = await ctx.db(lambda s: s.sync.active_path(session.id))
            mapped = await self._confirm_messages(ctx, cid, _pushable(path))
        local_only = candidate.local_only - len(mapped)
        if local_only > 0:
            reason = NO_MESSAGE_IMPORT if not ctx.account.messages_on_create else (
                "the server stored only some of the messages sent with /create (read back with /message/list);"
                " the others stay on this device"
            )
            ctx.not_pushed(NotPushed(session_id=session.id, conversation_id=cid, messages=local_only, reason=reason))
        key = ctx.account.account_key
        topic = conversation_title(updated) if updated.topic is not None else None
        modified = to_ms(updated.modified)
        await ctx.db(lambda s: s.sync.mark_pushed(
            account_key=key, conversation_id=cid, session_updated_at=session.updated_at,
            local_title=session.title, server_topic=topic, server_modified=modified,
            reported_local=max(local_only, 0), mapped=mapped, now=now_ms(),
        ))
        ctx.result.pushed += 1
        ctx.result.messages_pushed += len(mapped)

    async def _confirm_messages(
        self, ctx: RunContext, cid: int, sent: list[tuple[str, str, str]]
    ) -> list[tuple[str, int, str | None, str]]:
        """Pair what was sent with what ``/message/list`` shows now (role and text, in order)."""
        stored = normalize_messages(await self._fetch_messages(ctx, cid, None), now_ms())
        mapped: list[tuple[str, int, str | None, str]] = []
        for (message_id, role, text), server in zip(sent, stored, strict=False):
            if server.role != role or server.text.strip() != text.strip():
                break
            mapped.append((message_id, server.index, server.server_id, server.digest))
        return mapped

    async def _push_changes(self, ctx: RunContext, candidate: PushCandidate) -> None:
        session, link = candidate.session, candidate.link
        assert session is not None and link is not None
        cid = link.conversation_id
        topic, modified = link.server_topic, None
        pushed = False
        if session.title != link.local_title:
            updated = await ctx.client.update_conversation(cid, topic=session.title)
            if to_int(updated.id) != cid:
                # /update answers an empty conversation for one that is not there any more
                await self._mark_server_deleted(ctx, msgspec.structs.replace(link, session_exists=True))
                return
            topic = conversation_title(updated) if updated.topic is not None else session.title
            modified = to_ms(updated.modified)
            pushed = True
        if candidate.local_only > link.reported_local:
            ctx.not_pushed(NotPushed(
                session_id=session.id, conversation_id=cid, messages=candidate.local_only,
                reason=NO_APPEND if ctx.account.messages_on_create else NO_MESSAGE_IMPORT,
            ))
        key = ctx.account.account_key
        await ctx.db(lambda s: s.sync.mark_pushed(
            account_key=key, conversation_id=cid, session_updated_at=session.updated_at,
            local_title=session.title, server_topic=topic, server_modified=modified,
            reported_local=candidate.local_only, now=now_ms(),
        ))
        if pushed:
            ctx.result.pushed += 1


def _pushable(path: list[MessageV2]) -> list[tuple[str, str, str]]:
    """(message id, role, text) of the user and assistant messages of a branch that a
    server conversation can hold (final, with text)."""
    out: list[tuple[str, str, str]] = []
    for m in path:
        if m.role not in ("user", "assistant") or m.status not in FINAL_MESSAGE_STATUSES:
            continue
        text = m.text_content or ""
        if text.strip():
            out.append((m.id, m.role, text))
    return out
