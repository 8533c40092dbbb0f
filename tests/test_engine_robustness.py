"""Regression tests of the engine's failure paths, in process (fast): replies stopped while
they finish, errors inside a job, usage across a pause, a job that does not stop, deletes
racing sends, per-session state that must not grow, settings updates, the relay under
cancellation, retired provider clients and paused replies that fail to close."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import msgspec
import pytest
from anyio import wait_all_tasks_blocked

from protocol.errors import ErrorCode
from protocol.events import TextDeltaEvent
from protocol.chat import AbortParams, SendParams, UserInput
from protocol.common import IdParams
from protocol.providers import ProviderUpsertParams
from protocol.sessions import CreateSessionOptions
from protocol.settings import ChatSettings, ChatSettingsUpdate
from protocol.tools import ToolApproveParams
from protocol.types import ToolResultPart, Usage
from sidecar.engine import chat as chat_module
from sidecar.engine import providers as providers_module
from sidecar.engine.approvals import ApprovalService
from sidecar.engine.chat import ChatEngine
from sidecar.engine.providers import ProviderService
from sidecar.engine.relay import StreamRelay
from sidecar.engine.reply import ReplyBuilder
from sidecar.engine.sessions import SessionService
from sidecar.engine.settings import SettingsService
from sidecar.errors import NotFound, SidecarError
from sidecar.pipeline.output import OutputProcessor
from sidecar.pipeline.summary import Summarizer
from sidecar.providers.types import (
    ChatRequest,
    Finish,
    ModelInfo,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)
from sidecar.pipeline.builder import RequestBuilder
from sidecar.store import AsyncStore
from sidecar.store.attachments import AttachmentStore
from sidecar.tools.base import Tool, ToolContext, ToolOutput
from sidecar.tools.registry import ToolRegistry

pytestmark = pytest.mark.anyio

FINALS = ("StreamEndEvent", "ErrorEvent", "AbortedEvent")


# ---- a small rig: the real engine and store, a scripted provider ------------------------


class Resolved(msgspec.Struct):
    provider: Any
    model: ModelInfo


class Providers:
    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.calls: list[str] = []

    async def resolve(self, provider_id: str, model_id: str) -> Resolved:
        return Resolved(self.provider, ModelInfo(id="m", supports_tools=True))

    async def cost(self, provider_id: str, model_id: str, usage: Usage) -> float:
        self.calls.append("cost")
        return 0.5


class Hello:
    async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
        yield TextDelta(text="hello")
        yield UsageUpdate(usage=Usage(input_tokens=3, output_tokens=2))
        yield Finish(reason="stop")


class ToolThenText:
    """A step without tool results calls ``name``; the next one answers. Each step reports usage."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
        last = request.messages[-1]
        yield UsageUpdate(usage=Usage(input_tokens=100, output_tokens=10))
        if last.role == "assistant" and any(isinstance(p, ToolResultPart) for p in last.parts):
            yield TextDelta(text="done")
            yield Finish(reason="stop")
            return
        yield TextDelta(text="let me look")
        yield ToolCallStart(id="c1", name=self.name)
        yield ToolCallEnd(id="c1", name=self.name, arguments="{}")
        yield Finish(reason="tool_calls")


class Echo(Tool):
    def __init__(self, name: str, policy: str) -> None:
        self.name = name
        self.default_policy = policy  # type: ignore[assignment]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(text="ok")


class Tools:
    async def assemble(self, session: Any, model: Any, **_: Any) -> ToolRegistry:
        return ToolRegistry([Echo("guarded", "ask"), Echo("free", "auto")])


class Settings:
    def current(self) -> ChatSettings:
        return ChatSettings(generate_titles=False, delta_coalesce_ms=0, persist_interval_ms=20)


