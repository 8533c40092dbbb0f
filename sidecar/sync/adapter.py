"""ConversationSyncAdapter: pull and push between the local store and a Qiming server (seed 004 section 7.1).

Pull (``pull``):
1. Walk ``/list`` with ``lastId``. The server filters ``id < lastId`` but orders by
   ``modified``, so pages overlap (deduplicated by id) and can skip rows: a conversation
   behind a page's cursor in id but older in ``modified`` than that page's last row is in
   no page. The cursor is the last row of each page (as the server's own web UI pages),
   which skips the fewest; the walk ends on a short page. When it filled a page, a sweep
   follows: ``/list`` without ``lastId`` is the newest conversations by ``modified``, so
   doubling ``limit`` until a short page sees every row (``O(log n)`` requests, at most
   about four times the rows of one listing); after a complete pull the sweep stops at
   that pull's mark (the newest ``modified`` it had imported, held below any conversation
   that failed), which the first walk page usually reaches already.
2. For each listed conversation: new here -> fetch all its messages and import them; linked
   and ``modified`` newer than the link's -> fetch the messages newer than the newest
   imported (and from the oldest one that was unfinished) and merge them; tombstoned ->
   skipped (nothing deleted elsewhere comes back); deleted here but changed on the server
   since -> re-imported and reported; deleted here and unchanged -> left to push.
3. When the walk completed, every linked conversation it did not list is probed with
   ``POST /{id}``: "Conversation not found" is a deletion on the server (the local copy
   goes with it if it did not change here, else it is kept and reported); a conversation
   that still exists is treated as listed.
Messages are fetched with ``index`` paging until an empty page (the server drops SYSTEM rows
after its LIMIT, so a short page does not mean the end); for a conversation held already,
until the page that reaches the highest index held, unless the server's newest index is
below it (an index it sent once and no longer sends): then from the highest held index
the server can have sent, so one bad index never holds back later messages. WORKERS tasks
fetch while one importer stores what they fetched, a few conversations per transaction
(MAX_BATCH of them, MAX_BATCH_MESSAGES messages, MAX_BATCH_BYTES: the first of a batch
always goes), each one whole or not at all (a savepoint of its own, see
sidecar/store/sync.py), so an interrupted pull leaves whole conversations or nothing, and
pulling again changes nothing that did not change on the server.

Titles: the server's topic and the local title are compared with what both were at the
last sync; when both changed, the newer side (session ``updatedAt`` against conversation
``modified``) wins and the other value is reported as a metadata conflict. Pin, archive
and folder have no server field (ConversationDto carries none), so they stay local and
never conflict.

Bad server data: what the server sends is decoded with bounds (sidecar.sync.wire). A /list
row out of bounds is skipped and reported (``SyncResult.skipped``), and the walk goes on
past it; a conversation whose messages (or details) are out of bounds, or has a message
without a usable index (the server's key: such a message could be neither placed nor
fetched again), or whose messages come to more than sidecar.sync.bounded's budget, is
skipped whole and reported the same way (it is never imported in part), and stays below
the pull's mark so a later pull tries it again. Nothing of them reaches the store. The
listing keeps one slim row per conversation and stops (incomplete: nothing is probed or
deleted) past its own budget; what waits for the importer is bounded in bytes too.

Push (``push``) is sidecar.sync.push's. Any AuthRequired stops the run at once (no further
request); other failures are reported per conversation or session and the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream

from protocol.sync import SyncConflict
from protocol.types import SessionMode, SessionV2
from sidecar.errors import SidecarError
from sidecar.store import Store
from sidecar.store.ids import new_id, now_ms
from sidecar.store.sync_records import (
    ConversationUpdate,
    NewConversation,
    PulledMessage,
    SyncLink,
    UpdateOutcome,
)
from sidecar.sync.bounded import ByteGate, Listing, fetch_messages, held_bytes
from sidecar.sync.errors import AuthRequired, BadServerData, ConversationGone, QimingError, ServerMalformed
from sidecar.sync.mapping import ServerMessage, conversation_title, normalize_messages, to_message
from sidecar.sync.push import NO_MESSAGE_IMPORT, SyncPush
from sidecar.sync.run import RunContext
from sidecar.sync.wire import ConversationDto, ConversationPage, ConversationRow, to_int, to_ms

__all__ = ["ConversationSyncAdapter", "WORKERS", "MAX_LIST_PAGES", "NO_MESSAGE_IMPORT"]

log = logging.getLogger(__name__)

WORKERS = 4
"""Conversations fetched at the same time."""
IMPORT_QUEUE = 8
"""Fetched conversations waiting to be stored (the fetchers wait beyond that)."""
MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""What waits for the importer, as held (sidecar.sync.bounded.held_bytes); one conversation
larger than this still goes when nothing else waits."""
MAX_BATCH = 8
MAX_BATCH_MESSAGES = 1000
MAX_BATCH_BYTES = 16 * 1024 * 1024
"""One import transaction holds at most this many conversations / messages / bytes of
messages (one conversation past them goes alone), so the store's writer is never held for
long (chat writes wait at most one batch)."""
MAX_LIST_PAGES = 100_000
MAX_SWEEP_LIMIT = 1_000_000

