"""The ``knowledge_search`` tool and what a session's knowledge bases offer a request.

A session whose assistant has knowledge bases gets ``knowledge_search`` first, before every
other tool (seed 000 section 3: the knowledge tools come before the app's tools). It runs
the same retrieval a request does (KnowledgeService.tool_search) and returns the passages
with citation markers that continue the request's own numbering (the reply's ledger, given
in its ToolContext); its ToolOutput carries the Citation records of what it showed, so the
reply may cite them. The search runs for the call's session (its query embeddings are
charged to it).

``KnowledgeOffer`` is what ToolService.assemble makes of a session's knowledge bases
(``knowledge_offer``, from what the KnowledgeService says they are): the tools to register
and the truth about retrieval for ``get_session_capabilities``.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from protocol.types import Citation, SessionV2
from sidecar.retrieval.citations import CitationLedger
from sidecar.store.knowledge import KbRecord
from sidecar.tools.base import Tool, ToolContext, ToolError, ToolOutput, obj

__all__ = ["KnowledgeSearch", "KnowledgeOffer", "KnowledgeSource", "NO_KNOWLEDGE", "MAX_TOOL_RESULTS", "knowledge_offer"]

MAX_TOOL_RESULTS = 6

class Search(Protocol):
    """KnowledgeService.tool_search."""

    async def __call__(
        self, ledger: CitationLedger, kb_ids: list[str], query: str, limit: int, *, session_id: str
    ) -> tuple[str, list[Citation]]:
        """(result text, Citation records numbered in ``ledger``), searched for ``session_id``."""
        ...


class KnowledgeOffer(msgspec.Struct, kw_only=True):
    tools: list[Any] = []
    """Tool instances, registered before every other tool."""
    retrieval: dict[str, Any] = {}
    """The ``retrieval.knowledge_base`` part of get_session_capabilities."""


NO_KNOWLEDGE = KnowledgeOffer(retrieval={"enabled": False})


class KnowledgeSource(Protocol):
    """KnowledgeService (sidecar/retrieval/service.py)."""

    async def offered_bases(self, session: SessionV2 | None) -> tuple[bool, list[KbRecord]]:
        """(retrieve automatically, the session's knowledge bases)."""
        ...

    async def tool_search(
        self, ledger: CitationLedger, kb_ids: list[str], query: str, limit: int, *, session_id: str
    ) -> tuple[str, list[Citation]]: ...


async def knowledge_offer(source: KnowledgeSource, session: SessionV2 | None) -> KnowledgeOffer:
    """What ``session``'s knowledge bases bring a request: ``knowledge_search`` over them and
    the ``retrieval.knowledge_base`` capabilities (NO_KNOWLEDGE without any)."""
    automatic, kbs = await source.offered_bases(session)
    if not kbs:
        return NO_KNOWLEDGE
    bases = [
        {
            "id": kb.id, "name": kb.name, "mode": "hybrid" if kb.vector_model else "lexical",
            "embeddingModel": kb.embed_model,
        }
        for kb in kbs
    ]
    retrieval = {
        "enabled": True,
        "automatic": automatic,
        "tool": KnowledgeSearch.name,
        "maxChunks": 6,
        "bases": bases,
    }
    tool = KnowledgeSearch(source.tool_search, [kb.id for kb in kbs], [kb.name for kb in kbs])
    return KnowledgeOffer(tools=[tool], retrieval=retrieval)


class KnowledgeSearch(Tool):
    name = "knowledge_search"
    source = "knowledge"
    feature = "knowledge"
    default_policy = "auto"
    parameters = obj(
        {
            "query": {
                "type": "string", "minLength": 1, "maxLength": 2000,
                "description": "What to look for (words or a question; Chinese and English both work).",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_TOOL_RESULTS},
        },
        ["query"],
    )

    def __init__(self, search: Search, kb_ids: list[str], names: list[str]) -> None:
        self._search = search
        self._kb_ids = kb_ids
        shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
        self.description = (
            f"Search the user's knowledge bases ({shown}) for passages about a topic. Use it when the "
            "passages already given for the latest message do not answer it. Returns passages with "
            "citation markers such as [7]; cite what you use with those markers."
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        query = str(args["query"]).strip()
        if not query:
            raise ToolError("query must not be empty")
        limit = int(args.get("limit", MAX_TOOL_RESULTS))
        # outside a reply (no ledger) the markers number from [1] and are kept nowhere
        ledger = ctx.citations if ctx.citations is not None else CitationLedger()
        text, citations = await self._search(ledger, self._kb_ids, query, limit, session_id=ctx.session.id)
        return ToolOutput(text=text, citations=citations)