class Events:
    """chat:stream events by type name, awaitable."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = anyio.Event()

    async def notify(self, method: str, params: Any) -> None:
        if method == "chat:stream":
            self.items.append(params)
            self._changed.set()
            self._changed = anyio.Event()

    def of(self, message_id: str) -> list[str]:
        return [type(e).__name__ for e in self.items if e.message_id == message_id]

    async def wait(self, message_id: str, name: str, count: int = 1) -> None:
        with anyio.fail_after(10):
            while self.of(message_id).count(name) < count:
                await self._changed.wait()

    async def final(self, message_id: str) -> str:
        with anyio.fail_after(10):
            while not any(n in FINALS for n in self.of(message_id)):
                await self._changed.wait()
        return next(n for n in self.of(message_id) if n in FINALS)


class Rig(msgspec.Struct, kw_only=True):
    engine: ChatEngine
    store: AsyncStore
    events: Events
    approvals: ApprovalService
    session_id: str


@asynccontextmanager
async def rig(tmp_path: Path, provider: Any, providers: Providers | None = None) -> AsyncIterator[Rig]:
    store = await AsyncStore.open(tmp_path)
    events = Events()
    approvals = ApprovalService(store)
    providers = providers or Providers(provider)
    attachments = AttachmentStore(tmp_path)
    try:
        async with anyio.create_task_group() as tg:
            engine = ChatEngine(
                store=store, notify=events.notify, providers=providers, attachments=attachments,
                requests=RequestBuilder(store, attachments, providers=providers), settings=Settings(), task_group=tg, tools=Tools(),
                approvals=approvals, data_dir=tmp_path,
            )
            session = await store.run(lambda db: db.sessions.create(CreateSessionOptions(provider_id="p", model_id="m")))
            yield Rig(engine=engine, store=store, events=events, approvals=approvals, session_id=session.id)
            await engine.aclose()
    finally:
        await store.close()


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    """For states nothing signals (e.g. a stop having been requested): bounded polling."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.005)


def assert_one_final_last(names: list[str]) -> None:
    finals = [n for n in names if n in FINALS]
    assert len(finals) == 1 and names[-1] == finals[0], names


async def send(r: Rig, text: str = "hi") -> str:
    with anyio.fail_after(10):
        sent = await r.engine.send(SendParams(session_id=r.session_id, input=UserInput(content=text)))
    return sent.message_id


def stop_requested(r: Rig) -> bool:
    running = r.engine._jobs.get(r.session_id)
    return running is not None and running.job.abort_reason is not None


# ---- 1. a stop that arrives while the reply is finishing --------------------------------


async def test_abort_during_output_finish_still_ends_the_reply_once(tmp_path: Path, monkeypatch: Any) -> None:
    original = OutputProcessor.finish
    finishing = anyio.Event()
    async with rig(tmp_path, Hello()) as r:

        async def slow_finish(self: Any, session: Any, snap: Any) -> Any:
            finishing.set()
            # the stop arrives here; an unshielded ending would be cancelled on this await
            await until(lambda: stop_requested(r))
            await anyio.lowlevel.checkpoint()
            return await original(self, session, snap)

        monkeypatch.setattr(OutputProcessor, "finish", slow_finish)
        message_id = await send(r)
        with anyio.fail_after(10):
            await finishing.wait()
            await r.engine.abort(AbortParams(session_id=r.session_id))
        stored = await r.store.run(lambda db: db.messages.get(message_id))
        assert stored.status == "completed" and stored.text_content == "hello"
        assert_one_final_last(r.events.of(message_id))
        assert not r.engine.is_generating(r.session_id)


async def test_cost_comes_before_the_final_row_and_the_counters_right_after(tmp_path: Path, monkeypatch: Any) -> None:
    providers = Providers(Hello())
    async with rig(tmp_path, None, providers) as r:
        for repo, method_name, name in (
            (r.store.blocking.messages, "finish", "finish_message"),
            (r.store.blocking.sessions, "add_usage", "add_session_usage"),
        ):
            method = getattr(repo, method_name)

            def logged(*args: Any, _m: Any = method, _n: str = name, **kw: Any) -> Any:
                providers.calls.append(_n)
                return _m(*args, **kw)

            monkeypatch.setattr(repo, method_name, logged)
        message_id = await send(r)
        assert await r.events.final(message_id) == "StreamEndEvent"
        assert providers.calls == ["cost", "finish_message", "add_session_usage"]
        session = await r.store.run(lambda db: db.sessions.get(r.session_id))
        assert session.total_tokens == 5 and session.total_cost == 0.5


