"""The input-transformer interface: Draft messages, the TransformContext, InputTransformer.

A Draft is one message of the request copy while the pipeline works on it: role and parts
like a provider RequestMessage, plus where it came from (the stored message id and time, or
None for text the pipeline added). The system prompt is the first Draft (role ``system``)
when there is one.

Must stay true (seed 000 section 4):
- a transformer gets the previous one's output and returns the list for the next one;
- it changes the request copy only: it never mutates a part object it was given (stored
  messages share them) and builds new parts/lists instead; it never writes to the store;
- a transformer that fails on one item (an unreadable file, an OCR call that fails) leaves
  that item as it was and logs; it does not fail the request.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from protocol.context import AssistantProfile
from protocol.types import Citation, ContentPart, SessionV2, TextPart
from sidecar.providers.types import ModelInfo, RequestMessage
from sidecar.store.attachments import AttachmentStore

if TYPE_CHECKING:
    from sidecar.retrieval.citations import CitationLedger
    from sidecar.retrieval.results import RetrievalResult

__all__ = ["Draft", "TransformContext", "InputTransformer", "ModelCall", "KnowledgeRetriever", "MemoryRetriever", "last_index", "text_of", "with_system_text"]

ModelCall = Callable[..., Awaitable[str]]
"""``await call(provider_id, model_id, messages: list[RequestMessage], max_tokens=...) -> text``."""


class KnowledgeRetriever(Protocol):
    """What the knowledge transformer needs (KnowledgeService provides it)."""

    async def retrieve(
        self, *, query: str, knowledge_base_ids: list[str], limit: int, session_id: str
    ) -> RetrievalResult: ...


class MemoryRetriever(Protocol):
    """What the memory transformer needs (MemoryService provides it)."""

    async def retrieve(self, *, query: str, assistant_id: str, limit: int, session_id: str) -> list[str]:
        """Rendered ``<memory>`` elements, best first, retrieved for ``session_id``."""
        ...


class Draft(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant"]
    parts: list[ContentPart]
    source_id: str | None = None
    """The stored message this draft was copied from (None: added by the pipeline)."""
    created_at: int | None = None

    def to_request(self) -> RequestMessage:
        return RequestMessage(role=self.role, parts=list(self.parts))


class TransformContext(msgspec.Struct, kw_only=True):
    """What transformers may read (and the few things they report back)."""

    session: SessionV2
    assistant: AssistantProfile
    model: ModelInfo
    now: dt.datetime
    """Timezone-aware local time of this request."""
    attachments: AttachmentStore
    """Reads stored files (blocking: use a worker thread)."""
    call_model: ModelCall | None = None
    knowledge: KnowledgeRetriever | None = None
    """See retrieval.py."""
    memory: MemoryRetriever | None = None
    """See retrieval.py."""
    ledger: CitationLedger | None = None
    """The reply's citation ledger (its markers; see knowledge.py), None outside a reply."""
    citations: list[Citation] = []
    """The Citation records of the knowledge chunks this request sent (BuildInfo.citations)."""
    applied: list[str] = []
    """Names of the transformers that changed the request, in the order they ran."""


class InputTransformer(Protocol):
    name: str

    def enabled(self, ctx: TransformContext) -> bool: ...

    async def transform(self, drafts: list[Draft], ctx: TransformContext) -> list[Draft]: ...


def last_index(drafts: list[Draft], role: str) -> int | None:
    for i in range(len(drafts) - 1, -1, -1):
        if drafts[i].role == role:
            return i
    return None


def text_of(draft: Draft) -> str:
    return "\n".join(p.text for p in draft.parts if isinstance(p, TextPart))


def with_system_text(drafts: list[Draft], text: str, *, prepend: bool = False) -> list[Draft]:
    """``drafts`` with ``text`` added to the system prompt (a system draft is created if none)."""
    out = list(drafts)
    if out and out[0].role == "system":
        old = text_of(out[0])
        joined = f"{text}\n\n{old}" if prepend else f"{old}\n\n{text}"
        out[0] = Draft(role="system", parts=[TextPart(text=joined.strip())])
    else:
        out.insert(0, Draft(role="system", parts=[TextPart(text=text)]))
    return out
