"""TurnRunner: V1 turns through ``ChatEngine.send``, their events turned into progress frames.

A V1 prompt is a ``chat:send`` like any other (stored, streamed to the renderer as
``chat:stream``). What this module adds: it watches the session's events on the App's
EventHub, maps the events of the V1 turns into frames (sidecar.compat.frames) for the
ProgressHub, applies the request's ``tool_approval_rules`` to the turn's permission
requests, and knows which turn of a session is running (status Busy).

One pump per session with V1 turns in flight: it subscribes before the first send (so no
event of the reply can be missed) and handles the events in order, for every V1 turn of
the session (a newer send aborts the older reply: its ``cancelled`` frame comes before the
newer ``prompt_start``). Events of replies the renderer started itself are ignored. The
pump ends when no V1 turn of the session is left.

Overflow (decided here): the EventHub cuts off a subscriber that falls 4096 events behind.
Then every turn of that pump gets an ``error`` frame saying the progress was lost (the
reply goes on and is stored; the client reads it from the conversation), its later events
are no longer framed, and a fresh subscription only watches for its end (the stored
status is checked too, in case it ended in the gap), so status stays right.

Approvals: a ``tool_approval_required`` of a V1 turn is checked against the request's
rules (sidecar.compat.rules), then ``yolo`` when ``trust_agent_mode``. A request may only
narrow what runs without the user: its ``deny`` rules decide, its ``allow`` rules only
when the host opted in (``trustApprovalRules``; otherwise the call waits for the user). A
decision is made through the approval service's rule path (``decide_by_rule``: audited
as ``rule:allow`` / ``rule:deny`` by ``compat``, with which rule, never as the user's); no
decision leaves the call pending for the user. The user may decide first; that wins.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

import anyio
import anyio.abc
import msgspec

from protocol.chat import AbortParams, SendParams, SendResult, UserInput
from protocol.common import SuccessResult
from protocol.events import ChatStreamEvent, ToolApprovalRequiredEvent
from protocol.tools import ToolApproveParams, ToolApproveResult
from protocol.types import FINAL_MESSAGE_STATUSES, MessageV2
from sidecar.compat.frames import Frame, FrameBuilder, is_final
from sidecar.compat.rules import Rule, decide
from sidecar.errors import SidecarError
from sidecar.store.async_store import AsyncStore

log = logging.getLogger(__name__)

STASH_MAX = 4096
LOST = "the progress stream fell behind and was cut off; the reply goes on and is stored in the conversation"


class Chat(Protocol):
    async def send(self, params: SendParams) -> SendResult: ...

    async def abort(self, params: AbortParams) -> SuccessResult: ...


class Subscription(Protocol):
    overflowed: bool

    def __aiter__(self) -> Any: ...


class Events(Protocol):
    def subscribe(self, session_id: str | None = None, *, buffer: int = ...) -> AbstractContextManager[Any]: ...


class Approvals(Protocol):
    async def decide_by_rule(self, params: ToolApproveParams, note: str) -> ToolApproveResult: ...


GetMessage = Callable[[str], Awaitable[MessageV2]]


class Turn:
    """One V1 prompt: the reply it created and what its frames need."""

    def __init__(
        self, session_id: str, builder: FrameBuilder, *, rules: tuple[Rule, ...], yolo: bool, provider_id: str | None
    ) -> None:
        self.session_id = session_id
        self.builder = builder
        self.rules = rules
        self.yolo = yolo
        self.provider_id = provider_id
        self.message_id: str | None = None
        self.detached = False
        """Its progress was lost (overflow): only its end is still watched."""
        self.done = anyio.Event()
        self.started_at = time.time()


class _Pump:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.turns: dict[str, Turn] = {}
        self.unbound = 0
        self.stash: list[ChatStreamEvent] = []
        self.scope = anyio.CancelScope()

    def idle(self) -> bool:
        return not self.turns and self.unbound == 0


class TurnRunner:
    def __init__(
        self,
        *,
        chat: Chat,
        events: Events,
        approvals: Approvals,
        store: AsyncStore,
        get_message: GetMessage,
        publish: Callable[[str, Frame], None],
        task_group: anyio.abc.TaskGroup,
        trust_agent_mode: bool,
        trust_approval_rules: bool = False,
        subscription_buffer: int = 4096,
    ) -> None:
        self._chat = chat
        self._events = events
        self._approvals = approvals
        self._store = store
        self._get_message = get_message
        self._publish = publish
        self._tg = task_group
        self._trust_agent_mode = trust_agent_mode
        self._trust_approval_rules = trust_approval_rules
        self._buffer = subscription_buffer
        self._pumps: dict[str, _Pump] = {}
        self._current: dict[str, Turn] = {}

    # -- state ----------------------------------------------------------------------

    def running(self, session_id: str) -> Turn | None:
        """The session's V1 turn in flight (status Busy), if any."""
        turn = self._current.get(session_id)
        return turn if turn is not None and not turn.done.is_set() else None

    def running_turns(self) -> Iterator[Turn]:
        return (t for t in self._current.values() if not t.done.is_set())

    # -- turns ----------------------------------------------------------------------

    async def start(self, turn: Turn, user_input: UserInput) -> SendResult:
        """Send ``user_input`` on the turn's session; its frames follow on the ProgressHub."""
        session_id = turn.session_id
        pump = self._pumps.get(session_id)
        if pump is None:
            pump = self._pumps[session_id] = _Pump(session_id)
            await self._tg.start(self._run, pump)
        pump.unbound += 1
        previous = self._current.get(session_id)
        self._current[session_id] = turn
        try:
            result = await self._chat.send(SendParams(session_id=session_id, input=user_input))
        except BaseException:
            pump.unbound -= 1
            if self._current.get(session_id) is turn:
                if previous is not None and not previous.done.is_set():
                    self._current[session_id] = previous
                else:
                    del self._current[session_id]
            turn.done.set()
            self._close_if_idle(pump)
            raise
        turn.message_id = result.message_id
        pump.unbound -= 1
        pump.turns[result.message_id] = turn
        stash, pump.stash = pump.stash, []
        for event in stash:
            self._handle(pump, event)
        self._close_if_idle(pump)
        return result

    async def cancel(self, session_id: str) -> bool:
        """Abort the session's running reply (``chat:abort``); False if none ran."""
        result = await self._chat.abort(AbortParams(session_id=session_id))
        return result.success

    async def wait_done(self, turn: Turn, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await turn.done.wait()

    # -- the pump -------------------------------------------------------------------

    async def _run(self, pump: _Pump, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with pump.scope:
            try:
                with self._events.subscribe(pump.session_id, buffer=self._buffer) as sub:
                    task_status.started()
                    async for event in sub:
                        self._handle(pump, event)
                        if self._close_if_idle(pump):
                            return
                    overflowed = sub.overflowed
                if overflowed:
                    await self._lost(pump)
            finally:
                self._finish_all(pump)

    def _close_if_idle(self, pump: _Pump) -> bool:
        if not pump.idle():
            return False
        if self._pumps.get(pump.session_id) is pump:
            del self._pumps[pump.session_id]
        pump.scope.cancel()
        return True

    def _handle(self, pump: _Pump, event: ChatStreamEvent) -> None:
        turn = pump.turns.get(event.message_id)
        if turn is None:
            if pump.unbound and len(pump.stash) < STASH_MAX:
                pump.stash.append(event)  # a reply whose send has not returned yet
            return
        if not turn.detached:
            for frame in turn.builder.build(event):
                self._publish(pump.session_id, frame)
            if isinstance(event, ToolApprovalRequiredEvent) and (turn.rules or (self._trust_agent_mode and turn.yolo)):
                self._tg.start_soon(self._decide, turn, event)
        if is_final(event):
            self._finish(pump, turn)

    def _finish(self, pump: _Pump, turn: Turn) -> None:
        if turn.message_id is not None:
            pump.turns.pop(turn.message_id, None)
        if self._current.get(turn.session_id) is turn:
            del self._current[turn.session_id]
        turn.done.set()

    def _finish_all(self, pump: _Pump) -> None:
        for turn in list(pump.turns.values()):
            self._finish(pump, turn)
        if self._pumps.get(pump.session_id) is pump:
            del self._pumps[pump.session_id]

    async def _lost(self, pump: _Pump) -> None:
        """After an overflow: tell every client, then only watch the turns' ends."""
        log.warning("V1 progress of session %s fell behind the reply; its clients get an error frame", pump.session_id)
        for turn in pump.turns.values():
            turn.detached = True
            self._publish(pump.session_id, turn.builder.frames.error(LOST, None, turn.builder.request_id))
        with self._events.subscribe(pump.session_id, buffer=self._buffer) as sub:
            for turn in list(pump.turns.values()):
                assert turn.message_id is not None
                try:
                    stored = await self._get_message(turn.message_id)
                except SidecarError:
                    self._finish(pump, turn)
                    continue
                if stored.status in FINAL_MESSAGE_STATUSES:
                    self._finish(pump, turn)
            if self._close_if_idle(pump):
                return
            async for event in sub:
                self._handle(pump, event)
                if self._close_if_idle(pump):
                    return

    # -- approvals ------------------------------------------------------------------

    async def _decide(self, turn: Turn, event: ToolApprovalRequiredEvent) -> None:
        call = event.tool_call
        message_id = event.message_id
        try:
            record = await self._store.run(lambda s: s.tools.get_call(message_id, call.id))
            if record is None or record.state != "pending":
                return
            kind = None
            key = record.policy_key or ""
            if key.startswith("acp:"):
                kind = key.rsplit(":", 1)[1]
            try:
                raw_input: Any = msgspec.json.decode(call.arguments) if call.arguments else {}
            except msgspec.DecodeError:
                raw_input = call.arguments
            rule = decide(turn.rules, title=call.name, raw_input=raw_input, kind=kind)
            if rule is not None:
                action, why = rule.action, f"the V1 request's tool_approval_rules ({rule.action})"
                if action == "allow" and not self._trust_approval_rules:
                    # a request may only narrow what runs: its allow waits for the user
                    log.info("V1 allow rule for tool call %s left to the user (trustApprovalRules is off)", call.id)
                    return
            elif self._trust_agent_mode and turn.yolo:
                action, why = "allow", "the V1 request's agent_mode yolo (trustAgentMode)"
            else:
                return
            if action == "ask":
                return
            decision: Literal["approved", "denied"] = "approved" if action == "allow" else "denied"
            try:
                await self._approvals.decide_by_rule(
                    ToolApproveParams(session_id=turn.session_id, tool_call_id=call.id, decision=decision, message_id=message_id),
                    f"decided by {why}",
                )
            except SidecarError as exc:  # decided by the user first, or cancelled meanwhile
                log.info("V1 rule could not decide tool call %s: %s", call.id, exc.message)
                return
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:  # a rule must never take the endpoint down
            log.exception("deciding tool call %s by the V1 rules failed", call.id)
