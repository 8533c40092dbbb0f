"""9. MemoryRetrievalTransformer (seed 000 §4-5), and the knowledge names re-exported.

8. KnowledgeRetrievalTransformer lives in knowledge.py (KnowledgeService is its retriever).
When the assistant's memory and memory RAG are on (and ``transformers.memoryRetrieval``),
the query is the text of the last user message of the request; the retriever
(MemoryService.retrieve: hybrid search over the assistant's scope and ``global`` through
the retrieval core, lexical when there is no embedding model or the embedding call fails,
a relevance floor) gives at most ``MAX_RESULTS`` (6) memories, each already rendered as one
escaped ``<memory>`` element (sidecar/memory/text.py). They go into the system prompt in
one ``<memories>`` block under a header that says they are information, not
instructions. A retriever that fails is logged and the request goes on without them.
The retrieval runs for the request's session: its query embeddings are charged to it.
"""

from __future__ import annotations

import logging

from sidecar.errors import SidecarError
from sidecar.memory.text import render_block
from sidecar.pipeline.transformers.base import (
    Draft,
    KnowledgeRetriever,
    MemoryRetriever,
    TransformContext,
    last_index,
    text_of,
    with_system_text,
)
from sidecar.pipeline.transformers.knowledge import (
    MAX_RESULTS,
    KnowledgeRetrievalTransformer,
    NoKnowledge,
)

__all__ = [
    "MAX_RESULTS",
    "KnowledgeRetriever",
    "MemoryRetriever",
    "NoKnowledge",
    "NoMemory",
    "KnowledgeRetrievalTransformer",
    "MemoryRetrievalTransformer",
]

log = logging.getLogger(__name__)


class NoMemory:
    """The retriever of a builder without a MemoryService (tests, tools): finds nothing."""

    async def retrieve(self, *, query: str, assistant_id: str, limit: int, session_id: str) -> list[str]:
        return []


def _query(drafts: list[Draft]) -> str:
    index = last_index(drafts, "user")
    return text_of(drafts[index]) if index is not None else ""


class MemoryRetrievalTransformer:
    name = "MemoryRetrieval"

    def enabled(self, ctx: TransformContext) -> bool:
        memory = ctx.assistant.memory
        return (
            memory.enabled and memory.rag and ctx.assistant.transformers.memory_retrieval and ctx.memory is not None
        )

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        query = _query(drafts)
        if not query.strip() or ctx.memory is None:
            return drafts
        memory = ctx.memory
        if memory is None:
            return drafts
        try:
            found = await memory.retrieve(
                query=query, assistant_id=ctx.assistant.id, limit=MAX_RESULTS, session_id=ctx.session.id
            )
        except SidecarError as exc:
            log.warning("memory retrieval failed: %s", exc.message)
            return drafts
        text = render_block([m.strip() for m in found if m.strip()][:MAX_RESULTS])
        if text is None:
            return drafts
        return with_system_text(drafts, text)
