"""The reply lifecycle's driver interface: how a reply ends (Completed, Failed, Aborted,
Paused), what a job is (ReplyJob, ReplyServices, Pricing), what a driver calls
(ReplyFeed) and overrides (ReplyDriver). The contract is the package docstring
(sidecar/engine/lifecycle/__init__.py); the one implementation is runner.ReplyLifecycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from protocol.events import (
    FinishReason,
    NoticeCode,
    PlanEntry,
    StreamToolCall,
    ToolApprovalOption,
)
from protocol.providers import ReasoningLevel
from protocol.types import Citation, ContentPart, MessageV2, SessionV2, Usage
from sidecar.notify import Notifier
from sidecar.engine.reply import ReplyBuilder, ReplySnapshot
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from sidecar.store.async_store import AsyncStore
    from sidecar.store.store import Store

__all__ = [
    "ABORTED",
    "COMPLETED",
    "ERROR",
    "PAUSED",
    "Aborted",
    "Completed",
    "Ending",
    "Failed",
    "Paused",
    "Pricing",
    "ReplyDriver",
    "ReplyFeed",
    "ReplyJob",
    "ReplyServices",
    "StoreWrite",
    "internal_failure",
]

COMPLETED = "completed"
ERROR = "error"
ABORTED = "aborted"
PAUSED = "paused"

StoreWrite = Callable[["Store"], None]
"""A write of a driver's own state, run in the store's worker thread inside the transaction
of the reply's row."""


# ---- endings ----------------------------------------------------------------------------


class Completed(msgspec.Struct, frozen=True):
    finish_reason: FinishReason = "stop"


class Failed(msgspec.Struct, frozen=True):
    error: SidecarError
    close_open: bool = True
    """False: the driver left nothing open (its ``close`` hook is skipped)."""


class Aborted(msgspec.Struct, frozen=True):
    reason: str | None = None


class Paused(msgspec.Struct, frozen=True):
    pass


Ending = Completed | Failed | Aborted | Paused


def internal_failure(exc: BaseException, doing: str) -> SidecarError:
    """The failure a reply ends with when ``exc`` escaped its driver: a SidecarError (a store
    failure) as it is, anything else as an internal error naming only its type."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, SidecarError):
        return exc
    return SidecarError(f"internal error while {doing}: {type(exc).__name__}")


# ---- what a job is ------------------------------------------------------------------------


class LiveReply(Protocol):
    """A running reply's in-flight content (the ReplyLifecycle, runner.py, while it runs)."""

    def overlay(self, message: MessageV2) -> MessageV2: ...


class ReplyJob(msgspec.Struct, kw_only=True):
    """One run of a reply: the assistant message ``message_id``, a child of ``parent_id``."""

    session: SessionV2
    message_id: str
    parent_id: str
    provider_id: str
    model_id: str
    temperature: float | None = None
    reasoning: ReasoningLevel | None = None
    """A reasoning level for this reply only (a per-send option); None: the settings'."""
    tools: bool = True
    """False: no tools are offered for this reply (a per-send option)."""
    resume: MessageV2 | None = None
    """A paused reply to continue (its stored content, usage and seq), instead of a new one."""
    steps: int = 0
    """Model steps taken so far (direct mode; a resumed reply keeps counting)."""
    prepared: object | None = None
    """Reads the turn made ahead for its driver (direct mode: the first request's
    RequestBuilder.Prepared), or None; a driver checks the type it expects."""
    abort_reason: str | None = None
    """Set by whoever cancels the job (abort, a newer send, shutdown)."""
    stop_grace: float = 0.0
    """How much longer than ChatEngine's STOP_TIMEOUT_S a stop may take (set by a driver
    whose cleanup is slower, e.g. an ACP agent's cancel timeout)."""
    publish: bool = True
    """Send ``chat:session:updated`` after the ending (off at shutdown)."""
    outcome: str | None = None
    """completed | error | aborted | paused, once the job has ended."""
    ended_session: SessionV2 | None = None
    """The session as stored after the ending (what ``chat:session:updated`` carried)."""
    live: LiveReply | None = None
    """The lifecycle while it runs: the in-flight content for ``chat:messages:get``."""
    pausing: bool = False
    """Set by a driver that has decided to pause (before its ``tool_approval_required``
    events): the in-flight content is shown ``paused`` until the paused row is stored."""


# ---- collaborators ------------------------------------------------------------------------


class Pricing(Protocol):
    async def cost(self, provider_id: str, model_id: str, usage: Usage) -> float:
        """USD cost of ``usage`` (0 when unknown); SidecarError when it cannot be known."""
        ...


class ReplyServices:
    """What every lifecycle of a process shares (built once by ChatEngine)."""

    __slots__ = ("store", "notify", "pricing")

    def __init__(self, *, store: AsyncStore, notify: Notifier, pricing: Pricing) -> None:
        self.store = store
        self.notify = notify
        self.pricing = pricing


class ReplyFeed(Protocol):
    """What a driver feeds a reply with (see the module docstring)."""

    @property
    def content(self) -> ReplyBuilder: ...

    async def text(self, delta: str) -> None: ...

    async def thinking(self, delta: str, signature: str | None = None) -> None: ...

    async def tool_call_started(self, call_id: str, name: str, arguments: str = "") -> None: ...

    async def tool_call_arguments(self, call_id: str, name: str, fragment: str) -> None: ...

    async def tool_use(self, call_id: str, name: str, arguments: str) -> int: ...

    async def tool_result(
        self, call_id: str, output: str, is_error: bool, *, replace: int | None = None, announce: bool = True
    ) -> int: ...

    async def part(self, part: ContentPart) -> int: ...

    def replace_part(self, index: int, part: ContentPart) -> None: ...

    async def report_usage(self, total: Usage, *, announce: bool = False) -> None: ...

    async def notice(self, text: str, code: NoticeCode | None = None) -> None: ...

    async def plan(self, entries: list[PlanEntry]) -> None: ...

    async def citations(self, records: list[Citation]) -> None: ...

    async def approval_required(
        self,
        call: StreamToolCall,
        *,
        decisions: list[str] | None = None,
        options: list[ToolApprovalOption] | None = None,
        source: str = "tool",
        preview: str | None = None,
    ) -> None: ...


class ReplyDriver:
    """Produces a reply's content; see the module docstring for the contract."""

    doing = "generating the reply"
    """Completes "internal error while ..." when a bug escapes ``drive``."""

    async def drive(self, reply: ReplyFeed) -> Ending:
        raise NotImplementedError

    def persisted(self) -> StoreWrite | None:
        return None

    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None:
        return None

    async def finalize(self, snapshot: ReplySnapshot) -> ReplySnapshot:
        return snapshot

    def final_write(self, outcome: str) -> StoreWrite | None:
        return None
