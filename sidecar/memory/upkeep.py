"""MemoryUpkeep: ``memory:consolidate``, ``memory:consolidation:*``, ``memory:stats``,
``memory:export``, ``memory:import`` and ``memory:settings:*``.

Owns the upkeep settings (stored as JSON under SETTINGS_KEY), the expiry policy (what the
model wrote, unused for ``expireAfterDays`` and used at most ``expireMaxUses`` times, is
soft-deleted: at start in the background, and at every consolidation) and the choice of
scopes: one (``scope``), what one assistant sees (``assistantId``: its scope and ``global``)
or every scope that has memories. Consolidation itself is consolidate.py's; the Markdown
form is markdown.py's; every import goes through MemoryService's write rule.

Must stay true: nothing is lost (merges keep every version in the chain, expiry and
imports never purge); a bad field is INVALID_PARAMS naming it and writes nothing; an import
is all or nothing per item (an item that cannot be written is counted as skipped, with a
note, and the others still go in).
"""

from __future__ import annotations

import logging
import time

import msgspec

from protocol.common import EmptyParams, IdParams, SuccessResult
from protocol.memory import GLOBAL_SCOPE
from protocol.memory_upkeep import (
    ConsolidationMode,
    MemoryConsolidateParams,
    MemoryConsolidateResult,
    MemoryConsolidationAcceptParams,
    MemoryConsolidationListParams,
    MemoryExportFile,
    MemoryExportParams,
    MemoryExportResult,
    MemoryImportItem,
    MemoryImportParams,
    MemoryImportResult,
    MemoryMerge,
    MemoryScopeStats,
    MemoryStatsParams,
    MemoryStatsResult,
    MemoryUpkeepSettings,
    MemoryUpkeepSettingsUpdate,
)
from protocol.providers import DefaultModel
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar.memory.consolidate import Consolidator
from sidecar.memory.markdown import parse_scope, render_scope
from sidecar.memory.embedding import scopes_of
from sidecar.memory.service import MemoryService
from sidecar.providers.calls import ModelResolver
from sidecar.store.store import Store
from sidecar.notify import Notifier

__all__ = ["MemoryUpkeep", "SETTINGS_KEY", "DAY_MS"]

log = logging.getLogger(__name__)

SETTINGS_KEY = "memory.upkeep"
DAY_MS = 86_400_000
_settings = msgspec.json.Decoder(MemoryUpkeepSettings)


def _bad(field: str, why: str) -> InvalidParams:
    return InvalidParams(f"invalid params: {field} {why} - at `$.{field}`")


def _bad_state() -> int:
    from protocol.errors import ErrorCode

    return int(ErrorCode.BAD_STATE)


