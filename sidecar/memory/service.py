"""MemoryService: the ``memory:*`` methods, writing memories (dedup, flags, history),
embedding them, and what requests and tools get.

Owns:
- validation (a bad field is INVALID_PARAMS naming it, an unknown memory, proposal or
  assistant NOT_FOUND, an update of a superseded or deleted memory BAD_STATE);
- the write rule every writer follows (``memory:create``, the memory tools, the encoder,
  ``memory:accept``; ``write``): the text is stripped and must not be empty; its flags
  (text.py) are computed; an active memory of the same scope with the same normalized text
  makes the write a ``duplicate`` (nothing is written); an active memory of the same scope
  with the same ``key``, or the one named by ``supersedes``, is superseded (new version,
  history kept), except that what the user wrote (``manual``) is never replaced by key
  for a writer no one approved (``memory_save``, the encoder in ``auto`` mode:
  ``replace_manual=False``): that raises UserMemoryHeld and nothing is written, so an
  auto-approved save steered by injected text cannot overwrite the user's own memory
  (``memory_update``, which asks, can); for the memory tools and the encoder, a near
  duplicate (terms or vector similar above a threshold) is also a ``duplicate``;
  otherwise a new memory;
- the basic memory text (memory on, memory RAG off): the assistant's ``entries``, then the
  active memories of its scope and ``global``, most used and newest first, within
  ``budgetTokens``;
- retrieval for requests and tools (MemoryRetriever, retriever.py), which counts a use of
  every memory it hands out;
- embeddings: the stored vectors of every memory are kept by MemoryEmbeddings
  (embedding.py: in the background, after every write, at start, and when a search meets a
  (scope, model) not checked yet; charged to nobody); the embeddings made for a session's
  turn are charged to it as ``side:embedding`` (through the SideUsage given to ``start``):
  the query of its retrieval and of ``memory_search``, and the near-duplicate check of a
  memory its tools or its encoder write;
- the in-memory vector indexes follow every write (superseded, deleted and purged rows
  leave them; a restored row comes back).

Deleting an assistant deletes its memories (every version), its proposals and its Soul.md
versions in the transaction of the delete (AssistantService.delete_assistant); afterwards
``forget_assistant`` drops its scope's vector indexes. Global memories stay (README "Memory").

Lifetime: ``async with MemoryService(...)``: its task group runs the embedding jobs and
the encoder's jobs (encoder.py); leaving it cancels them (nothing half-written: each write
is one transaction).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import msgspec

from protocol.common import IdParams, SuccessResult
from protocol.context import AssistantProfile
from protocol.memory import (
    GLOBAL_SCOPE,
    AcceptAction,
    Memory,
    MemoryAcceptParams,
    MemoryAcceptResult,
    MemoryCreateParams,
    MemoryDetail,
    MemoryHit,
    MemoryKind,
    MemoryListParams,
    MemoryListResult,
    MemoryProposal,
    MemoryProposalListParams,
    MemorySearchParams,
    MemorySearchResult,
    MemorySourceKind,
    MemoryUpdateParams,
)
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar.memory import text as mtext
from sidecar.memory.embedding import MemoryEmbeddings, model_key, scopes_of
from sidecar.memory.retriever import MemoryRetriever, MemorySearch
from sidecar.retrieval.indexes import VectorIndexes
from sidecar.retrieval.retriever import EmbedderFor, charge_embedding
from sidecar.store.async_store import AsyncStore
from sidecar.store.memory_records import MemoryRecord, NewMemory, ProposalRecord
from sidecar.store.store import Store
from sidecar.notify import Notifier
from protocol.notifications import MEMORY_PROPOSED

if TYPE_CHECKING:
    from sidecar.memory.soul import SoulService
    from sidecar.providers.calls import UsageSink

__all__ = ["MemoryService", "Written", "MAX_RESULTS"]

log = logging.getLogger(__name__)

MAX_RESULTS = 6
BASIC_DEPTH = 200
SIMILAR_TERMS = 0.8
"""Jaccard similarity of terms from which a new memory counts as a near duplicate."""
SIMILAR_COSINE = 0.92
"""Cosine (the viewing assistant's embedding model) from which it counts as one."""
ELEMENT_OVERHEAD_TOKENS = 24
"""Tokens of a ``<memory ...>`` element around its text (attributes, tags), for the budget."""


class AssistantFor(Protocol):
    async def __call__(self, session_id: str | None) -> AssistantProfile: ...


class ReplyReader(Protocol):
    """The MemoryEncoder (encoder.py, which sits above this service)."""

    def schedule(self, session_id: str, job: Any) -> None: ...


class UserMemoryHeld(Exception):
    """A write no one approved would replace, by key, a memory the user wrote: not written."""

    def __init__(self, record: MemoryRecord) -> None:
        super().__init__(f"memory {record.id} (written by the user) has that key")
        self.record = record


class Written(msgspec.Struct, kw_only=True):
    record: MemoryRecord
    action: AcceptAction
    old: MemoryRecord | None = None


def _bad(field: str, why: str) -> InvalidParams:
    return InvalidParams(f"invalid params: {field} {why} - at `$.{field}`")


def _clean(value: str | None, field: str, *, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise _bad(field, "is required")
        return None
    if "\x00" in value:
        raise _bad(field, "must not contain NUL characters")
    stripped = value.strip()
    if required and not stripped:
        raise _bad(field, "must not be empty")
    return stripped or None


class MemoryService:
    def __init__(
        self,
        *,
        store: AsyncStore,
        notify: Notifier,
        embedder_for: EmbedderFor,
        assistant_for: AssistantFor,
    ) -> None:
        self._store = store
        self._notify = notify
        self._embedder_for = embedder_for
        self._assistant_for = assistant_for
        self.assistant_for = assistant_for
        """The profile in effect for a session (its own, else the default)."""
        self.indexes = VectorIndexes(store, source=lambda s: s.memory)
        self.retriever = MemoryRetriever(store, self.indexes, embedder_for)
        self._tg: anyio.abc.TaskGroup | None = None
        self.embeddings = MemoryEmbeddings(
            store, self.indexes, self.retriever, embedder_for, task_group=lambda: self._tg
        )
        self.encoder: ReplyReader | None = None
        """The MemoryEncoder (set by the app once providers exist)."""
        self.souls: SoulService | None = None
        """The SoulService the ``soul_update`` tool writes through (set by the app)."""

    # ---- lifetime -------------------------------------------------------------------

    async def __aenter__(self) -> MemoryService:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(*exc)
        finally:
            self._tg = None

    @property
    def task_group(self) -> anyio.abc.TaskGroup | None:
        return self._tg

    @property
    def store(self) -> AsyncStore:
        return self._store

    async def start(self, usage: UsageSink | None = None) -> None:
        """Embed what a previous run left without vectors. ``usage``: where the embeddings
        made for a session are charged (the engine's SideUsage)."""
        if usage is not None:
            self.retriever.usage = usage
        for assistant in await self._store.run(lambda s: s.assistants.list()):
            model = model_key(assistant)
            if assistant.memory.enabled and model is not None:
                for scope in scopes_of(assistant):
                    self.embeddings.schedule(scope, model)

    # ---- validation helpers -----------------------------------------------------------

    async def _check_scope(self, scope: str, field: str = "scope") -> str:
        if scope == GLOBAL_SCOPE:
            return scope
        if not await self._store.run(lambda s: s.assistants.exists(scope)):
            raise NotFound(f"assistant {scope!r} not found (a scope is 'global' or an assistant id) - at `$.{field}`",
                           data={"assistantId": scope})
        return scope

    async def assistant(self, assistant_id: str | None) -> AssistantProfile:
        """The assistant of that id (NOT_FOUND), or the default one."""
        if assistant_id is None:
            return await self._store.run(lambda s: s.assistants.default())
        return await self._store.run(lambda s: s.assistants.get(assistant_id))

    # ---- writing ----------------------------------------------------------------------

    def new_memory(
        self, *, scope: str, kind: MemoryKind, text: str, source_kind: MemorySourceKind, task: str | None = None,
        outcome: str | None = None, context: str | None = None, key: str | None = None,
        session_id: str | None = None, message_id: str | None = None, tool_call_id: str | None = None,
    ) -> NewMemory:
        from sidecar.tokens import count_text

        return NewMemory(
            scope=scope, kind=kind, text=text, task=task, outcome=outcome, context=context, key=key,
            norm_hash=mtext.norm_hash(text), source_kind=source_kind, session_id=session_id,
            message_id=message_id, tool_call_id=tool_call_id, flags=mtext.flags_of(text, task, outcome, context),
            tokens=count_text("\n".join(t for t in (text, task, outcome, context) if t)),
        )

    async def write(
        self,
        new: NewMemory,
        *,
        supersedes: str | None = None,
        similar_to: AssistantProfile | None = None,
        first: Callable[[Store], None] | None = None,
        replace_manual: bool = True,
    ) -> Written:
        """The write rule (module docstring): duplicate, supersede or create, in one store hop.
        ``similar_to``: also skip a near duplicate as that assistant would retrieve it (the
        memory tools and the encoder): an active memory of the scope whose terms are at least
        SIMILAR_TERMS alike, or whose vector is at least SIMILAR_COSINE close; a memory it
        supersedes (``supersedes``, ``key``) is not a duplicate but the version it replaces.
        ``first(store)`` runs in the same transaction before anything else (it may raise:
        then nothing is written)."""
        near = await self._near_duplicate(new, similar_to) if similar_to is not None else None

        def run(s: Store) -> Written:
            with s.transaction():
                if first is not None:
                    first(s)
                same = s.memory.same_text([new.scope], new.norm_hash)
                if same is not None:
                    return Written(record=same, action="duplicate")
                target: MemoryRecord | None = None
                if supersedes is not None:
                    try:
                        target = s.memory.get(supersedes)
                    except NotFound:
                        target = None
                    if target is not None and (target.scope != new.scope or not target.active):
                        target = None  # stale or foreign: a new memory instead
                if target is None and new.key:
                    target = s.memory.with_key(new.scope, new.key)
                    if target is not None and target.source_kind == "manual" and not replace_manual:
                        raise UserMemoryHeld(target)
                if target is not None:
                    record, old = s.memory.supersede(target.id, new)
                    return Written(record=record, action="superseded", old=old)
                if near is not None:
                    current = s.memory.by_rowids([near.rowid], active_only=True).get(near.rowid)
                    if current is not None:
                        return Written(record=current, action="duplicate")
                return Written(record=s.memory.create(new), action="created")

        written = await self._store.run(run)
        if written.action != "duplicate":
            await self.embeddings.changed(written.record.scope, removed=[written.old.rowid] if written.old else [])
        return written

    async def _near_duplicate(self, new: NewMemory, assistant: AssistantProfile) -> MemoryRecord | None:
        scope = new.scope
        hits = await self._store.run(lambda s: s.memory.lexical([scope], new.text, 10))
        if hits:
            records = await self._store.run(lambda s: s.memory.by_rowids([r for r, _ in hits], active_only=True))
            for rowid, _ in hits:
                record = records.get(rowid)
                if record is not None and mtext.similarity(record.text, new.text) >= SIMILAR_TERMS:
                    return record
        model = model_key(assistant)
        if model is None:
            return None
        try:
            embedder = await self._embedder_for(model)
            with anyio.fail_after(15):
                embedded = await embedder.embed([new.text])
        except (SidecarError, TimeoutError) as exc:
            log.info("near-duplicate check of a memory without vectors (embedding failed: %s)", exc)
            return None
        await charge_embedding(self.retriever.usage, new.session_id, model, embedded)
        vector = embedded.vectors[0]
        close = [(r, c) for r, c in await self.indexes.search([(scope, model)], vector, 3) if c >= SIMILAR_COSINE]
        if not close:
            return None
        records = await self._store.run(lambda s: s.memory.by_rowids([close[0][0]], active_only=True))
        return records.get(close[0][0])

    async def proposal_target(
        self, new: NewMemory, supersedes: str | None, assistant: AssistantProfile
    ) -> str | None:
        """What ``write(new, supersedes=..., similar_to=assistant)`` would do, for a proposal:
        ``"duplicate"``, the id of the memory it would supersede, or None (a new memory)."""
        near = await self._near_duplicate(new, assistant)

        def check(s: Store) -> str | None:
            if s.memory.same_text([new.scope], new.norm_hash) is not None:
                return "duplicate"
            if supersedes is not None:
                try:
                    target = s.memory.get(supersedes)
                except NotFound:
                    target = None
                if target is not None and target.scope == new.scope and target.active:
                    return target.id
            if new.key:
                keyed = s.memory.with_key(new.scope, new.key)
                if keyed is not None:
                    return keyed.id
            return "duplicate" if near is not None else None

        return await self._store.run(check)

    async def rewritten(self, scope: str, removed: Sequence[int] = ()) -> None:
        """Rows of ``scope`` were written or left the active set outside ``write`` (memory
        upkeep: merges, expiry, imports): retrieval caches, vector indexes and embeddings follow."""
        await self.embeddings.changed(scope, removed=removed)

    # ---- memory:* -----------------------------------------------------------------------

    async def list_memories(self, params: MemoryListParams) -> MemoryListResult:
        if params.scope is not None and params.assistant_id is not None:
            raise _bad("assistantId", "and scope exclude each other")
        scopes: list[str] | None = None
        if params.scope is not None:
            scopes = [await self._check_scope(params.scope)]
        elif params.assistant_id is not None:
            scopes = scopes_of(await self.assistant(params.assistant_id))
        query = _clean(params.query, "query") if params.query is not None else None
        if params.query is not None and query is None:
            raise _bad("query", "must not be empty")
        records, total = await self._store.run(lambda s: s.memory.list_page(
            scopes=scopes, kind=params.kind, query=query, status=params.status,
            limit=params.limit, offset=params.offset))
        return MemoryListResult(memories=[r.to_wire() for r in records], total=total)

    async def get_memory(self, params: IdParams) -> MemoryDetail:
        record = await self._store.run(lambda s: s.memory.get(params.id))
        versions = await self._store.run(lambda s: s.memory.versions(params.id))
        return MemoryDetail(memory=record.to_wire(), versions=[v.to_wire() for v in versions])

    async def create_memory(self, params: MemoryCreateParams) -> Memory:
        text = _clean(params.text, "text", required=True)
        assert text is not None
        scope = await self._check_scope(params.scope)
        new = self.new_memory(
            scope=scope, kind=params.kind, text=text, source_kind="manual",
            task=_clean(params.task, "task"), outcome=_clean(params.outcome, "outcome"),
            context=_clean(params.context, "context"), key=_clean(params.key, "key"),
        )
        return (await self.write(new)).record.to_wire()

    async def update_memory(self, params: MemoryUpdateParams) -> Memory:
        given = _clean(params.text, "text", required=params.text is not None)
        for field in ("task", "outcome", "context", "key"):
            _clean(getattr(params, field), field)
        old = await self._store.run(lambda s: s.memory.get(params.id))
        if not old.active:
            raise SidecarError(
                f"memory {params.id!r} is {old.status}: only an active memory can be updated",
                code=_bad_state(), data={"memoryId": params.id, "status": old.status},
            )
        text = given or old.text
        new = self.new_memory(
            scope=old.scope, kind=params.kind or old.kind, text=text, source_kind="manual",
            task=_clean(params.task, "task") if params.task is not None else old.task,
            outcome=_clean(params.outcome, "outcome") if params.outcome is not None else old.outcome,
            context=_clean(params.context, "context") if params.context is not None else old.context,
            key=_clean(params.key, "key") if params.key is not None else old.key,
        )
        return (await self.supersede(old.id, new)).to_wire()

    async def supersede(self, old_id: str, new: NewMemory) -> MemoryRecord:
        """A new version of ``old_id`` (BAD_STATE when it is no longer active); an update that
        changes nothing returns the memory as it is (no new version)."""
        current = await self._store.run(lambda s: s.memory.get(old_id))
        if current.active and (current.text, current.kind, current.task, current.outcome, current.context,
                               current.key) == (new.text, new.kind, new.task, new.outcome, new.context, new.key):
            return current
        record, old = await self._store.run(lambda s: s.memory.supersede(old_id, new))
        await self.embeddings.changed(record.scope, removed=[old.rowid])
        return record

    async def delete_memory(self, params: IdParams) -> Memory:
        return (await self.forget(params.id)).to_wire()

    async def forget(self, memory_id: str) -> MemoryRecord:
        """Soft delete: out of every request, index and tool."""
        record = await self._store.run(lambda s: s.memory.delete(memory_id))
        self.retriever.generation += 1
        await self.indexes.update(record.scope, None, [], [record.rowid])
        return record

    async def get_record(self, memory_id: str) -> MemoryRecord:
        return await self._store.run(lambda s: s.memory.get(memory_id))

    async def restore_memory(self, params: IdParams) -> Memory:
        record = await self._store.run(lambda s: s.memory.restore(params.id))
        self.retriever.generation += 1
        if record.active:
            rowid, models = record.rowid, list(record.models)

            def read(s: Store) -> dict[str, bytes]:
                found: dict[str, bytes] = {}
                for model in models:
                    vector = s.memory.vectors_of([rowid], model).get(rowid)
                    if vector is not None:
                        found[model] = vector[1]
                return found

            for model, blob in (await self._store.run(read)).items():
                await self.indexes.update(record.scope, model, [(rowid, blob)], [])
        return record.to_wire()

    async def purge_memory(self, params: IdParams) -> SuccessResult:
        gone = await self._store.run(lambda s: s.memory.purge(params.id))
        self.retriever.generation += 1
        by_scope: dict[str, list[int]] = {}
        for scope, rowid in gone:
            by_scope.setdefault(scope, []).append(rowid)
        for scope, rowids in by_scope.items():
            await self.indexes.update(scope, None, [], rowids)
        return SuccessResult()

    async def search_memories(self, params: MemorySearchParams) -> MemorySearchResult:
        query = _clean(params.query, "query", required=True)
        assert query is not None
        assistant = await self.assistant(params.assistant_id)
        result = await self.search(assistant, query, params.limit, count_use=False)
        return MemorySearchResult(
            mode=result.mode,
            notes=result.notes,
            hits=[
                MemoryHit(memory=h.record.to_wire(), score=round(h.score, 6), lexical_rank=h.lexical_rank,
                          vector_rank=h.vector_rank, cosine=round(h.cosine, 6) if h.cosine is not None else None)
                for h in result.hits
            ],
        )

    # ---- proposals ----------------------------------------------------------------------

    async def list_proposals(self, params: MemoryProposalListParams) -> list[MemoryProposal]:
        rows = await self._store.run(lambda s: s.memory.pending_proposals(params.session_id, params.limit))
        return [await self._proposal_wire(r) for r in rows]

    async def _proposal_wire(self, record: ProposalRecord) -> MemoryProposal:
        text = None
        if record.supersedes:
            try:
                text = (await self._store.run(lambda s: s.memory.get(record.supersedes or ""))).text
            except NotFound:
                text = None
        return record.to_wire(text)

    async def accept(self, params: MemoryAcceptParams) -> MemoryAcceptResult:
        given = _clean(params.text, "text", required=params.text is not None)
        for field in ("task", "outcome", "context"):
            _clean(getattr(params, field), field)
        proposal = await self._store.run(lambda s: s.memory.get_proposal(params.id))
        if proposal.status != "pending":
            raise SidecarError(f"memory proposal {params.id!r} was {proposal.status} already",
                               code=_bad_state(), data={"proposalId": params.id, "status": proposal.status})
        edited = any(v is not None for v in (params.text, params.kind, params.scope, params.task,
                                             params.outcome, params.context))
        text = given or proposal.text
        scope = await self._check_scope(params.scope) if params.scope is not None else proposal.scope
        new = self.new_memory(
            scope=scope, kind=params.kind or proposal.kind, text=text,
            source_kind="manual" if edited else "encoder",
            task=_clean(params.task, "task") if params.task is not None else proposal.task,
            outcome=_clean(params.outcome, "outcome") if params.outcome is not None else proposal.outcome,
            context=_clean(params.context, "context") if params.context is not None else proposal.context,
            key=proposal.key, session_id=proposal.session_id, message_id=proposal.message_id,
        )

        def decide(s: Store) -> None:
            if not s.memory.decide_proposal(params.id, "accepted"):
                raise SidecarError(f"memory proposal {params.id!r} was decided meanwhile", code=_bad_state())

        written = await self.write(new, supersedes=proposal.supersedes if scope == proposal.scope else None,
                                   first=decide)
        return MemoryAcceptResult(memory=written.record.to_wire(), action=written.action)

    async def reject(self, params: IdParams) -> SuccessResult:
        proposal = await self._store.run(lambda s: s.memory.get_proposal(params.id))
        if proposal.status != "pending" or not await self._store.run(
            lambda s: s.memory.decide_proposal(params.id, "rejected")
        ):
            raise SidecarError(f"memory proposal {params.id!r} was {proposal.status} already",
                               code=_bad_state(), data={"proposalId": params.id})
        return SuccessResult()

    async def propose(self, proposal: ProposalRecord) -> MemoryProposal:
        stored = await self._store.run(lambda s: s.memory.add_proposal(proposal))
        wire = await self._proposal_wire(stored)
        await self._notify(MEMORY_PROPOSED, wire)
        return wire

    # ---- for requests and tools -----------------------------------------------------------

    async def search(
        self, assistant: AssistantProfile, query: str, limit: int, *, count_use: bool = True,
        session_id: str | None = None,
    ) -> MemorySearch:
        """``session_id``: the session the search is made for (charged for its query
        embedding), None for none (``memory:search``)."""
        model = model_key(assistant)
        if model is not None:
            for scope in scopes_of(assistant):
                self.embeddings.check(scope, model)
        result, cached = await self.retriever.search(
            scopes_of(assistant), query, limit=limit, model=model, session_id=session_id
        )
        if count_use and not cached and result.hits:
            rowids = [h.record.rowid for h in result.hits]
            await self._store.run(lambda s: s.memory.mark_used(rowids))
        return result

    async def retrieve(self, *, query: str, assistant_id: str, limit: int, session_id: str) -> list[str]:
        """The rendered ``<memory>`` elements a request of ``session_id`` gets
        (MemoryRetrievalTransformer)."""
        assistant = await self._store.run(lambda s: s.assistants.resolve(assistant_id))
        result = await self.search(assistant, query, min(limit, MAX_RESULTS), session_id=session_id)
        return [render(h.record) for h in result.hits]

    def basic_text_blocking(self, store: Store, assistant: AssistantProfile) -> str | None:
        """The basic memory block (blocking, in a store thread): see the module docstring."""
        return basic_text(store, assistant)

    def reply_completed(self, session_id: str, job: Any) -> None:
        """A reply completed (ChatEngine hook): the encoder reads it in the background."""
        if self.encoder is not None:
            self.encoder.schedule(session_id, job)

    async def forget_assistant(self, assistant_id: str) -> None:
        """After an assistant was deleted: its scope's vectors leave the indexes."""
        self.indexes.drop(assistant_id)
        self.retriever.generation += 1


def render(record: MemoryRecord, *, with_id: bool = False) -> str:
    return mtext.render_memory(
        memory_id=record.id if with_id else None,
        text=record.text, scope=record.scope, kind=record.kind, source=record.source_kind,
        created_at=record.created_at, flags=record.flags, task=record.task, outcome=record.outcome,
        context=record.context,
    )


def basic_text(store: Store, assistant: AssistantProfile) -> str | None:
    """The basic memory block of ``assistant`` (memory on, RAG off), or None (blocking)."""
    memory = assistant.memory
    if not memory.enabled or memory.rag:
        return None
    budget = max(0, int(memory.budget_tokens))
    newest, used = store.memory.basic(scopes_of(assistant), BASIC_DEPTH)
    order: list[int] = []
    seen: set[int] = set()
    for i in range(max(len(newest), len(used))):  # most used and newest, alternating
        for lst in (used, newest):
            if i < len(lst) and lst[i] not in seen:
                seen.add(lst[i])
                order.append(lst[i])
    records = store.memory.by_rowids(order, active_only=True) if order else {}
    from sidecar.tokens import count_text

    spent = sum(count_text(e) + ELEMENT_OVERHEAD_TOKENS for e in memory.entries if e.strip())
    elements: list[str] = []
    for rowid in order:
        record = records.get(rowid)
        if record is None:
            continue
        cost = record.tokens + ELEMENT_OVERHEAD_TOKENS
        if spent + cost > budget:
            continue
        spent += cost
        elements.append(render(record))
    return mtext.render_block(elements, memory.entries)


def _bad_state() -> int:
    from protocol.errors import ErrorCode

    return int(ErrorCode.BAD_STATE)
