"""Property: a Pending tool never runs (seed 000 invariant).

In process, for speed: the real ChatEngine, GenerationHandler, ApprovalService and store,
with a scripted provider (every step without tool results asks for two calls: one whose
policy is ``ask`` and one ``auto``; a step after results answers with text) and tools that
record every execution. Hypothesis drives random interleavings of send, approve, deny,
answer, abort, restart (close everything, reopen the store on the same data dir) and
settle (wait until nothing runs). Every execution of the ``ask`` tool is checked at the
moment it starts: its call must be ``running`` in the store and the audit trail must hold
the user's ``approved`` decision for it and no other decision; no call runs twice.
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
from protocol.sessions import CreateSessionOptions, SessionFilter
from protocol.settings import ChatSettings
from protocol.tools import ToolApproveParams
from protocol.types import ToolResultPart
from sidecar.engine.approvals import ApprovalService
from sidecar.engine.chat import ChatEngine
from sidecar.engine.tool_loop import INTERRUPTED_NOTE
from sidecar.errors import SidecarError
from sidecar.providers.types import (
    ChatRequest,
    Finish,
    ModelInfo,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from sidecar.pipeline.builder import RequestBuilder
from sidecar.store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.tools.base import Tool, ToolContext, ToolOutput
from sidecar.tools.registry import ToolRegistry
from sidecar.notify import Notifier


class World:
    """What the tools saw, across restarts of one example."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.runs: list[tuple[str, str, str]] = []  # (tool, message id, call id)
        self.violations: list[str] = []
        self.store: AsyncStore | None = None


class ScriptedProvider:
    def __init__(self, world: World) -> None:
        self._world = world

    async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
        last = request.messages[-1]
        answered = last.role == "assistant" and any(isinstance(p, ToolResultPart) for p in last.parts)
        await anyio.sleep(0)
        if answered:
            yield TextDelta(text="done")
            yield Finish(reason="stop")
            return
        for name in ("guarded", "free"):
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
        self._provider = ScriptedProvider(world)

    async def resolve(self, provider_id: str, model_id: str) -> Resolved:
        return Resolved(self._provider, ModelInfo(id=model_id, supports_tools=True))

    async def cost(self, *args: Any) -> float:
        return 0.0


class Recording(Tool):
    def __init__(self, world: World, name: str, policy: str) -> None:
        self._world = world
        self.name = name
        self.default_policy = policy  # type: ignore[assignment]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        world = self._world
        assert world.store is not None
        tools = world.store.blocking.tools
        key = (self.name, ctx.message_id, ctx.tool_call_id)
        if key in world.runs:
            world.violations.append(f"{key} ran twice")
        world.runs.append(key)
        call = tools.get_call(ctx.message_id, ctx.tool_call_id)
        if call is None or call.state != "running":
            world.violations.append(f"{key} ran in state {call.state if call else None}")
        if self.default_policy == "ask":
            decisions = [a.decision for a in tools.list_audit(tool_call_id=ctx.tool_call_id, limit=1000)
                         if a.message_id == ctx.message_id and a.decision not in ("requested",)]
            if decisions != ["approved"]:
                world.violations.append(f"{key} ran with decisions {decisions}")
        await anyio.sleep(0)
        return ToolOutput(text=f"ran {self.name}")


class Tools:
    def __init__(self, world: World) -> None:
        self._world = world

    async def assemble(self, session: Any, model: Any, **_: Any) -> ToolRegistry:
        return ToolRegistry([Recording(self._world, "guarded", "ask"), Recording(self._world, "free", "auto")])


class Settings:
    def current(self) -> ChatSettings:
        return ChatSettings(generate_titles=False, delta_coalesce_ms=0, persist_interval_ms=20)


class Rig:
    """One 'process': store, approvals, engine in a task group."""

    def __init__(self, world: World, data_dir: Path) -> None:
        self.world = world
        self.data_dir = data_dir

    async def __aenter__(self) -> Rig:
        self.store = await AsyncStore.open(self.data_dir)
        self.world.store = self.store
        await self.store.run(lambda db: db.tools.complete_interrupted(INTERRUPTED_NOTE))
        self.approvals = ApprovalService(self.store)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        providers = Providers(self.world)
        attachments = AttachmentStore(self.data_dir)
        self.engine = ChatEngine(
            store=self.store, notify=Notifier(self._notify), providers=providers, attachments=attachments,
            requests=RequestBuilder(self.store, attachments, providers=providers), settings=Settings(), task_group=self._tg,
            tools=Tools(self.world), approvals=self.approvals, data_dir=self.data_dir,
        )
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
        st.just(("abort", 0)),
        st.just(("restart", 0)),
        st.just(("settle", 0)),
    ),
    min_size=1,
    max_size=14,
)


async def _settle(rig: Rig, session_id: str) -> None:
    with anyio.fail_after(20):
        while rig.engine.is_generating(session_id):
            await anyio.sleep(0.005)


async def _scenario(ops: list[tuple[str, int]], data_dir: Path) -> World:
    world = World()
    rig = await Rig(world, data_dir).__aenter__()
    try:
        session = await rig.store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
        for op, n in ops:
            if op == "send":
                await rig.engine.send(SendParams(session_id=session.id, input=UserInput(content="go")))
            elif op == "abort":
                await rig.engine.abort(AbortParams(session_id=session.id))
            elif op == "restart":
                await rig.__aexit__(None, None, None)
                rig = await Rig(world, data_dir).__aenter__()
            elif op == "settle":
                await _settle(rig, session.id)
            else:
                pending = await rig.store.run(lambda db: db.tools.list_open(session_id=session.id, states=("pending",)))
                if not pending:
                    continue
                call = pending[n % len(pending)]
                try:
                    await rig.approvals.approve(ToolApproveParams(
                        session_id=session.id, tool_call_id=call.tool_call_id, message_id=call.message_id,
                        decision=op, answer="user says hi" if op == "answered" else None,  # type: ignore[arg-type]
                    ))
                except SidecarError:
                    pass  # decided or superseded meanwhile: a clear error, never a run
        await _settle(rig, session.id)
    finally:
        await rig.__aexit__(None, None, None)
    return world


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_a_pending_tool_never_runs(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        world = anyio.run(_scenario, ops, Path(tmp))
        assert world.violations == []
        # and every guarded call that ran had been approved by the user (checked above); the
        # store agrees: nothing is left running once everything settled
        from sidecar.store import Store

        store = Store(tmp)
        try:
            assert store.tools.list_open(states=("running", "approved")) == []
            guarded_runs = {(m, c) for name, m, c in world.runs if name == "guarded"}
            approved = {
                (a.message_id, a.tool_call_id)
                for a in store.tools.list_audit(limit=1000)
                if a.decision == "approved" and a.actor == "user"
            }
            assert guarded_runs <= approved
        finally:
            store.close()


def test_the_rig_runs_an_approved_call() -> None:
    """The property is not vacuous: approving a pending call does run it."""
    with tempfile.TemporaryDirectory() as tmp:
        world = anyio.run(_scenario, [("send", 0), ("settle", 0), ("approved", 0), ("settle", 0)], Path(tmp))
        assert world.violations == []
        assert [name for name, _, _ in world.runs] == ["free", "guarded"]
        from sidecar.store import Store

        store = Store(tmp)
        try:
            reply = store.messages.path(store.sessions.query(SessionFilter()).sessions[0].id)[-1]
            assert reply.status == "completed" and reply.text_content == "done"
        finally:
            store.close()