# ---- 2. errors inside the job ----------------------------------------------------------


async def test_a_failing_partial_write_does_not_end_the_reply(tmp_path: Path, monkeypatch: Any) -> None:
    gate = anyio.Event()

    class Slow:
        async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
            yield TextDelta(text="one ")
            await gate.wait()
            yield TextDelta(text="two")
            yield Finish(reason="stop")

    async with rig(tmp_path, Slow()) as r:
        failures = 0
        original = r.store.blocking.messages.update_partial

        def flaky(*args: Any, **kw: Any) -> None:  # runs in the store's worker thread
            nonlocal failures
            if failures == 0:
                failures += 1
                raise SidecarError("database is locked")
            original(*args, **kw)
            anyio.from_thread.run_sync(gate.set)  # the write after the failure went through

        monkeypatch.setattr(r.store.blocking.messages, "update_partial", flaky)
        message_id = await send(r)
        assert await r.events.final(message_id) == "StreamEndEvent"
        stored = await r.store.run(lambda db: db.messages.get(message_id))
        assert stored.status == "completed" and stored.text_content == "one two" and failures == 1


async def test_a_store_error_in_the_tool_loop_ends_the_reply_as_error(tmp_path: Path, monkeypatch: Any) -> None:
    async with rig(tmp_path, ToolThenText("free")) as r:
        tools = r.store.blocking.tools

        def broken(*args: Any, **kw: Any) -> None:
            raise SidecarError("database is locked")

        monkeypatch.setattr(tools, "add_calls", broken)
        message_id = await send(r)
        assert await r.events.final(message_id) == "ErrorEvent"
        assert_one_final_last(r.events.of(message_id))
        stored = await r.store.run(lambda db: db.messages.get(message_id))
        assert stored.status == "error" and stored.text_content == "let me look"
        assert "database is locked" in (stored.error or "")
        await until(lambda: not r.engine.is_generating(r.session_id))


