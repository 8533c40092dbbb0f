"""GenerationHandler: one assistant reply, through the model/tool step loop (seed 000 section 8).

A job is ``run(job)``: resolve the model, assemble the request's tools (ToolService), then
loop: build the request from the stored branch plus this reply's content so far, stream
the provider's parts into a ReplyBuilder (content) and a StreamRelay (events); if the step
left tool calls without results, each call is checked and its policy decides:
- invalid (unknown tool, arguments not JSON / not matching the schema) -> an error result;
- policy ``auto`` (or already approved) -> run, with a time limit, result spilled if large;
- policy ``deny`` / decision denied -> a structured error result; answered -> the user's text;
- policy ``ask`` -> ``pending`` (stored, audited, a ``tool_approval_required`` event), and
  after the runnable calls of the step have run the reply is PAUSED: status ``paused``,
  content and seq stored, the job ends. ``chat:tool:approve`` resumes it (a new job with
  ``resume`` set) once no call of the message is pending; the events continue its seq.
Results go into the same assistant message as ToolResultPart (no TOOL messages), each
with a ``tool_result`` event. At most MAX_STEPS model steps per reply; a reply that wants
more ends with an ``error`` event naming the limit (its last calls get "not run" results).

Must stay true (seed 000 section 9 and its invariants, DESIGN.md section 4):
- ``stream_start`` is the first event of every reply (seq 1), even when it fails at once;
  a resumed reply sends no second one;
- a pending call never runs: only calls moved ``approved -> running`` by a conditional
  store update are executed;
- cancellation propagates into running tools (a command is killed); the aborted state,
  with a "cancelled" result for every call that had not finished, is written and the
  cancellation is re-raised;
- every ending (completed, error, aborted, paused) runs in one shielded, bounded scope
  (``_end``): a stop that arrives while a reply is finishing waits for it; a reply gets
  exactly one final event and its final row (an ending that fails or runs out of time
  falls back to ``error`` with the content so far);
- the last throttled state is flushed (events and database) before the final event;
- a provider/store failure, or a bug, ends this reply with ``error`` and never escapes the
  job; a failed partial write is logged and retried at the next tick;
- nothing already received from the provider is lost: partial text stays in the message.

The paused state and restarts: crash recovery (Messages.recover_interrupted) only touches
``pending``/``streaming`` rows, so a ``paused`` reply and its pending calls survive a
restart and can be approved afterwards. A reply that was *running* tools when the process
died is ``aborted`` by recovery; at the next start ToolStore.complete_interrupted gives its
unfinished calls a "cancelled" result before any new send (see sidecar/app.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import msgspec

from protocol.errors import ErrorCode
from protocol.events import (
    AbortedEvent,
    ErrorEvent,
    StreamEndEvent,
    StreamStartEvent,
    StreamToolCall,
    StreamToolResult,
    ToolApprovalRequiredEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEvent,
    UsageEvent,
)
from protocol.settings import ChatSettings
from protocol.types import MessageV2, SessionV2, ToolCall, Usage
from sidecar.engine.approvals import ApprovalRequest, ApprovalService
from sidecar.engine.relay import StreamRelay
from sidecar.engine.reply import ReplyBuilder
from sidecar.errors import SidecarError
from sidecar.pipeline.builder import Prepared, RequestBuilder
from sidecar.providers.types import (
    Finish,
    GenerationParams,
    RequestMessage,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)
from sidecar.store.tools import ToolCallRecord, ToolRun, audit_entry
from sidecar.tools.base import ToolContext, ToolOutput
from sidecar.tools.registry import CheckedCall, ToolRegistry

log = logging.getLogger(__name__)

FINALIZE_TIMEOUT_S = 10.0
FALLBACK_TIMEOUT_S = 3.0
"""What is left for the fallback ending when the first one failed (both stay under
ChatEngine's STOP_TIMEOUT_S, so a stop waits for the ending instead of giving up)."""
MAX_STEPS = 256
PAUSED = "paused"
ABORTED = "aborted"
CANCELLED_NOTE = "cancelled: the generation was stopped before this tool call finished"
INTERRUPTED_NOTE = "cancelled: the sidecar stopped while this tool call was running; it may or may not have completed"
SUPERSEDED_NOTE = "not run: the user moved on before deciding (superseded by a newer message or aborted)"
LIMIT_NOTE = f"not run: the generation reached its limit of {MAX_STEPS} model/tool steps"
DENIED_RESULT = json.dumps({"error": "denied", "message": "The user denied this tool call. Do not retry it; continue without it."})
POLICY_DENIED_RESULT = json.dumps({"error": "denied", "message": "This tool is disabled by the user's policy."})


class GenerationJob(msgspec.Struct, kw_only=True):
    """What to generate: the assistant message ``message_id`` as a child of ``parent_id``."""

    session: SessionV2
    message_id: str
    parent_id: str
    provider_id: str
    model_id: str
    temperature: float | None = None
    abort_reason: str | None = None
    """Set by whoever cancels the job (abort, a newer send, shutdown)."""
    outcome: str | None = None
    """completed | error | aborted | paused, once the job has ended."""
    live: Any = None
    """(ReplyBuilder, StreamRelay) while streaming: the in-flight content for resync."""
    resume: MessageV2 | None = None
    """A paused reply to continue (its stored content and seq), instead of a new one."""
    steps: int = 0
    """Model steps taken so far (stored with the run, so a resumed reply keeps counting)."""
    has_run: bool = False
    """A tool_runs row exists for this reply."""
    prepared: Any = None
    """The first request's reads, when the send already made them (RequestBuilder.Prepared)."""
    stop_grace: float = 0.0
    """How much longer than ChatEngine's STOP_TIMEOUT_S a stop may take (an ACP agent's
    cancel timeout)."""


class GenerationHandler:
    def __init__(
        self,
        *,
        store: Any,
        notify: Callable[[str, Any], Awaitable[None]],
        providers: Any,
        requests: RequestBuilder,
        settings: Callable[[], ChatSettings],
        tools: Any = None,
        approvals: ApprovalService | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self._store = store
        self._notify = notify
        self._providers = providers
        self._requests = requests
        self._settings = settings
        self._tools = tools
        self._approvals = approvals
        self._tool_store = store.sync.tools
        self._data_dir = data_dir or Path(".")
        self._paused: set[str] | None = None
        """Sessions that may hold a paused reply (loaded once, then kept here), so a send on
        a session without one costs no extra database hop."""

    async def run(self, job: GenerationJob) -> None:
        settings = self._settings()
        reply = ReplyBuilder()
        relay = StreamRelay(
            self._notify,
            job.session.id,
            job.message_id,
            coalesce_s=max(0, settings.delta_coalesce_ms) / 1000,
            on_delta=reply.add_delta,
        )
        if job.resume is not None:
            reply.restore(job.resume)  # its usage too: stored when the reply paused
            relay.seq = job.resume.seq or 0
            job.has_run = True
        job.live = (reply, relay)
        started = time.monotonic()
        model_id = job.model_id
        result: SidecarError | str | None
        try:
            if job.resume is None:
                await relay.emit(
                    StreamStartEvent,
                    parent_id=job.parent_id,
                    model_id=job.model_id,
                    provider_id=job.provider_id,
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(relay.run_flusher)
                tg.start_soon(self._persist_loop, job, relay, reply, settings)
                try:
                    result = await self._loop(job, settings, relay, reply)
                finally:
                    relay.close()
                    tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            await self._end(job, relay, reply, started, model_id, ABORTED)
            raise
        except Exception as exc:  # a store failure in the tool loop, or a bug (the task group wraps it)
            log.exception("generation of %s failed", job.message_id)
            await self._end(job, relay, reply, started, model_id, internal_failure(exc, "generating"), close_calls=True)
            return
        await self._end(job, relay, reply, started, model_id, result)

    # -- the step loop ---------------------------------------------------------------

    async def _loop(
        self, job: GenerationJob, settings: ChatSettings, relay: StreamRelay, reply: ReplyBuilder
    ) -> SidecarError | str | None:
        """Run model steps and tool calls; None (completed), PAUSED, or the failure."""
        try:
            resolved = await self._providers.resolve(job.provider_id, job.model_id)
            registry = ToolRegistry()

            async def assemble() -> None:
                nonlocal registry
                registry = await self._assemble(job.session, resolved.model)

            prepared = job.prepared
            if prepared is not None and (prepared.leaf_id, prepared.model_id) != (job.parent_id, resolved.model.id):
                prepared = None  # made for another leaf or model: read again
            job.prepared = None
            if prepared is not None:
                await assemble()
            else:
                # the tool assembly and the first request's reads (both in worker threads) overlap
                async with anyio.create_task_group() as tg:
                    tg.start_soon(assemble)
                    prepared = await self._requests.prepare(
                        session=job.session, leaf_id=job.parent_id, model=resolved.model
                    )
        except SidecarError as exc:
            return exc
        except Exception as exc:  # a bug: keep serving, report it as internal
            log.exception("preparing generation of %s failed", job.message_id)
            return SidecarError(f"internal error while preparing the request: {type(exc).__name__}")
        if job.resume is not None and reply.unanswered_calls():
            if await self._run_calls(job, relay, reply, registry) == PAUSED:
                return PAUSED
        while True:
            if job.steps >= MAX_STEPS:
                return SidecarError(
                    f"stopped: the generation reached its limit of {MAX_STEPS} model/tool steps",
                    code=ErrorCode.BAD_STATE,
                )
            job.steps += 1
            failure = await self._model_step(job, settings, relay, reply, resolved, registry, prepared)
            prepared = None  # later steps read the branch again
            if failure is not None:
                return failure
            if not reply.unanswered_calls():
                return None
            if job.steps >= MAX_STEPS:
                await self._close_calls(job, reply, LIMIT_NOTE, relay)
                return SidecarError(
                    f"stopped: the generation reached its limit of {MAX_STEPS} model/tool steps "
                    "and its last tool calls were not run",
                    code=ErrorCode.BAD_STATE,
                )
            if await self._run_calls(job, relay, reply, registry) == PAUSED:
                return PAUSED

    async def _assemble(self, session: SessionV2, model: Any) -> ToolRegistry:
        if self._tools is None:
            return ToolRegistry()
        try:
            return await self._tools.assemble(session, model)  # type: ignore[no-any-return]
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:  # tools are an addition: a broken tool source must not stop the reply
            log.exception("assembling the tools of %s failed; generating without tools", session.id)
            return ToolRegistry()

    async def _model_step(
        self,
        job: GenerationJob,
        settings: ChatSettings,
        relay: StreamRelay,
        reply: ReplyBuilder,
        resolved: Any,
        registry: ToolRegistry,
        prepared: Prepared | None = None,
    ) -> SidecarError | None:
        """One provider step; returns the failure that ended it, if any."""
        try:
            request = await self._requests.build(
                session=job.session,
                leaf_id=job.parent_id,
                model=resolved.model,
                params=GenerationParams(
                    temperature=job.temperature if job.temperature is not None else settings.temperature,
                    top_p=settings.top_p,
                    max_tokens=settings.max_tokens,
                    reasoning=settings.reasoning,
                ),
                tools=registry.specs(),
                tool_prompts=registry.prompts(),
                capability_note=registry.capability_note,
                prepared=prepared,
            )
        except SidecarError as exc:
            return exc
        except Exception as exc:
            log.exception("building the request of %s failed", job.message_id)
            return SidecarError(f"internal error while preparing the request: {type(exc).__name__}")
        if reply.parts:
            # the steps so far (text, tool calls and their results) continue the reply
            request.messages.append(RequestMessage(role="assistant", parts=list(reply.parts)))
        try:
            # think tags in text become reasoning while streaming (pipeline/output.py)
            await self._consume(self._requests.output.stream(resolved.provider.stream(request)), relay, reply)
        except SidecarError as exc:
            return exc
        except Exception as exc:
            log.exception("stream of %s failed", job.message_id)
            return SidecarError(f"internal error while streaming: {type(exc).__name__}")
        return None

    async def _consume(self, parts: Any, relay: StreamRelay, reply: ReplyBuilder) -> None:
        tool_names: dict[str, str] = {}
        base = reply.usage  # usage of earlier steps: a step's updates are cumulative within it
        # Adapters number calls that come without an id per request (call_0, call_1...), so a
        # later step of the same reply can repeat an id: such a call gets a fresh one here,
        # before any event names it, so results and history stay unambiguous.
        used = {c.id for c in reply.tool_calls}
        ids: dict[str, str] = {}

        def own(provider_id: str) -> str:
            if provider_id not in ids:
                fresh, n = provider_id, 1
                while fresh in used:
                    n += 1
                    fresh = f"{provider_id}_{n}"
                used.add(fresh)
                ids[provider_id] = fresh
            return ids[provider_id]

        async with aclosing(parts):
            async for part in parts:
                # text and thinking reach the ReplyBuilder through the relay, when their
                # event is sent (see StreamRelay.on_delta)
                if isinstance(part, TextDelta):
                    await relay.delta("text", part.text)
                elif isinstance(part, ThinkingDelta):
                    await relay.delta("thinking", part.text)
                    if part.signature:
                        # Anthropic wants a signed thinking block back unchanged when a tool
                        # turn continues: the signature belongs to the block just streamed
                        await relay.flush()
                        reply.sign_thinking(part.signature)
                elif isinstance(part, ToolCallStart):
                    call_id = own(part.id)
                    tool_names[call_id] = part.name
                    await relay.emit(
                        ToolCallStartEvent, tool_call=StreamToolCall(id=call_id, name=part.name)
                    )
                elif isinstance(part, ToolCallDelta):
                    call_id = own(part.id)
                    await relay.emit(
                        ToolCallDeltaEvent,
                        tool_call=StreamToolCall(
                            id=call_id, name=tool_names.get(call_id, ""), arguments=part.arguments
                        ),
                    )
                elif isinstance(part, ToolCallEnd):
                    await relay.flush()  # the call's place in the parts follows the text before it
                    reply.add_tool_call(own(part.id), part.name, part.arguments)
                elif isinstance(part, UsageUpdate):
                    reply.usage = _add_usage(base, part.usage)
                elif isinstance(part, Finish):
                    reply.finish_reason = part.reason

    # -- tool calls --------------------------------------------------------------------

    async def _run_calls(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, registry: ToolRegistry
    ) -> str | None:
        """Decide and run the reply's unanswered calls; PAUSED when some wait for the user."""
        calls = reply.unanswered_calls()
        await self._ensure_run(job)
        known = {c.tool_call_id: c for c in await self._db(self._tool_store.calls, job.message_id)}
        # schema validation (jsonschema, imported on first use) can take a while: not on the loop
        checks = await anyio.to_thread.run_sync(lambda: [registry.check(c.name, c.arguments) for c in calls])
        results: dict[str, ToolOutput] = {}
        runnable: list[tuple[ToolCall, CheckedCall]] = []
        to_ask: list[ApprovalRequest] = []
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
                if self._approvals is not None:
                    policy = await self._approvals.policy(tool.name, tool.default_policy, tool.server_key)
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
                    to_ask.append(
                        ApprovalRequest(
                            session_id=job.session.id, message_id=job.message_id, tool_call_id=call.id,
                            tool_name=call.name, arguments=call.arguments, policy_key=tool.name,
                            server_key=tool.server_key, step=job.steps,
                        )
                    )
            elif record.state == "pending":
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
            await self._db(self._tool_store.add_calls, new_rows, audits)
        fresh = [r for r in to_ask if r.tool_call_id not in known]
        if fresh and self._approvals is not None:
            await self._approvals.open(fresh)
        if runnable:
            results.update(await self._execute(job, runnable, registry))
        for call in calls:  # results in call order, whatever order they finished in
            output = results.get(call.id)
            if output is not None:
                await self._add_result(job, relay, reply, call.id, output)
        if to_ask:
            for request in to_ask:
                await relay.emit(
                    ToolApprovalRequiredEvent,
                    tool_call=StreamToolCall(id=request.tool_call_id, name=request.tool_name, arguments=request.arguments),
                )
            return PAUSED
        return None

    async def _execute(
        self, job: GenerationJob, runnable: list[tuple[ToolCall, CheckedCall]], registry: ToolRegistry
    ) -> dict[str, ToolOutput]:
        """Run approved calls concurrently; each is moved approved -> running first."""
        outputs: dict[str, ToolOutput] = {}
        workspace = Path(job.session.workspace_dir) if job.session.workspace_dir else None

        async def one(call: ToolCall, checked: CheckedCall) -> None:
            started = await self._db(
                lambda: self._tool_store.transition(
                    job.message_id, call.id, from_states={"approved"}, to_state="running"
                )
            )
            if not started:  # cancelled or decided otherwise meanwhile: never run it
                outputs[call.id] = ToolOutput(text=SUPERSEDED_NOTE, is_error=True)
                return
            ctx = ToolContext(
                session=job.session, message_id=job.message_id, tool_call_id=call.id,
                data_dir=self._data_dir, workspace=workspace,
            )
            outputs[call.id] = await registry.execute(checked, ctx)

        async with anyio.create_task_group() as tg:
            for call, checked in runnable:
                tg.start_soon(one, call, checked)
        return outputs

    async def _add_result(
        self,
        job: GenerationJob,
        relay: StreamRelay,
        reply: ReplyBuilder,
        call_id: str,
        output: ToolOutput,
    ) -> None:
        reply.add_tool_result(call_id, output.text, output.is_error)
        await self._db(
            lambda: self._tool_store.transition(
                job.message_id, call_id,
                from_states={"pending", "approved", "denied", "answered", "running"}, to_state="done",
            )
        )
        await relay.emit(
            ToolResultEvent,
            tool_result=StreamToolResult(tool_call_id=call_id, output=output.text, is_error=output.is_error),
        )

    async def _close_calls(
        self, job: GenerationJob, reply: ReplyBuilder, note: str, relay: StreamRelay | None = None
    ) -> None:
        """Every unanswered call gets an error result ``note`` and ends ``cancelled`` (with a
        ``tool_result`` event when ``relay`` is given), so the stored reply stays a valid history."""
        for call in reply.unanswered_calls():
            reply.add_tool_result(call.id, note, True)
            if job.has_run:
                await self._db(
                    lambda c=call: self._tool_store.transition(
                        job.message_id, c.id,
                        from_states={"pending", "approved", "denied", "answered", "running"},
                        to_state="cancelled",
                    )
                )
            if relay is not None:
                await relay.emit(
                    ToolResultEvent, tool_result=StreamToolResult(tool_call_id=call.id, output=note, is_error=True)
                )

    async def _ensure_run(self, job: GenerationJob) -> None:
        if job.has_run:
            return
        run = ToolRun(
            message_id=job.message_id, session_id=job.session.id, provider_id=job.provider_id,
            model_id=job.model_id, temperature=job.temperature, steps=job.steps,
        )
        await self._db(self._tool_store.begin_run, run)
        job.has_run = True

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._store.run(lambda _: fn(*args))

    # -- paused replies ----------------------------------------------------------------

    async def _pause(self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder) -> None:
        await relay.flush()
        snap = reply.snapshot()
        # a failure here raises: _end then ends the reply as an error instead of leaving it
        # streaming while the session is counted as holding a paused reply
        await self._db(
            lambda: self._tool_store.pause_message(
                job.message_id, text_content=snap.text_content, parts=snap.parts,
                tool_calls=snap.tool_calls, seq=relay.seq, steps=job.steps, usage=reply.usage,
            )
        )
        if self._paused is not None:
            self._paused.add(job.session.id)
        job.outcome = PAUSED

    def prepare_first(self, session: SessionV2, leaf_id: str | None, model_id: str) -> Any:
        """The first request's reads for a direct-mode reply under ``leaf_id`` (blocking: for a
        worker thread that is already storing the turn); None when it cannot be made here."""
        if session.mode != "direct" or not leaf_id or not model_id:
            return None
        try:
            return self._requests.prepare_blocking(session, leaf_id, model_id)
        except Exception:  # the job makes the same reads again and reports what fails
            log.debug("reading ahead for %s failed", session.id, exc_info=True)
            return None

    def is_idle(self, session_id: str) -> bool:
        """True when the session is known to have no paused reply (no database read)."""
        return self._paused is not None and session_id not in self._paused

    def forget_session(self, session_id: str) -> None:
        """Drop what is kept per session once the session is deleted."""
        if self._paused is not None:
            self._paused.discard(session_id)
        self._requests.context.forget(session_id)

    async def close_paused(self, session_id: str, reason: str) -> bool:
        """End the session's paused replies as ``aborted``: pending calls are cancelled and
        get a "not run" result; an ``aborted`` event closes each reply's stream.

        The work is shielded and bounded; the session counts as idle only once every one
        of its paused replies is closed (a failure leaves it to the next call)."""
        if self._paused is None:
            runs = await self._db(lambda: self._tool_store.runs(state="paused"))
            self._paused = {r.session_id for r in runs}
        if session_id not in self._paused:
            return False
        closed = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINALIZE_TIMEOUT_S):
            runs = await self._db(lambda: self._tool_store.runs(session_id=session_id, state="paused"))
            for run in runs:
                closed = await self._close_paused_run(session_id, run, reason) or closed
            self._paused.discard(session_id)
        return closed

    async def _close_paused_run(self, session_id: str, run: ToolRun, reason: str) -> bool:
        if self._approvals is not None:
            await self._approvals.cancel(session_id, run.message_id, note=reason)
        message = await self._db(self._tool_store.reopen_message, run.message_id)
        if message is None:
            return False
        reply = ReplyBuilder()
        reply.restore(message)
        relay = StreamRelay(self._notify, session_id, run.message_id, coalesce_s=0)
        relay.seq = message.seq or 0
        job = GenerationJob(
            session=await self._store.run(lambda s: s.sessions.get(session_id)), message_id=run.message_id,
            parent_id=message.parent_id or "", provider_id=run.provider_id, model_id=run.model_id,
            has_run=True,
        )
        await self._close_calls(job, reply, SUPERSEDED_NOTE)
        snap = reply.snapshot()
        await self._store.run(lambda s: s.messages.finish(
            run.message_id, status="aborted", text_content=snap.text_content, parts=snap.parts,
            tool_calls=snap.tool_calls, usage=reply.usage, seq=relay.seq + 1,
        ))
        await self._db(lambda: self._tool_store.set_run(run.message_id, state="done"))
        job.outcome = ABORTED
        await relay.emit(AbortedEvent, reason=reason)
        return True

    # -- persistence -------------------------------------------------------------------

    async def _persist_loop(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, settings: ChatSettings
    ) -> None:
        # pending -> streaming is written on the first tick, not before the provider request
        # (it must not delay the first delta); a crash before it ends the same way, as an
        # aborted reply, and a live reply's status is overlaid by ChatEngine.overlay_live
        unwritten = job.resume is None
        interval = max(20, settings.persist_interval_ms) / 1000
        failures = 0
        while True:
            await anyio.sleep(interval)
            if reply.dirty or unwritten:
                snap = reply.snapshot()
                try:
                    seq = relay.seq
                    await self._store.run(lambda s: s.messages.update_partial(
                        job.message_id,
                        text_content=snap.text_content,
                        parts=snap.parts,
                        status="streaming",
                        seq=seq,
                    ))
                except SidecarError as exc:
                    # a busy or failing database must not end the reply: the content stays in
                    # memory, the next tick tries again and the final row is written anyway
                    failures += 1
                    log.log(
                        logging.WARNING if failures == 1 else logging.DEBUG,
                        "could not store the partial reply %s (%d times): %s", job.message_id, failures, exc.message,
                    )
                    reply.dirty = True
                    continue
                unwritten = False

    # -- endings ---------------------------------------------------------------------

    async def _end(
        self,
        job: GenerationJob,
        relay: StreamRelay,
        reply: ReplyBuilder,
        started: float,
        model_id: str,
        result: SidecarError | str | None,
        *,
        close_calls: bool = False,
    ) -> None:
        """The reply's one ending: ``result`` is None (completed), PAUSED, ABORTED or the
        failure (``close_calls``: a failure that may have left tool calls open).

        Shielded: a stop that arrives meanwhile (an abort, a newer send) waits for it, so the
        row is never left ``streaming`` without a final event. Bounded: when the ending
        fails or runs out of time before its final event, the reply ends as ``error`` with
        the content it has (calls still open are closed)."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(FINALIZE_TIMEOUT_S):
                try:
                    if result == ABORTED:
                        await self._finish_aborted(job, relay, reply, started, model_id)
                    elif result == PAUSED:
                        await self._pause(job, relay, reply)
                    elif isinstance(result, SidecarError):
                        await self._finish_error(job, relay, reply, started, model_id, result, close_calls=close_calls)
                    else:
                        await self._finish_completed(job, relay, reply, started, model_id)
                except Exception:
                    log.exception("ending the reply %s failed", job.message_id)
            if job.outcome is not None:
                return
            with anyio.move_on_after(FALLBACK_TIMEOUT_S):
                try:
                    await self._finish_error(
                        job, relay, reply, started, model_id,
                        SidecarError("internal error while ending the reply"), close_calls=True,
                    )
                except Exception:
                    log.exception("the fallback ending of %s failed too", job.message_id)

    async def _finish_completed(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, started: float, model_id: str
    ) -> None:
        await relay.flush()
        usage = reply.usage or Usage()
        if reply.usage is not None:
            await relay.emit(UsageEvent, usage=usage)
        # finish processing (think tags closed, base64 images to files, output regex rules)
        snap = await self._requests.output.finish(job.session, reply.snapshot())
        # the cost first: the final row and the session's counters are then written back
        # to back, with no other await between them
        try:
            cost = await self._providers.cost(job.provider_id, model_id, usage)
        except SidecarError as exc:
            log.warning("no cost for the reply %s: %s", job.message_id, exc.message)
            cost = 0.0
        await self._store_final(job, relay, reply, snap, started, model_id, "completed", cost=cost)
        job.outcome = "completed"
        await relay.emit(StreamEndEvent, finish_reason=_finish_reason(reply), usage=reply.usage)

    async def _finish_error(
        self,
        job: GenerationJob,
        relay: StreamRelay,
        reply: ReplyBuilder,
        started: float,
        model_id: str,
        failure: SidecarError,
        *,
        close_calls: bool = False,
    ) -> None:
        """``close_calls``: the failure may have left tool calls open (not a model step's
        own failure): pending ones are cancelled and unanswered ones get a result."""
        relay.close()
        await relay.flush()
        try:
            if close_calls:
                await self._cancel_open_calls(job, reply)
            await self._store_final(
                job, relay, reply, reply.snapshot(), started, model_id, "error", error=failure.message
            )
        except Exception:  # the final event still goes out (restart recovery ends the row)
            log.exception("could not store the error state of %s", job.message_id)
        job.outcome = "error"
        code = int(failure.code) if failure.code != ErrorCode.INTERNAL_ERROR else None
        await relay.emit(ErrorEvent, error=failure.message, code=code)

    async def _finish_aborted(
        self, job: GenerationJob, relay: StreamRelay, reply: ReplyBuilder, started: float, model_id: str
    ) -> None:
        relay.close()
        await relay.flush()
        try:
            await self._cancel_open_calls(job, reply)
            await self._store_final(job, relay, reply, reply.snapshot(), started, model_id, ABORTED)
        except Exception:  # the final event still goes out (restart recovery ends the row)
            log.exception("could not store the aborted state of %s", job.message_id)
        job.outcome = ABORTED
        await relay.emit(AbortedEvent, reason=job.abort_reason)

    async def _cancel_open_calls(self, job: GenerationJob, reply: ReplyBuilder) -> None:
        if job.has_run and self._approvals is not None:
            # calls stored pending just before the stop must not stay open
            await self._approvals.cancel(job.session.id, job.message_id, note=CANCELLED_NOTE)
        # calls that were running (their tasks are cancelled, commands killed) or not started
        await self._close_calls(job, reply, CANCELLED_NOTE)

    async def _store_final(
        self,
        job: GenerationJob,
        relay: StreamRelay,
        reply: ReplyBuilder,
        snap: Any,
        started: float,
        model_id: str,
        status: str,
        *,
        error: str | None = None,
        cost: float | None = None,
    ) -> None:
        """The reply's final row (its last event, the final one, is ``relay.seq + 1``);
        with ``cost``, the session's token and cost counters right after it."""
        latency = _elapsed_ms(started)
        seq = relay.seq + 1
        await self._store.run(lambda s: s.messages.finish(
            job.message_id,
            status=status,
            text_content=snap.text_content,
            parts=snap.parts,
            tool_calls=snap.tool_calls,
            usage=reply.usage,
            latency_ms=latency,
            model_id=model_id,
            error=error,
            seq=seq,
        ))
        if cost is not None:
            usage = reply.usage or Usage()
            try:
                await self._store.run(
                    lambda s: s.sessions.add_usage(job.session.id, usage.input_tokens + usage.output_tokens, cost)
                )
            except SidecarError:  # the reply is stored: only the session's counters miss it
                log.exception("could not add the usage of %s to its session", job.message_id)
        await self._end_run(job)

    async def _end_run(self, job: GenerationJob) -> None:
        if job.has_run:
            await self._db(lambda: self._tool_store.set_run(job.message_id, state="done", steps=job.steps))


def internal_failure(exc: BaseException, doing: str) -> SidecarError:
    """The failure a reply ends with when ``exc`` escaped its job: a SidecarError (a store
    failure) as it is, anything else as an internal error naming only its type."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, SidecarError):
        return exc
    return SidecarError(f"internal error while {doing}: {type(exc).__name__}")


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _finish_reason(reply: ReplyBuilder) -> Any:
    return reply.finish_reason or "stop"


def _add_usage(base: Usage | None, step: Usage) -> Usage:
    if base is None:
        return step

    def plus(a: int | None, b: int | None) -> int | None:
        return None if a is None and b is None else (a or 0) + (b or 0)

    return Usage(
        input_tokens=base.input_tokens + step.input_tokens,
        output_tokens=base.output_tokens + step.output_tokens,
        cache_read_tokens=plus(base.cache_read_tokens, step.cache_read_tokens),
        cache_write_tokens=plus(base.cache_write_tokens, step.cache_write_tokens),
        reasoning_tokens=plus(base.reasoning_tokens, step.reasoning_tokens),
    )
