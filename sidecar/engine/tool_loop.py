"""ToolLoop: the tool calls of direct-mode replies (seed 000 section 8).

Owns deciding, executing, pausing, resuming and closing the tool calls a model step left
without results, and knowing which sessions hold a paused reply. The step loop
(generation.py) asks ``ReplyTools.run`` after every step that made calls; each unanswered
call is checked and its policy decides:
- invalid (unknown tool, arguments not JSON / not matching the schema) -> an error result;
- policy ``auto`` (or already approved) -> run, with a time limit, result spilled if large;
- policy ``deny`` / decision denied -> a structured error result; answered -> the user's text;
- policy ``ask`` -> ``pending`` (stored and audited before the runnable calls run, so
  ``tool:pending:list`` shows it at once). Pausing and resuming are one decision: once the
  runnable calls of the step have run, the decisions made meanwhile are applied (an
  approved call runs in the same step); only calls still pending then make the reply
  PAUSE (``tool_approval_required`` events, ``run`` returns True, the step loop ends its
  reply ``Paused``; from the first event on ``chat:messages:get`` shows it ``paused``).
  A decision made after that last read resumes the paused reply (ChatEngine.resume waits
  for the paused row, then starts a job with ``resume`` set) once no call is pending.
Results go into the same assistant message as ToolResultPart (no TOOL messages), each with
a ``tool_result`` event, in call order whatever order the calls finished in.

Must stay true:
- a pending call never runs: only calls moved ``approved -> running`` by a conditional
  store update are executed;
- cancellation propagates into running tools (a command is killed); the reply's ending
  (``cancel_open``) gives every call that had not finished a "cancelled" result, so the
  stored reply stays a valid history, and cancels the calls still pending;
- a reply's run (``tool_runs``) is written before its first call and ends with the reply:
  ``paused`` with its steps, or ``done``, in the transaction of the reply's row
  (``final_write``).

The paused state and restarts: crash recovery (MessageRepo.recover_interrupted) only touches
``pending``/``streaming`` rows, so a ``paused`` reply and its pending calls survive a
restart and can be approved afterwards. A reply that was *running* tools when the process
died is ``aborted`` by recovery; at the next start ToolStore.complete_interrupted gives its
unfinished calls a "cancelled" result before any new send (see sidecar/app.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import anyio

from protocol.events import StreamToolCall
from protocol.settings import ChatSettings
from protocol.types import Citation, ToolCall
from sidecar.engine.approvals import ApprovalRequest, ApprovalService
from sidecar.engine.lifecycle import (
    FINALIZE_TIMEOUT_S,
    PAUSED,
    Aborted,
    Ending,
    Failed,
    ReplyDriver,
    ReplyFeed,
    ReplyJob,
    ReplyLifecycle,
    ReplyServices,
    StoreWrite,
)
from sidecar.retrieval.citations import CitationLedger
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store
from sidecar.store.tools import INTERRUPTED_NOTE, OPEN_STATES, ToolCallRecord, ToolRun, audit_entry
from sidecar.tools.base import Tool, ToolContext, ToolOutput
from sidecar.tools.registry import CheckedCall, ToolRegistry

__all__ = [
    "ToolLoop",
    "ReplyTools",
    "CANCELLED_NOTE",
    "INTERRUPTED_NOTE",
    "SUPERSEDED_NOTE",
    "DENIED_RESULT",
    "POLICY_DENIED_RESULT",
]

log = logging.getLogger(__name__)

CANCELLED_NOTE = "cancelled: the generation was stopped before this tool call finished"
SUPERSEDED_NOTE = "not run: the user moved on before deciding (superseded by a newer message or aborted)"
def _preview(tool: Tool, args: dict[str, Any]) -> str | None:
    """The tool's preview of a call (a broken preview is logged: the approval still comes)."""
    try:
        return tool.preview(args)
    except Exception:
        log.exception("the approval preview of %s failed", getattr(tool, "name", "?"))
        return None


