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
    ) -> ChatRequest:
        def read_and_build() -> ChatRequest:
            path = self._store.get_path(session.id, leaf_id)
            messages = build_request_messages(
                path,
                system_prompt=session.system_prompt,
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
