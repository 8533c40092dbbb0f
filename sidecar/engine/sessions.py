"""SessionService: the chat:session:* and chat:messages:* methods (seed 004 sections 5-6).

Owns: turning the method params (protocol Structs) into store calls and shaping the
results the server sends. The store does the validation and the work; this layer adds
what is not storage:
- ``on_delete``: async hooks run before a session is deleted or replaced by an import,
  with the session id and why (the chat engine registers one that cancels the session's
  running generation and waits for it, and ends its paused replies, so no job writes into
  a session that is going away). A hook may return a callable: it is called once the
  delete is over, done or failed (the chat engine refuses new replies until then). Before
  messages are deleted (``chat:messages:delete``) the same hooks run with ``below``: the
  message whose subtree holds everything the delete removes; the chat engine then stops
  only a reply inside that subtree (running or paused);
- ``on_deleted``: async hooks run once a delete (or a replacing import) is committed:
  StorageService.release, which removes the files the delete released and closes the
  agent sessions no reply uses any more. ``chat:session:import {replace: true}`` takes
  exactly the delete path: hooks, one transaction (delete + insert), release.
- ``publish``: the ``chat:session:updated`` notification for changes the renderer did not
  request itself (a generated title, new counters).
- ``chat:messages:tree`` is answered with pre-encoded JSON (msgspec.Raw): a long linear
  chat is a tree as deep as it is long, and msgspec's recursive encoder fails past ~450
  levels, so the tree is written iteratively here; the JSON is exactly what encoding the
  list[MessageTreeNode] would give.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from protocol.common import IdParams, SuccessResult
from protocol.limits import MAX_SEARCH_OFFSET, MAX_SEARCH_PAGE
from protocol.messages import (
    MessageQueryOptions,
    MessagesDeleteParams,
    MessagesDeleteResult,
    MessagesGetParams,
    MessagesPage,
    MessagesPageParams,
    MessagesSearchParams,
    MessagesSelectParams,
    MessagesTreeParams,
    MessagesUpdateParams,
    SearchOptions,
    SearchPage,
    SearchPageParams,
)
from protocol.sessions import (
    CreateSessionOptions,
    SessionExportParams,
    SessionFilter,
    SessionForkParams,
    SessionImportParams,
    SessionListResult,
    SessionPinParams,
    SessionUpdateParams,
    SessionUpdates,
)
from protocol.types import MessageTreeNode, MessageV2, SearchResult, SessionExport, SessionV2
from sidecar.engine import session_reads as reads
from sidecar.engine.session_reads import encode_tree
from sidecar.progress import work_progress
from protocol.errors import ErrorCode
from sidecar.errors import InvalidParams, NotFound, SidecarError, StoreError
from sidecar.store import AsyncStore
from sidecar.store.settings import DEFAULT_PROVIDER_KEY
from sidecar.store.store import Store
from sidecar.notify import Notifier
from protocol.notifications import SESSION_UPDATED

if TYPE_CHECKING:
    from sidecar.store.providers import ProviderRecord

__all__ = ["SessionService", "encode_tree", "check_new_session", "check_model_choice", "DeleteHook"]

log = logging.getLogger(__name__)


class DeleteHook(Protocol):
    """``(session_id, reason)`` before a session goes, ``(session_id, reason, below)``
    before the messages at and below ``below`` go -> what to call once the delete is over
    (or None)."""

    def __call__(
        self, session_id: str, reason: str, below: str | None = None
    ) -> Awaitable[Callable[[], None] | None]: ...


T = TypeVar("T")

DEFAULT_PAGE = 100
"""``chat:messages:page`` without ``options.limit``."""


class SessionService:
    """The methods the server binds as ``sessions.<name>``."""

    def __init__(self, store: AsyncStore, notify: Notifier) -> None:
        self.store = store
        self._notify = notify
        self.on_delete: list[DeleteHook] = []
        """Awaited in order with the session id and the reason before the session is deleted
        (or replaced by an import); the callables they return are called when the delete is over."""
        self.on_deleted: list[Callable[[], Awaitable[Any]]] = []
        """Awaited once a delete is committed (the release of its files)."""
        self.overlay_live: Callable[[MessageV2], MessageV2] | None = None
        """Set by the chat engine: replaces a message that is streaming right now with its
        in-flight content and seq (the database copy lags by one persistence interval)."""

    # ---- sessions -------------------------------------------------------------------

    async def create_session(self, params: CreateSessionOptions) -> SessionV2:
        """``chat:session:create``: a ``providerId`` must name a configured provider that
        fits the mode (see ``check_model_choice``); sessions made by sync, channels and the
        V1 endpoint's own providers go through the store and are not refused here. Mode
        ``remote`` is a channel's remote-agent route's own."""
        def create(s: Store) -> SessionV2:
            check_new_session(s, params, prefix="")
            return s.sessions.create(params)

        return await self.store.run(create)

    async def list_sessions(self, params: SessionFilter) -> SessionListResult:
        return await self.store.read(lambda s: reads.list_sessions(s, params))

    async def get_session(self, params: IdParams) -> SessionV2:
        return await self.store.read(lambda s: reads.get_session(s, params))

    async def update_session(self, params: SessionUpdateParams) -> SessionV2:
        """``chat:session:update``: a new ``providerId``/``modelId`` is checked as at create."""
        u = params.updates

        def update(s: Store) -> SessionV2:
            if isinstance(u, SessionUpdates) and (u.provider_id is not UNSET or u.model_id is not UNSET):
                session = s.sessions.get(params.id)
                provider = session.provider_id if u.provider_id is UNSET else u.provider_id
                model = None if u.model_id is UNSET else u.model_id
                named = u.provider_id if isinstance(u.provider_id, str) else None
                check_model_choice(s, session.mode, named, model, prefix="updates.", model_provider=provider)
            return s.sessions.update(params.id, u)

        return await self.store.run(update)

    async def delete_session(self, params: IdParams) -> SuccessResult:
        await self.store.run(lambda s: s.sessions.get(params.id))  # NotFound before any hook runs
        await self.delete_path(params.id, "the session was deleted", lambda s: s.sessions.delete(params.id))
        return SuccessResult(success=True)

    async def delete_path(
        self, session_id: str, reason: str, write: Callable[[Store], T], *, below: str | None = None
    ) -> T:
        """The delete path: stop what runs on the session (hooks; with ``below``: what runs
        on the messages at and below it), ``write`` (one transaction), then release what it
        freed."""
        after: list[Callable[[], None]] = []
        try:
            for hook in list(self.on_delete):
                done = await (hook(session_id, reason) if below is None else hook(session_id, reason, below))
                if done is not None:
                    after.append(done)
            result = await self.store.run(write)
        finally:
            for done in after:
                done()
        await self.released()
        return result

    async def released(self) -> None:
        """Run the ``on_deleted`` hooks (after any delete of sessions or messages)."""
        for hook in list(self.on_deleted):
            try:
                await hook()
            except SidecarError as exc:  # the delete is done; what is left is retried later
                log.warning("cleaning up after a delete failed: %s", exc.message)

    async def archive_session(self, params: IdParams) -> SuccessResult:
        await self.store.run(lambda s: s.sessions.archive(params.id))
        return SuccessResult(success=True)

    async def pin_session(self, params: SessionPinParams) -> SuccessResult:
        await self.store.run(lambda s: s.sessions.pin(params.id, params.pinned))
        return SuccessResult(success=True)

    async def fork_session(self, params: SessionForkParams) -> SessionV2:
        return await self.store.run(lambda s: s.sessions.fork(params.id, params.message_id))

    async def export_session(self, params: SessionExportParams) -> SessionExport:
        async with work_progress(self._notify, params.progress_token, "exporting messages") as progress:
            report = progress.from_thread if progress is not None else None
            return await self.store.run(lambda s: s.sessions.export(params.id, report))

    async def import_session(self, params: SessionImportParams) -> SessionV2:
        session = params.session

        async with work_progress(self._notify, params.progress_token, "importing messages") as progress:
            report = progress.from_thread if progress is not None else None

            def write(s: Store) -> SessionV2:
                return s.sessions.import_(
                    session, params.messages, params.replace, report, trust_workspace=params.trust_workspace
                )

            exists = isinstance(session, SessionV2) and await self.store.run(lambda s: s.sessions.exists(session.id))
            if params.replace and exists:
                return await self.delete_path(session.id, "the session was replaced by an import", write)
            return await self.store.run(write)

    # ---- messages -------------------------------------------------------------------

    async def get_messages(self, params: MessagesGetParams) -> list[MessageV2]:
        return await self._live(await self.store.read(lambda s: reads.get_messages(s, params)))

    async def get_tree(self, params: MessagesTreeParams) -> msgspec.Raw:
        return await self.store.read(lambda s: reads.get_tree(s, params))

    async def search_messages(self, params: MessagesSearchParams) -> list[SearchResult]:
        return await self.store.read(lambda s: reads.search_messages(s, params))

    async def select_branch(self, params: MessagesSelectParams) -> list[MessageV2]:
        return await self._live(
            await self.store.run(lambda s: s.messages.select_branch(params.session_id, params.leaf_id))
        )

    async def update_message(self, params: MessagesUpdateParams) -> MessageV2:
        """``chat:messages:update``: the user's correction of a finished reply's text. A
        rolling summary that covers the message is dropped with it (it summarized the old
        text; the next request that needs one writes it again)."""

        def edit(s: Store) -> MessageV2:
            with s.transaction():
                edited = s.messages.edit_text(params.session_id, params.message_id, params.content)
                covered = s.context.summary_ids(params.session_id)
                if covered is not None and params.message_id in covered:
                    s.context.delete_summary(params.session_id)
            return edited

        return await self.store.run(edit)

    async def delete_messages(self, params: MessagesDeleteParams) -> MessagesDeleteResult:
        """``chat:messages:delete``: one message (mode ``message``: its children move up to
        its parent; a root user message takes its replies with it, so no branch starts
        with a reply) or a message with its subtree (mode ``branch``).

        - The message must be in the session (NotFound); a server-mode session refuses
          (BAD_STATE: its Qiming conversation is linear and would not follow), and so does a
          delete of messages a pull brought from the server (the next pull would bring them
          back); local messages of a synced session can go.
        - A reply being generated or paused at or below the message is stopped first (the
          ``on_delete`` hooks with ``below``: its final event is ``aborted``, its pending
          approvals end); BUSY, with nothing deleted, when it does not stop in time.
        - One transaction: the rows, their search index, citations, tool runs, agent turns
          (cascades), counters, the active leaf (MessageRepo._move_active_leaf: when it was
          removed, the newest leaf of the nearest surviving sibling, else the parent), and
          the rolling summary when it covered a deleted message (it quoted what is gone;
          the next request that needs one writes it again).
        - Then the released files are removed and agent sessions no reply runs on any more
          are closed (``on_deleted``), and ``chat:session:updated`` carries the session.
          An ACP agent is not told otherwise: an agent session that still carries a
          surviving reply keeps the deleted turns in its own context."""
        session_id, message_id, mode = params.session_id, params.message_id, params.mode

        def check(s: Store) -> None:
            session = s.sessions.get(session_id)
            gone = s.messages.delete_ids(session_id, message_id, mode)  # NotFound unless it is in the session
            if s.sync.server_messages(gone):
                raise StoreError(
                    "messages that came from the Qiming server cannot be deleted here: the next pull"
                    " would bring them back (server:conversation:delete removes the conversation)",
                    code=ErrorCode.BAD_STATE, data={"sessionId": session_id, "messageId": message_id},
                )
            if session.mode == "server":
                raise StoreError(
                    "messages of a server session cannot be deleted here: its conversation on the"
                    " server is linear and would keep them",
                    code=ErrorCode.BAD_STATE, data={"sessionId": session_id, "mode": session.mode},
                )

        await self.store.run(check)

        def write(s: Store) -> MessagesDeleteResult:
            with s.transaction():  # (reads inside it see the state before it)
                gone = s.messages.delete(session_id, message_id, mode)
                covered = s.context.summary_ids(session_id)
                if covered is not None and not set(gone.ids).isdisjoint(covered):
                    s.context.delete_summary(session_id)
            return MessagesDeleteResult(success=True, deleted=len(gone.ids), active_leaf_id=gone.active_leaf_id)

        reason = "its branch was deleted" if mode == "branch" else "a message of its branch was deleted"
        result = await self.delete_path(session_id, reason, write, below=message_id)
        try:
            await self.publish(session_id)
        except NotFound:  # the session itself was deleted meanwhile: nothing to announce
            pass
        return result

    async def get_page(self, params: MessagesPageParams) -> MessagesPage:
        """``chat:messages:page``: one page of ``chat:messages:get`` (one more message is read
        to know whether another page follows)."""
        options = params.options or MessageQueryOptions()
        limit = options.limit if options.limit is not None else DEFAULT_PAGE
        before = params.cursor if params.cursor is not None else options.before
        query = msgspec.structs.replace(options, limit=min(limit + 1, 10_000), before=before)
        found = await self.store.read(lambda s: s.messages.query(params.session_id, query))
        more = len(found) > limit
        items = await self._live(found[1:] if more else found)
        return MessagesPage(items=items, has_more=more, next_cursor=items[0].id if more and items else None)

    async def search_page(self, params: SearchPageParams) -> SearchPage:
        """``chat:messages:searchPage``: one page of ``chat:messages:search``; the cursor is
        the offset of the next page."""
        options = params.options or SearchOptions()
        offset = options.offset
        if params.cursor is not None:
            if not params.cursor.isdigit() or int(params.cursor) > MAX_SEARCH_OFFSET:
                raise InvalidParams("invalid params: cursor is not one this method gave - at `$.cursor`")
            offset = int(params.cursor)
        limit = options.limit
        if offset + limit > MAX_SEARCH_OFFSET:  # the last page search can reach
            limit = max(1, MAX_SEARCH_OFFSET - offset)
        page = msgspec.structs.replace(options, offset=offset, limit=min(limit + 1, MAX_SEARCH_PAGE))
        probe = msgspec.structs.replace(options, offset=min(offset + limit, MAX_SEARCH_OFFSET), limit=1)

        def read(s: Store) -> tuple[list[SearchResult], bool]:
            found = s.search.messages(params.query, page)
            if len(found) > limit:
                return found[:limit], True
            if len(found) < limit or offset + limit >= MAX_SEARCH_OFFSET:
                return found, False
            return found, bool(s.search.messages(params.query, probe))  # a full page of 200

        items, more = await self.store.read(read)
        return SearchPage(items=items, has_more=more, next_cursor=str(offset + limit) if more else None)

    async def _live(self, messages: list[MessageV2]) -> list[MessageV2]:
        """In-flight rows with the live content of their reply. A row read in flight whose
        reply ended between the read and now (no live job: its final or paused row is
        stored) is read again, so a reply never reads back older than its last event."""
        overlay = self.overlay_live
        if overlay is None:
            return messages
        out = [overlay(m) if m.status in ("pending", "streaming") else m for m in messages]
        stale = [i for i, (m, o) in enumerate(zip(messages, out)) if o is m and m.status in ("pending", "streaming")]
        if stale:
            ids = [messages[i].id for i in stale]

            def read_again(s: Store) -> list[MessageV2 | None]:
                found: list[MessageV2 | None] = []
                for message_id in ids:
                    try:
                        found.append(s.messages.get(message_id))
                    except NotFound:  # deleted meanwhile: the first read stands
                        found.append(None)
                return found

            for i, m in zip(stale, await self.store.read(read_again)):
                if m is not None:
                    out[i] = overlay(m) if m.status in ("pending", "streaming") else m
        return out

    # ---- notifications --------------------------------------------------------------

    async def publish(self, session_id: str) -> SessionV2:
        """Send ``chat:session:updated`` with the session as stored now; returns it."""
        session = await self.store.read(lambda s: s.sessions.get(session_id))
        await self._notify(SESSION_UPDATED, session)
        return session


def check_new_session(s: Store, options: CreateSessionOptions, *, prefix: str) -> None:
    """What a user may ask of a new session (``chat:session:create``, a task's
    ``newSession``; InvalidParams at ``$.{prefix}...``): not mode ``remote`` (a channel's
    remote-agent route makes those), and the provider and model ``check_model_choice``
    allows."""
    if options.mode == "remote":
        raise InvalidParams(
            f"invalid params: {prefix}mode remote sessions are made by a channel's remote-agent route"
            f" - at `$.{prefix}mode`"
        )
    check_model_choice(s, options.mode, options.provider_id, options.model_id, prefix=prefix)


def check_model_choice(
    s: Store,
    mode: str,
    provider_id: str | None,
    model_id: str | None,
    *,
    prefix: str,
    model_provider: str | None | UnsetType = UNSET,
) -> None:
    """The provider and model a user names for a session, checked where they are chosen
    rather than at the first send (InvalidParams naming the field):
    - ``providerId`` (when given, not empty) must be a configured provider; an ACP session
      (mode ``acp``) needs an ``acp-engine`` one, a direct session any other type (a server
      session forwards its turns and uses none);
    - ``modelId`` (when given) of a direct session must be one its provider lists, when
      that provider lists any (provider:setDefault's rule); the provider is
      ``model_provider`` (the session's after the update) when given, else ``provider_id``,
      else the default one. A provider that no longer exists is not checked here: its
      sessions fail at the send, as a provider deleted later does.
    An empty or null value means the configured default and is not checked."""
    record: ProviderRecord | None = None
    if provider_id:
        try:
            record = s.providers.get(provider_id)
        except NotFound:
            raise InvalidParams(
                f"invalid params: {prefix}providerId {provider_id!r} is not a configured provider"
                f" (provider:list shows them) - at `$.{prefix}providerId`"
            ) from None
        engine = record.type == "acp-engine"
        if mode == "acp" and not engine:
            raise InvalidParams(
                f"invalid params: {prefix}providerId {record.name!r} is a {record.type} provider; an ACP"
                f" session needs an acp-engine provider - at `$.{prefix}providerId`"
            )
        if mode == "direct" and engine:
            raise InvalidParams(
                f"invalid params: {prefix}providerId {record.name!r} is an ACP agent engine; use it from a"
                f" session created with mode 'acp' - at `$.{prefix}providerId`"
            )
    if not model_id or mode != "direct":
        return
    owner = provider_id if model_provider is UNSET else model_provider
    if not owner:
        owner = s.settings.get(DEFAULT_PROVIDER_KEY)
    if not owner:
        return
    if record is None or record.id != owner:
        try:
            record = s.providers.get(owner)
        except NotFound:
            return
    if record.models and record.model(model_id) is None:
        listed = ", ".join(m.id for m in record.models[:20]) + (", ..." if len(record.models) > 20 else "")
        raise InvalidParams(
            f"invalid params: {prefix}modelId {model_id!r} is not a model of provider {record.name!r}"
            f" (its models: {listed}) - at `$.{prefix}modelId`"
        )