DENIED_RESULT = json.dumps({"error": "denied", "message": "The user denied this tool call. Do not retry it; continue without it."})
POLICY_DENIED_RESULT = json.dumps({"error": "denied", "message": "This tool is disabled by the user's policy."})


class DecisionGate:
    """Whether the running step of a reply will still read a decision made now.

    Unsealed: the step reads the decisions of its pending calls once its runnable calls
    have run, so a decision made now is applied there. Sealed: the step has made (or is
    making) its last read and may pause; a decision made now is applied by resuming the
    paused reply once it is stored (ChatEngine.resume waits for one or the other)."""

    __slots__ = ("sealed", "_changed")

    def __init__(self) -> None:
        self.sealed = False
        self._changed = anyio.Event()

    def seal(self) -> None:
        self._set(True)

    def unseal(self) -> None:
        self._set(False)

    def _set(self, sealed: bool) -> None:
        if sealed != self.sealed:
            self.sealed = sealed
            self._changed.set()
            self._changed = anyio.Event()

    async def changed(self) -> None:
        await self._changed.wait()


class ToolLoop:
    """The tool calls of every direct-mode reply of the process (one per ChatEngine)."""

    def __init__(
        self,
        *,
        store: AsyncStore,
        approvals: ApprovalService | None,
        data_dir: Path,
        services: ReplyServices,
        settings: Callable[[], ChatSettings],
    ) -> None:
        self._store = store
        self.approvals = approvals
        self.data_dir = data_dir
        self._services = services
        self._settings = settings
        self._paused: set[str] | None = None
        """Sessions that may hold a paused reply (loaded once, then kept here), so a send on
        a session without one costs no extra database hop."""
        self._gates: dict[str, DecisionGate] = {}
        """message id -> the gate of its running job's tool step (while the job runs)."""

    @property
    def store(self) -> AsyncStore:
        return self._store

    def for_reply(self, job: ReplyJob, citations: CitationLedger | None = None) -> ReplyTools:
        """The tool calls of ``job``'s reply; ``citations``: its citation ledger (given to the
        tools it runs, so a knowledge tool numbers what it shows in it)."""
        return ReplyTools(self, job, citations)

    def gate(self, message_id: str) -> DecisionGate:
        gate = self._gates.get(message_id)
        if gate is None:
            gate = self._gates[message_id] = DecisionGate()
        return gate

    def running_gate(self, message_id: str) -> DecisionGate | None:
        """The gate of the reply's running job, if it has reached a tool step."""
        return self._gates.get(message_id)

    def job_ended(self, message_id: str) -> None:
        gate = self._gates.pop(message_id, None)
        if gate is not None:
            gate.seal()  # wakes a waiting approval: the job is over

    # -- sessions with paused replies ----------------------------------------------------

    def is_idle(self, session_id: str) -> bool:
        """True when the session is known to have no paused reply (no database read)."""
        return self._paused is not None and session_id not in self._paused

    def note_paused(self, session_id: str) -> None:
        if self._paused is not None:
            self._paused.add(session_id)

    def forget(self, session_id: str) -> None:
        if self._paused is not None:
            self._paused.discard(session_id)

    async def close_paused(self, session_id: str, reason: str, only: Collection[str] | None = None) -> bool:
        """End the session's paused replies (``only``: those whose message id is in it) as
        ``aborted``: pending calls are cancelled and every unanswered call gets a "not run"
        result; an ``aborted`` event closes each reply's stream (its seq continued).

        Shielded and bounded; the session counts as idle only once every one of its paused
        replies is closed (a failure raises and leaves it to the next call)."""
        if self._paused is None:
            runs = await self._store.run(lambda s: s.tools.runs(state="paused"))
            self._paused = {r.session_id for r in runs}
        if session_id not in self._paused:
            return False
        closed = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINALIZE_TIMEOUT_S):
            runs = await self._store.run(lambda s: s.tools.runs(session_id=session_id, state="paused"))
            for run in runs:
                if only is None or run.message_id in only:
                    closed = await self._close_paused_run(session_id, run, reason) or closed
            if only is None or all(run.message_id in only for run in runs):
                self._paused.discard(session_id)
        return closed

    async def _close_paused_run(self, session_id: str, run: ToolRun, reason: str) -> bool:
        if self.approvals is not None:
            await self.approvals.cancel(session_id, run.message_id, note=reason)

        def reopen(s: Store) -> ReplyJob | None:
            message = s.tools.reopen_message(run.message_id)
            if message is None:
                return None
            return ReplyJob(
                session=s.sessions.get(session_id), message_id=run.message_id, parent_id=message.parent_id or "",
                provider_id=run.provider_id, model_id=run.model_id, resume=message, steps=run.steps,
            )

        job = await self._store.run(reopen)
        if job is None:
            return False
        lifecycle = ReplyLifecycle(job, self._services, self._settings())
        try:
            await lifecycle.run(_ClosePaused(self.for_reply(job), reason))
        finally:
            self.job_ended(run.message_id)
        return True


