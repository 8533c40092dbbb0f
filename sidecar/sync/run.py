"""RunContext: what one sync run carries (client, account, settings) and what it reports.

Owns: collecting the SyncResult (counts, conflicts, issues, skipped conversations, messages
that stay local), progress notifications under the caller's token (a WorkProgress:
throttled, ``end`` always sent), and the run's database work: through the store gateway
(``store.run``), one call at a time (the run's lock), so a sync never holds more than one
of the store's connections and chat keeps the others.

Must stay true: a run takes nothing from its caller but checked params, so a value the
store refuses (INVALID_PARAMS) came from the server: it leaves ``db`` as BadServerData,
never as -32602, which says the caller's params were wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec

from protocol.common import ProgressToken
from protocol.errors import ErrorCode
from protocol.sync import (
    AgentMode,
    ChatApi,
    NotPushed,
    SkippedConversation,
    SyncConflict,
    SyncIssue,
    SyncPhase,
    SyncResult,
    SyncSettings,
)
from sidecar.progress import WorkProgress
from sidecar.errors import SidecarError
from sidecar.store import AsyncStore, Store
from sidecar.store.ids import now_ms
from sidecar.sync.client import QimingClient
from sidecar.sync.errors import BadServerData, QimingError
from sidecar.notify import Notifier

__all__ = ["RunContext", "AccountConfig"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class AccountConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The configured account as a run or a forwarded turn needs it (no token: the client
    holds it)."""

    account_key: str
    agent_id: int | None = None
    messages_on_create: bool = False
    user_id: int | None = None
    """The server's id of the account's user (``user_id`` of the computer API)."""
    chat_api: ChatApi = "conversation"
    chat_idle_timeout_s: float = 60.0
    agent_mode: AgentMode | None = None


class RunContext:
    def __init__(
        self,
        *,
        client: QimingClient,
        account: AccountConfig,
        settings: SyncSettings,
        notify: Notifier,
        progress_token: ProgressToken | None,
        store: AsyncStore,
        db_lock: anyio.Lock,
    ) -> None:
        self.client = client
        self.account = account
        self.settings = settings
        self.result = SyncResult(started_at=now_ms())
        self._progress = WorkProgress(notify, progress_token, "sync") if progress_token is not None else None
        self._store = store
        self._db_lock = db_lock
        self.done = 0
        self.total: int | None = None
        self._skipped: set[int | str] = set()
        """What ``skip`` reported: a conversation id, or the message of a row without one."""

    # ---- database ---------------------------------------------------------------------

    async def db(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` through the store gateway, after the run's other database call."""
        async with self._db_lock:
            try:
                return await self._store.run(fn)
            except SidecarError as exc:
                if exc.code != ErrorCode.INVALID_PARAMS:
                    raise
                raise BadServerData(f"the server sent a value this device cannot store ({exc.message})") from exc

    # ---- reporting --------------------------------------------------------------------

    def issue(
        self, phase: SyncPhase, exc: SidecarError, *, session_id: str | None = None, conversation_id: int | None = None
    ) -> None:
        kind: str
        if isinstance(exc, QimingError):
            kind, status, code, retryable = exc.kind, exc.status, exc.server_code, exc.retryable
        else:
            kind, status, code, retryable = "store", None, None, False
        log.warning("sync %s: %s", phase, exc.message)
        self.result.errors.append(SyncIssue(
            phase=phase, kind=kind, message=exc.message, session_id=session_id,
            conversation_id=conversation_id, status=status, code=code, retryable=retryable,
        ))

    def note(self, phase: SyncPhase, kind: str, message: str, **where: Any) -> None:
        log.warning("sync %s: %s", phase, message)
        self.result.errors.append(SyncIssue(phase=phase, kind=kind, message=message, **where))

    def skip(self, conversation_id: int | None, exc: QimingError, *, session_id: str | None = None) -> None:
        """A conversation (or a /list row) the server sent out of bounds: reported once per
        run, not stored."""
        key = conversation_id if conversation_id is not None else exc.message
        if key in self._skipped:
            return
        self._skipped.add(key)
        log.warning("sync: conversation %s skipped: %s", conversation_id, exc.message)
        self.result.skipped.append(SkippedConversation(
            conversation_id=conversation_id, session_id=session_id,
            field=exc.field if isinstance(exc, BadServerData) else None, message=exc.message,
        ))

    def conflict(self, conflict: SyncConflict) -> None:
        log.info("sync conflict: %s", conflict.message)
        self.result.conflicts.append(conflict)

    def not_pushed(self, item: NotPushed) -> None:
        self.result.not_pushed.append(item)

    async def begin(self, message: str) -> None:
        if self._progress is not None:
            await self._progress.begin(self.total, message)

    async def report(self, message: str, *, force: bool = False) -> None:
        """Throttled (WorkProgress), but the last step of a phase always shows."""
        if self._progress is not None:
            await self._progress.report(self.done, self.total, message, force=force or self.done == self.total)

    async def end(self, message: str) -> None:
        if self._progress is not None:
            self._progress.done, self._progress.total = self.done, self.total
            with anyio.move_on_after(5, shield=True):
                await self._progress.end(message)
