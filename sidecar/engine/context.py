"""ContextService: chat:context:get / update / compact.

``get`` also reports the context budget (a context meter): the next request of the active
branch as it would be planned now (RequestBuilder.plan_budget: the system prompt, the tools
its assistant and model get, the summary, the window, the reserved output; no model call)
and the last request built for the session in this process (transformers included).

``update`` chooses a session's assistant profile and truncation strategy ("" returns to the
default profile / the profile's strategy); ``compact`` runs the rolling-context planner on
the active branch now (seed 000 section 2: the same planner, a forced target length and
the user's extra requirements), through the same RequestBuilder the generation loop uses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
import msgspec

from protocol.context import (
    AssistantProfile,
    ContextBudgetInfo,
    ContextCompactParams,
    ContextCompactResult,
    ContextGetParams,
    ContextUpdateParams,
    RollingSummaryInfo,
    SessionContextInfo,
)
from protocol.settings import ChatSettings
from protocol.types import SessionV2
from sidecar.engine.generation import ToolAssembler
from sidecar.errors import EngineError, InvalidParams, NotFound, SidecarError
from sidecar.pipeline import planner
from sidecar import tokens as tk
from sidecar.pipeline.budget import BudgetParts
from sidecar.pipeline.builder import RequestBuilder
from sidecar.providers.calls import ModelResolver
from sidecar.providers.types import GenerationParams
from sidecar.store.async_store import AsyncStore
from sidecar.store.context import StoredSummary
from sidecar.store.store import Store
from sidecar.tools.registry import ToolRegistry

__all__ = ["ContextService", "budget_info"]

log = logging.getLogger(__name__)

MAX_INSTRUCTIONS = 4000


def _info(summary: StoredSummary | None, valid: bool) -> RollingSummaryInfo | None:
    if summary is None:
        return None
    return RollingSummaryInfo(
        text=summary.text, covered_count=summary.covered_count, last_covered_id=summary.last_covered_id,
        tokens=summary.tokens, valid=valid, updated_at=summary.updated_at,
    )


def budget_info(parts: BudgetParts) -> ContextBudgetInfo:
    return ContextBudgetInfo(
        context_window=parts.context_window, reserved_output=parts.reserved_output,
        system_prompt=parts.system_prompt, summary=parts.summary, tools=parts.tools, messages=parts.messages,
        message_count=parts.message_count, attachments=parts.attachments, total=parts.total,
        available=parts.available, threshold=parts.threshold, dropped=parts.dropped, exact=parts.exact,
        model_id=parts.model_id,
    )


class ContextService:
    def __init__(
        self,
        store: AsyncStore,
        builder: RequestBuilder,
        *,
        providers: ModelResolver | None = None,
        tools: ToolAssembler | None = None,
        settings: Callable[[], ChatSettings] = ChatSettings,
    ) -> None:
        """``providers`` and ``tools`` make ``get`` plan the budget (without them it reports
        only the last request's)."""
        self._store = store
        self._builder = builder
        self._providers = providers
        self._tools = tools
        self._settings = settings

    async def get_context(self, params: ContextGetParams) -> SessionContextInfo:
        profiles = self._builder.profiles
        session, profile = await self._store.run(
            lambda s: (s.sessions.get(params.session_id), profiles.for_session(params.session_id))
        )
        summary, valid = await self._builder.context.valid_summary(session.id, session.active_leaf_id)
        return SessionContextInfo(
            session_id=session.id,
            assistant_id=profile.assistant.id,
            session_assistant_id=profile.session_assistant_id,
            truncation_strategy=profile.strategy,
            session_truncation_strategy=profile.session_strategy,
            threshold=planner.effective_threshold(profile.assistant.context.compress_threshold),
            summary=_info(summary, valid),
            budget=await self._plan(session, profile.assistant),
            last_request=budget_info(last) if (last := self._builder.last_budget(session.id)) else None,
        )

    async def _plan(self, session: SessionV2, assistant: AssistantProfile) -> ContextBudgetInfo | None:
        if self._providers is None or session.mode != "direct" or not session.active_leaf_id:
            return None
        try:
            resolved = await self._providers.resolve(session.provider_id, session.model_id)
            model = resolved.model
            registry = (
                await self._tools.assemble(session, model, assistant=assistant) if self._tools is not None
                else ToolRegistry()
            )
            parts = await self._builder.plan_budget(
                session=session, leaf_id=session.active_leaf_id, model=model,
                params=GenerationParams(max_tokens=self._settings().max_tokens),
                tools=registry.specs(), tool_prompts=registry.prompts(), capability_note=registry.capability_note,
            )
        except SidecarError as exc:  # no provider yet, a branch changing meanwhile: no meter now
            log.debug("no context budget for %s: %s", session.id, exc.message)
            return None
        return budget_info(parts)

    async def update_context(self, params: ContextUpdateParams) -> SessionContextInfo:
        session = await self._store.run(lambda s: s.sessions.get(params.session_id))

        def write(s: Store) -> None:
            # left out: kept; null or "": inherited again
            assistant_id, strategy = s.context.get_session_settings(session.id)
            if params.assistant_id is not msgspec.UNSET:
                if params.assistant_id and not s.assistants.exists(params.assistant_id):
                    raise InvalidParams(
                        f"invalid params: no assistant {params.assistant_id!r} - at `$.assistantId`"
                    )
                assistant_id = params.assistant_id or None
            if params.truncation_strategy is not msgspec.UNSET:
                strategy = params.truncation_strategy or None
            s.context.set_session_settings(session.id, assistant_id=assistant_id, truncation_strategy=strategy)

        await self._store.run(write)
        return await self.get_context(ContextGetParams(session_id=session.id))

    async def compact(self, params: ContextCompactParams) -> ContextCompactResult:
        if params.target_tokens is not None and not 256 <= params.target_tokens <= 10_000_000:
            raise InvalidParams("invalid params: targetTokens must be 256..10000000 - at `$.targetTokens`")
        if params.instructions is not None and len(params.instructions) > MAX_INSTRUCTIONS:
            raise InvalidParams(
                f"invalid params: instructions is longer than {MAX_INSTRUCTIONS} characters - at `$.instructions`"
            )
        session = await self._store.run(lambda s: s.sessions.get(params.session_id))
        if session.mode != "direct":
            raise EngineError("only direct-mode sessions have a rolling context (ACP engines keep their own)")
        profiles = self._builder.profiles
        profile = await self._store.run(lambda _: profiles.for_session(session.id))
        leaf = session.active_leaf_id
        if leaf is None:
            raise EngineError("the session has no messages to compact")
        try:
            resolved = session.model_id
            encoding = tk.encoding_for_model(resolved).encoding
            outcome = await self._builder.context.compact(
                session=session, leaf_id=leaf, assistant=profile.assistant, encoding=encoding,
                target_tokens=params.target_tokens, instructions=params.instructions,
            )
        except NotFound as exc:
            raise EngineError(f"the active branch changed while compacting: {exc.message}") from exc
        return ContextCompactResult(
            compacted=outcome.compacted,
            summary=_info(outcome.summary, True),
            window_count=outcome.window_count,
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_after,
        )