class MemoryUpkeep:
    def __init__(self, memory: MemoryService, providers: ModelResolver, notify: Notifier) -> None:
        self._memory = memory
        self._store = memory.store
        self.consolidator = Consolidator(memory, providers, notify)
        self.settings = MemoryUpkeepSettings()

    async def load(self) -> None:
        raw = await self._store.run(lambda s: s.settings.get(SETTINGS_KEY))
        if raw:
            try:
                self.settings = _settings.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("the stored memory upkeep settings are unreadable; using the defaults")

    def start(self) -> None:
        """The expiry policy once, in the background (MemoryService's task group)."""
        tg = self._memory.task_group
        if tg is not None and self.settings.expire_after_days is not None:
            tg.start_soon(self._expire_quietly)

    async def _expire_quietly(self) -> None:
        try:
            await self.expire(None)
        except SidecarError as exc:
            log.warning("expiring stale memories failed: %s", exc.message)

    # ---- settings ------------------------------------------------------------------------

    async def get_settings(self, params: EmptyParams) -> MemoryUpkeepSettings:
        return self.settings

    async def update_settings(self, params: MemoryUpkeepSettingsUpdate) -> MemoryUpkeepSettings:
        defaults = MemoryUpkeepSettings()
        changes = {
            name: (getattr(defaults, name) if value is None else value)
            for name in ("expire_after_days", "expire_max_uses", "consolidation_mode", "consolidation_model")
            if (value := getattr(params, name)) is not msgspec.UNSET
        }
        model = changes.get("consolidation_model")
        if isinstance(model, DefaultModel):
            provider_id = model.provider_id

            def check(s: Store) -> None:
                try:
                    s.providers.get(provider_id)
                except NotFound:
                    raise _bad("consolidationModel.providerId", f"names no provider ({provider_id!r})") from None

            await self._store.run(check)
        settings = msgspec.structs.replace(self.settings, **changes)
        encoded = msgspec.json.encode(settings).decode()
        await self._store.run(lambda s: s.settings.set(SETTINGS_KEY, encoded))
        self.settings = settings
        return settings

    # ---- scopes ------------------------------------------------------------------------------

    async def _scopes(self, scope: str | None, assistant_id: str | None, *, every: bool = True) -> list[str] | None:
        """The scopes asked for; None: every scope (when ``every``)."""
        if scope is not None and assistant_id is not None:
            raise _bad("assistantId", "and scope exclude each other")
        if scope is not None:
            if scope != GLOBAL_SCOPE and not await self._store.run(lambda s: s.assistants.exists(scope)):
                raise NotFound(f"assistant {scope!r} not found (a scope is 'global' or an assistant id) - at `$.scope`")
            return [scope]
        if assistant_id is not None:
            return scopes_of(await self._memory.assistant(assistant_id))
        return None if every else []

    # ---- expiry -------------------------------------------------------------------------------

    def _policy(self) -> tuple[int, int] | None:
        days = self.settings.expire_after_days
        if days is None:
            return None
        return int(time.time() * 1000) - days * DAY_MS, self.settings.expire_max_uses

    async def expire(self, scopes: list[str] | None) -> int:
        """Soft-delete what the policy expires now; how many."""
        policy = self._policy()
        if policy is None:
            return 0
        gone = await self._store.run(lambda s: s.memory_upkeep.expire(policy[0], policy[1], scopes))
        by_scope: dict[str, list[int]] = {}
        for record in gone:
            by_scope.setdefault(record.scope, []).append(record.rowid)
        for scope, rowids in by_scope.items():
            await self._memory.rewritten(scope, rowids)
        if gone:
            log.info("memory expiry: %d memories unused for %d days deleted (memory:restore brings one back)",
                     len(gone), self.settings.expire_after_days)
        return len(gone)

    # ---- consolidation ----------------------------------------------------------------------------

    async def consolidate(self, params: MemoryConsolidateParams) -> MemoryConsolidateResult:
        scopes = await self._scopes(params.scope, params.assistant_id)
        return await self.run(scopes, params.mode or self.settings.consolidation_mode)

    async def run(self, scopes: list[str] | None, mode: ConsolidationMode) -> MemoryConsolidateResult:
        expired = await self.expire(scopes)
        if scopes is None:
            scopes = sorted(await self._store.run(lambda s: s.memory.scopes()))
        result = MemoryConsolidateResult(mode=mode, scopes=scopes, examined=0, groups=0,
                                         expired=expired)
        for scope in scopes:
            done = await self.consolidator.run(scope, mode, await self._model_for(scope))
            result.examined += done.examined
            result.groups += done.groups
            result.applied += done.applied
            result.proposed += done.proposed
            result.notes += [f"{scope}: {n}" for n in done.notes]
        return result

    async def consolidate_scope(self, scope: str | None) -> str:
        """A ``memory-consolidate`` task's run: one line saying what it did."""
        result = await self.run([scope] if scope is not None else None, self.settings.consolidation_mode)
        return (f"{result.examined} memories in {len(result.scopes)} scopes: {len(result.applied)} merged, "
                f"{len(result.proposed)} proposed, {result.expired} expired")

    async def _model_for(self, scope: str) -> DefaultModel | None:
        if self.settings.consolidation_model is not None:
            return self.settings.consolidation_model
        assistant = await self._memory.assistant(None if scope == GLOBAL_SCOPE else scope)
        return assistant.memory.encoder_model

    async def list_consolidations(self, params: MemoryConsolidationListParams) -> list[MemoryMerge]:
        rows = await self._store.run(lambda s: s.memory_upkeep.pending_merges(params.scope, params.limit))
        return [await self.consolidator.wire(r) for r in rows]

    async def accept_consolidation(self, params: MemoryConsolidationAcceptParams) -> MemoryMerge:
        record = await self._store.run(lambda s: s.memory_upkeep.get_merge(params.id))
        if record.status != "pending":
            raise SidecarError(f"consolidation proposal {params.id!r} was {record.status} already",
                               code=_bad_state(), data={"proposalId": params.id, "status": record.status})
        if params.text is not None and "\x00" in params.text:
            raise _bad("text", "must not contain NUL characters")
        return await self.consolidator.apply(record, status="accepted", text=params.text)

    async def reject_consolidation(self, params: IdParams) -> SuccessResult:
        record = await self._store.run(lambda s: s.memory_upkeep.get_merge(params.id))
        if record.status != "pending" or not await self._store.run(
            lambda s: s.memory_upkeep.decide_merge(params.id, "rejected")
        ):
            raise SidecarError(f"consolidation proposal {params.id!r} was {record.status} already",
                               code=_bad_state(), data={"proposalId": params.id})
        return SuccessResult()

    # ---- statistics ----------------------------------------------------------------------------------

    async def stats(self, params: MemoryStatsParams) -> MemoryStatsResult:
        scopes = await self._scopes(params.scope, params.assistant_id)
        policy = self._policy()
        counts, (proposals, merges) = await self._store.run(
            lambda s: (s.memory_upkeep.counts(scopes, policy), s.memory_upkeep.pending_counts()))
        return MemoryStatsResult(
            scopes=[MemoryScopeStats(**msgspec.structs.asdict(c)) for c in counts],
            active=sum(c.active for c in counts), pending_proposals=proposals, pending_merges=merges,
        )

    # ---- export and import ------------------------------------------------------------------------------

    async def export(self, params: MemoryExportParams) -> MemoryExportResult:
        scopes = await self._scopes(params.scope, params.assistant_id)
        history = params.history and params.format == "json"
        rows = await self._store.run(lambda s: s.memory_upkeep.rows(scopes, history=history))
        now = int(time.time() * 1000)
        memories = [r.to_wire() for r in rows]
        if params.format == "json":
            return MemoryExportResult(format="json", exported_at=now, memories=memories)
        files = []
        for scope in scopes if scopes is not None else sorted({m.scope for m in memories}):
            own = [m for m in memories if m.scope == scope]
            files.append(MemoryExportFile(scope=scope, name=f"{scope}.md", content=render_scope(scope, own, now)))
        return MemoryExportResult(format="markdown", exported_at=now, files=files)

    async def import_memories(self, params: MemoryImportParams) -> MemoryImportResult:
        notes: list[str] = []
        if params.format == "markdown":
            if params.content is None:
                raise _bad("content", "is required for a markdown import")
            if params.scope is None:
                raise _bad("scope", "is required for a markdown import (one file is one scope)")
            if params.memories:
                raise _bad("memories", "is for a json import")
            items, notes = parse_scope(params.content)
        else:
            if params.content is not None:
                raise _bad("content", "is for a markdown import")
            items = list(params.memories)
        if params.scope is not None:
            await self._scopes(params.scope, None)
        result = MemoryImportResult(created=0, superseded=0, duplicates=0, skipped=0, notes=notes)
        for index, item in enumerate(items):
            await self._import_one(index, item, params.scope, result)
        return result

    async def _import_one(self, index: int, item: MemoryImportItem, scope: str | None,
                          result: MemoryImportResult) -> None:
        if item.status != "active":
            result.skipped += 1
            return
        target = scope or item.scope or GLOBAL_SCOPE
        try:
            if target != GLOBAL_SCOPE and not await self._store.run(lambda s: s.assistants.exists(target)):
                raise NotFound(f"no assistant {target!r}")
            text = item.text.strip()
            if not text or "\x00" in text:
                raise _bad("text", "must not be empty")
            new = self._memory.new_memory(
                scope=target, kind=item.kind, text=text, source_kind="manual", task=_clean(item.task),
                outcome=_clean(item.outcome), context=_clean(item.context), key=_clean(item.key),
            )
            written = await self._memory.write(new)
        except SidecarError as exc:
            result.skipped += 1
            if len(result.notes) < 100:
                result.notes.append(f"item {index}: {exc.message}")
            return
        if written.action == "created":
            result.created += 1
        elif written.action == "superseded":
            result.superseded += 1
        else:
            result.duplicates += 1


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.replace("\x00", "").strip()
    return value or None
