"""SyncService: the ``server:*`` and ``sync:*`` methods and the periodic sync.

Owns: one sync run at a time (a request that arrives while one runs waits for it, then
runs), the run's lifecycle (progress begin/end, the result stored as the last sync, a
``server:status:updated`` notification after every run), the switch to ``auth_required``
when the server refuses the token (the run stops, nothing is retried), the periodic run
(setting ``autoSync`` / ``intervalMinutes``, in the service's own task; it skips while
the account is not usable), the sync settings, the server conversation calls
(``server:conversation:update|delete|share``), and what server sessions need besides
their turns (sidecar/sync/forward.py): ``server:session:create``, ``chat:suggest``,
``server:chat:pageResult``.

Must stay true: a sync never blocks chat: it runs in the task of its request (or the
periodic task), its database work goes through the store gateway one call at a time, and
each write is a small batch of whole conversations; cancelling the request cancels the run
between two writes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import anyio
import anyio.abc
import msgspec

from protocol.common import EmptyParams, ProgressToken, SuccessResult
from protocol.sessions import CreateSessionOptions
from protocol.sync import (
    ChatSuggestParams,
    ConversationRef,
    ServerConfigureParams,
    ServerConversation,
    ServerConversationDeleteParams,
    ServerConversationShareParams,
    ServerConversationUpdateParams,
    ServerPageResultParams,
    ServerSessionCreateParams,
    ServerShare,
    ServerStatus,
    SyncParams,
    SyncPushParams,
    SyncResult,
    SyncSettings,
    SyncSettingsUpdate,
)
from protocol.types import SessionV2
from sidecar.errors import EngineError, InvalidParams, NotFound, SecretsLocked, SidecarError
from sidecar.store import AsyncStore
from sidecar.store.ids import now_ms
from sidecar.sync.account import ServerAccount
from sidecar.sync.adapter import SERVER_DELETED, ConversationSyncAdapter, DeletePath
from sidecar.sync.client import QimingClient
from sidecar.sync.errors import AuthRequired, ConversationGone, NotConfigured, QimingError, ServerMalformed
from sidecar.sync.mapping import MAX_TITLE_CHARS, conversation_title
from sidecar.sync.run import AccountConfig, RunContext
from sidecar.sync.wire import ConversationDto, to_int, to_ms
from sidecar.notify import Notifier
from protocol.notifications import SERVER_STATUS_UPDATED

__all__ = ["SyncService", "SETTINGS_KEY"]

log = logging.getLogger(__name__)

SETTINGS_KEY = "sync_settings"
MAX_SUGGESTIONS = 20
MAX_SUGGESTION_CHARS = 1000
MINUTE_S = 60.0
"""Seconds per ``intervalMinutes`` unit (a module constant so an in-process test can shorten it)."""
_settings_json = msgspec.json.Decoder(SyncSettings)
_encode = msgspec.json.Encoder().encode


class SyncService:
    """The methods the server binds as ``sync.<name>``."""

    def __init__(
        self,
        store: AsyncStore,
        notify: Notifier,
        *,
        delete_path: DeletePath,
        transport: Any = None,
    ) -> None:
        self.store = store
        self._notify = notify
        self._running = 0
        self.account = ServerAccount(store, notify, syncing=lambda: self._running > 0, transport=transport)
        self.adapter = ConversationSyncAdapter(delete_path=delete_path)
        self._run_lock = anyio.Lock()
        self._db_lock = anyio.Lock()
        self._settings = SyncSettings()
        self._settings_changed = anyio.Event()

    async def load(self) -> None:
        raw = await self.store.run(lambda s: s.settings.get(SETTINGS_KEY))
        if raw:
            try:
                self._settings = _settings_json.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("stored sync settings unreadable (%s); using the defaults", exc)

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        task_group.start_soon(self._periodic)

    async def aclose(self) -> None:
        await self.account.aclose()

    # ---- server:* ---------------------------------------------------------------------

    async def configure(self, params: ServerConfigureParams) -> ServerStatus:
        # after a running sync: it holds the client this replaces
        async with self._run_lock:
            status = await self.account.configure(params)
        self._wake()
        return status

    async def status(self, params: EmptyParams) -> ServerStatus:
        return await self.account.status()

    async def logout(self, params: EmptyParams) -> SuccessResult:
        async with self._run_lock:
            await self.account.logout()
        return SuccessResult(success=True)

    # ---- sync:* -----------------------------------------------------------------------

    async def pull(self, params: SyncParams) -> SyncResult:
        return await self._run(pull=True, push=False, agent_id=params.agent_id, token=params.progress_token)

    async def push(self, params: SyncPushParams) -> SyncResult:
        return await self._run(pull=False, push=True, agent_id=None, token=params.progress_token)

    async def run(self, params: SyncParams) -> SyncResult:
        return await self._run(pull=True, push=True, agent_id=params.agent_id, token=params.progress_token)

    async def get_settings(self, params: EmptyParams) -> SyncSettings:
        return self._settings

    async def update_settings(self, params: SyncSettingsUpdate) -> SyncSettings:
        changes = {f: v for f in params.__struct_fields__ if (v := getattr(params, f)) is not None}
        bounds = {"interval_minutes": (1, 1440), "list_page_size": (1, 1000), "message_page_size": (1, 1000)}
        for field, (lo, hi) in bounds.items():
            value = changes.get(field)
            if value is not None and not lo <= value <= hi:
                name = "".join(w.capitalize() if i else w for i, w in enumerate(field.split("_")))
                raise InvalidParams(f"{name} must be between {lo} and {hi}, got {value}")
        updated = msgspec.structs.replace(self._settings, **changes)
        encoded = _encode(updated).decode()
        await self.store.run(lambda s: s.settings.set(SETTINGS_KEY, encoded))
        self._settings = updated
        self._wake()
        return updated

    async def _run(self, *, pull: bool, push: bool, agent_id: int | None, token: ProgressToken | None) -> SyncResult:
        if agent_id is not None and agent_id <= 0:
            raise InvalidParams("agentId must be a positive server agent id")
        async with self._run_lock:
            client, account = await self.account.open()
            ctx = RunContext(
                client=client, account=account, settings=self._settings, notify=self._notify,
                progress_token=token, store=self.store, db_lock=self._db_lock,
            )
            what = "sync" if pull and push else ("pull" if pull else "push")
            self._running += 1
            await ctx.begin(f"{what} with {client.settings.service_url}")
            try:
                if pull:
                    await self.adapter.pull(ctx, agent_id)
                if push:
                    ctx.done, ctx.total = 0, None
                    await self.adapter.push(ctx)
            except AuthRequired as exc:
                ctx.issue("pull" if pull and not ctx.result.pushed else "push", exc)
                ctx.result.complete = False
                await self.account.auth_expired(exc)
            finally:
                self._running -= 1
                ctx.result.finished_at = now_ms()
                skipped = len(ctx.result.skipped)
                note = f" ({skipped} conversations skipped: the server sent them out of bounds)" if skipped else ""
                await ctx.end((f"{what} finished" if ctx.result.complete else f"{what} stopped early") + note)
            result = ctx.result
            await self.account.record_result(result)
        status = await self.account.status(probe=False)
        await self._notify(SERVER_STATUS_UPDATED, status)
        return result

    async def _periodic(self) -> None:
        while True:
            changed = self._settings_changed
            settings = self._settings
            if not settings.auto_sync:
                await changed.wait()
                continue
            with anyio.move_on_after(settings.interval_minutes * MINUTE_S):
                await changed.wait()
                continue
            try:
                result = await self._run(pull=True, push=True, agent_id=None, token=None)
                log.info("periodic sync: pulled %d, pushed %d, %d errors", result.pulled, result.pushed,
                         len(result.errors))
            except (NotConfigured, AuthRequired, SecretsLocked) as exc:
                log.info("periodic sync skipped: %s", exc.message)
            except SidecarError as exc:
                log.warning("periodic sync failed: %s", exc.message)
            except Exception:  # a bug: logged, and the next period tries again (never kills the process)
                log.exception("periodic sync failed")

    def _wake(self) -> None:
        changed, self._settings_changed = self._settings_changed, anyio.Event()
        changed.set()

    # ---- server:conversation:* ----------------------------------------------------------

    async def _target(self, ref: ConversationRef) -> tuple[QimingClient, AccountConfig, int, str | None]:
        if (ref.session_id is None) == (ref.conversation_id is None):
            raise InvalidParams("give exactly one of sessionId and conversationId")
        client, account = await self.account.open()
        if ref.session_id is not None:
            session_id = ref.session_id
            link = await self.store.run(lambda s: s.sync.link_of_session(account.account_key, session_id))
            if link is None or link.state not in ("linked", "creating"):
                raise NotFound(
                    f"session {ref.session_id!r} is not linked to a conversation of this server",
                    data={"sessionId": ref.session_id},
                )
            return client, account, link.conversation_id, link.session_id
        assert ref.conversation_id is not None
        if ref.conversation_id <= 0:
            raise InvalidParams("conversationId must be a positive server conversation id")
        cid = ref.conversation_id
        links = await self.store.run(lambda s: s.sync.links(account.account_key, [cid]))
        link = links.get(ref.conversation_id)
        return client, account, ref.conversation_id, link.session_id if link is not None else None

    async def _guard(self, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except AuthRequired as exc:
            await self.account.auth_expired(exc)
            raise

    async def update_conversation(self, params: ServerConversationUpdateParams) -> ServerConversation:
        topic = params.topic.strip() if params.topic is not None else None
        if (topic is None) == (params.first_message is None) or topic == "":
            raise InvalidParams("give exactly one of a non-empty topic and firstMessage")
        if topic is not None and len(topic) > MAX_TITLE_CHARS:
            raise InvalidParams(f"topic must be at most {MAX_TITLE_CHARS} characters")
        client, account, cid, session_id = await self._target(params)
        updated = await self._guard(client.update_conversation(cid, topic=topic, first_message=params.first_message))
        if to_int(updated.id) != cid:
            raise ConversationGone(f"conversation {cid} not found on the server")
        title = conversation_title(updated) if updated.topic is not None else None
        await self.store.run(lambda s: s.sync.note_server_topic(
            account.account_key, cid, topic=title, modified=to_ms(updated.modified), local_title=title, now=now_ms(),
        ))
        return _conversation(updated, session_id)

    async def delete_conversation(self, params: ServerConversationDeleteParams) -> SuccessResult:
        client, account, cid, session_id = await self._target(params)
        await self._guard(client.delete_conversation(cid))
        if session_id is not None:
            # The tombstone keeps the kept local copy from being pushed back, and a later
            # list from bringing the conversation back.
            state = "deleted" if params.delete_local else "server_deleted"
            await self.store.run(lambda s: s.sync.set_link_state(account.account_key, cid, state, now_ms()))
            if params.delete_local:
                await self.adapter.delete_path(session_id, SERVER_DELETED, lambda s: s.sync.delete_session(session_id))
        return SuccessResult(success=True)

    async def share_conversation(self, params: ServerConversationShareParams) -> ServerShare:
        if params.expire_seconds is not None and not 1 <= params.expire_seconds <= 10 * 365 * 86400:
            raise InvalidParams("expireSeconds must be between 1 and 315360000")
        client, _, cid, _ = await self._target(params)
        share = await self._guard(client.share_conversation(
            cid, share_type=params.type, expire_seconds=params.expire_seconds, content=params.content,
        ))
        if not share.share_key:
            raise ServerMalformed("/share returned no share key")
        return ServerShare(
            share_key=share.share_key, id=to_int(share.id), type=share.type,
            target_id=None if share.target_id is None else str(share.target_id),
            expire=to_ms(share.expire), created=to_ms(share.created),
        )


    # ---- server sessions ------------------------------------------------------------------

    async def create_server_session(self, params: ServerSessionCreateParams) -> SessionV2:
        client, account = await self.account.open()
        key = account.account_key
        if params.conversation_id is not None:
            cid = params.conversation_id
            async with self._run_lock:  # not while a pull may be importing it
                links = await self.store.run(lambda s: s.sync.links(key, [cid]))
                link = links.get(cid)
                if link is not None and link.state not in ("linked", "creating"):
                    raise EngineError(f"conversation {cid} was deleted (here or on the server)")
                if link is not None and link.session_exists:
                    session_id = link.session_id
                    return await self.store.run(lambda s: s.sync.set_server_mode(session_id))
                dto = await self._guard(client.get_conversation(cid))
                ctx = RunContext(
                    client=client, account=account, settings=self._settings, notify=self._notify,
                    progress_token=None, store=self.store, db_lock=self._db_lock,
                )
                try:
                    return await self.adapter.import_conversation(ctx, dto, link, mode="server")
                except AuthRequired as exc:
                    await self.account.auth_expired(exc)
                    raise
        agent_id = params.agent_id if params.agent_id is not None else account.agent_id
        if agent_id is None:
            raise InvalidParams("agentId is needed: the account has no server agent (server:configure agentId)")
        title = params.title.strip() if params.title is not None and params.title.strip() else None
        created = await self._guard(client.create_conversation(agent_id))
        cid_new = to_int(created.id)
        if cid_new is None:
            raise ServerMalformed("/create answered without a conversation id")
        modified = to_ms(created.modified)
        options = CreateSessionOptions(title=title, mode="server")
        session = await self.store.run(lambda s: s.sessions.create(options))
        await self.store.run(lambda s: s.sync.link_forwarded(
            account_key=key, session_id=session.id, conversation_id=cid_new, agent_id=agent_id,
            server_modified=modified, now=now_ms(),
        ))
        if title is not None:
            updated = await self._guard(client.update_conversation(cid_new, topic=title))
            if to_int(updated.id) == cid_new:
                topic, when = conversation_title(updated), to_ms(updated.modified)
                await self.store.run(lambda s: s.sync.note_server_topic(
                    key, cid_new, topic=topic, modified=when, local_title=None, now=now_ms(),
                ))
        return session

    async def suggest(self, params: ChatSuggestParams) -> list[str]:
        """``/chat/suggest`` of the session's conversation; ``[]`` when the server has none
        or the call fails (as the server itself answers), an error when the session is not
        linked to a conversation of this server."""
        session_id = params.session_id
        await self.store.run(lambda s: s.sessions.get(session_id))  # NotFound
        client, account = await self.account.open()
        link = await self.store.run(lambda s: s.sync.link_of_session(account.account_key, session_id))
        if link is None or link.state not in ("linked", "creating"):
            raise EngineError(
                f"session {session_id!r} is not linked to a conversation of this server", data={"sessionId": session_id}
            )
        try:
            found = await self._guard(client.suggest(link.conversation_id))
        except AuthRequired:
            raise
        except QimingError as exc:
            log.info("no suggestions for session %s: %s", session_id, exc.message)
            return []
        out = [" ".join(text.split())[:MAX_SUGGESTION_CHARS] for text in found if isinstance(text, str)]
        return [text for text in out if text][:MAX_SUGGESTIONS]

    async def page_result(self, params: ServerPageResultParams) -> SuccessResult:
        client, _ = await self.account.open()
        await self._guard(client.page_result(params.request_id, params.html))
        return SuccessResult(success=True)


def _conversation(dto: ConversationDto, session_id: str | None) -> ServerConversation:
    cid = to_int(dto.id)
    assert cid is not None
    return ServerConversation(
        id=cid, agent_id=to_int(dto.agent_id), topic=dto.topic, summary=dto.summary, type=dto.type,
        task_status=dto.task_status, topic_updated=dto.topic_updated,
        sandbox_server_id=None if dto.sandbox_server_id is None else str(dto.sandbox_server_id),
        sandbox_session_id=dto.sandbox_session_id, created=to_ms(dto.created), modified=to_ms(dto.modified),
        session_id=session_id,
    )