async def test_a_bug_in_the_ending_falls_back_to_error_with_the_text(tmp_path: Path, monkeypatch: Any) -> None:
    async def broken_finish(self: Any, session: Any, snap: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(OutputProcessor, "finish", broken_finish)
    async with rig(tmp_path, Hello()) as r:
        message_id = await send(r)
        assert await r.events.final(message_id) == "ErrorEvent"
        assert_one_final_last(r.events.of(message_id))
        stored = await r.store.run(lambda db: db.messages.get(message_id))
        assert stored.status == "error" and stored.text_content == "hello"


# ---- 3. usage across a pause -------------------------------------------------------------


async def test_usage_of_the_steps_before_a_pause_is_kept(tmp_path: Path) -> None:
    async with rig(tmp_path, ToolThenText("guarded")) as r:
        message_id = await send(r)
        await r.events.wait(message_id, "ToolApprovalRequiredEvent")
        with anyio.fail_after(10):  # the paused row holds the usage so far (a restart keeps it)
            while (paused := await r.store.run(lambda db: db.messages.get(message_id))).status != "paused":
                await anyio.sleep(0.01)
        assert paused.usage is not None and (paused.usage.input_tokens, paused.usage.output_tokens) == (100, 10)
        with anyio.fail_after(10):
            await r.approvals.approve(
                ToolApproveParams(session_id=r.session_id, tool_call_id="c1", decision="approved")
            )
        assert await r.events.final(message_id) == "StreamEndEvent"
        stored = await r.store.run(lambda db: db.messages.get(message_id))
        assert stored.status == "completed"
        assert stored.usage is not None and (stored.usage.input_tokens, stored.usage.output_tokens) == (200, 20)


# ---- 8. a job that does not stop -------------------------------------------------------


async def test_a_job_that_does_not_stop_makes_the_next_send_busy(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(chat_module, "STOP_TIMEOUT_S", 0.2)
    release = anyio.Event()
    streaming = anyio.Event()

    class Stubborn:
        async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
            yield TextDelta(text="a")
            streaming.set()
            with anyio.CancelScope(shield=True):  # ignores the stop until released
                await release.wait()
            yield Finish(reason="stop")

    async with rig(tmp_path, Stubborn()) as r:
        try:
            first = await send(r)
            with anyio.fail_after(10):
                await streaming.wait()
            count = len(await r.store.run(lambda db: db.messages.query(r.session_id, None)))
            with pytest.raises(SidecarError) as caught:
                await send(r, "second")
            assert caught.value.code == ErrorCode.BUSY
            assert len(await r.store.run(lambda db: db.messages.query(r.session_id, None))) == count  # nothing written
            assert r.engine._jobs[r.session_id].job.message_id == first  # still the one job
        finally:
            release.set()  # whatever happened, the rig can shut down
        assert await r.events.final(first) in FINALS
        assert_one_final_last(r.events.of(first))


# ---- 10. per-session state ---------------------------------------------------------------


async def test_sends_to_unknown_sessions_leave_no_locks(tmp_path: Path) -> None:
    async with rig(tmp_path, Hello()) as r:
        for i in range(50):
            with pytest.raises(NotFound):
                await r.engine.send(SendParams(session_id=f"bogus-{i}", input=UserInput(content="x")))
        message_id = await send(r)
        await r.events.final(message_id)
        assert len(r.engine._locks) == 0


async def test_retired_provider_clients_are_closed_once_unused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(providers_module, "RETIRE_GRACE_S", 0.0)
    store = await AsyncStore.open(tmp_path)
    try:
        service = ProviderService(store)
        params = ProviderUpsertParams(name="P", type="openai-compat", base_url="http://127.0.0.1:9/v1", api_key="k")
        info = await service.upsert_provider(params)
        old = (await service.resolve(info.id, "m")).provider
        await service.upsert_provider(msgspec.structs.replace(params, id=info.id, name="P2"))
        new = (await service.resolve(info.id, "m")).provider
        assert new is not old and old.provider._client.is_closed and not new.provider._client.is_closed
        assert service._retired == []
        await service.delete_provider(IdParams(id=info.id))
        assert service._live == {} and new.provider._client.is_closed
        await service.aclose()
    finally:
        await store.close()


# ---- 9. settings ---------------------------------------------------------------------------


async def test_concurrent_settings_updates_keep_both_changes() -> None:
    db: dict[str, str | None] = {}
    hold = anyio.Event()

    async def get(key: str) -> str | None:
        return db.get(key)

    async def put(key: str, value: str | None) -> None:
        await hold.wait()
        db[key] = value

    service = SettingsService(get_setting=get, set_setting=put)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.update_settings, ChatSettingsUpdate(generate_titles=False))
            tg.start_soon(service.update_settings, ChatSettingsUpdate(temperature=0.3))
            await wait_all_tasks_blocked()
            hold.set()
    stored = msgspec.json.decode(db["chat_settings"] or "", type=ChatSettings)
    for settings in (service.current(), stored):
        assert settings.generate_titles is False and settings.temperature == 0.3


# ---- 11. paused replies that fail to close ------------------------------------------------


async def test_a_paused_reply_that_fails_to_close_keeps_the_session_busy(tmp_path: Path, monkeypatch: Any) -> None:
    async with rig(tmp_path, ToolThenText("guarded")) as r:
        message_id = await send(r)
        await r.events.wait(message_id, "ToolApprovalRequiredEvent")
        await until(lambda: not r.engine.is_generating(r.session_id))
        assert (await r.store.run(lambda db: db.messages.get(message_id))).status == "paused"
        handler = r.engine._handler
        original = r.approvals.cancel

        async def broken(*args: Any, **kw: Any) -> Any:
            raise SidecarError("database is locked")

        monkeypatch.setattr(r.approvals, "cancel", broken)
        with pytest.raises(SidecarError):
            await handler.close_paused(r.session_id, "test")
        assert not handler.is_idle(r.session_id)  # still known to hold a paused reply
        monkeypatch.setattr(r.approvals, "cancel", original)
        assert await handler.close_paused(r.session_id, "test") is True
        assert handler.is_idle(r.session_id)
        assert (await r.store.run(lambda db: db.messages.get(message_id))).status == "aborted"


# ---- 12. a delete racing a send ------------------------------------------------------------


async def test_sends_are_refused_while_the_session_is_being_deleted(tmp_path: Path, monkeypatch: Any) -> None:
    async with rig(tmp_path, Hello()) as r:
        sessions = SessionService(r.store, r.events.notify)
        raced: list[BaseException] = []

        async def hook(session_id: str, reason: str) -> Any:
            release = await r.engine.stop_session(session_id, reason)
            try:  # a send between the hook and the delete
                await send(r, "late")
            except SidecarError as exc:
                raced.append(exc)
            return release

        sessions.on_delete.append(hook)
        original = r.store.blocking.sessions.delete

        def failing_delete(session_id: str) -> None:
            raise SidecarError("disk full")

        monkeypatch.setattr(r.store.blocking.sessions, "delete", failing_delete)
        with pytest.raises(SidecarError, match="disk full"):
            await sessions.delete_session(IdParams(id=r.session_id))
        assert len(raced) == 1 and isinstance(raced[0], NotFound)
        assert await r.store.run(lambda db: db.messages.query(r.session_id, None)) == []
        # the delete failed: the session takes sends again
        message_id = await send(r)
        assert await r.events.final(message_id) == "StreamEndEvent"
        monkeypatch.setattr(r.store.blocking.sessions, "delete", original)
        raced.clear()
        await sessions.delete_session(IdParams(id=r.session_id))
        assert len(raced) == 1 and isinstance(raced[0], NotFound)
        assert r.engine._deleting == {}


# ---- 13. the relay under cancellation -------------------------------------------------------


async def test_a_cancelled_flush_loses_no_text() -> None:
    sent: list[Any] = []
    block = anyio.Event()
    blocked = anyio.Event()

    async def notify(method: str, event: Any) -> None:
        if sent and not block.is_set():
            blocked.set()
            await block.wait()  # the output queue is full
        sent.append(event)

    reply = ReplyBuilder()
    relay = StreamRelay(notify, "s", "m", coalesce_s=60, on_delta=reply.add_delta)
    await relay.delta("text", "first ")  # the first delta goes out at once, the others wait
    await relay.delta("thinking", "hmm")
    await relay.delta("text", "second")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.flush)
            await blocked.wait()
            tg.cancel_scope.cancel()  # cancelled while sending the thinking run
        block.set()
        await relay.flush()
    assert reply.text == "first second" and "hmm" in str(reply.parts)
    assert [e.text for e in sent if isinstance(e, TextDeltaEvent)] == ["first ", "second"]


# ---- 6. summaries are tokenized off the event loop ------------------------------------------


async def test_summary_chunks_are_made_in_a_worker_thread(monkeypatch: Any) -> None:
    seen: list[bool] = []
    original = Summarizer._chunks

    def recording(self: Any, blocks: list[str], *rest: Any) -> list[list[str]]:
        seen.append(threading.current_thread() is threading.main_thread())
        return original(self, blocks, *rest)

    monkeypatch.setattr(Summarizer, "_chunks", recording)

    async def model(provider_id: str, model_id: str, messages: Any, **kw: Any) -> str:
        return "summary"

    from protocol.types import MessageV2

    message = MessageV2(id="a", session_id="s", role="user", text_content="hello", created_at=0, updated_at=0)
    with anyio.fail_after(10):
        assert await Summarizer(model).summarize(previous=None, messages=[message], provider_id="p", model_id="m") == "summary"
    assert seen == [False]
