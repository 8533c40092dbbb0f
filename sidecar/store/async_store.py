"""AsyncStore: the Store for async code; every call runs in a worker thread.

Owns: keeping database work off the event loop. Each method has the name and arguments of
its Store method and runs it with ``anyio.to_thread.run_sync`` under one CapacityLimiter
shared by all calls of this store (sized to the connections: one writer plus the
readers, so threads never queue inside the store). Cancellation waits for the running
call to finish (it is one short transaction), so a cancelled caller never leaves a
transaction half-done.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from protocol.messages import MessageQueryOptions, SearchOptions
from protocol.sessions import CreateSessionOptions, SessionFilter, SessionListResult, SessionUpdates
from protocol.types import (
    ContentPart,
    MessageTreeNode,
    MessageV2,
    SearchResult,
    SessionExport,
    SessionV2,
    ToolCall,
    Usage,
)
from sidecar.store.ids import now_ms
from sidecar.store.store import ACTIVE_LEAF, Store

__all__ = ["AsyncStore"]

T = TypeVar("T")


class AsyncStore:
    """Async facade of a Store (same method names)."""

    def __init__(self, store: Store, *, limiter: anyio.CapacityLimiter | None = None) -> None:
        self.sync = store
        self._limiter = limiter if limiter is not None else anyio.CapacityLimiter(3)

    @classmethod
    async def open(
        cls, data_dir: str | Path, *, clock: Callable[[], int] = now_ms, readers: int = 2
    ) -> AsyncStore:
        """Open (migrate, recover) a Store in a worker thread."""
        store = await anyio.to_thread.run_sync(partial(Store, data_dir, clock=clock, readers=readers))
        return cls(store, limiter=anyio.CapacityLimiter(readers + 1))

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=self._limiter)

    async def close(self) -> None:
        """Close the database; shielded, so it also runs while the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await self._run(self.sync.close)

    # sessions
    async def create_session(self, opts: CreateSessionOptions) -> SessionV2:
        return await self._run(self.sync.sessions.create, opts)

    async def get_session(self, session_id: str) -> SessionV2:
        return await self._run(self.sync.sessions.get, session_id)

    async def list_sessions(self, flt: SessionFilter) -> SessionListResult:
        return await self._run(self.sync.sessions.query, flt)

    async def update_session(self, session_id: str, updates: SessionUpdates) -> SessionV2:
        return await self._run(self.sync.sessions.update, session_id, updates)

    async def delete_session(self, session_id: str) -> None:
        await self._run(self.sync.sessions.delete, session_id)

    async def archive_session(self, session_id: str, archived: bool = True) -> None:
        await self._run(self.sync.sessions.archive, session_id, archived)

    async def pin_session(self, session_id: str, pinned: bool) -> None:
        await self._run(self.sync.sessions.pin, session_id, pinned)

    async def fork_session(self, session_id: str, message_id: str) -> SessionV2:
        return await self._run(self.sync.sessions.fork, session_id, message_id)

    async def export_session(self, session_id: str) -> SessionExport:
        return await self._run(self.sync.sessions.export, session_id)

    async def import_session(
        self, session: SessionV2, messages: list[MessageV2], replace: bool = False
    ) -> SessionV2:
        return await self._run(self.sync.sessions.import_, session, messages, replace)

    async def add_session_usage(self, session_id: str, tokens: int, cost: float) -> SessionV2:
        return await self._run(self.sync.sessions.add_usage, session_id, tokens, cost)

    # messages
    async def get_message(self, message_id: str) -> MessageV2:
        return await self._run(self.sync.messages.get, message_id)

    async def get_path(self, session_id: str, leaf_id: str | None = None) -> list[MessageV2]:
        return await self._run(self.sync.messages.path, session_id, leaf_id)

    async def get_messages(
        self, session_id: str, options: MessageQueryOptions | None = None
    ) -> list[MessageV2]:
        return await self._run(self.sync.messages.query, session_id, options)

    async def get_tree(self, session_id: str) -> list[MessageTreeNode]:
        return await self._run(self.sync.messages.tree, session_id)

    async def select_branch(self, session_id: str, leaf_id: str) -> list[MessageV2]:
        return await self._run(self.sync.messages.select_branch, session_id, leaf_id)

    async def search_messages(
        self, query: str, options: SearchOptions | None = None
    ) -> list[SearchResult]:
        return await self._run(self.sync.search.messages, query, options)

    async def append_message(
        self,
        session_id: str,
        *,
        role: str,
        parent_id: Any = ACTIVE_LEAF,
        content_type: str = "text",
        text_content: str | None = None,
        parts: list[ContentPart] | None = None,
        tool_calls: list[ToolCall] | None = None,
        tool_call_id: str | None = None,
        tool_name: str | None = None,
        model_id: str | None = None,
        status: str = "completed",
        error: str | None = None,
        usage: Usage | None = None,
        latency_ms: int | None = None,
        acp_message_id: str | None = None,
        acp_parts: list[Any] | None = None,
        make_active: bool = True,
        seq: int | None = None,
    ) -> MessageV2:
        """See Store.append_message (``parent_id`` defaults to the active leaf)."""
        return await self._run(
            self.sync.messages.append,
            session_id,
            role=role,
            parent_id=parent_id,
            content_type=content_type,
            text_content=text_content,
            parts=parts,
            tool_calls=tool_calls,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            model_id=model_id,
            status=status,
            error=error,
            usage=usage,
            latency_ms=latency_ms,
            acp_message_id=acp_message_id,
            acp_parts=acp_parts,
            make_active=make_active,
            seq=seq,
        )

    async def update_partial(
        self,
        message_id: str,
        *,
        text_content: str | None,
        parts: list[ContentPart] | None,
        status: str = "streaming",
        seq: int | None = None,
    ) -> None:
        await self._run(
            self.sync.messages.update_partial,
            message_id,
            text_content=text_content,
            parts=parts,
            status=status,
            seq=seq,
        )

    async def finish_message(
        self,
        message_id: str,
        *,
        status: str,
        text_content: str | None,
        parts: list[ContentPart] | None,
        tool_calls: list[ToolCall] | None = None,
        usage: Usage | None = None,
        latency_ms: int | None = None,
        model_id: str | None = None,
        error: str | None = None,
        seq: int | None = None,
    ) -> MessageV2:
        return await self._run(
            self.sync.messages.finish,
            message_id,
            status=status,
            text_content=text_content,
            parts=parts,
            tool_calls=tool_calls,
            usage=usage,
            latency_ms=latency_ms,
            model_id=model_id,
            error=error,
            seq=seq,
        )

    async def delete_branch(self, message_id: str) -> int:
        return await self._run(self.sync.messages.delete_branch, message_id)

    # settings and maintenance
    async def get_setting(self, key: str) -> str | None:
        return await self._run(self.sync.settings.get, key)

    async def set_setting(self, key: str, value: str | None) -> None:
        await self._run(self.sync.settings.set, key, value)

    async def recover_interrupted(self) -> int:
        return await self._run(self.sync.messages.recover_interrupted)
