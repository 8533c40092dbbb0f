"""Server-forwarded chat in-process: the stream follower (re-attach, replay detection, idle
timeout, limits), the event mapping of both chat APIs, the permission request shapes, and the
request content."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from protocol.types import FilePart, ImagePart, MessageV2, TextPart, Usage
from sidecar.engine.lifecycle import Aborted, Completed, Failed
from sidecar.sync import chatstream
from sidecar.sync.chatstream import Follower, ReplayFilter, canonical_key
from sidecar.sync.errors import ChatFailed, ServerRejected, ServerUnreachable
from sidecar.sync.events import DEFAULT_OPTIONS, ComputerEvents, ConversationEvents, PermissionAsk, ending_of_message
from sidecar.sync.forward import _our_reply, _request_content
from sidecar.sync.wire import AgentOutputDto, ChatMessageDto, PermissionRequestDto, SessionFrame

pytestmark = pytest.mark.anyio


# ---- the follower -------------------------------------------------------------------------


class Item(msgspec.Struct):
    name: str
    end: bool = False
    beat: bool = False


def key_of(item: Item) -> bytes | None:
    return None if item.beat else canonical_key("item", msgspec.json.encode({"n": item.name}))


def scripted(*streams: list[Item | Exception | float]) -> tuple[Any, list[int]]:
    """An opener returning the given streams in order: an Exception ends one with that
    failure, a float sleeps that long (past the idle timeout: silence)."""
    opened: list[int] = []
    queue = list(streams)

    @asynccontextmanager
    async def opener() -> AsyncIterator[AsyncIterator[Item]]:
        opened.append(1)
        script = queue.pop(0) if queue else [ServerUnreachable("gone")]
        if isinstance(script, Exception):
            raise script

        async def gen() -> AsyncIterator[Item]:
            for step in script:
                if isinstance(step, Exception):
                    raise step
                if isinstance(step, float):
                    await anyio.sleep(step)
                    continue
                yield step

        yield gen()

    return opener, opened


async def collect(follower: Follower[Item]) -> list[str]:
    out = []
    with anyio.fail_after(20):
        async for item in follower.events():
            out.append(item.name)
    return out


def follower(first: Any, again: Any, *, idle: float = 5.0, first_starts: bool = True) -> Follower[Item]:
    return Follower(open_first=first, open_again=again, key=key_of, ends=lambda i: i.end, idle_s=idle,
                    what="test", first_starts=first_starts)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chatstream, "REATTACH_BACKOFF_S", (0.0,) * 5)


async def test_a_replay_from_the_start_is_skipped_and_the_rest_follows():
    first, _ = scripted([Item("a"), Item("b"), ServerUnreachable("dropped")])
    again, opened = scripted([Item("a"), Item("beat", beat=True), Item("b"), Item("c"), Item("z", end=True)])
    f = follower(first, again)
    assert await collect(f) == ["a", "b", "beat", "c", "z"]
    assert f.reattached == 1 and len(opened) == 1 and f.ended


async def test_a_continuation_is_not_a_replay():
    first, _ = scripted([Item("a"), Item("b")])  # ends early: re-attached
    again, _ = scripted([Item("c"), Item("a"), Item("z", end=True)])
    assert await collect(follower(first, again)) == ["a", "b", "c", "a", "z"]


async def test_a_replay_that_diverges_is_new_from_there():
    first, _ = scripted([Item("a"), Item("b"), Item("c"), ServerUnreachable("dropped")])
    again, _ = scripted([Item("a"), Item("x"), Item("c"), Item("z", end=True)])
    assert await collect(follower(first, again)) == ["a", "b", "c", "x", "c", "z"]


async def test_silence_past_the_idle_timeout_reattaches():
    first, _ = scripted([Item("a"), 10.0, Item("never")])
    again, opened = scripted([Item("a"), Item("b", end=True)])
    f = follower(first, again, idle=0.2)
    assert await collect(f) == ["a", "b"]
    assert len(opened) == 1


async def test_a_turn_that_cannot_start_is_not_reattached():
    first, _ = scripted(ServerRejected("refused", server_code="0001"))
    again, opened = scripted([Item("z", end=True)])
    with pytest.raises(ServerRejected):
        await collect(follower(first, again))
    assert opened == []
    # the computer API started the turn before: its first stream is re-attached like any
    first, _ = scripted(ServerUnreachable("connect"))
    again, opened = scripted([Item("z", end=True)])
    assert await collect(follower(first, again, first_starts=False)) == ["z"]


async def test_reattaching_gives_up_after_the_limit():
    first, _ = scripted([Item("a"), ServerUnreachable("dropped")])
    again, opened = scripted(*[ServerUnreachable("down")] * 20)
    f = follower(first, again)
    with pytest.raises(ServerUnreachable, match="could not be re-attached"):
        await collect(f)
    assert len(opened) == chatstream.MAX_REATTACH + 1


async def test_iterating_again_after_the_consumer_stopped_reattaches():
    first, _ = scripted([Item("a"), Item("b"), 10.0])
    again, _ = scripted([Item("a"), Item("b"), Item("c"), Item("z", end=True)])
    f = follower(first, again)
    seen = []
    async with anyio.create_task_group() as tg:
        async def consume() -> None:
            async for item in f.events():
                seen.append(item.name)
                if item.name == "b":
                    tg.cancel_scope.cancel()
        tg.start_soon(consume)
    assert seen == ["a", "b"]
    assert await collect(f) == ["c", "z"]


def test_keys_ignore_key_order_and_replay_filter_rules():
    assert canonical_key("k", b'{"a":1,"b":2}') == canonical_key("k", b'{"b":2,"a":1}')
    assert canonical_key("k", b'{"a":1}') != canonical_key("j", b'{"a":1}')
    keys = [b"1", b"2"]
    f = ReplayFilter(keys)
    assert [f.is_repeat(k) for k in (b"1", b"2", b"3", b"1")] == [True, True, False, False]
    assert ReplayFilter([]).is_repeat(b"1") is False


# ---- the event mapping ----------------------------------------------------------------------


class FakeReply:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.parts: list[Any] = []

    async def text(self, delta: str) -> None:
        self.calls.append(("text", delta))

    async def thinking(self, delta: str, signature: str | None = None) -> None:
        self.calls.append(("thinking", delta))

    async def part(self, part: Any) -> int:
        self.parts.append(part)
        self.calls.append(("part", type(part).__name__))
        return len(self.parts) - 1

    def replace_part(self, index: int, part: Any) -> None:
        self.parts[index] = part
        self.calls.append(("replace", index))

    async def tool_call_started(self, call_id: str, name: str, arguments: str = "") -> None:
        self.calls.append(("start", call_id, name))

    async def tool_result(self, call_id: str, output: str, is_error: bool, *, replace: int | None = None,
                          announce: bool = True) -> int:
        self.calls.append(("result", call_id, output, is_error, replace))
        return 99 if replace is None else replace

    async def report_usage(self, total: Usage, *, announce: bool = False) -> None:
        self.calls.append(("usage", total.input_tokens, total.output_tokens))

    async def plan(self, entries: list[Any]) -> None:
        self.calls.append(("plan", [e.content for e in entries]))

    async def notice(self, text: str, code: str | None = None) -> None:
        self.calls.append(("notice", text))


def event(kind: str, data: Any = None, **fields: Any) -> AgentOutputDto:
    return msgspec.json.decode(msgspec.json.encode({"eventType": kind, "data": data, **fields}), type=AgentOutputDto)


def processing(status: str, execute_id: str = "t1", **result: Any) -> AgentOutputDto:
    return event("PROCESSING", {"targetId": -1, "name": "Bash ls", "type": "ToolCall", "status": status,
                                "result": {"executeId": execute_id, "input": {"command": "ls"}, **result}})


async def test_conversation_events_map_to_the_reply():
    reply = FakeReply()
    asks: list[PermissionAsk] = []
    events = ConversationEvents(reply, asks.append)  # type: ignore[arg-type]
    for item in [
        event("MESSAGE", {"type": "THINK", "text": "hmm"}, requestId="r1"),
        event("MESSAGE", {"type": "CHAT", "text": "Hi "}),
        event("HEART_BEAT"),
        processing("EXECUTING"),
        processing("EXECUTING"),  # seen again: nothing new
        processing("FINISHED", data=[{"type": "content", "content": {"type": "text", "text": "a.txt"}}]),
        processing("FINISHED", data="b.txt"),  # the result changed: replaced
        event("PROCESSING", {"type": "Plan", "status": "FINISHED", "result": {"data": [
            {"content": "step one", "status": "completed"}, {"content": "step two"}]}}),
        event("PROCESSING", {"type": "Event", "subEventType": "REQUEST_PERMISSION", "status": "FINISHED", "result": {
            "executeId": "p1", "input": {"tool_call_id": "p1", "request_permission_request": {
                "sessionId": "s", "toolCall": {"toolCallId": "p1", "title": "Write", "kind": "edit",
                                               "rawInput": {"path": "x"}},
                "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}]}}}}),
        event("PROCESSING", "not an object"),
        event("MESSAGE", {"type": "CHAT", "text": "there"}),
    ]:
        assert await events.apply(item) is None
    assert events.request_id == "r1" and events.text == "Hi there"
    assert reply.calls == [
        ("thinking", "hmm"), ("text", "Hi "), ("part", "ToolUsePart"), ("start", "t1", "Bash ls"),
        ("result", "t1", "a.txt", False, None), ("result", "t1", "b.txt", False, 99),
        ("plan", ["step one", "step two"]), ("text", "there"),
    ]
    assert asks == [PermissionAsk(tool_call_id="p1", title="Write", kind="edit", arguments='{"path":"x"}',
                                  options=[DEFAULT_OPTIONS[0].__class__(option_id="ok", name="OK", kind="allow_once")])]
    final = await events.apply(event("FINAL_RESULT", {"success": True, "promptTokens": 7, "completionTokens": 3},
                                     completed=True))
    assert final == Completed("stop") and reply.calls[-1] == ("usage", 7, 3)


async def test_conversation_endings():
    reply = FakeReply()
    events = ConversationEvents(reply, lambda ask: None)  # type: ignore[arg-type]
    await events.apply(event("MESSAGE", {"type": "CHAT", "text": "boom", "finished": True, "finishReason": "ERROR"}))
    assert reply.calls == []  # the error text is not content
    failed = await events.apply(event("FINAL_RESULT", {"success": False}, completed=True))
    assert isinstance(failed, Failed) and isinstance(failed.error, ChatFailed) and failed.error.message == "boom"
    quiet = ConversationEvents(reply, lambda ask: None)  # type: ignore[arg-type]
    assert isinstance(await quiet.apply(event("FINAL_RESULT", {"success": False}, completed=True)), Aborted)
    not_running = await quiet.apply(event("ERROR", error="Conversation not executing"))
    assert isinstance(not_running, Failed) and "not executing" in not_running.error.message
    assert ending_of_message(msgspec.convert({"finishReason": "EndTurn"}, ChatMessageDto)) == Completed("stop")
    assert isinstance(ending_of_message(msgspec.convert({"finishReason": "STOP"}, ChatMessageDto)), Aborted)
    assert isinstance(ending_of_message(msgspec.convert({"finishReason": "ERROR", "text": "x"}, ChatMessageDto)), Failed)
    assert isinstance(ending_of_message(None), Failed)


def frame(message_type: str, sub_type: str, data: Any) -> SessionFrame:
    return msgspec.json.decode(msgspec.json.encode(
        {"messageType": message_type, "subType": sub_type, "data": data}), type=SessionFrame)


async def test_computer_frames_map_through_the_acp_mapper():
    reply = FakeReply()
    asks: list[PermissionAsk] = []
    events = ComputerEvents(reply, asks.append)  # type: ignore[arg-type]
    for item in [
        frame("sessionPromptStart", "prompt_start", {"request_id": "r"}),
        frame("agentSessionUpdate", "agent_message_chunk", {"content": {"type": "text", "text": "Hi"}}),  # no sessionUpdate
        frame("heartbeat", "ping", {"type": "heartbeat"}),
        frame("acpRequestPermission", "request_permission", {"tool_call_id": "p", "request_permission_request": {
            "toolCall": {"toolCallId": "p", "title": "Bash"}}}),
    ]:
        assert await events.apply(item) is None
    assert reply.calls == [("text", "Hi")]
    assert [a.tool_call_id for a in asks] == ["p"] and asks[0].options == DEFAULT_OPTIONS
    assert await events.apply(frame("sessionPromptEnd", "max_tokens", {"reason": "max_tokens"})) == Completed("length")
    assert isinstance(await events.apply(frame("sessionPromptEnd", "cancelled", {})), Aborted)
    failed = await events.apply(frame("sessionPromptEnd", "error", {"description": "model down"}))
    assert isinstance(failed, Failed) and failed.error.message == "model down"


def test_permission_requests_in_every_spelling():
    for value in (
        {"request_permission_request": {"toolCall": {"toolCallId": "a"}, "options": [{"optionId": "x"}]}},
        {"requestPermissionRequest": {"tool_call": {"tool_call_id": "a"}, "options": [{"option_id": "x"}]}},
        {"toolCall": {"toolCallId": "a"}, "options": [{"optionId": "x"}], "tool_call_id": "a"},
    ):
        request = PermissionRequestDto.from_input(value)
        assert request.tool_call is not None and request.tool_call.tool_call_id == "a"
        assert request.options is not None and request.options[0].option_id == "x"
    assert PermissionRequestDto.from_input("nope") == PermissionRequestDto()
    assert PermissionRequestDto.from_input({"options": "bad"}) == PermissionRequestDto()


def test_our_reply_and_the_request_content():
    page = [msgspec.convert(m, ChatMessageDto) for m in (
        {"index": 1, "role": "USER", "text": "hi"},
        {"index": 2, "id": "old", "role": "ASSISTANT", "text": "first"},
        {"index": 3, "role": "USER", "text": "hi"},
        {"index": 4, "id": "req", "role": "ASSISTANT", "text": "second"},
    )]
    found = _our_reply(page, "req", "hi")
    assert found is not None and found.text == "second"
    by_text = _our_reply(page, None, "hi")
    assert by_text is not None and by_text.text == "second"
    assert _our_reply(page, None, "other") is None
    user = MessageV2(id="u", session_id="s", role="user", content_type="multipart", text_content="look",
                     parts=[TextPart(text="look"), ImagePart(mime_type="image/png", url="https://x/a.png"),
                            FilePart(uri="file:///tmp/secret.txt", name="secret.txt")],
                     created_at=1, updated_at=1)
    text, attachments, dropped = _request_content(user)
    assert text == "look" and [a.file_url for a in attachments] == ["https://x/a.png"]
    assert dropped == ["secret.txt (only http(s) files can be sent)"]
