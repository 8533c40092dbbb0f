"""RequestBuilder: one provider request from a session's stored branch (DESIGN.md section 4).

The single entry point the generation loop calls before each model step. Today it reads
the branch root -> ``leaf_id`` and turns it into RequestMessages (``request.py``) with the
session's system prompt. The context window (rolling summary, truncation), system prompt
composition and the input transformers of seed 000 sections 2 and 4 belong behind this
same call; whatever they do, they change only the returned request, never the stored
branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from protocol.types import SessionV2
from sidecar.pipeline.request import build_request_messages
from sidecar.providers.types import ChatRequest, GenerationParams, ModelInfo, ToolSpec
from sidecar.store.attachments import AttachmentStore


class RequestBuilder:
    def __init__(self, store: Any, attachments: AttachmentStore) -> None:
        self._store = store  # the synchronous Store: reads happen in one worker-thread hop
        self._attachments = attachments

    async def build(
        self,
        *,
        session: SessionV2,
        leaf_id: str,
        model: ModelInfo,
        params: GenerationParams,
        tools: Sequence[ToolSpec] = (),
        tool_prompts: Sequence[str] = (),
        capability_note: str | None = None,
    ) -> ChatRequest:
        """``tools`` are sent when the model supports tools; ``tool_prompts`` (the system
        prompts the registered tools contribute) and ``capability_note`` (what a model
        without tool support is told instead) go into the system prompt."""
        def read_and_build() -> ChatRequest:
            path = self._store.get_path(session.id, leaf_id)
            system = "\n\n".join(
                p for p in (session.system_prompt, capability_note, *tool_prompts) if p and p.strip()
            )
            messages = build_request_messages(
                path,
                system_prompt=system or None,
                model=model,
                attachments=self._attachments,
            )
            return ChatRequest(
                model=model,
                messages=messages,
                tools=list(tools) if model.supports_tools else [],
                params=params,
            )

        return await anyio.to_thread.run_sync(read_and_build)
