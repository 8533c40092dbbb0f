"""SideUsage: attributing the usage of a side call to the session it was made for.

A reply's usage is added by its lifecycle (sidecar/engine/lifecycle/, kind ``reply``). Every other model
call made on behalf of a session (a title, a rolling summary, OCR of an image, and the
features that spend tokens around a turn: suggestions, the memory encoder, embeddings)
is a side call, attributed with ONE call::

    await app.side_usage.record(session_id, provider_id, model_id, usage, kind="side:title")

which prices ``usage`` with the model's prices (ProviderService.cost: cached prompt tokens at
their own prices) and adds it to the session's totals and to ``usageByKind[kind]``
(the repository call underneath, for code that already runs in the store's thread with a
cost in hand: ``s.sessions.add_usage(session_id, usage, cost, kind="side:...")``).
``kind`` is ``side:<what>`` (lowercase letters, digits, ``.``, ``_``, ``-``). The kinds in
use: ``side:title``, ``side:summary`` (rolling and session summaries), ``side:ocr``,
``side:suggestions``, ``side:memory-encoder``, and ``side:embedding``: the query
embeddings of a session's knowledge and memory retrieval (a request's, ``knowledge_search``,
``memory_search``) and the near-duplicate check of a memory its tools or encoder write, one
record per embedding request (sidecar/retrieval/retriever.py ``charge_embedding``).
Ingestion (documents indexed, memories' stored vectors) belongs to no session and is not
recorded.

Must stay true: recording never fails the caller's work (a session deleted meanwhile, a
price that cannot be known: logged, nothing added).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from protocol.types import Usage
from sidecar.engine.lifecycle import Pricing
from sidecar.errors import SidecarError
from sidecar.providers.types import StreamPart, UsageUpdate
from sidecar.store.async_store import AsyncStore
from sidecar.usage_counts import reported

__all__ = ["SideUsage", "usage_of"]

log = logging.getLogger(__name__)


def usage_of(parts: Iterable[StreamPart]) -> Usage | None:
    """The usage a non-streaming answer reported (its last cumulative UsageUpdate)."""
    usage = None
    for part in parts:
        if isinstance(part, UsageUpdate):
            usage = part.usage
    return usage


class SideUsage:
    def __init__(self, store: AsyncStore, pricing: Pricing) -> None:
        self._store = store
        self._pricing = pricing

    async def record(
        self, session_id: str, provider_id: str, model_id: str, usage: Usage | None, *, kind: str
    ) -> None:
        """Add a side call's usage (priced) to the session; nothing when there is none."""
        if usage is None or not kind.startswith("side:"):
            if usage is not None:
                log.warning("side usage of kind %r ignored: side calls are 'side:<what>'", kind)
            return
        usage = reported(usage)  # a peer's counts: what is not a count is not reported
        try:
            cost = await self._pricing.cost(provider_id, model_id, usage)
        except SidecarError as exc:
            log.warning("no cost for a %s call of session %s: %s", kind, session_id, exc.message)
            cost = 0.0
        try:
            await self._store.run(lambda s: s.sessions.add_usage(session_id, usage, cost, kind=kind))
        except SidecarError as exc:
            log.info("the %s usage of session %s was not added: %s", kind, session_id, exc.message)

    async def __call__(
        self, session_id: str, provider_id: str, model_id: str, usage: Usage | None, *, kind: str
    ) -> None:
        await self.record(session_id, provider_id, model_id, usage, kind=kind)
