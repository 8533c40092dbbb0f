"""Property: pausing and resuming are one decision; no interleaving strands a reply.

In process, with the real ChatEngine, GenerationHandler, ApprovalService and store (see
tests/test_tool_loop_property.py for the rig this follows). The scripted model asks, in
every step without results, for one ``ask`` tool and one ``auto`` tool; the auto tool
blocks until the test lets it finish, so decisions arrive while the step's auto tools
still run. Hypothesis interleaves: send (a second send supersedes), approve / deny /
answer (of any pending call), release (the running auto tools finish), abort, restart
(close everything, reopen on the same data dir, run the start-up pass), pending (wait
until the running step has stored its pending call) and settle (let every tool finish,
wait until nothing runs).

Checked after every settle and at the end:
- no reply is ``paused`` with nothing pending (and no pending call lies outside a paused
  reply): a paused reply always waits for someone;
- every ``paused`` reply reads back ``paused`` with its content (its tool calls);
- a decision is never lost: a call approved by the user ran, or its reply was ended;
- an approval answered ``resumed: true`` was applied (its call is not pending any more).
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.chat import AbortParams, SendParams, UserInput
from protocol.sessions import CreateSessionOptions
from protocol.settings import ChatSettings
from protocol.tools import ToolApproveParams
from protocol.types import ToolResultPart
from sidecar.engine.approvals import ApprovalService
from sidecar.engine.chat import ChatEngine
from sidecar.engine.tool_loop import INTERRUPTED_NOTE
from sidecar.errors import SidecarError
from sidecar.pipeline.builder import RequestBuilder
from sidecar.providers.types import ChatRequest, Finish, ModelInfo, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from sidecar.store import AsyncStore, Store
from sidecar.store.attachments import AttachmentStore
from sidecar.tools.base import Tool, ToolContext, ToolOutput
from sidecar.tools.registry import ToolRegistry
from sidecar.notify import Notifier


class World:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.runs: list[tuple[str, str, str]] = []
        self.release = anyio.Event()
        self.violations: list[str] = []
        self.resumed_true: list[tuple[str, str]] = []
        self.waiting = 0
        """Slow tools waiting for their release right now."""


class Model:
    def __init__(self, world: World) -> None:
        self._world = world

    async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
        last = request.messages[-1]
        await anyio.sleep(0)
        if last.role == "assistant" and any(isinstance(p, ToolResultPart) for p in last.parts):
            yield TextDelta(text="done")
            yield Finish(reason="stop")
            return
        for name in ("guarded", "slow"):
            call_id = f"c{next(self._world.ids)}"
            yield ToolCallStart(id=call_id, name=name)
            yield ToolCallDelta(id=call_id, arguments="{}")
            yield ToolCallEnd(id=call_id, name=name, arguments="{}")
        yield Finish(reason="tool_calls")


class Resolved(msgspec.Struct):
    provider: Any
    model: ModelInfo


class Providers:
    def __init__(self, world: World) -> None:
        self._model = Model(world)

    async def resolve(self, provider_id: str, model_id: str) -> Resolved:
        return Resolved(self._model, ModelInfo(id=model_id or "m", supports_tools=True))

    async def cost(self, *args: Any) -> float:
        return 0.0


class Guarded(Tool):
    name = "guarded"
    default_policy = "ask"

    def __init__(self, world: World) -> None:
        self._world = world

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        self._world.runs.append((self.name, ctx.message_id, ctx.tool_call_id))
        return ToolOutput(text="guarded ran")


class Slow(Tool):
    """Auto: runs until the test releases it (decisions arrive meanwhile)."""

    name = "slow"
    default_policy = "auto"

    def __init__(self, world: World) -> None:
        self._world = world

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        self._world.runs.append((self.name, ctx.message_id, ctx.tool_call_id))
        self._world.waiting += 1
        try:
            await self._world.release.wait()
        finally:
            self._world.waiting -= 1
        return ToolOutput(text="slow ran")


class Tools:
    def __init__(self, world: World) -> None:
        self._world = world

    async def assemble(self, session: Any, model: Any, **_: Any) -> ToolRegistry:
        return ToolRegistry([Guarded(self._world), Slow(self._world)])


class Settings:
    def current(self) -> ChatSettings:
        return ChatSettings(generate_titles=False, delta_coalesce_ms=0, persist_interval_ms=20)


class Rig:
    def __init__(self, world: World, data_dir: Path) -> None:
        self.world = world
        self.data_dir = data_dir

    async def __aenter__(self) -> Rig:
        self.store = await AsyncStore.open(self.data_dir)
        await self.store.run(lambda db: db.tools.complete_interrupted(INTERRUPTED_NOTE))
        self.approvals = ApprovalService(self.store)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        providers = Providers(self.world)
        attachments = AttachmentStore(self.data_dir)
        self.engine = ChatEngine(
            store=self.store, notify=Notifier(self._notify), providers=providers, attachments=attachments,
            requests=RequestBuilder(self.store, attachments, providers=providers), settings=Settings(),
            task_group=self._tg, tools=Tools(self.world), approvals=self.approvals, data_dir=self.data_dir,
        )
        await self.engine.catch_up()  # the app's start-up pass (run in the background there)
        return self

    async def _notify(self, method: str, params: Any) -> None:
        pass

    async def __aexit__(self, *exc: Any) -> None:
        await self.engine.aclose()
        await self._tg.__aexit__(None, None, None)
        await self.store.close()


OPS = st.lists(
    st.one_of(
        st.just(("send", 0)),
        st.tuples(st.sampled_from(["approved", "denied", "answered"]), st.integers(0, 5)),
        st.just(("release", 0)),
        st.just(("pending", 0)),
        st.just(("abort", 0)),
        st.just(("restart", 0)),
        st.just(("settle", 0)),
    ),
    min_size=1,
    max_size=16,
)


def release(world: World) -> None:
    world.release.set()
    world.release = anyio.Event()


async def settle(rig: Rig, session_id: str) -> None:
    with anyio.fail_after(30):
        while rig.engine.is_generating(session_id):
            rig.world.release.set()  # every auto tool that runs now or starts later finishes
            await anyio.sleep(0.005)
    rig.world.release = anyio.Event()


def check(store: Store, session_id: str, world: World) -> None:
    paused = [m for m in store.messages.query(session_id, _all()) if m.status == "paused"]
    pending = store.tools.list_open(session_id=session_id, states=("pending",))
    pending_by_message = {c.message_id for c in pending}
    for m in paused:
        if m.id not in pending_by_message:
            world.violations.append(f"{m.id} is paused with nothing pending")
        if not m.tool_calls:
            world.violations.append(f"{m.id} is paused without its content")
    for c in pending:
        if c.message_id not in {m.id for m in paused}:
            world.violations.append(f"{c.tool_call_id} is pending outside a paused reply")
    for message_id, call_id in world.resumed_true:
        call = store.tools.get_call(message_id, call_id)
        if call is not None and call.state == "pending":
            world.violations.append(f"{call_id} was answered resumed but is still pending")


def _all() -> Any:
    from protocol.messages import MessageQueryOptions

    return MessageQueryOptions(all_branches=True)


async def scenario(ops: list[tuple[str, int]], data_dir: Path) -> World:
    world = World()
    rig = await Rig(world, data_dir).__aenter__()
    try:
        session = await rig.store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        sid = session.id
        for op, n in ops:
            if op == "send":
                await rig.engine.send(SendParams(session_id=sid, input=UserInput(content="go")))
            elif op == "release":
                release(world)
                await anyio.sleep(0.01)
            elif op == "pending":
                # until the step has stored its pending call, or nothing runs, or all that runs
                # is a slow tool waiting for a release (the step cannot store more before it)
                with anyio.fail_after(20):
                    while rig.engine.is_generating(sid) and not world.waiting and not await rig.store.run(
                        lambda db: db.tools.list_open(session_id=sid, states=("pending",))
                    ):
                        await anyio.sleep(0.005)
            elif op == "abort":
                await rig.engine.abort(AbortParams(session_id=sid))
            elif op == "restart":
                await rig.__aexit__(None, None, None)
                world.release = anyio.Event()
                rig = await Rig(world, data_dir).__aenter__()
            elif op == "settle":
                await settle(rig, sid)
                await rig.store.run(lambda db: check(db, sid, world))
            else:
                pending = await rig.store.run(lambda db: db.tools.list_open(session_id=sid, states=("pending",)))
                if not pending:
                    continue
                call = pending[n % len(pending)]
                try:
                    result = await rig.approvals.approve(ToolApproveParams(
                        session_id=sid, tool_call_id=call.tool_call_id, message_id=call.message_id,
                        decision=op, answer="the user's answer" if op == "answered" else None,  # type: ignore[arg-type]
                    ))
                except SidecarError:
                    continue  # decided or superseded meanwhile: a clear error, never a run
                remaining = await rig.store.run(
                    lambda db: [c for c in db.tools.calls(call.message_id) if c.state == "pending"]
                )
                if result.resumed:
                    world.resumed_true.append((call.message_id, call.tool_call_id))
                elif not remaining:
                    # the last decision of a reply that did not resume: its reply must have
                    # ended (aborted meanwhile), never be left paused
                    status = (await rig.store.run(lambda db: db.messages.get(call.message_id))).status
                    if status == "paused":
                        world.violations.append(f"{call.message_id} decided, not resumed, still paused")
        await settle(rig, sid)
        await rig.store.run(lambda db: check(db, sid, world))
        # approved guarded calls ran (or their reply was ended without them)
        approved = await rig.store.run(lambda db: [
            a for a in db.tools.list_audit(session_id=sid, limit=1000) if a.decision == "approved" and a.actor == "user"
        ])
        ran = {(m, c) for name, m, c in world.runs if name == "guarded"}
        for a in approved:
            if (a.message_id, a.tool_call_id) in ran:
                continue
            state = (await rig.store.run(lambda db: db.messages.get(a.message_id))).status
            if state not in ("aborted", "error"):
                world.violations.append(f"approved {a.tool_call_id} never ran and its reply is {state}")
    finally:
        await rig.__aexit__(None, None, None)
    return world


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_no_interleaving_leaves_a_reply_paused_with_nothing_pending(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        world = anyio.run(scenario, ops, Path(tmp))
        assert world.violations == [], ops


def test_an_approval_while_the_auto_tool_runs_continues_the_same_job() -> None:
    """Not vacuous: the decision made during the step is applied by the step itself."""
    with tempfile.TemporaryDirectory() as tmp:
        ops = [("send", 0), ("pending", 0), ("approved", 0), ("release", 0), ("settle", 0)]
        world = anyio.run(scenario, ops, Path(tmp))
        assert world.violations == []
        assert [name for name, _, _ in world.runs] == ["slow", "guarded"]
        assert len(world.resumed_true) == 1
        store = Store(tmp)
        try:
            session = store.sessions.query(_filter()).sessions[0]
            reply = store.messages.path(session.id)[-1]
            assert reply.status == "completed" and reply.text_content == "done"
        finally:
            store.close()


def test_a_restart_after_the_last_decision_resumes_the_reply() -> None:
    """The process stopped between the decision and the resume: the start-up pass resumes."""
    with tempfile.TemporaryDirectory() as tmp:
        world = anyio.run(scenario, [("send", 0), ("settle", 0)], Path(tmp))
        assert world.violations == []
        store = Store(tmp)
        try:
            session = store.sessions.query(_filter()).sessions[0]
            reply = store.messages.path(session.id)[-1]
            assert reply.status == "paused"
            [call] = store.tools.list_open(session_id=session.id, states=("pending",))
            # decided while no process ran (as if it stopped right after the decision)
            from sidecar.store.tools import audit_entry

            assert store.tools.decide(call, state="approved", answer=None, option_id=None,
                                      audit=[audit_entry(call, "approved", "user")]) == 0
        finally:
            store.close()

        async def restart() -> World:
            again = World()
            again.release.set()
            rig = await Rig(again, Path(tmp)).__aenter__()
            try:
                await settle(rig, session.id)
            finally:
                await rig.__aexit__(None, None, None)
            return again

        after = anyio.run(restart)
        assert [name for name, _, _ in after.runs] == ["guarded", "slow"][:1]
        store = Store(tmp)
        try:
            assert store.messages.path(session.id)[-1].status == "completed"
        finally:
            store.close()


def _filter() -> Any:
    from protocol.sessions import SessionFilter

    return SessionFilter()
