"""EmbeddingRetries: the schedule that makes the vectors of documents indexed while their
embedding provider failed (status ``embedding_pending``: chunked and searchable lexically).

Owned and run by KnowledgeService (``run`` in its task group: cancelled with it, so
shutdown never waits for a retry; an attempt cut off writes nothing). One task, one
attempt at a time:
- it sleeps until the first pending document is due (``embed_retry_at``, kept in the
  database: a restart goes on with the same schedule, an attempt due meanwhile runs at
  once) or until ``wake`` (a document became pending, a base's attempts were brought
  forward); it never polls;
- an attempt (``Indexer.embed_pending``) that fails, whatever the failure, is counted
  (``KnowledgeRepo.embedding_failed``) and puts the next one ``retry_delay_s(attempts)``
  later: RETRY_BASE_S doubled after each failure, at most RETRY_MAX_S, so the schedule
  never spins on one document; the other pending documents of its base wait with it (one
  attempt per base and round while its provider fails);
- a success makes the document ``ready`` and brings the base's other pending documents
  forward (the provider answers again); so does the end of a base's re-embedding
  (``base_now``);
- deleting a document cancels its running attempt (its scope is in the service's
  ``running`` registry, as an indexing run's is).
"""

from __future__ import annotations

import logging

import anyio

from sidecar.errors import NotFound, SidecarError
from sidecar.retrieval.ingest import Indexer
from sidecar.store.async_store import AsyncStore
from sidecar.store.ids import now_ms
from sidecar.store.knowledge import DocRecord

__all__ = ["EmbeddingRetries", "RETRY_BASE_S", "RETRY_MAX_S", "retry_delay_s", "retry_delay_ms"]

log = logging.getLogger(__name__)

RETRY_BASE_S = 2.0
"""The wait before the first retry of a document's vectors (doubled after each failure)."""
RETRY_MAX_S = 600.0
"""The longest wait between two attempts at a document's vectors."""


def retry_delay_s(attempts: int) -> float:
    """How long to wait after the ``attempts``-th failed attempt at a document's vectors."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2.0 ** max(0, min(attempts, 32) - 1))


def retry_delay_ms(attempts: int) -> int:
    """``retry_delay_s`` in milliseconds (what the repository adds to the time it counts a
    failure at)."""
    return int(retry_delay_s(attempts) * 1000)


class EmbeddingRetries:
    def __init__(self, store: AsyncStore, indexer: Indexer, running: dict[str, anyio.CancelScope]) -> None:
        """``running``: the service's cancel scopes by document id (a delete cancels them)."""
        self._store = store
        self._indexer = indexer
        self._running = running
        self._wake = anyio.Event()

    def wake(self) -> None:
        """Look at the schedule again (a document became pending, or one is due earlier)."""
        self._wake.set()

    async def base_now(self, kb_id: str) -> None:
        """Bring the next attempt of the base's pending documents forward to now."""
        if await self._store.run(lambda s: s.knowledge.retry_embedding_now(kb_id)):
            self.wake()

    async def run(self) -> None:
        while True:
            wake = self._wake = anyio.Event()  # before reading: a wake from now on is seen
            due = await self._store.run(lambda s: s.knowledge.next_embedding_retry())
            if due is None:
                await wake.wait()
                continue
            doc_id, at = due
            wait_s = (at - now_ms()) / 1000
            if wait_s > 0:
                with anyio.move_on_after(wait_s):
                    await wake.wait()
                continue
            await self._attempt(doc_id)

    async def _attempt(self, doc_id: str) -> None:
        try:
            doc: DocRecord = await self._store.run(lambda s: s.knowledge.get_document(doc_id))
        except NotFound:
            return
        failure: str | None = None
        with anyio.CancelScope() as scope:
            self._running[doc_id] = scope
            try:
                if await self._indexer.embed_pending(doc):
                    log.info("vectors of document %s (%s) made: ready", doc.id, doc.name)
                else:  # it changed meanwhile: counted (a no-op unless it is still pending)
                    failure = "the document or its base changed while its vectors were made"
            except anyio.get_cancelled_exc_class():
                raise
            except SidecarError as exc:
                failure = f"embedding failed: {exc.message}"
            except Exception as exc:  # a bug: counted like a failure, so it is not retried at once
                log.exception("the vectors of document %s failed", doc_id)
                failure = f"internal error while embedding: {type(exc).__name__}"
            finally:
                if self._running.get(doc_id) is scope:
                    del self._running[doc_id]
        if scope.cancelled_caught:
            log.info("the attempt at the vectors of document %s was cancelled", doc_id)
            return
        if failure is not None:
            with anyio.CancelScope(shield=True):
                counted = await self._store.run(lambda s: s.knowledge.embedding_failed(doc, failure, retry_delay_ms))
            if counted is not None:
                log.warning("vectors of document %s (%s), attempt %d: %s; next in %gs", doc.id, doc.name,
                            counted.embed_attempts, failure, retry_delay_s(counted.embed_attempts))
