"""AssistantService: assistant:list / get / upsert / delete / setDefault.

Owns validating a profile before it is stored (seed 000 attaches these settings to an
"assistant"): names and sizes bounded, regex rules and the template must compile, lorebook
entries need a keyword unless constant, numbers in range, ``enabledTools`` names tools
that exist (the tool service's check). A bad profile is an
invalid-params error naming the field; nothing is stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from protocol.context import AssistantIdParams, AssistantProfile, AssistantUpsertParams
from protocol.memory import GLOBAL_SCOPE
from protocol.common import EmptyParams, SuccessResult
from sidecar.errors import InvalidParams
from sidecar.pipeline.transformers.regex import compile_rules
from sidecar.pipeline.transformers.template import check_template
from sidecar.store.async_store import AsyncStore
from sidecar.store.ids import now_ms
from sidecar.store.store import Store

__all__ = ["AssistantService", "validate_profile"]

MAX_NAME = 200
MAX_PROMPT = 200_000
MAX_ITEMS = 500
MAX_THRESHOLD = 10_000_000
MIN_MEMORY_BUDGET = 64
MAX_MEMORY_BUDGET = 32768


def _bad(field: str, why: str) -> InvalidParams:
    return InvalidParams(f"invalid params: {field} {why} - at `$.{field}`")


def validate_profile(p: AssistantUpsertParams) -> None:
    if not p.name.strip() or len(p.name) > MAX_NAME:
        raise _bad("name", f"must be 1..{MAX_NAME} characters")
    if p.id is not None and (not p.id.strip() or len(p.id) > 200):
        raise _bad("id", "must be 1..200 characters")
    if p.id == GLOBAL_SCOPE:
        raise _bad("id", f"must not be {GLOBAL_SCOPE!r} (the memory scope every assistant shares)")
    if not MIN_MEMORY_BUDGET <= p.memory.budget_tokens <= MAX_MEMORY_BUDGET:
        raise _bad("memory.budgetTokens", f"must be {MIN_MEMORY_BUDGET}..{MAX_MEMORY_BUDGET}")
    if p.memory.embedding_model is not None and not (
        p.memory.embedding_model.provider_id.strip() and p.memory.embedding_model.model_id.strip()
    ):
        raise _bad("memory.embeddingModel", "needs a providerId and a modelId")
    if len(p.system_prompt) > MAX_PROMPT:
        raise _bad("systemPrompt", f"is longer than {MAX_PROMPT} characters")
    for field, items in (("regexRules", p.regex_rules), ("enabledTools", p.enabled_tools or []),
                         ("knowledgeBaseIds", p.knowledge_base_ids), ("modes", p.modes),
                         ("lorebook", p.lorebook), ("memory.entries", p.memory.entries)):
        if len(items) > MAX_ITEMS:
            raise _bad(field, f"has more than {MAX_ITEMS} items")
    compile_rules(p.regex_rules, "user", strict=True)
    for i, tool in enumerate(p.enabled_tools or []):
        if not tool.strip() or len(tool) > 200:
            raise _bad(f"enabledTools[{i}]", "must be a tool name")
    for i, mode in enumerate(p.modes):
        if len(mode.content) > MAX_PROMPT:
            raise _bad(f"modes[{i}].content", "is too long")
        if not 0 <= mode.depth <= 10_000:
            raise _bad(f"modes[{i}].depth", "must be 0..10000")
    for i, entry in enumerate(p.lorebook):
        if not entry.constant and not any(k.strip() for k in entry.keywords):
            raise _bad(f"lorebook[{i}].keywords", "needs a keyword (or constant: true)")
        if not 1 <= entry.scan_depth <= 1000:
            raise _bad(f"lorebook[{i}].scanDepth", "must be 1..1000")
        if not 0 <= entry.depth <= 10_000:
            raise _bad(f"lorebook[{i}].depth", "must be 0..10000")
        if len(entry.content) > MAX_PROMPT:
            raise _bad(f"lorebook[{i}].content", "is too long")
    if p.context.compress_threshold > MAX_THRESHOLD:
        raise _bad("context.compressThreshold", f"must be at most {MAX_THRESHOLD}")
    if p.transformers.template.enabled or p.transformers.template.template != "{{ message }}":
        check_template(p.transformers.template.template)
    if len(p.transformers.user_name) > MAX_NAME:
        raise _bad("transformers.userName", f"is longer than {MAX_NAME} characters")


class AssistantService:
    def __init__(
        self,
        store: AsyncStore,
        *,
        clock: Callable[[], int] = now_ms,
        check_tools: Callable[[list[str]], None] | None = None,
    ) -> None:
        """``check_tools(enabledTools)``: InvalidParams for a name that is not a tool the
        profile may name (ToolService.check_enabled_tools)."""
        self._store = store
        self._clock = clock
        self._check_tools = check_tools
        self.on_delete: list[Callable[[str], Awaitable[None]]] = []
        """Awaited after an assistant was deleted (its memory scope leaves the indexes)."""

    async def list_assistants(self, params: EmptyParams | None = None) -> list[AssistantProfile]:
        return await self._store.run(lambda s: s.assistants.list())

    async def get_assistant(self, params: AssistantIdParams) -> AssistantProfile:
        return await self._store.run(lambda s: s.assistants.get(params.id))

    async def upsert_assistant(self, params: AssistantUpsertParams) -> AssistantProfile:
        await anyio.to_thread.run_sync(validate_profile, params)  # compiles regexes and the template: CPU only
        if self._check_tools is not None and params.enabled_tools:
            self._check_tools(params.enabled_tools)
        now = self._clock()
        return await self._store.run(lambda s: s.assistants.upsert(params, now))

    async def delete_assistant(self, params: AssistantIdParams) -> SuccessResult:
        """Its memories (every version), proposals and Soul.md versions go with it, in the
        same transaction (README "Memory": they are not moved to ``global``)."""

        def delete(s: Store) -> None:
            with s.transaction():
                s.assistants.delete(params.id)
                s.memory.purge_scope(params.id)
                s.souls.delete_scope(params.id)

        await self._store.run(delete)
        for hook in self.on_delete:
            await hook(params.id)
        return SuccessResult()

    async def set_default_assistant(self, params: AssistantIdParams) -> SuccessResult:
        await self._store.run(lambda s: s.assistants.set_default(params.id))
        return SuccessResult()
