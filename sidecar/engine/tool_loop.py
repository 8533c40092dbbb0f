"""ToolLoop: the tool calls of direct-mode replies (seed 000 section 8).

Owns deciding, executing, pausing, resuming and closing the tool calls a model step left
without results, and knowing which sessions hold a paused reply. The step loop
(generation.py) asks ``ReplyTools.run`` after every step that made calls; each unanswered
call is checked and its policy decides:
- invalid (unknown tool, arguments not JSON / not matching the schema) -> an error result;
- policy ``auto`` (or already approved) -> run, with a time limit, result spilled if large;
- policy ``deny`` / decision denied -> a structured error result; answered -> the user's text;
- policy ``ask`` -> ``pending`` (stored, audited, a ``tool_approval_required`` event), and
  once the runnable calls of the step have run the reply PAUSES (``run`` returns True; the
  step loop ends its reply ``Paused``). ``chat:tool:approve`` resumes it (ChatEngine.resume
  starts a job with ``resume`` set) once no call of the message is pending.
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

The paused state and restarts: crash recovery (Messages.recover_interrupted) only touches
``pending``/``streaming`` rows, so a ``paused`` reply and its pending calls survive a
restart and can be approved afterwards. A reply that was *running* tools when the process
died is ``aborted`` by recovery; at the next start ToolStore.complete_interrupted gives its
unfinished calls a "cancelled" result before any new send (see sidecar/app.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import anyio

from protocol.events import StreamToolCall
from protocol.settings import ChatSettings
from protocol.types import ToolCall
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
from sidecar.store.async_store import AsyncStore
from sidecar.store.store import Store
from sidecar.store.tools import INTERRUPTED_NOTE, OPEN_STATES, ToolCallRecord, ToolRun, audit_entry
from sidecar.tools.base import ToolContext, ToolOutput
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
def _preview(tool: object, args: dict[str, object]) -> str | None:
    """The tool's preview of a call (a broken preview is logged: the approval still comes)."""
    try:
        return tool.preview(args)  # type: ignore[attr-defined, no-any-return]
    except Exception:
        log.exception("the approval preview of %s failed", getattr(tool, "name", "?"))
        return None


