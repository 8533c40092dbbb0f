"""RollingContext: which part of a branch a request carries, and the rolling summary.

Owns (seed 000 section 2, seed 004 section 4.3): validating a session's stored
RollingContextSummary against the active branch, planning with ``planner.py`` under the
session's TruncationStrategy, refreshing the summary with a model call, and the fallback.

Must stay true:
- the stored branch is never changed; only which messages the request copy carries;
- a summary is used only while the exact ids it covers are still the prefix of the branch
  being answered. Checked cheaply on every request: walking up from the leaf must meet the
  summary's last covered id (the parent links above it never change: deleting a branch
  deletes everything below it, and ``chat:messages:delete`` of one message, which re-parents
  its children, drops a summary that covers it in the same transaction; so meeting it
  means the prefix root -> it is the one summarized).
  Once per process and summary, the full id list is also compared one by one. An edit (a
  new sibling), a delete or a branch switch above that id makes the walk miss it;
- a refresh stores the new summary with the ids of the whole prefix it now covers; it
  plans on the branch and summary as read under the session's lock (a compaction that
  wrote a summary after the request read the branch is seen), and refuses to store when
  the ids stored are no longer those of the summary it merged;
- if the refresh fails, the request carries the still-valid previous summary (if any) and
  the recent window only, never the full history;
- summaries are written and compacted under a per-session lock (an entry only while in
  use); one verified summary key is remembered per session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import msgspec

from protocol.context import AssistantProfile, TruncationStrategy
from protocol.types import MessageV2, SessionV2, TextPart
from sidecar.errors import NotFound, SidecarError
from sidecar.pipeline import planner
from sidecar.pipeline import tokens as tk
from sidecar.pipeline.locks import KeyedLocks
from sidecar.pipeline.summary import Summarizer
from sidecar.pipeline.token_cache import TokenLedger
from sidecar.store.async_store import AsyncStore
from sidecar.store.context import ContextRepo, StoredSummary
from sidecar.store.ids import now_ms
from sidecar.store.store import Store

__all__ = ["RollingContext", "ContextWindow", "CompactOutcome", "BranchRead"]

log = logging.getLogger(__name__)


class ContextWindow(msgspec.Struct, kw_only=True):
    """The part of the branch one request carries."""

    messages: list[MessageV2]
    """Sent verbatim, root side first."""
    summary: StoredSummary | None = None
    """A validated summary of everything before ``messages`` (goes into the system prompt)."""
    strategy: TruncationStrategy = "summarize-old"
    estimated: int = 0
    """Estimated tokens of the branch part considered (summary + messages after it)."""
    branch_length: int = 0
    refreshed: bool = False
    failure: str | None = None
    """Why the summary refresh failed (the request then carries the recent window only)."""
    tokens: list[int] = []
    """The estimated tokens of each of ``messages`` (the ledger's counts)."""


class CompactOutcome(msgspec.Struct, kw_only=True):
    compacted: bool
    summary: StoredSummary | None
    window_count: int
    tokens_before: int
    tokens_after: int


class BranchRead(msgspec.Struct, kw_only=True):
    """What planning a request reads of a branch: the summary that still holds, the
    messages after it with their token counts."""

    summary: StoredSummary | None
    tail: list[MessageV2]
    tokens: list[int]
    summary_tokens: int
    covered_count: int


class RollingContext:
    def __init__(
        self,
        store: AsyncStore,
        ledger: TokenLedger,
        summarizer: Summarizer | None,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._store = store
        self._repo: ContextRepo = store.blocking.context
        self._ledger = ledger
        self._summarizer = summarizer
        self._clock = clock
        self._verified: dict[str, tuple[int, str]] = {}
        """session id -> (updated_at, last covered id) of its summary whose ids were compared."""
        self._locks = KeyedLocks()

    # ---- the request path -------------------------------------------------------------

    async def prepare(
        self,
        *,
        session: SessionV2,
        leaf_id: str,
        assistant: AssistantProfile,
        strategy: TruncationStrategy,
        encoding: str,
        read: BranchRead | None = None,
        threshold: int | None = None,
        summary_max_tokens: int | None = None,
        refresh: bool = True,
        reserved: int = 0,
    ) -> ContextWindow:
        """``read``: the result of ``read_branch`` for these arguments when the caller already
        made it (in the same worker-thread hop as its own reads). ``threshold``: the one in
        effect (the context budget's: the smaller of compressThreshold and what fits), default
        compressThreshold less ``reserved``, the tokens the system prompt needs beyond the
        history (Soul.md, the basic memory text; never below half of it);
        ``summary_max_tokens`` bounds a refreshed summary; ``refresh=False`` plans without
        calling a model (the current summary, the planned window)."""
        if threshold is None:
            threshold = planner.effective_threshold(assistant.context.compress_threshold)
            threshold = max(threshold - max(0, reserved), threshold // 2)
        if read is None:
            read = await self._store.run(lambda _: self.read_branch(session.id, leaf_id, encoding, strategy))
        if strategy not in ("sliding-window", "smart-select"):
            if not refresh:
                return _plan_summarize(read, strategy, threshold)[1]
            return await self._prepare_summarized(
                session, leaf_id, assistant, strategy, encoding, read, threshold, summary_max_tokens
            )
        length = read.covered_count + len(read.tail)
        if strategy == "sliding-window":
            plan = planner.plan_sliding(read.tokens, [m.role for m in read.tail], threshold=threshold)
            return ContextWindow(
                messages=read.tail[plan.window_start :], strategy=strategy, estimated=plan.estimated,
                branch_length=length, tokens=read.tokens[plan.window_start :],
            )
        # smart-select
        plan = planner.plan_smart(
            read.tokens, [m.role for m in read.tail], [_plain_text(m) for m in read.tail], threshold=threshold
        )
        indices = plan.kept_older + list(range(plan.window_start, len(read.tail)))
        return ContextWindow(
            messages=[read.tail[i] for i in indices], strategy=strategy, estimated=plan.estimated,
            branch_length=length, tokens=[read.tokens[i] for i in indices],
        )

    async def _prepare_summarized(
        self,
        session: SessionV2,
        leaf_id: str,
        assistant: AssistantProfile,
        strategy: TruncationStrategy,
        encoding: str,
        read: BranchRead,
        threshold: int,
        summary_max_tokens: int | None,
    ) -> ContextWindow:
        plan, window = _plan_summarize(read, strategy, threshold)
        if not plan.refresh:
            return window
        async with self._locks.hold(session.id):
            # the branch was read before the lock: a compaction may have written a summary
            # since, and merging the old one with these messages would cover ids twice
            read = await self._store.run(lambda _: self.read_branch(session.id, leaf_id, encoding, strategy))
            plan, window = _plan_summarize(read, strategy, threshold)
            if not plan.refresh:
                return window
            try:
                window.summary = await self._refresh(
                    session, assistant, read.summary, read.tail[: plan.window_start], encoding, None,
                    max_tokens=summary_max_tokens,
                )
                window.refreshed = True
            except SidecarError as exc:
                log.warning("rolling summary of session %s failed: %s", session.id, exc.message)
                window.failure = exc.message
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:  # a bug: still never the full history
                log.exception("rolling summary of session %s failed", session.id)
                window.failure = f"internal error: {type(exc).__name__}"
        return window

    # ---- manual compaction ------------------------------------------------------------

    async def compact(
        self,
        *,
        session: SessionV2,
        leaf_id: str,
        assistant: AssistantProfile,
        encoding: str,
        target_tokens: int | None,
        instructions: str | None,
    ) -> CompactOutcome:
        """Run the summarize-old planner now with ``target_tokens`` as the threshold (forced).
        A failure of the summary call raises (the caller asked for it explicitly)."""
        async with self._locks.hold(session.id):
            read = await self._store.run(lambda _: self._read(session.id, leaf_id, encoding, True))
            target = target_tokens if target_tokens is not None else assistant.context.compress_threshold
            plan = planner.plan_summarize(
                read.tokens,
                [m.role for m in read.tail],
                summary_tokens=read.summary_tokens,
                covered_count=read.covered_count,
                target=planner.effective_threshold(target),
                force=True,
            )
            if not plan.refresh:
                return CompactOutcome(
                    compacted=False, summary=read.summary, window_count=len(read.tail),
                    tokens_before=plan.estimated, tokens_after=plan.estimated,
                )
            summary = await self._refresh(
                session, assistant, read.summary, read.tail[: plan.window_start], encoding, instructions
            )
            after = summary.tokens + sum(read.tokens[plan.window_start :])
            return CompactOutcome(
                compacted=True, summary=summary, window_count=len(read.tail) - plan.window_start,
                tokens_before=plan.estimated, tokens_after=after,
            )

    async def valid_summary(self, session_id: str, leaf_id: str | None) -> tuple[StoredSummary | None, bool]:
        """The stored summary and whether it is valid for the branch ending at ``leaf_id``."""

        def check(_: Store) -> tuple[StoredSummary | None, bool]:
            summary = self._repo.get_summary(session_id)
            if summary is None or leaf_id is None:
                return summary, False
            rows = self._repo.walk(session_id, leaf_id, stop_id=summary.last_covered_id)
            return summary, bool(rows) and self._is_prefix(summary, rows)

        return await self._store.run(check)

    # ---- internals --------------------------------------------------------------------

    def forget(self, session_id: str) -> None:
        """Drop what is remembered about a session (it was deleted)."""
        self._verified.pop(session_id, None)

    def read_branch(self, session_id: str, leaf_id: str, encoding: str, strategy: TruncationStrategy) -> BranchRead:
        """What ``prepare`` plans on (blocking: call it from a worker thread)."""
        return self._read(session_id, leaf_id, encoding, strategy == "summarize-old")

    def _read(self, session_id: str, leaf_id: str, encoding: str, use_summary: bool) -> BranchRead:
        summary = self._repo.get_summary(session_id) if use_summary else None
        if summary is not None:
            rows = self._repo.walk(session_id, leaf_id, stop_id=summary.last_covered_id)
            if rows and self._is_prefix(summary, rows):
                tail = rows[1:]
                return BranchRead(
                    summary=summary, tail=tail, tokens=self._ledger.counts(tail, encoding),
                    summary_tokens=tk.count_text(summary.text, encoding) + tk.MESSAGE_OVERHEAD,
                    covered_count=summary.covered_count,
                )
            full = rows if rows and rows[0].parent_id is None else self._repo.walk(session_id, leaf_id)
        else:
            full = self._repo.walk(session_id, leaf_id)
        if not full and leaf_id:
            raise NotFound(f"message {leaf_id!r} is not in session {session_id!r}")
        return BranchRead(summary=None, tail=full, tokens=self._ledger.counts(full, encoding), summary_tokens=0,
                     covered_count=0)

    def _is_prefix(self, summary: StoredSummary, rows: list[MessageV2]) -> bool:
        """``rows`` is the walk leaf -> the summary's last id (root side first)."""
        if rows[0].id != summary.last_covered_id:
            return False
        key = (summary.updated_at, summary.last_covered_id)
        if self._verified.get(summary.session_id) == key:
            return True
        covered = self._repo.summary_ids(summary.session_id)
        ok = covered is not None and covered == self._repo.path_ids(summary.session_id, summary.last_covered_id)
        if ok:
            self._verified[summary.session_id] = key
        return ok

    async def _refresh(
        self,
        session: SessionV2,
        assistant: AssistantProfile,
        previous: StoredSummary | None,
        newly: list[MessageV2],
        encoding: str,
        instructions: str | None,
        *,
        max_tokens: int | None = None,
    ) -> StoredSummary:
        if self._summarizer is None:
            raise SidecarError("no summary model is available")
        chosen = assistant.context.summary_model
        provider_id = chosen.provider_id if chosen else session.provider_id
        model_id = chosen.model_id if chosen else session.model_id
        text = await self._summarizer.summarize(
            previous=previous.text if previous else None,
            messages=newly,
            provider_id=provider_id,
            model_id=model_id,
            instructions=instructions,
            session_id=session.id,
            max_tokens=max_tokens,
        )

        def store(_: Store) -> StoredSummary:
            before = (self._repo.summary_ids(session.id) or []) if previous is not None else []
            if previous is not None and (
                len(before) != previous.covered_count or not before or before[-1] != previous.last_covered_id
            ):
                # never store a summary whose ids would not be the branch's prefix
                raise SidecarError("the rolling summary changed while it was being refreshed")
            covered = before + [m.id for m in newly]
            saved = self._repo.put_summary(
                session.id, text=text, covered_ids=covered,
                tokens=tk.count_text(text, encoding) + tk.MESSAGE_OVERHEAD, model_id=model_id or None,
                now=max(self._clock(), (previous.updated_at + 1) if previous else 0),
            )
            self._verified[saved.session_id] = (saved.updated_at, saved.last_covered_id)
            return saved

        return await self._store.run(store)


def _plan_summarize(read: BranchRead, strategy: TruncationStrategy, threshold: int) -> tuple[planner.RollingPlan, ContextWindow]:
    plan = planner.plan_summarize(
        read.tokens,
        [m.role for m in read.tail],
        summary_tokens=read.summary_tokens,
        covered_count=read.covered_count,
        threshold=threshold,
    )
    window = ContextWindow(
        messages=read.tail[plan.window_start :], summary=read.summary, strategy=strategy,
        estimated=plan.estimated, branch_length=read.covered_count + len(read.tail),
        tokens=read.tokens[plan.window_start :],
    )
    return plan, window


def _plain_text(message: MessageV2) -> str:
    if message.parts:
        return " ".join(p.text for p in message.parts if isinstance(p, TextPart))
    return message.text_content or ""

