"""8. KnowledgeRetrievalTransformer: the request's knowledge chunks (seed 000 §4-5).

For an assistant with knowledge bases and ``transformers.knowledgeRetrieval`` on, the query
is the text of the last user message of the request; the retriever (KnowledgeService:
hybrid search, lexical when there is no embedding model or the embedding call fails) gives
at most ``MAX_RESULTS`` (6) chunks within its token budget. They go into the system prompt
inside one boundary-tagged ``<knowledge>`` block, each a ``<source marker="n" ...>`` element
on one line with its document name, page and section, written as untrusted text
(sidecar/retrieval/citations.py renders it); the markers come from the reply's citation
ledger (``ctx.ledger``: ``[1]``..``[6]``; a ``knowledge_search`` call of the same reply
continues the numbering). The ledger keeps the retrieval of the reply's first request, so
its later model steps send the same block. The Citation records of exactly what was sent
are appended to ``ctx.citations`` (BuildInfo.citations): only those, and what an executed
knowledge tool returned, may be cited by the reply.

A build without a ledger (a preview, chat:context:*) numbers into a ledger of its own that
nobody keeps. A retriever that fails is logged and the request goes on without knowledge.
The retrieval runs for the request's session: its query embeddings are charged to it.
"""

from __future__ import annotations

import logging

from sidecar.errors import SidecarError
from sidecar.pipeline.transformers.base import (
    Draft,
    KnowledgeRetriever,
    TransformContext,
    last_index,
    text_of,
    with_system_text,
)
from sidecar.retrieval.citations import CitationLedger, render_block
from sidecar.retrieval.results import RetrievalResult

__all__ = ["MAX_RESULTS", "KnowledgeRetriever", "NoKnowledge", "KnowledgeRetrievalTransformer"]

log = logging.getLogger(__name__)
MAX_RESULTS = 6


class NoKnowledge:
    """The retriever of a builder without knowledge bases (tests, tools): finds nothing."""

    async def retrieve(
        self, *, query: str, knowledge_base_ids: list[str], limit: int, session_id: str
    ) -> RetrievalResult:
        return RetrievalResult(mode="lexical", chunks=[])


class KnowledgeRetrievalTransformer:
    name = "KnowledgeRetrieval"

    def enabled(self, ctx: TransformContext) -> bool:
        return (
            ctx.assistant.transformers.knowledge_retrieval
            and bool(ctx.assistant.knowledge_base_ids)
            and ctx.knowledge is not None
        )

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]:
        index = last_index(drafts, "user")
        if index is None or ctx.knowledge is None:
            return drafts
        query = text_of(drafts[index])
        if not query.strip():
            return drafts
        ledger = ctx.ledger if ctx.ledger is not None else CitationLedger()
        chunks = ledger.retrieved(query)
        if chunks is None:
            try:
                result = await ctx.knowledge.retrieve(
                    query=query, knowledge_base_ids=list(ctx.assistant.knowledge_base_ids), limit=MAX_RESULTS,
                    session_id=ctx.session.id,
                )
            except SidecarError as exc:
                log.warning("knowledge retrieval failed: %s", exc.message)
                return drafts
            chunks = list(result.chunks)[:MAX_RESULTS]
            ledger.remember(query, chunks)
        if not chunks:
            return drafts
        citations = ledger.cite(chunks)
        if not citations:
            return drafts
        ctx.citations.extend(citations)
        return with_system_text(drafts, render_block(citations))