DENIED_RESULT = json.dumps({"error": "denied", "message": "The user denied this tool call. Do not retry it; continue without it."})
POLICY_DENIED_RESULT = json.dumps({"error": "denied", "message": "This tool is disabled by the user's policy."})


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

    @property
    def store(self) -> AsyncStore:
        return self._store

    def for_reply(self, job: ReplyJob) -> ReplyTools:
        return ReplyTools(self, job)

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

    async def close_paused(self, session_id: str, reason: str) -> bool:
        """End the session's paused replies as ``aborted``: pending calls are cancelled and
        every unanswered call gets a "not run" result; an ``aborted`` event closes each
        reply's stream (its seq continued).

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
                closed = await self._close_paused_run(session_id, run, reason) or closed
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
        await lifecycle.run(_ClosePaused(self.for_reply(job), reason))
        return True


class ReplyTools:
    """The tool calls of one reply (its job's message)."""

    def __init__(self, loop: ToolLoop, job: ReplyJob) -> None:
        self._loop = loop
        self._store = loop.store
        self._job = job
        self._has_run = job.resume is not None
        """A tool_runs row exists for this reply."""

    async def run(self, reply: ReplyFeed, registry: ToolRegistry) -> bool:
        """Decide and run the reply's unanswered calls; True when some wait for the user."""
        job = self._job
        approvals = self._loop.approvals
        calls = reply.content.unanswered_calls()
        begin = None if self._has_run else ToolRun(
            message_id=job.message_id, session_id=job.session.id, provider_id=job.provider_id,
            model_id=job.model_id, temperature=job.temperature, steps=job.steps,
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
        results: dict[str, ToolOutput] = {}
        runnable: list[tuple[ToolCall, CheckedCall]] = []
        to_ask: list[ApprovalRequest] = []
        previews: dict[str, str | None] = {}
        new_rows: list[ToolCallRecord] = []
        audits = []
        for call, checked in zip(calls, checks):
            record = known.get(call.id)
            if record is None:
                row = ToolCallRecord(
                    message_id=job.message_id, tool_call_id=call.id, session_id=job.session.id,
                    tool_name=call.name, arguments=call.arguments, step=job.steps, state="done",
                )
                if checked.error is not None:
                    results[call.id] = ToolOutput(text=checked.error, is_error=True)
                    new_rows.append(row)
                    continue
                tool = checked.tool
                row.policy_key = tool.name
                policy = "auto"
                if approvals is not None:
                    policy = await approvals.policy(tool.name, tool.default_policy, tool.server_key)
                if policy == "auto":
                    row.state = "approved"
                    new_rows.append(row)
                    audits.append(audit_entry(row, "policy:auto", "policy"))
                    runnable.append((call, checked))
                elif policy == "deny":
                    new_rows.append(row)
                    audits.append(audit_entry(row, "policy:deny", "policy"))
                    results[call.id] = ToolOutput(text=POLICY_DENIED_RESULT, is_error=True)
                else:
                    previews[call.id] = _preview(tool, checked.args)
                    to_ask.append(
                        ApprovalRequest(
                            session_id=job.session.id, message_id=job.message_id, tool_call_id=call.id,
                            tool_name=call.name, arguments=call.arguments, policy_key=tool.name,
                            server_key=tool.server_key, step=job.steps,
                        )
                    )
            elif record.state == "pending":
                if checked.error is None:
                    previews[call.id] = _preview(checked.tool, checked.args)
                to_ask.append(ApprovalRequest(
                    session_id=job.session.id, message_id=job.message_id, tool_call_id=call.id,
                    tool_name=call.name, arguments=call.arguments,
                ))
            elif record.state == "approved":
                if checked.error is not None:
                    results[call.id] = ToolOutput(text=checked.error, is_error=True)
                else:
                    runnable.append((call, checked))
            elif record.state == "denied":
                results[call.id] = ToolOutput(text=DENIED_RESULT, is_error=True)
            elif record.state == "answered":
                results[call.id] = ToolOutput(text=record.answer or "")
            else:  # running/done/cancelled without a result: it was interrupted
                results[call.id] = ToolOutput(text=INTERRUPTED_NOTE, is_error=True)
        if new_rows or audits:
            await self._store.run(lambda s: s.tools.add_calls(new_rows, audits))
        fresh = [r for r in to_ask if r.tool_call_id not in known]
        if fresh and approvals is not None:
            await approvals.open(fresh)
        if runnable:
            results.update(await self._execute(runnable, registry))
        for call in calls:  # results in call order, whatever order they finished in
            output = results.get(call.id)
            if output is not None:
                await self._add_result(reply, call.id, output)
        for request in to_ask:
            await reply.approval_required(
                StreamToolCall(id=request.tool_call_id, name=request.tool_name, arguments=request.arguments),
                preview=previews.get(request.tool_call_id),
            )
        return bool(to_ask)

    async def _execute(
        self, runnable: list[tuple[ToolCall, CheckedCall]], registry: ToolRegistry
    ) -> dict[str, ToolOutput]:
        """Run approved calls concurrently; each is moved approved -> running first."""
        job = self._job
        outputs: dict[str, ToolOutput] = {}
        workspace = Path(job.session.workspace_dir) if job.session.workspace_dir else None

        async def one(call: ToolCall, checked: CheckedCall) -> None:
            started = await self._store.run(
                lambda s: s.tools.transition(job.message_id, call.id, from_states={"approved"}, to_state="running")
            )
            if not started:  # cancelled or decided otherwise meanwhile: never run it
                outputs[call.id] = ToolOutput(text=SUPERSEDED_NOTE, is_error=True)
                return
            ctx = ToolContext(
                session=job.session, message_id=job.message_id, tool_call_id=call.id,
                data_dir=self._loop.data_dir, workspace=workspace,
            )
            outputs[call.id] = await registry.execute(checked, ctx)

        async with anyio.create_task_group() as tg:
            for call, checked in runnable:
                tg.start_soon(one, call, checked)
        return outputs

    async def _add_result(self, reply: ReplyFeed, call_id: str, output: ToolOutput) -> None:
        message_id = self._job.message_id
        await reply.tool_result(call_id, output.text, output.is_error)
        await self._store.run(
            lambda s: s.tools.transition(message_id, call_id, from_states=OPEN_STATES, to_state="done")
        )

    async def close(self, reply: ReplyFeed, note: str, *, announce: bool) -> None:
        """Every unanswered call gets the error result ``note`` and ends ``cancelled`` (with
        a ``tool_result`` event when ``announce``), so the stored reply stays a valid history."""
        calls = reply.content.unanswered_calls()
        for call in calls:
            await reply.tool_result(call.id, note, True, announce=announce)
        if calls and self._has_run:
            message_id = self._job.message_id

            def cancel(s: Store) -> None:
                for call in calls:
                    s.tools.transition(message_id, call.id, from_states=OPEN_STATES, to_state="cancelled")

            await self._store.run(cancel)

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
