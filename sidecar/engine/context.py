"""ContextService: chat:context:get / update / compact.

``update`` chooses a session's assistant profile and truncation strategy ("" returns to the
default profile / the profile's strategy); ``compact`` runs the rolling-context planner on
the active branch now (seed 000 section 2: the same planner, a forced target length and
the user's extra requirements), through the same RequestBuilder the generation loop uses.
"""

from __future__ import annotations

import msgspec

from protocol.context import (
    ContextCompactParams,
    ContextCompactResult,
    ContextGetParams,
    ContextUpdateParams,
    RollingSummaryInfo,
    SessionContextInfo,
)
from sidecar.errors import EngineError, InvalidParams, NotFound
from sidecar.pipeline import planner
from sidecar.pipeline import tokens as tk
from sidecar.pipeline.builder import RequestBuilder
from sidecar.store.async_store import AsyncStore
from sidecar.store.context import StoredSummary
from sidecar.store.store import Store

__all__ = ["ContextService"]

MAX_INSTRUCTIONS = 4000


def _info(summary: StoredSummary | None, valid: bool) -> RollingSummaryInfo | None:
    if summary is None:
        return None
    return RollingSummaryInfo(
        text=summary.text, covered_count=summary.covered_count, last_covered_id=summary.last_covered_id,
        tokens=summary.tokens, valid=valid, updated_at=summary.updated_at,
    )


class ContextService:
    def __init__(self, store: AsyncStore, builder: RequestBuilder) -> None:
        self._store = store
        self._builder = builder

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
        )

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

