"""ApprovalService: the one approval flow for tool calls (direct-mode tool loop and ACP).

Owns the Pending -> Approved / Denied / Answered decision of a tool call (seed 000 section
8), the stored policies (auto / ask / deny per tool name or per ``mcp:<server>``), the
remembered "always allow" decisions and the audit trail of every decision.

Public API (``app.approvals``; helper E's ACP bridge builds on it, keep it stable)::

    approvals = ApprovalService(store)                 # the AsyncStore (its ``tools`` repository)

    await approvals.policy(key, default="ask", server_key=None) -> "auto" | "ask" | "deny"
        # a stored policy for ``key`` wins, then one for ``server_key``, else ``default``

    # A caller that waits in-process (ACP session/request_permission):
    decision = await approvals.ask(ApprovalRequest(...), announce=emit)
        # policy auto/deny: decided at once (actor "policy"), ``announce`` is not called;
        # otherwise the call is stored as pending (audit "requested"), ``await
        # announce(request)`` lets the caller send its tool_approval_required event with
        # its own StreamRelay, then ``ask`` waits until chat:tool:approve decides it or
        # ``cancel`` is called; if the caller is cancelled the call is recorded cancelled
        # and the cancellation re-raised. Returns a Decision (decision, answer, option_id
        # chosen among the request's options, remember, actor).

    # The tool loop (its pause survives a restart, so nobody waits in-process):
    await approvals.open(requests)                      # store them pending (audit "requested")
    approvals.on_settled["tool"] = resume               # async (session_id, message_id) -> bool
        # called when the last pending call of a message was decided; True = resumed

    await approvals.cancel(session_id, message_id=None, note=...) -> list[ToolCallRecord]
        # pending calls -> cancelled (audited, in-process waiters get "cancelled")

    # methods bound in sidecar/server.py
    approve(ToolApproveParams) -> ToolApproveResult     chat:tool:approve
    decide_by_rule(ToolApproveParams, note)             the V1 endpoint's rules (actor compat)
    list_pending(ToolPendingListParams) -> list[PendingToolCall]   tool:pending:list
    get_policies(EmptyParams) / set_policy(ToolPolicySetParams) -> list[ToolPolicy]
    list_audit(ToolAuditListParams) -> list[ToolAuditEntry]        tool:audit:list

Must stay true:
- a decision is accepted only for a call that is pending *now* (a conditional update in
  the store); a second decision for the same call is BAD_STATE, never a second run;
- every decision (user, policy, system, a V1 rule) leaves an audit row with the call's
  arguments, naming who decided (a rule's decision is never recorded as the user's);
- ``remember`` with approved stores policy auto for the call's policy key (its tool name
  unless the requester named another key, e.g. ``acp:<engine>:<kind>``); with denied, deny.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.events import ApprovalSource, ToolApprovalOption
from protocol.common import EmptyParams
from protocol.tools import (
    AuditActor,
    AuditDecision,
    PendingToolCall,
    ToolApproveParams,
    ToolApproveResult,
    ToolAuditEntry,
    ToolAuditListParams,
    ToolPendingListParams,
    ToolPolicy,
    ToolPolicySetParams,
)
from sidecar.errors import InvalidParams, NotFound, SidecarError
from sidecar.store.async_store import AsyncStore
from sidecar.store.tools import ToolCallRecord, audit_entry

__all__ = ["ApprovalService", "ApprovalRequest", "Decision", "Policy", "pick_option"]

Policy = Literal["auto", "ask", "deny"]
DecisionKind = Literal["approved", "denied", "answered", "cancelled"]
Settled = Callable[[str, str], Awaitable[bool]]

MAX_ANSWER_CHARS = 100_000


class ApprovalRequest(msgspec.Struct, kw_only=True):
    """A tool call that may need the user's decision."""

    session_id: str
    message_id: str
    """The assistant message the call belongs to."""
    tool_call_id: str
    tool_name: str
    arguments: str
    """The arguments as JSON text (shown to the user, stored in the audit trail)."""
    source: ApprovalSource = "tool"
    """``tool`` (direct-mode tool loop) or ``acp``."""
    policy_key: str | None = None
    """Key of the policy that decides it and that ``remember`` sets (default: tool_name)."""
    server_key: str | None = None
    """A second policy key consulted when ``policy_key`` has none (``mcp:<server>``)."""
    default_policy: Policy = "ask"
    options: list[ToolApprovalOption] | None = None
    """ACP permission options; the Decision names the one chosen."""
    step: int = 0


class Decision(msgspec.Struct, kw_only=True):
    decision: DecisionKind
    actor: str
    """user | policy | system | compat"""
    answer: str | None = None
    option_id: str | None = None
    remember: bool = False


