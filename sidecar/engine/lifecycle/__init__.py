"""ReplyLifecycle: everything an assistant reply has, whatever produces its content.

A reply is one assistant message, stored ``pending`` by the turn that asked for it
(sidecar/engine/turns.py), and the ``chat:stream`` events that build it. Whatever produces
the content (the direct-mode model/tool step loop, an ACP agent, a remote server, the V1
shim), the life of the reply is the same, and it is owned here, once:

- the row: ``pending`` -> ``streaming`` (written at the first persistence tick, so it never
  delays the first delta) -> exactly one final status (``completed`` | ``error`` |
  ``aborted``), or ``paused`` while it waits for the user (a later job resumes it);
- ``seq`` and the StreamRelay: ``stream_start`` is event 1 (a resumed reply continues its
  seq and sends none); the first delta goes out at once, later ones are merged for
  ``deltaCoalesceMs``; every other event flushes the pending deltas first;
- persistence: the partial content every ``persistIntervalMs`` while it changed (a failed
  write is logged and retried at the next tick: the content stays in memory) and at every
  state change (pause, ending);
- the overlay ``chat:messages:get`` shows while the message streams (``overlay``): exactly
  the content of events 1..seq;
- usage (the driver reports running totals) and cost (``Pricing``), added to the session's
  counters (``usageByKind.reply``) at every ending that used tokens, completed, error or
  aborted (a paused reply adds its usage when it ends), and ``chat:session:updated`` with
  the session as stored after the ending;
- the ending: shielded (a stop that arrives meanwhile waits for it) and bounded
  (FINALIZE_TIMEOUT_S); the last throttled state is flushed, then one final row and exactly
  one final event (``stream_end`` | ``error`` | ``aborted``); when the driver's ``finalize``
  stored other text than was streamed, ``content_replaced`` with the stored text comes right
  before ``stream_end`` (the renderer never keeps text that is not stored); an ending that fails or runs
  out of time falls back to ``error`` with the content so far (FALLBACK_TIMEOUT_S); if that
  cannot store its row in time either, the ``error`` event is still sent (the row is left
  to restart recovery).

The driver interface
--------------------
A driver produces content and nothing else. It subclasses ReplyDriver::

    class EchoDriver(ReplyDriver):
        doing = "echoing"              # a bug escaping drive(): "internal error while echoing"

        async def drive(self, reply: ReplyFeed) -> Ending:
            await reply.text("hello")
            await reply.report_usage(Usage(input_tokens=3, output_tokens=1))
            return Completed("stop")

    await ReplyLifecycle(job, services, settings).run(EchoDriver())

``drive`` feeds the reply through ReplyFeed and returns how the content ended:

    Completed(finish_reason)        complete: ``stream_end`` with the finish reason
    Failed(error, close_open=True)  failed: ``error`` (a SidecarError) is stored and sent;
                                    ``close_open=False`` says nothing of the driver is left
                                    open (its ``close`` hook is skipped)
    Aborted(reason)                 the producer stopped by itself (an agent cancelled its turn)
    Paused()                        waits for the user (tool calls pending approval): the row
                                    becomes ``paused`` with content, usage and seq and no final
                                    event is sent; a new job with ``ReplyJob.resume`` (the
                                    stored message) continues it, content, usage and seq included

Cancellation (chat:abort, a newer send, shutdown) propagates out of ``drive`` (a driver may
clean up first, shielded and bounded, as ACP's ``session/cancel``) and ends the reply
``aborted`` with ``job.abort_reason``; any other exception ends it ``error`` (a
SidecarError as it is, anything else as an internal error naming only its type). A driver
never has to catch anything to end its reply properly.

ReplyFeed, what a driver calls (content and its event move together)::

    await reply.text(delta)                               text_delta (coalesced)
    await reply.thinking(delta, signature=None)           thinking_delta; a signature seals
                                                          the block just streamed
    await reply.tool_call_started(id, name, arguments="") tool_call_start (a call being made)
    await reply.tool_call_arguments(id, name, fragment)   tool_call_delta
    await reply.tool_use(id, name, arguments) -> index    a complete call the reply owes a
                                                          result (ToolUsePart + ToolCall, no event)
    await reply.tool_result(id, output, is_error, replace=None, announce=True) -> index
                                                          ToolResultPart (+ tool_result); replace:
                                                          the index of the result it updates
    await reply.part(part) -> index                       any other part: DiffPart, StepStartPart,
                                                          StepFinishPart, ImagePart, FilePart...
    reply.replace_part(index, part)                       a part changed in place (no event)
    await reply.report_usage(total, announce=False)       the usage so far (announce: usage event)
    await reply.notice(text, code)                        notice
    await reply.plan(entries)                             plan (an agent's whole plan)
    await reply.citations(records)                        citations: every source the reply
                                                          may cite so far (the full list)
    await reply.approval_required(call, decisions=None, options=None, source="tool")
                                                          tool_approval_required
    reply.content                                         the ReplyBuilder, to read (parts so
                                                          far, calls without a result, usage)

Hooks a driver may override (ReplyDriver's defaults add nothing)::

    def persisted(self) -> StoreWrite | None
        Driver state stored with the row, in its transaction, at each persistence tick and
        at the ending: a write of what changed since the last call, or None (ACP: the raw
        session/update log, appended). A failed write is retried, together with the next
        one (a write must be idempotent: it may run twice).
    async def close(self, reply: ReplyFeed, ending: Failed | Aborted) -> None
        Before the row of an error or aborted ending: close what the driver left open (the
        tool loop: pending approvals cancelled, unanswered calls given a "cancelled" result
        with announce=False). A failure is logged; the row and the final event still follow.
    async def finalize(self, snapshot: ReplySnapshot) -> ReplySnapshot
        Before the row of a completed ending: the content as it is stored (direct mode: think
        tags, images to files, output regex rules, citation markers normalized and checked).
        A failure ends the reply as ``error``. When it changes the content, ``stream_end``
        carries the stored content (``contentReplaced``), so a renderer never keeps showing
        text that was not stored; when it changes the citations, a ``citations`` event with
        the final list comes first.
    def final_write(self, outcome: str) -> StoreWrite | None
        Stored in the transaction of the final or paused row: the driver's own record of how
        the reply ended (the tool loop's run state).

A reply that pauses for approvals fits as it is: the driver records the pending calls, sends
``approval_required`` and returns Paused(); the approval starts a new job with ``resume``
set, whose driver continues from ``reply.content`` (the restored message). A driver whose
approvals are answered while it waits (ACP's permission requests) simply awaits them
inside ``drive``.

Where the events go is ``ReplyServices.notify`` (``chat:stream`` notifications through the
server's writer, for ChatEngine's jobs); whoever runs a lifecycle may give it its own, e.g. a
shim that also streams the events to an HTTP client. Whoever runs it also keeps the one
job per message rule (ChatEngine does for its jobs).

Must stay true: the lifecycle is the only writer of the reply's row and the only sender of
its events while it runs; ``job.outcome`` is set right before the final event, once the
final row was attempted (or when the paused row is stored); the timeouts of an ending add
up to less than ChatEngine's STOP_TIMEOUT_S.
"""