_T = TypeVar("_T")


class DeletePath(Protocol):
    """The sessions' delete path (SessionService.delete_path): what runs on the session is
    stopped, ``write`` runs as one transaction, then the files it released are removed."""

    async def __call__(self, session_id: str, reason: str, write: Callable[[Store], _T]) -> _T: ...


SERVER_DELETED = "the conversation was deleted on the server"


class _Job(msgspec.Struct, kw_only=True):
    kind: str
    """``new`` | ``update`` | ``reimport`` | ``probe``."""
    conversation_id: int
    dto: ConversationRow | None = None
    link: SyncLink | None = None


class _Ready(msgspec.Struct, kw_only=True):
    """A fetched conversation waiting for the importer."""

    job: _Job
    item: NewConversation | ConversationUpdate
    title_conflict: SyncConflict | None = None
    size: int = 0
    """What its messages hold (held_bytes), set when it is queued."""


class ConversationSyncAdapter:
    def __init__(self, *, delete_path: DeletePath) -> None:
        self.delete_path = delete_path

    # ==== pull ==========================================================================

    async def pull(self, ctx: RunContext, agent_id: int | None) -> None:
        key = ctx.account.account_key
        scope = "*" if agent_id is None else f"agent:{agent_id}"
        watermark = await ctx.db(lambda s: s.sync.watermark(scope))
        listed, complete = await self._list(ctx, agent_id, watermark)
        links = await ctx.db(lambda s: s.sync.links(key))
        jobs: list[_Job] = []
        for cid, dto in listed.items():
            job = self._plan(ctx, cid, dto, links.get(cid))
            if job is not None:
                jobs.append(job)
        if complete:
            for cid, link in links.items():
                if cid in listed or link.state != "linked":
                    continue
                if agent_id is not None and link.agent_id != agent_id:
                    continue
                jobs.append(_Job(kind="probe", conversation_id=cid, link=link))
        ctx.done, ctx.total = 0, len(jobs)
        await ctx.report(f"{len(listed)} conversations listed, {len(jobs)} to fetch", force=True)
        failed = await self._run_jobs(ctx, jobs)
        if complete and listed:
            # Everything modified up to here is in; a conversation that failed stays above the
            # mark, so the next sweep still reaches it even if the walk skips it again.
            mark = max((m for m in (to_ms(d.modified) for d in listed.values()) if m is not None), default=None)
            for cid in failed:
                modified = to_ms(listed[cid].modified) if cid in listed else None
                if modified is not None and mark is not None:
                    mark = min(mark, modified - 1)
            if mark is not None and (watermark is None or mark > watermark):
                await ctx.db(lambda s: s.sync.set_watermark(scope, mark))

    async def _list(
        self, ctx: RunContext, agent_id: int | None, watermark: int | None
    ) -> tuple[dict[int, ConversationRow], bool]:
        """The walk by ``lastId``, then (when it filled a page) the sweep that finds what it skipped."""
        listing = Listing()
        listed = listing.rows
        first_page, complete = await self._walk_list(ctx, agent_id, listing)
        if not complete or first_page is None or first_page.size < ctx.settings.list_page_size:
            return listed, complete  # failed, or one short page: that is everything
        oldest = _oldest(first_page)
        if watermark is not None and oldest is not None and oldest <= watermark:
            return listed, True  # the newest page reaches the mark: nothing newer was skipped
        return listed, await self._sweep(ctx, agent_id, watermark, listing)

    async def _sweep(self, ctx: RunContext, agent_id: int | None, watermark: int | None, listing: Listing) -> bool:
        """Rows the walk skipped: ``/list`` without ``lastId`` is the newest conversations by
        ``modified``, so doubling ``limit`` until a short page (or one reaching the last
        complete pull's mark) sees every conversation (changed since the mark) at least once,
        in O(log n) requests and at most about four times the rows of one full listing."""
        limit = ctx.settings.list_page_size * 2
        while limit <= MAX_SWEEP_LIMIT:
            try:
                page = await ctx.client.list_conversations(agent_id=agent_id, limit=limit)
            except AuthRequired:
                raise
            except QimingError as exc:
                ctx.issue("list", exc)
                ctx.result.complete = False
                return False
            before = len(listing.rows)
            listing.take(ctx, page)
            if len(listing.rows) > before:
                log.info("the /list walk skipped %d conversations; the sweep found them", len(listing.rows) - before)
            await ctx.report(f"listing conversations: {len(listing.rows)}")
            if listing.stopped is not None:
                return _stop_listing(ctx, listing.stopped)
            oldest = _oldest(page)
            if page.size < limit or (watermark is not None and oldest is not None and oldest <= watermark):
                return True
            limit *= 2
        ctx.note("list", "malformed", f"more than {MAX_SWEEP_LIMIT} conversations: the listing may be incomplete")
        ctx.result.complete = False
        return False

    async def _walk_list(
        self, ctx: RunContext, agent_id: int | None, listing: Listing
    ) -> tuple[ConversationPage | None, bool]:
        size = ctx.settings.list_page_size
        first: ConversationPage | None = None
        last_id: int | None = None
        for number in range(MAX_LIST_PAGES):
            try:
                page = await ctx.client.list_conversations(agent_id=agent_id, last_id=last_id, limit=size)
            except AuthRequired:
                raise
            except QimingError as exc:
                ctx.issue("list", exc)
                ctx.result.complete = False
                return first, False
            if number == 0:
                first = page
            ids = listing.take(ctx, page)
            await ctx.report(f"listing conversations: {len(listing.rows)}")
            if listing.stopped is not None:
                return first, _stop_listing(ctx, listing.stopped)
            if page.size < size:
                return first, True
            # the server's web UI pages the same way: lastId = the page's last row
            cursor = page.last_id
            if cursor is None:
                cursor = min(ids) if ids else None
            if cursor is None or (last_id is not None and cursor >= last_id):
                ctx.note("list", "malformed", "the server's /list does not move past lastId; stopped listing")
                ctx.result.complete = False
                return first, False
            last_id = cursor
        return first, _stop_listing(ctx, f"more than {MAX_LIST_PAGES} pages of conversations; stopped listing")

    def _plan(self, ctx: RunContext, cid: int, dto: ConversationRow, link: SyncLink | None) -> _Job | None:
        if link is None:
            return _Job(kind="new", conversation_id=cid, dto=dto)
        if link.state != "linked":
            return None  # tombstoned or being created by a push
        modified = to_ms(dto.modified)
        newer = link.server_modified is None or (modified is not None and modified > link.server_modified)
        topic_moved = dto.topic is not None and conversation_title(dto) != link.server_topic
        if not link.session_exists:
            if newer:
                ctx.conflict(SyncConflict(
                    kind="deleted_locally", session_id=link.session_id, conversation_id=cid, winner="server",
                    message=f"conversation {cid} was deleted here but changed on the server since: restored",
                ))
                return _Job(kind="reimport", conversation_id=cid, dto=dto, link=link)
            return None
        if newer or topic_moved:
            return _Job(kind="update", conversation_id=cid, dto=dto, link=link)
        return None

    async def _run_jobs(self, ctx: RunContext, jobs: list[_Job]) -> set[int]:
        """WORKERS tasks fetch; one importer stores what they fetched, a few conversations per
        transaction (each in its own savepoint), while they fetch the next ones. Returns the
        conversations that failed."""
        failed: set[int] = set()
        if not jobs:
            return failed
        expired: list[AuthRequired] = []
        job_send, job_receive = anyio.create_memory_object_stream[_Job](0)
        ready_send, ready_receive = anyio.create_memory_object_stream[_Ready](IMPORT_QUEUE)
        gate = ByteGate(MAX_QUEUED_BYTES)

        def finished(job: _Job, ok: bool) -> None:
            ctx.done += 1
            if not ok:
                failed.add(job.conversation_id)

        async def fetcher(
            jobs_in: anyio.abc.ObjectReceiveStream[_Job], ready_out: anyio.abc.ObjectSendStream[_Ready],
            scope: anyio.CancelScope,
        ) -> None:
            async with jobs_in, ready_out:
                async for job in jobs_in:
                    try:
                        ready = await self._prepare(ctx, job)
                    except AuthRequired as exc:
                        expired.append(exc)
                        scope.cancel()
                        return
                    if isinstance(ready, _Ready):
                        ready.size = held_bytes(ready.item.messages)
                        await gate.enter(ready.size)
                        await ready_out.send(ready)
                    else:
                        finished(job, ready)
                        await ctx.report(f"{ctx.done} of {ctx.total} conversations")

        async def importer(ready_in: MemoryObjectReceiveStream[_Ready]) -> None:
            async with ready_in:
                carry: _Ready | None = None
                while True:
                    if carry is None:
                        try:
                            carry = await ready_in.receive()
                        except anyio.EndOfStream:
                            return
                    batch, carry = [carry], None
                    count, size = len(batch[0].item.messages), batch[0].size
                    while len(batch) < MAX_BATCH:
                        try:
                            more = ready_in.receive_nowait()
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                        count, size = count + len(more.item.messages), size + more.size
                        if count > MAX_BATCH_MESSAGES or size > MAX_BATCH_BYTES:
                            carry = more  # the next batch's first
                            break
                        batch.append(more)
                    items = [r.item for r in batch]
                    results = await ctx.db(lambda s: s.sync.import_batch(items))
                    gate.leave(sum(r.size for r in batch))
                    log.debug("stored a batch of %d conversations, %d messages, %d bytes", len(batch),
                              sum(len(r.item.messages) for r in batch), sum(r.size for r in batch))
                    for ready, result in zip(batch, results, strict=True):
                        finished(ready.job, self._stored(ctx, ready, result))
                    await ctx.report(f"{ctx.done} of {ctx.total} conversations")

        async with anyio.create_task_group() as tg:
            tg.start_soon(importer, ready_receive)
            async with ready_send:
                for _ in range(min(WORKERS, len(jobs))):
                    tg.start_soon(fetcher, job_receive.clone(), ready_send.clone(), tg.cancel_scope)
            job_receive.close()
            async with job_send:
                for job in jobs:
                    await job_send.send(job)
        if expired:
            raise expired[0]
        return failed

    async def import_conversation(
        self, ctx: RunContext, dto: ConversationDto, link: SyncLink | None, *, mode: SessionMode
    ) -> SessionV2:
        """One conversation imported now, whole, exactly as a pull stores it (its session in
        ``mode``); ``link``: its link when its session was deleted here (the same id again)."""
        cid = to_int(dto.id)
        if cid is None:
            raise ServerMalformed("the conversation has no id")
        ready = await self._prepare_new(ctx, _Job(kind="new" if link is None else "reimport",
                                                  conversation_id=cid, dto=dto, link=link))
        assert isinstance(ready.item, NewConversation)
        item = msgspec.structs.replace(ready.item, session=msgspec.structs.replace(ready.item.session, mode=mode))
        (result,) = await ctx.db(lambda s: s.sync.import_batch([item]))
        if isinstance(result, SidecarError):
            raise result
        assert isinstance(result, SessionV2)
        return result

    async def _prepare(self, ctx: RunContext, job: _Job) -> _Ready | bool:
        """The network part of a job: what to store, or True/False when there is nothing to
        store (done / failed, reported)."""
        cid = job.conversation_id
        try:
            if job.kind == "probe":
                return await self._probe(ctx, job)
            if job.kind == "update":
                return await self._prepare_update(ctx, job)
            return await self._prepare_new(ctx, job)
        except AuthRequired:
            raise
        except BadServerData as exc:
            ctx.skip(cid, exc, session_id=job.link.session_id if job.link else None)
        except ConversationGone as exc:
            ctx.issue("pull", ConversationGone(
                f"conversation {cid} vanished between the list and its messages ({exc.message})",
                server_code=exc.server_code,
            ), conversation_id=cid, session_id=job.link.session_id if job.link else None)
        except SidecarError as exc:
            ctx.issue("pull", exc, conversation_id=cid, session_id=job.link.session_id if job.link else None)
        return False

    def _stored(self, ctx: RunContext, ready: _Ready, result: SessionV2 | UpdateOutcome | SidecarError) -> bool:
        """Account for one stored conversation (or the store's refusal of it)."""
        job = ready.job
        if isinstance(result, SidecarError):
            ctx.issue("pull", result, conversation_id=job.conversation_id,
                      session_id=job.link.session_id if job.link else None)
            return False
        if isinstance(result, SessionV2):
            ctx.result.pulled += 1
            ctx.result.messages_pulled += len(ready.item.messages)
            return True
        if result.state != "updated":
            return True  # deleted here meanwhile: the next run decides
        if ready.title_conflict is not None:
            ctx.conflict(ready.title_conflict)
        if result.added or result.changed or result.kept_edits or result.title_applied:
            ctx.result.pulled += 1
        ctx.result.messages_pulled += result.added + result.kept_edits
        if result.kept_edits:
            ctx.conflict(SyncConflict(
                kind="branches", session_id=result.session.id if result.session else None,
                conversation_id=job.conversation_id, winner="both",
                message=f"{result.kept_edits} repl{'ies' if result.kept_edits != 1 else 'y'} edited on this device"
                        " changed on the server; the server's text was added as a branch beside the edit",
            ))
        if result.branched:
            ctx.conflict(SyncConflict(
                kind="branches", session_id=result.session.id if result.session else None,
                conversation_id=job.conversation_id, winner="both",
                message=f"{result.added} new server messages were added as a branch beside this device's messages",
            ))
        return True

    async def _prepare_new(self, ctx: RunContext, job: _Job) -> _Ready:
        assert job.dto is not None
        dto = job.dto
        cid = job.conversation_id
        now = now_ms()
        messages = normalize_messages(await fetch_messages(ctx, cid, None), to_ms(dto.created) or now)
        created = to_ms(dto.created) or (messages[0].created_at if messages else now)
        modified = to_ms(dto.modified)
        session = SessionV2(
            id=job.link.session_id if job.link is not None else new_id(),
            title=conversation_title(dto),
            summary=dto.summary or None,
            provider_id="",
            model_id="",
            created_at=created,
            updated_at=min(modified or now, now),
        )
        return _Ready(job=job, item=NewConversation(
            account_key=ctx.account.account_key, conversation_id=cid, agent_id=to_int(dto.agent_id),
            session=session, messages=[_pulled(m) for m in messages], server_modified=modified,
            server_topic=conversation_title(dto) if dto.topic is not None else None,
            sandbox_session_id=dto.sandbox_session_id, now=now,
        ))

    async def _prepare_update(self, ctx: RunContext, job: _Job) -> _Ready | bool:
        assert job.dto is not None and job.link is not None
        dto, link = job.dto, job.link
        cid = job.conversation_id
        state = await ctx.db(lambda s: s.sync.session_state(link.session_id))
        if state is None:
            return True  # deleted here meanwhile: the next run decides
        session, _ = state
        modified = to_ms(dto.modified)
        newer = link.server_modified is None or (modified is not None and modified > link.server_modified)
        messages: list[ServerMessage] = []
        if newer:
            stop_at = link.pulled_index
            if link.open_index is not None:
                stop_at = link.open_index - 1 if stop_at is None else min(stop_at, link.open_index - 1)
            fetched = await fetch_messages(ctx, cid, stop_at)
            newest = max((to_int(m.index) or 0 for m in fetched), default=None)
            if stop_at is not None and newest is not None and newest < stop_at:
                # The mark is past the server's newest message: it came from an index the
                # server no longer sends. Go on from the newest index held that it can have
                # sent, or messages after it would never be pulled.
                account_key, server_newest = ctx.account.account_key, newest
                stop_at = await ctx.db(lambda s: s.sync.held_index_at_most(account_key, cid, server_newest))
                fetched = await fetch_messages(ctx, cid, stop_at)
            messages = normalize_messages(fetched, session.last_message_at or session.created_at)
            if stop_at is not None:
                messages = [m for m in messages if m.index > stop_at]
        server_topic = conversation_title(dto) if dto.topic is not None else link.server_topic
        apply_title, conflict = _decide_title(cid, session, link, server_topic, modified)
        return _Ready(job=job, title_conflict=conflict, item=ConversationUpdate(
            account_key=ctx.account.account_key, conversation_id=cid, messages=[_pulled(m) for m in messages],
            server_modified=modified if modified is not None else link.server_modified,
            server_topic=server_topic, apply_title=apply_title, expected_title=session.title,
            sandbox_session_id=dto.sandbox_session_id, now=now_ms(),
        ))

    async def _probe(self, ctx: RunContext, job: _Job) -> _Ready | bool:
        assert job.link is not None
        link = job.link
        cid = job.conversation_id
        try:
            dto = await ctx.client.get_conversation(cid)
        except ConversationGone:
            await self._server_deleted(ctx, link)
            return True
        except (AuthRequired, BadServerData):
            raise
        except QimingError as exc:
            ctx.issue("probe", exc, conversation_id=cid, session_id=link.session_id)
            return False
        follow = self._plan(ctx, cid, dto, link)
        return True if follow is None else await self._prepare(ctx, follow)

    async def _server_deleted(self, ctx: RunContext, link: SyncLink) -> None:
        key = ctx.account.account_key

        def mark(s: Store) -> str:
            return s.sync.mark_server_deleted(key, link.conversation_id, now_ms())

        if link.session_exists and await ctx.db(lambda s: s.sync.deletable(key, link.conversation_id)):
            # It goes with the server's copy, on the path chat:session:delete takes (the
            # repository checks again inside the transaction that deletes it).
            outcome = await self.delete_path(link.session_id, SERVER_DELETED, mark)
        else:
            outcome = await ctx.db(mark)
        if outcome == "deleted_local":
            ctx.result.deleted += 1
        elif outcome == "kept":
            ctx.conflict(SyncConflict(
                kind="deleted_on_server", session_id=link.session_id, conversation_id=link.conversation_id,
                winner="local",
                message=(
                    f"conversation {link.conversation_id} was deleted on the server but changed here:"
                    " kept on this device (it is not pushed back)"
                ),
            ))

    # ==== push ==========================================================================

    async def push(self, ctx: RunContext) -> None:
        await SyncPush(fetch=fetch_messages, server_deleted=self._server_deleted).push(ctx)


