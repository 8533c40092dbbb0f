"""MemoryEmbeddings: a vector for every active memory, per embedding model in use, made in
the background.

Owns: for each model some assistant with memory on uses (``memory.embeddingModel``), every
active memory of the scopes that assistant sees (its own and ``global``) gets a vector
(EMBED_BATCH per store call), after every write, at start, and when a search meets a
(scope, model) not checked since the last write. A failing embedding call is logged and
retried at the next write, or at a search EMBED_RETRY_S later. These stored vectors belong
to no session (charged to nobody).
Must stay true: at most one job per (scope, model) runs; a write while it runs makes it
look again when it is done; the in-memory vector indexes and the retriever's cache
generation follow every vector written and every row that left the active set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import anyio
import anyio.abc

from protocol.context import AssistantProfile
from protocol.memory import GLOBAL_SCOPE
from sidecar.errors import SidecarError
from sidecar.memory.retriever import MemoryRetriever
from sidecar.retrieval.indexes import VectorIndexes
from sidecar.retrieval.retriever import EmbedderFor
from sidecar.store.async_store import AsyncStore

__all__ = ["MemoryEmbeddings", "EMBED_BATCH", "EMBED_RETRY_S", "model_key", "scopes_of"]

log = logging.getLogger(__name__)

EMBED_BATCH = 64
EMBED_RETRY_S = 60.0
"""After a failed embedding job, searches do not start another for this long (writes do)."""


def model_key(assistant: AssistantProfile) -> str | None:
    """The embedding model of the assistant's memory (``providerId/modelId``), or None."""
    ref = assistant.memory.embedding_model
    return f"{ref.provider_id}/{ref.model_id}" if ref is not None else None


def scopes_of(assistant: AssistantProfile) -> list[str]:
    """The memory scopes an assistant sees: its own, then the global one."""
    return [assistant.id, GLOBAL_SCOPE]


class MemoryEmbeddings:
    def __init__(
        self,
        store: AsyncStore,
        indexes: VectorIndexes,
        retriever: MemoryRetriever,
        embedder_for: EmbedderFor,
        *,
        task_group: Callable[[], anyio.abc.TaskGroup | None],
    ) -> None:
        self._store = store
        self._indexes = indexes
        self._retriever = retriever
        self._embedder_for = embedder_for
        self._task_group = task_group
        """The MemoryService's task group while it runs (None before and after: nothing starts)."""
        self._embedding: set[tuple[str, str]] = set()
        self._checked: set[tuple[str, str]] = set()
        """(scope, model) pairs with no memory lacking a vector since the last write."""
        self._dirty: set[tuple[str, str]] = set()
        self._failed_at: dict[tuple[str, str], float] = {}

    async def changed(self, scope: str, *, removed: Sequence[int] = ()) -> None:
        """Rows of ``scope`` were written, or ``removed`` (rowids) left the active set:
        retrieval caches and vector indexes follow, and the scope is embedded again."""
        self._retriever.generation += 1
        if removed:
            await self._indexes.update(scope, None, [], list(removed))
        for key in [k for k in self._checked if k[0] == scope]:
            self._checked.discard(key)
        for key in [k for k in self._failed_at if k[0] == scope]:
            del self._failed_at[key]
        await self._for_scope(scope)

    def check(self, scope: str, model: str) -> None:
        """A search meets (scope, model): embed what lacks a vector unless that was checked
        since the last write, or failed less than EMBED_RETRY_S ago."""
        key = (scope, model)
        if key not in self._checked and time.monotonic() - self._failed_at.get(key, -EMBED_RETRY_S) >= EMBED_RETRY_S:
            self.schedule(scope, model)

    def schedule(self, scope: str, model: str) -> None:
        """Embed the memories of ``scope`` lacking a ``model`` vector, in the background."""
        key = (scope, model)
        tg = self._task_group()
        if tg is None:
            return
        if key in self._embedding:
            self._dirty.add(key)  # the running job looks again when it is done
            return
        self._embedding.add(key)
        tg.start_soon(self._job, scope, model)

    async def _for_scope(self, scope: str) -> None:
        for assistant in await self._store.run(lambda s: s.assistants.list()):
            model = model_key(assistant)
            if model is not None and assistant.memory.enabled and scope in scopes_of(assistant):
                self.schedule(scope, model)

    async def _job(self, scope: str, model: str) -> None:
        key = (scope, model)
        try:
            while True:
                self._dirty.discard(key)
                missing = await self._store.run(lambda s: s.memory.missing_vectors(scope, model, EMBED_BATCH))
                if not missing:
                    self._checked.add(key)
                    if key not in self._dirty:
                        return
                    continue
                embedder = await self._embedder_for(model)
                vectors = (await embedder.embed([text for _, text in missing])).vectors
                rows = [(rowid, vectors[i].astype("<f4").tobytes()) for i, (rowid, _) in enumerate(missing)]
                dims = int(vectors.shape[1])
                written = await self._store.run(lambda s: s.memory.write_vectors(model, dims, rows))
                await self._indexes.update(scope, model, [(rowid, blob) for _, rowid, blob in written], [])
                self._retriever.generation += 1
                if len(written) < len(rows) and not written:
                    return  # the rows vanished meanwhile
        except anyio.get_cancelled_exc_class():
            raise
        except SidecarError as exc:
            self._failed_at[key] = time.monotonic()
            log.warning("embedding memories of scope %s with %s failed: %s (retried at the next write, or a "
                        "search after %gs)", scope, model, exc.message, EMBED_RETRY_S)
        except Exception:
            self._failed_at[key] = time.monotonic()
            log.exception("embedding memories of scope %s with %s failed", scope, model)
        finally:
            self._embedding.discard(key)