from sidecar.engine.lifecycle.driver import (
    ABORTED,
    COMPLETED,
    ERROR,
    PAUSED,
    Aborted,
    Completed,
    Ending,
    Failed,
    Paused,
    Pricing,
    ReplyDriver,
    ReplyFeed,
    ReplyJob,
    ReplyServices,
    StoreWrite,
    internal_failure,
)
from sidecar.engine.lifecycle.runner import (
    COST_TIMEOUT_S,
    FALLBACK_TIMEOUT_S,
    FINALIZE_TIMEOUT_S,
    LAST_EVENT_TIMEOUT_S,
    PUBLISH_TIMEOUT_S,
    ReplyLifecycle,
)

__all__ = [
    "ABORTED",
    "COMPLETED",
    "ERROR",
    "PAUSED",
    "COST_TIMEOUT_S",
    "FALLBACK_TIMEOUT_S",
    "FINALIZE_TIMEOUT_S",
    "LAST_EVENT_TIMEOUT_S",
    "PUBLISH_TIMEOUT_S",
    "Aborted",
    "Completed",
    "Ending",
    "Failed",
    "Paused",
    "Pricing",
    "ReplyDriver",
    "ReplyFeed",
    "ReplyJob",
    "ReplyLifecycle",
    "ReplyServices",
    "StoreWrite",
    "internal_failure",
]