class ReplyTools:
    """The tool calls of one reply (its job's message)."""

    def __init__(self, loop: ToolLoop, job: ReplyJob, citations: CitationLedger | None = None) -> None:
        self._loop = loop
        self._store = loop.store
        self._job = job
        self._citations = citations
        self._cited: list[Citation] = []
        """Citations of the tool results added to the reply since ``take_cited``."""
        self._has_run = job.resume is not None
        """A tool_runs row exists for this reply."""
        loop.gate(job.message_id)  # from the job's start: approvals look for it

    async def run(self, reply: ReplyFeed, registry: ToolRegistry) -> bool:
        """Decide and run the reply's unanswered calls; True when some wait for the user.

        Pausing is decided once, at the end of the step: after the runnable calls have run,
        the decisions that arrived meanwhile for this step's pending calls are read and
        applied (approved calls run, denied and answered ones get their results), again
        until none arrives; only calls still pending then make the reply pause. A decision
        that arrives after that last read finds the step sealed (``DecisionGate``): the
        approval waits for the paused row and resumes the reply from it."""
        job = self._job
        approvals = self._loop.approvals
        calls = reply.content.unanswered_calls()
        begin = None if self._has_run else ToolRun(
            message_id=job.message_id, session_id=job.session.id, provider_id=job.provider_id,
            model_id=job.model_id, temperature=job.temperature, steps=job.steps, reasoning=job.reasoning,
        )

        def read(s: Store) -> list[ToolCallRecord]:
            if begin is not None:
                s.tools.begin_run(begin)
            return s.tools.calls(job.message_id)

        known = {c.tool_call_id: c for c in await self._store.run(read)}
        self._has_run = True
        # schema validation (jsonschema, imported on first use) can take a while: not on the
        # loop (CPU only: anyio's own threads)
        checks = await anyio.to_thread.run_sync(lambda: [registry.check(c.name, c.arguments) for c in calls])
        checked = {c.id: (c, chk) for c, chk in zip(calls, checks)}
        results: dict[str, ToolOutput] = {}
        runnable: list[tuple[ToolCall, CheckedCall]] = []
        to_ask: list[ApprovalRequest] = []
        previews: dict[str, str | None] = {}
        new_rows: list[ToolCallRecord] = []
        audits = []
        for call, check in zip(calls, checks):
            record = known.get(call.id)
            if record is None:
                row = ToolCallRecord(
                    message_id=job.message_id, tool_call_id=call.id, session_id=job.session.id,
                    tool_name=call.name, arguments=call.arguments, step=job.steps, state="done",
                )
                if check.error is not None:
                    results[call.id] = ToolOutput(text=check.error, is_error=True)
                    new_rows.append(row)
                    continue
                tool = check.tool
                row.policy_key = tool.name
                policy = "auto"
                if approvals is not None:
                    policy = await approvals.policy(tool.name, tool.default_policy, tool.server_key)
                if policy == "auto":
                    row.state = "approved"
                    new_rows.append(row)
                    audits.append(audit_entry(row, "policy:auto", "policy"))
                    runnable.append((call, check))
                elif policy == "deny":
                    new_rows.append(row)
                    audits.append(audit_entry(row, "policy:deny", "policy"))
                    results[call.id] = ToolOutput(text=POLICY_DENIED_RESULT, is_error=True)
                else:
                    previews[call.id] = _preview(tool, check.args)
                    to_ask.append(
                        ApprovalRequest(
                            session_id=job.session.id, message_id=job.message_id, tool_call_id=call.id,
                            tool_name=call.name, arguments=call.arguments, policy_key=tool.name,
                            server_key=tool.server_key, step=job.steps,
                        )
                    )
            elif record.state == "pending":
                if check.error is None:
                    previews[call.id] = _preview(check.tool, check.args)
                to_ask.append(ApprovalRequest(
                    session_id=job.session.id, message_id=job.message_id, tool_call_id=call.id,
                    tool_name=call.name, arguments=call.arguments,
                ))
            else:
                self._apply(record, call, check, results, runnable)
        if new_rows or audits:
            await self._store.run(lambda s: s.tools.add_calls(new_rows, audits))
        fresh = [r for r in to_ask if r.tool_call_id not in known]
        if fresh and approvals is not None:
            await approvals.open(fresh)
        waiting = [r.tool_call_id for r in to_ask]
        gate = self._loop.gate(job.message_id)
        while True:
            if runnable:
                results.update(await self._execute(runnable, registry))
                runnable = []
            if not waiting:
                break
            gate.seal()  # a decision committed from here on may be missed by the read below
            states = {c.tool_call_id: c for c in await self._store.run(lambda s: s.tools.calls(job.message_id))}
            decided = [i for i in waiting if i in states and states[i].state != "pending"]
            if not decided:
                break  # still sealed: the reply pauses
            gate.unseal()
            for call_id in decided:
                call, check = checked[call_id]
                self._apply(states[call_id], call, check, results, runnable)
            waiting = [i for i in waiting if i not in decided]
        for call in calls:  # results in call order, whatever order they finished in
            output = results.get(call.id)
            if output is not None:
                await self._add_result(reply, call.id, output)
        if not waiting:
            gate.unseal()
            return False
        job.pausing = True  # chat:messages:get shows it paused from the first event on
        for request in to_ask:
            if request.tool_call_id in waiting:
                await reply.approval_required(
                    StreamToolCall(id=request.tool_call_id, name=request.tool_name, arguments=request.arguments),
                    preview=previews.get(request.tool_call_id),
                )
        return True

    @staticmethod
    def _apply(
        record: ToolCallRecord,
        call: ToolCall,
        check: CheckedCall,
        results: dict[str, ToolOutput],
        runnable: list[tuple[ToolCall, CheckedCall]],
    ) -> None:
        """What a call that is no longer pending gets: approved runs, denied and answered
        have their results, anything else was interrupted."""
        if record.state == "approved":
            if check.error is not None:
                results[call.id] = ToolOutput(text=check.error, is_error=True)
            else:
                runnable.append((call, check))
        elif record.state == "denied":
            results[call.id] = ToolOutput(text=DENIED_RESULT, is_error=True)
        elif record.state == "answered":
            results[call.id] = ToolOutput(text=record.answer or "")
        elif record.state == "cancelled":
            results[call.id] = ToolOutput(text=SUPERSEDED_NOTE, is_error=True)
        else:  # running/done without a result: it was interrupted
            results[call.id] = ToolOutput(text=INTERRUPTED_NOTE, is_error=True)

    async def _execute(
        self, runnable: list[tuple[ToolCall, CheckedCall]], registry: ToolRegistry
    ) -> dict[str, ToolOutput]:
        """Run approved calls concurrently; each is moved approved -> running first."""
        job = self._job
        outputs: dict[str, ToolOutput] = {}
        workspace = Path(job.session.workspace_dir) if job.session.workspace_dir else None
        session_id, message_id = job.session.id, job.message_id

        async def one(call: ToolCall, checked: CheckedCall) -> None:
            started = await self._store.run(
                lambda s: s.tools.transition(message_id, call.id, from_states={"approved"}, to_state="running")
            )
            if not started:  # cancelled or decided otherwise meanwhile: never run it
                outputs[call.id] = ToolOutput(text=SUPERSEDED_NOTE, is_error=True)
                return
            ctx = ToolContext(
                session=job.session, message_id=message_id, tool_call_id=call.id,
                data_dir=self._loop.data_dir, workspace=workspace, citations=self._citations,
            )
            output = await registry.execute(checked, ctx)
            spilled = output.spilled
            if spilled is not None:  # the reply owns it from now on (removed with the session)
                await self._store.run(
                    lambda s: s.files.own(session_id, message_id, spilled, "spill", workspace=workspace)
                )
            outputs[call.id] = output

        async with anyio.create_task_group() as tg:
            for call, checked in runnable:
                tg.start_soon(one, call, checked)
        return outputs

    def take_cited(self) -> list[Citation]:
        """The Citation records of the results added since the last call (what executed
        knowledge tools showed the model: the reply may cite them)."""
        cited, self._cited = self._cited, []
        return cited

    async def _add_result(self, reply: ReplyFeed, call_id: str, output: ToolOutput) -> None:
        message_id = self._job.message_id
        await reply.tool_result(call_id, output.text, output.is_error)
        if output.citations and not output.is_error:
            self._cited.extend(output.citations)
        await self._store.run(
            lambda s: s.tools.transition(message_id, call_id, from_states=OPEN_STATES, to_state="done")
        )

    async def close(self, reply: ReplyFeed, note: str, *, announce: bool) -> None:
        """Every unanswered call gets the error result ``note`` and ends ``cancelled`` (with
        a ``tool_result`` event when ``announce``), so the stored reply stays a valid history.
        A call whose result reached the reply ends ``done``: the stop may have come between
        its result and its row (``_add_result``), and no row outlives its reply open."""
        calls = reply.content.unanswered_calls()
        for call in calls:
            await reply.tool_result(call.id, note, True, announce=announce)
        if self._has_run and reply.content.tool_calls:
            message_id = self._job.message_id
            unanswered = {call.id for call in calls}
            answered = [call.id for call in reply.content.tool_calls if call.id not in unanswered]

            def settle(s: Store) -> None:
                with s.transaction():  # one commit for the reply's calls, however many steps it took
                    for call_id in unanswered:
                        s.tools.transition(message_id, call_id, from_states=OPEN_STATES, to_state="cancelled")
                    for call_id in answered:
                        s.tools.transition(message_id, call_id, from_states=OPEN_STATES, to_state="done")

            await self._store.run(settle)

    async def cancel_open(self, reply: ReplyFeed) -> None:
        """At an error or aborted ending: calls stored pending just before the stop must not
        stay open; calls that were running (their tasks are cancelled, commands killed) or
        not started get a "cancelled" result."""
        approvals = self._loop.approvals
        if self._has_run and approvals is not None:
            await approvals.cancel(self._job.session.id, self._job.message_id, note=CANCELLED_NOTE)
        await self.close(reply, CANCELLED_NOTE, announce=False)

    def final_write(self, outcome: str) -> StoreWrite | None:
        """The run's state at the reply's ending, for the transaction of its row."""
        if not self._has_run:
            return None
        message_id, steps = self._job.message_id, self._job.steps
        state = "paused" if outcome == PAUSED else "done"
        return lambda s: s.tools.set_run(message_id, state=state, steps=steps)


class _ClosePaused(ReplyDriver):
    """Ends a paused reply as aborted (the user moved on before deciding)."""

    doing = "closing a paused reply"

    def __init__(self, tools: ReplyTools, reason: str) -> None:
        self._tools = tools
        self._reason = reason

    async def drive(self, reply: ReplyFeed) -> Ending:
        return Aborted(self._reason)

    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None:
        await self._tools.close(reply, SUPERSEDED_NOTE, announce=False)

    def final_write(self, outcome: str) -> StoreWrite | None:
        return self._tools.final_write(outcome)