class _Waiter:
    __slots__ = ("event", "decision")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.decision: Decision | None = None


class ApprovalService:
    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._waiters: dict[tuple[str, str], _Waiter] = {}
        self.on_settled: dict[str, Settled] = {}
        """source -> callback run when the last pending call of a message was decided."""

    # ---- policy -----------------------------------------------------------------------

    async def policy(self, key: str, default: Policy = "ask", server_key: str | None = None) -> Policy:
        keys = [key] + ([server_key] if server_key else [])
        stored = await self._store.run(lambda s: s.tools.policies(keys))
        for k in keys:
            if k in stored:
                return stored[k].policy
        return default

    async def policies_for(self, keys: Iterable[str]) -> dict[str, ToolPolicy]:
        wanted = list(keys)
        return await self._store.run(lambda s: s.tools.policies(wanted))

    # ---- in-process waiting (ACP) -------------------------------------------------------

    async def ask(
        self,
        request: ApprovalRequest,
        announce: Callable[[ApprovalRequest], Awaitable[None]] | None = None,
    ) -> Decision:
        policy = await self.policy(
            request.policy_key or request.tool_name, request.default_policy, request.server_key
        )
        call = _record(request, "pending")
        if policy != "ask":
            decision = Decision(
                decision="approved" if policy == "auto" else "denied",
                actor="policy",
                option_id=pick_option(request.options, policy == "auto", False),
            )
            call.state = "done"
            audit = [audit_entry(call, "policy:auto" if policy == "auto" else "policy:deny", "policy")]
            await self._store.run(lambda s: s.tools.add_calls([call], audit))
            return decision
        waiter = _Waiter()
        self._waiters[(request.message_id, request.tool_call_id)] = waiter
        try:
            await self.open([request])
            if announce is not None:
                await announce(request)
            await waiter.event.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._cancel_calls([call], "the request was cancelled")
            raise
        finally:
            self._waiters.pop((request.message_id, request.tool_call_id), None)
        assert waiter.decision is not None
        if waiter.decision.decision != "cancelled":
            await self._store.run(
                lambda s: s.tools.transition(
                    request.message_id, request.tool_call_id,
                    from_states={"approved", "denied", "answered"}, to_state="done",
                )
            )
        return waiter.decision

    # ---- the tool loop ------------------------------------------------------------------

    async def open(self, requests: list[ApprovalRequest]) -> None:
        """Store ``requests`` as pending calls (audit "requested")."""
        calls = [_record(r, "pending") for r in requests]
        audit = [audit_entry(c, "requested", "system") for c in calls]
        await self._store.run(lambda s: s.tools.add_calls(calls, audit))

    async def cancel(
        self, session_id: str, message_id: str | None = None, *, note: str
    ) -> list[ToolCallRecord]:
        """Pending calls of the session (or of one message) -> cancelled; waiters woken."""
        calls = await self._store.run(lambda s: s.tools.list_open(session_id=session_id, states=("pending",)))
        if message_id is not None:
            calls = [c for c in calls if c.message_id == message_id]
        return await self._cancel_calls(calls, note)

    async def _cancel_calls(self, calls: list[ToolCallRecord], note: str) -> list[ToolCallRecord]:
        done: list[ToolCallRecord] = []
        for call in calls:
            audit = audit_entry(call, "cancelled", "system", note=note)
            moved = await self._store.run(
                lambda s: s.tools.transition(
                    call.message_id, call.tool_call_id, from_states={"pending"}, to_state="cancelled", audit=audit,
                )
            )
            if moved:
                done.append(call)
                self._wake(call, Decision(decision="cancelled", actor="system"))
        return done

    def _wake(self, call: ToolCallRecord, decision: Decision) -> bool:
        waiter = self._waiters.get((call.message_id, call.tool_call_id))
        if waiter is None:
            return False
        waiter.decision = decision
        waiter.event.set()
        return True

    # ---- methods ------------------------------------------------------------------------

    async def approve(self, params: ToolApproveParams) -> ToolApproveResult:
        """``chat:tool:approve``: the user's decision."""
        return await self._decide(params, "user", None)

    async def decide_by_rule(self, params: ToolApproveParams, note: str) -> ToolApproveResult:
        """A decision a rule made (the V1 endpoint's ``tool_approval_rules``, a trusted
        ``yolo``): the same flow, audited once as ``rule:allow`` / ``rule:deny`` by actor
        ``compat`` with ``note`` saying which rule, never as the user's. Only approved or
        denied, never remembered."""
        if params.decision not in ("approved", "denied") or params.remember:
            raise InvalidParams("a rule only approves or denies, and remembers nothing")
        return await self._decide(params, "compat", note)

    async def _decide(self, params: ToolApproveParams, actor: AuditActor, rule_note: str | None) -> ToolApproveResult:
        if params.decision == "answered":
            if params.answer is None:
                raise InvalidParams("invalid params: answer is required when decision is 'answered' - at `$.answer`")
            if len(params.answer) > MAX_ANSWER_CHARS:
                raise InvalidParams(f"invalid params: answer is longer than {MAX_ANSWER_CHARS} characters - at `$.answer`")
        found = await self._store.run(
            lambda s: s.tools.find_pending(params.session_id, params.tool_call_id, params.message_id)
        )
        if not found:
            raise NotFound(f"no tool call {params.tool_call_id!r} in session {params.session_id!r}")
        call = found[0]
        if call.state != "pending":
            raise SidecarError(
                f"tool call {params.tool_call_id!r} is not waiting for a decision (it is {call.state})",
                code=ErrorCode.BAD_STATE,
            )
        if call.source != "tool" and params.decision == "answered":
            raise InvalidParams("invalid params: this call accepts only approved or denied - at `$.decision`")
        approved = params.decision == "approved"
        option_id = None
        if call.options:
            option_id = params.option_id or pick_option(call.options, approved, params.remember)
            if option_id not in {o.option_id for o in call.options}:
                raise InvalidParams(f"invalid params: unknown optionId {option_id!r} - at `$.optionId`")
        remember = None
        if params.remember and params.decision in ("approved", "denied"):
            remember = (call.policy_key or call.tool_name, "auto" if approved else "deny")
        if rule_note is not None:
            audit = [audit_entry(call, "rule:allow" if approved else "rule:deny", actor, note=rule_note)]
        else:
            audit = [audit_entry(call, params.decision, actor, answer=params.answer)]
        if remember is not None:
            kept: AuditDecision = "remember:auto" if approved else "remember:deny"
            audit.append(audit_entry(call, kept, "user", note=f"policy of {remember[0]}"))
        remaining = await self._store.run(
            lambda s: s.tools.decide(
                call, state=params.decision, answer=params.answer, option_id=option_id,
                audit=audit, remember=remember,
            )
        )
        if remaining is None:
            raise SidecarError(
                f"tool call {params.tool_call_id!r} was decided or cancelled meanwhile",
                code=ErrorCode.BAD_STATE,
            )
        decision = Decision(
            decision=params.decision, actor=actor, answer=params.answer,
            option_id=option_id, remember=params.remember,
        )
        if self._wake(call, decision):
            return ToolApproveResult(resumed=False)
        resumed = False
        settled = self.on_settled.get(call.source)
        if remaining == 0 and settled is not None:
            resumed = await settled(call.session_id, call.message_id)
        return ToolApproveResult(resumed=resumed)

    async def list_pending(self, params: ToolPendingListParams) -> list[PendingToolCall]:
        calls = await self._store.run(lambda s: s.tools.list_open(session_id=params.session_id, states=("pending",)))
        return [
            PendingToolCall(
                session_id=c.session_id, message_id=c.message_id, tool_call_id=c.tool_call_id,
                tool_name=c.tool_name, arguments=c.arguments, source=c.source, options=c.options,
                created_at=c.created_at,
            )
            for c in calls
        ]

    async def get_policies(self, params: EmptyParams | None = None) -> list[ToolPolicy]:
        stored = await self._store.run(lambda s: s.tools.policies(None))
        return list(stored.values())

    async def set_policy(self, params: ToolPolicySetParams) -> list[ToolPolicy]:
        await self._store.run(lambda s: s.tools.set_policy(params.key, params.policy))
        return await self.get_policies()

    async def list_audit(self, params: ToolAuditListParams) -> list[ToolAuditEntry]:
        return await self._store.run(
            lambda s: s.tools.list_audit(
                session_id=params.session_id, tool_call_id=params.tool_call_id,
                limit=params.limit, offset=params.offset,
            )
        )


def _record(request: ApprovalRequest, state: str) -> ToolCallRecord:
    return ToolCallRecord(
        message_id=request.message_id,
        tool_call_id=request.tool_call_id,
        session_id=request.session_id,
        tool_name=request.tool_name,
        arguments=request.arguments,
        source=request.source,
        policy_key=request.policy_key,
        options=request.options,
        state=state,
        step=request.step,
    )


def pick_option(options: list[ToolApprovalOption] | None, approved: bool, remember: bool) -> str | None:
    """The ACP option matching a decision: allow/reject, once/always (falls back across)."""
    if not options:
        return None
    verb = "allow" if approved else "reject"
    order = [f"{verb}_always", f"{verb}_once"] if remember else [f"{verb}_once", f"{verb}_always"]
    for kind in order:
        for option in options:
            if option.kind == kind:
                return option.option_id
    return None