def _decide_title(
    cid: int, session: SessionV2, link: SyncLink, server_topic: str | None, modified: int | None
) -> tuple[str | None, SyncConflict | None]:
    """The title to apply locally (the server's topic; None keeps the local one) and the
    conflict to report once it is stored, when both sides changed it."""
    if server_topic is None:
        return None, None
    server_changed = server_topic != link.server_topic
    local_changed = session.title != link.local_title
    if not server_changed or session.title == server_topic:
        return (server_topic if server_changed else None), None
    if not local_changed:
        return server_topic, None
    local_wins = modified is None or session.updated_at >= modified
    kept, lost = (session.title, server_topic) if local_wins else (server_topic, session.title)
    conflict = SyncConflict(
        kind="metadata", field="title", session_id=session.id, conversation_id=cid,
        winner="local" if local_wins else "server", local_value=session.title, server_value=server_topic,
        message=(
            f"the title changed on both sides; kept the {'local' if local_wins else 'server'} one"
            f" ({kept!r}), the other was {lost!r}"
        ),
    )
    return (None if local_wins else server_topic), conflict


def _oldest(page: ConversationPage) -> int | None:
    stamps = [m for m in (to_ms(d.modified) for d in page.rows) if m is not None]
    return min(stamps) if stamps else None


def _stop_listing(ctx: RunContext, why: str) -> bool:
    """The listing ends here, incomplete (so nothing is probed, nor the mark moved)."""
    ctx.note("list", "malformed", why)
    ctx.result.complete = False
    return False


def _pulled(m: ServerMessage) -> PulledMessage:
    # id, session and parent are set by the repository when it stores the message
    placeholder = to_message(m, message_id="", session_id="", parent_id=None)
    return PulledMessage(
        message=placeholder, server_index=m.index, server_id=m.server_id, digest=m.digest, finished=m.finished
    )
