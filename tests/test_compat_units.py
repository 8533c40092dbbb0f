"""The V1 endpoint's parts in-process: frame bytes per flavor, rules, the progress hub, checks."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from protocol.chat import UserInput
from protocol.events import (
    AbortedEvent,
    ErrorEvent,
    PlanEntry,
    PlanEvent,
    StreamEndEvent,
    StreamStartEvent,
    StreamToolCall,
    StreamToolResult,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolApprovalRequiredEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
    ToolResultEvent,
    UsageEvent,
)
from protocol.types import Usage
from sidecar.compat import rules, validate, wire
from sidecar.compat.frames import FrameBuilder, Frames
from sidecar.compat.progress import BUFFER_MAX, BUFFER_TTL_S, CLIENT_MAX_BYTES, ProgressHub, TooManyClients
from sidecar.compat.wire import ToolApprovalRuleIn, V1Error

NOW = dt.datetime(2026, 3, 9, 2, 25, 1, 120000, tzinfo=dt.UTC)
SID = "0b6c2f1e-0000-7000-8000-000000000001"


def base(event_type: type, seq: int, **fields: Any) -> Any:
    return event_type(session_id=SID, message_id="m1", timestamp=1, seq=seq, **fields)


def frames_of(flavor: str, events: list[Any], request_id: str | None = "a1b2c3", **kw: Any) -> list[bytes]:
    builder = FrameBuilder(Frames(flavor, SID, clock=lambda: NOW, **kw), request_id)  # type: ignore[arg-type]
    return [frame.encode() for event in events for frame in builder.build(event)]


def parse(frame: bytes) -> tuple[str, dict[str, Any]]:
    head, data, tail = frame.split(b"\n", 2)
    assert tail == b"\n" and head.startswith(b"event: ") and data.startswith(b"data: ")
    return head[7:].decode(), json.loads(data[6:])


def test_electron_frames_are_the_documented_bytes() -> None:
    out = frames_of("electron", [
        base(StreamStartEvent, 1),
        base(TextDeltaEvent, 2, text="好的，"),
        base(StreamEndEvent, 3, finish_reason="stop"),
    ])
    assert out[0] == (
        b'event: prompt_start\ndata: {"sessionId":"' + SID.encode() + b'","acpSessionId":"' + SID.encode()
        + b'","messageType":"sessionPromptStart","subType":"prompt_start","data":{"request_id":"a1b2c3"},'
        b'"timestamp":"2026-03-09T02:25:01.120Z"}\n\n'
    )
    assert out[1] == (
        b'event: agent_message_chunk\ndata: {"sessionId":"' + SID.encode() + b'","acpSessionId":"' + SID.encode()
        + b'","messageType":"agentSessionUpdate","subType":"agent_message_chunk","data":{"sessionUpdate":'
        b'"agent_message_chunk","content":{"type":"text","text":"' + "好的，".encode() + b'"}},'
        b'"timestamp":"2026-03-09T02:25:01.120Z"}\n\n'
    )
    event, message = parse(out[2])
    assert event == "end_turn"
    assert message["messageType"] == "sessionPromptEnd"
    assert message["data"] == {"reason": "end_turn", "description": "Prompt completed: end_turn"}
    # Electron leaves out a request id it did not get
    assert parse(frames_of("electron", [base(StreamStartEvent, 1)], request_id=None)[0])[1]["data"] == {}


def test_rcoder_frames_carry_request_id_and_rust_reasons() -> None:
    out = frames_of("rcoder", [
        base(StreamStartEvent, 1),
        base(ThinkingDeltaEvent, 2, thinking="hmm"),
        base(StreamEndEvent, 3, finish_reason="length"),
        base(AbortedEvent, 4),
        base(ErrorEvent, 5, error="boom", code=-32004),
    ])
    messages = [parse(f) for f in out]
    for _, message in messages:
        assert "acpSessionId" not in message
        assert message["timestamp"] == "2026-03-09T02:25:01.120Z"
    assert messages[1] == ("agent_thought_chunk", messages[1][1])
    assert messages[1][1]["data"] == {"content": {"type": "text", "text": "hmm"}, "request_id": "a1b2c3"}
    assert messages[2][0] == "max_tokens"
    assert messages[2][1]["data"] == {"reason": "MaxTokens", "description": "Max token limit reached", "request_id": "a1b2c3"}
    assert messages[3][0] == "cancelled" and messages[3][1]["data"]["reason"] == "Cancelled"
    assert messages[4][0] == "error"
    assert messages[4][1]["data"] == {"code": -32004, "message": "boom", "request_id": "a1b2c3"}


def test_end_reasons_cancel_forms_and_errors() -> None:
    def end(flavor: str, event: Any, **kw: Any) -> tuple[str, dict[str, Any]]:
        return parse(frames_of(flavor, [event], **kw)[0])

    for reason, sub in (("stop", "end_turn"), ("length", "max_tokens"), ("refusal", "refusal"),
                        ("content_filter", "refusal"), ("max_turn_requests", "max_turn_requests"),
                        ("tool_calls", "end_turn"), (None, "end_turn")):
        event, message = end("electron", base(StreamEndEvent, 1, finish_reason=reason))
        assert event == sub and message["data"]["reason"] == sub
    event, message = end("electron", base(AbortedEvent, 1, reason="aborted by the user"))
    assert (event, message["data"]) == ("cancelled", {"reason": "cancelled", "description": "Prompt completed: cancelled"})
    event, message = end("electron", base(AbortedEvent, 1), cancel_as_error=True)
    assert (event, message["data"]) == ("error", {"reason": "error", "description": "Session cancelled"})
    event, message = end("electron", base(ErrorEvent, 1, error="provider said no"))
    assert (event, message["data"]) == ("error", {"reason": "error", "description": "provider said no"})


def test_tool_calls_plan_and_usage() -> None:
    out = [parse(f) for f in frames_of("electron", [
        base(ToolCallStartEvent, 1, tool_call=StreamToolCall(id="t1", name="workspace_write", arguments="")),
        base(ToolCallDeltaEvent, 2, tool_call=StreamToolCall(id="t1", name="workspace_write", arguments='{"path":')),
        base(ToolCallDeltaEvent, 3, tool_call=StreamToolCall(id="t1", name="workspace_write", arguments='"a.txt"}')),
        base(ToolResultEvent, 4, tool_result=StreamToolResult(tool_call_id="t1", output="ok")),
        base(ToolCallStartEvent, 5, tool_call=StreamToolCall(id="t2", name="Bash", arguments='{"command":"ls"}')),
        base(ToolApprovalRequiredEvent, 6, tool_call=StreamToolCall(id="t2", name="Bash", arguments='{"command":"ls"}')),
        base(ToolResultEvent, 7, tool_result=StreamToolResult(tool_call_id="t2", output="denied", is_error=True)),
        base(PlanEvent, 8, entries=[PlanEntry(content="Look", priority="high", status="completed")]),
        base(UsageEvent, 9, usage=Usage(input_tokens=3)),
        base(UsageEvent, 10, usage=Usage(context_used=1234, context_size=200000)),
    ])]
    assert [e for e, _ in out] == ["tool_call", "tool_call_update", "tool_call", "tool_call_update", "plan", "usage_update"]
    assert out[0][1]["data"] == {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "workspace_write", "status": "pending", "rawInput": {}}
    assert out[1][1]["data"] == {
        "sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed", "rawInput": {"path": "a.txt"},
        "content": [{"type": "content", "content": {"type": "text", "text": "ok"}}],
    }
    assert out[2][1]["data"]["rawInput"] == {"command": "ls"}  # complete at start: not sent again
    assert out[3][1]["data"]["status"] == "failed" and "rawInput" not in out[3][1]["data"]
    assert out[4][1]["data"] == {"sessionUpdate": "plan", "entries": [{"content": "Look", "priority": "high", "status": "completed"}]}
    assert out[5][1]["data"] == {"sessionUpdate": "usage_update", "used": 1234, "size": 200000}


def test_pings_and_the_idle_end() -> None:
    electron = Frames("electron", SID, clock=lambda: NOW)
    event, message = parse(electron.ping().encode())
    assert event == "ping" and list(message) == ["sessionId", "messageType", "subType", "data", "timestamp"]
    assert message["data"] == {"type": "heartbeat", "message": "keep-alive", "timestamp": "2026-03-09T02:25:01.120Z"}
    event, message = parse(electron.idle_end().encode())
    assert event == "end_turn" and message["messageType"] == "sessionPromptEnd" and "acpSessionId" not in message
    assert message["data"] == {"reason": "EndTurn", "description": "Agent 当前无在执行任务"}
    rcoder = Frames("rcoder", SID, clock=lambda: NOW.replace(microsecond=120456))
    _, message = parse(rcoder.ping().encode())
    assert message["timestamp"] == "2026-03-09T02:25:01.120456Z"
    assert message["data"]["timestamp"] == "2026-03-09T02:25:01.120456+00:00"


def test_envelope_bytes() -> None:
    assert wire.ok({"a": 1}) == b'{"code":"0000","message":"success","data":{"a":1},"tid":null,"success":true}'
    assert wire.error("VALIDATION_ERROR", "user_id is required") == (
        b'{"code":"VALIDATION_ERROR","message":"user_id is required","data":null,"tid":null,"success":false}'
    )
    body = msgspec.json.encode(wire.ChatResponse(project_id="p", session_id="s", request_id="r", is_new_session=True))
    assert body == b'{"project_id":"p","session_id":"s","error":null,"request_id":"r","is_new_session":true}'
    body = msgspec.json.encode(wire.ChatResponse(project_id="p", session_id="s"))
    assert body == b'{"project_id":"p","session_id":"s","error":null,"request_id":null}'


# -- rules ----------------------------------------------------------------------------


def compile_(*specs: dict[str, Any]) -> tuple[rules.Rule, ...]:
    return rules.compile_rules([msgspec.convert(s, ToolApprovalRuleIn) for s in specs])


def action(compiled: tuple[rules.Rule, ...], title: str, raw_input: Any, kind: str | None = None) -> str | None:
    rule = rules.decide(compiled, title=title, raw_input=raw_input, kind=kind)
    return rule.action if rule else None


def test_rules_follow_the_shared_matching_spec() -> None:
    general = compile_({"patterns": ["*get_stock_data", "rm -rf *"], "action": "ask"})
    assert action(general, "A_get_stock_data", {"tool": "get_stock_data"}, "other") == "ask"
    assert action(general, "Bash", {"command": "rm -rf /tmp"}, "execute") == "ask"
    assert action(general, "Bash", {"command": "ls"}, "execute") is None
    # explicit kind: one target, case-insensitive kind and patterns
    by_kind = compile_({"patterns": ["*DELETE*"], "action": "deny", "tool_kind": "Delete"})
    assert action(by_kind, "delete_file now", {}, "delete") == "deny"
    assert action(by_kind, "delete_file now", {}, "edit") is None
    assert action(compile_({"patterns": ["ls *"], "action": "allow", "tool_kind": "execute"}), "Terminal", {"cmd": "ls -la"}, "execute") == "allow"
    # first match wins; the server's own rules: ask for nothing, allow ask_question
    server = compile_({"action": "ask", "patterns": []}, {"action": "allow", "patterns": ["*ask_question*"]})
    assert action(server, "mcp__nuwax__ask_question", {}) == "allow"
    assert action(server, "Bash", {"command": "ls"}) is None
    # glob dialect: ? [a-z] [!x], * spans "/", braces are literal, anchored
    g = compile_({"patterns": ["[rc]m ?", "cat /etc/*", "{a,b}", "git"], "action": "deny"})
    assert action(g, "x", {"command": "rm x"}) == "deny"
    assert action(g, "x", {"command": "cat /etc/ssh/sshd_config"}) == "deny"
    assert action(g, "x", {"command": "a"}) is None and action(g, "x", {"command": "{a,b}"}) == "deny"
    assert action(g, "x", {"command": "git status"}) is None
    assert action(compile_({"patterns": ["bash"], "action": "allow"}), "x", "bash") == "allow"  # a string rawInput is a command


def test_bad_rules_are_validation_errors() -> None:
    with pytest.raises(V1Error) as err:
        compile_({"patterns": ["x"], "action": "maybe"})
    assert err.value.status == 400 and "tool_approval_rules[0].action" in err.value.message


# -- progress hub ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hub_with(session: str = "s1", **kw: Any) -> tuple[ProgressHub, Frames, Clock]:
    clock = Clock()
    hub = ProgressHub(max_clients=kw.pop("max_clients", 2), clock=clock)
    frames = hub.ensure(session, lambda: Frames("electron", session, clock=lambda: NOW))
    return hub, frames, clock


def test_early_buffer_keeps_50_merges_text_and_always_the_end() -> None:
    hub, frames, _ = hub_with()
    hub.publish("s1", frames.prompt_start("r"))
    for i in range(BUFFER_MAX + 20):
        hub.publish("s1", frames.text("agent_message_chunk", f"{i} ", "r"))
    hub.publish("s1", frames.update("tool_call", {"toolCallId": "x"}, "r"))  # past the limit: dropped
    hub.publish("s1", frames.end("end_turn", "r"))
    client, replay = hub.connect("s1")
    assert len(replay) == BUFFER_MAX + 1
    assert replay[-1].terminal and replay[0].event == "prompt_start"
    text = "".join(f.message.data["content"]["text"] for f in replay if f.text_kind)
    assert text == "".join(f"{i} " for i in range(BUFFER_MAX + 20))
    assert not hub.buffered("s1")  # consumed by the first client
    hub.disconnect(client)


def test_buffer_expires_and_live_clients_get_frames_directly() -> None:
    hub, frames, clock = hub_with()
    hub.publish("s1", frames.prompt_start(None))
    clock.now += BUFFER_TTL_S
    assert not hub.buffered("s1")
    client, replay = hub.connect("s1")
    assert replay == []
    hub.publish("s1", frames.text("agent_message_chunk", "hi", None))
    assert not hub.buffered("s1")
    second, _ = hub.connect("s1")
    with pytest.raises(TooManyClients):
        hub.connect("s1")
    hub.close_session("s1")
    assert hub.client_count("s1") == 0
    hub.disconnect(client)
    hub.disconnect(second)


@pytest.mark.anyio
async def test_a_client_that_does_not_read_is_cut_off_alone() -> None:
    hub, frames, _ = hub_with()
    slow, _ = hub.connect("s1")
    fast, _ = hub.connect("s1")
    big = frames.text("agent_message_chunk", "x" * 65536, None)
    received = 0
    for _ in range(CLIENT_MAX_BYTES // 65536 + 8):
        hub.publish("s1", big)
        await fast.receive()
        received += 1
    assert slow.cut and not fast.cut and hub.client_count("s1") == 1
    with pytest.raises(anyio.EndOfStream):
        while True:
            await slow.receive()  # what it had queued, then the end
    hub.disconnect(slow)
    hub.disconnect(fast)


# -- checks ---------------------------------------------------------------------------


def test_ids_and_work_dirs_cannot_climb_out(tmp_path: Path) -> None:
    for bad in ("../x", "a/b", "..", "a\\b", "C:", "x" * 65, "é", "a b", "a\x00"):
        with pytest.raises(V1Error) as err:
            validate.identifier(bad, "project_id")
        assert err.value.status == 400 and err.value.v1_code == "VALIDATION_ERROR"
    assert validate.identifier("1464425_1128", "project_id") == "1464425_1128"
    root = tmp_path / "root"
    allowed = (tmp_path,)
    assert validate.work_dir("1464425", root) == root / "1464425"
    for bad, code in (("../up", "AGENT_WORK_DIR_INVALID"), (str(tmp_path / "missing"), "AGENT_WORK_DIR_NOT_FOUND")):
        with pytest.raises(V1Error) as err:
            validate.work_dir(bad, root, allowed)
        assert err.value.v1_code == code
    (tmp_path / "file").write_text("x")
    with pytest.raises(V1Error) as err:
        validate.work_dir(str(tmp_path / "file"), root, allowed)
    assert err.value.v1_code == "AGENT_WORK_DIR_NOT_A_DIRECTORY"
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert validate.work_dir(str(tmp_path / "link"), root, allowed) == real.resolve()
    # outside every allowed root (the workspace, the host's roots): refused, existing or not
    for outside in ("/", str(tmp_path / "real"), str(tmp_path.parent)):
        with pytest.raises(V1Error) as err:
            validate.work_dir(outside, root)
        assert err.value.v1_code == "AGENT_WORK_DIR_INVALID"
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(V1Error) as err:
            validate.work_dir(str(locked), root, allowed)
        assert err.value.v1_code == "AGENT_WORK_DIR_NOT_WRITABLE"


def test_token_compare() -> None:
    assert validate.token_matches(b"a" * 20, "a" * 20)
    assert not validate.token_matches(b"a" * 20, "a" * 19 + "b")
    assert not validate.token_matches(b"a" * 20, None) and not validate.token_matches(b"a" * 20, "")
    assert not validate.token_matches(b"a" * 20, "é" * 10)


# -- turns ----------------------------------------------------------------------------


class FakeChat:
    async def send(self, params: Any) -> Any:
        from protocol.chat import SendResult

        return SendResult(message_id="m1", user_message_id="u1")

    async def abort(self, params: Any) -> Any:
        raise AssertionError("not called")


class StoredMessage:
    status = "streaming"


@pytest.mark.anyio
async def test_a_pump_that_falls_behind_ends_the_progress_with_an_error_and_still_sees_the_end() -> None:
    from sidecar.compat.turns import LOST, Turn, TurnRunner
    from sidecar.engine.events import EventHub

    async def nowhere(method: str, params: Any) -> None:
        pass

    hub = EventHub(nowhere)
    published: list[Any] = []

    async def get_message(message_id: str) -> Any:
        return StoredMessage()

    async with anyio.create_task_group() as tg:
        runner = TurnRunner(
            chat=FakeChat(), events=hub, approvals=None, store=None,  # type: ignore[arg-type]
            get_message=get_message, publish=lambda sid, frame: published.append(frame), task_group=tg,
            trust_agent_mode=False, subscription_buffer=4,
        )
        frames = Frames("electron", SID, clock=lambda: NOW)
        turn = Turn(SID, FrameBuilder(frames, "r"), rules=(), yolo=False, provider_id=None)
        await runner.start(turn, UserInput(content="hi"))
        assert runner.running(SID) is turn
        await hub.publish("chat:stream", base(StreamStartEvent, 1))
        for seq in range(2, 12):  # no checkpoint in between: the pump cannot keep up
            await hub.publish("chat:stream", base(TextDeltaEvent, seq, text=f"{seq} "))
        with anyio.fail_after(10):
            while not any(f.event == "error" for f in published):
                await anyio.sleep(0.01)
        await hub.publish("chat:stream", base(TextDeltaEvent, 12, text="late"))
        await hub.publish("chat:stream", base(StreamEndEvent, 13, finish_reason="stop"))
        with anyio.fail_after(10):
            await turn.done.wait()
        assert runner.running(SID) is None
        errors = [f for f in published if f.event == "error"]
        assert len(errors) == 1 and errors[0].message.data["description"] == LOST
        assert published[-1] is errors[0]  # nothing of the turn is framed after the error
        assert published[0].event == "prompt_start"
        tg.cancel_scope.cancel()


def test_connection_caps_leave_descriptors_to_the_rest_of_the_process() -> None:
    from sidecar.compat.guard import RESERVED_FDS, Caps

    for soft, total in ((256, 128), (1024, 768), (20000, 4096), (100, 16), (65536, 4096)):
        caps = Caps.from_limits(soft)
        assert (caps.total, caps.unauthenticated) == (total, max(8, total // 2)), soft
        if soft >= RESERVED_FDS + 16:
            assert soft - caps.total >= RESERVED_FDS


def test_a_request_head_is_counted_however_its_reads_are_cut() -> None:
    from sidecar.compat.guard import MAX_HEAD_BYTES, MAX_HEADER_LINES, HeadCount, Tally

    line = b"GET /health HTTP/1.1\r\n"
    at_lines = line + b"a: b\r\n" * MAX_HEADER_LINES + b"\r\n"
    pad = MAX_HEAD_BYTES - len(line) - len(b"x: \r\n\r\n")
    cases = [
        (at_lines, True),
        (line + b"a: b\r\n" * (MAX_HEADER_LINES + 1) + b"\r\n", False),
        (at_lines.replace(b"\r\n", b"\n"), True),  # h11 takes a bare LF as a line end
        (line.replace(b"\r\n", b"\n") + b"a: b\n" * (MAX_HEADER_LINES + 1) + b"\n", False),
        (line + b"x: " + b"y" * pad + b"\r\n\r\n", True),  # MAX_HEAD_BYTES exactly
        (line + b"x: " + b"y" * (pad + 1) + b"\r\n\r\n", False),
        (line + b"x: " + b"y" * 100_000, False),  # never complete
    ]
    after = b"POST / HTTP/1.1\r\n" + b"a:\r\n" * 500 + b"\r\n"  # the next request, not this head
    for head, within in cases:
        step = 1 if len(head) < 2000 else 97
        for cut in range(1, len(head), step):
            count = HeadCount()
            answers = [count.feed(head[:cut]), count.feed(head[cut:] + after)]
            assert all(answers) is within, (len(head), cut, answers)
            if within:
                assert count.complete and count.size == len(head), (len(head), cut)
        count = HeadCount()
        assert all([count.feed(head[i:i + 1]) for i in range(min(len(head), MAX_HEAD_BYTES + 10))]) is within
        if within:
            assert count.feed(after) and count.size == len(head)  # nothing counted once complete

    tally = Tally()
    assert [n + 1 for n in range(2500) if tally.add()] == [1, 1000, 2000] and tally.count == 2500


@pytest.mark.anyio
async def test_a_kept_alive_connection_keeps_no_headers_of_a_finished_request() -> None:
    """The real server in this process (GET /health needs no engine): once its answer is
    complete, a request's 100 headers are not held by the connection waiting for the next."""
    from sidecar.compat import http

    head = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"x-filler: %s\r\n" % (b"f" * 100) * 99 + b"\r\n"

    async def healthy(stream: Any) -> None:
        await stream.send(head)
        answer = b""
        with anyio.fail_after(10):
            while b'"healthy"' not in answer:
                answer += await stream.receive()
        assert answer.startswith(b"HTTP/1.1 200 ")

    with http.listen("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        app = http.V1App(None, token="t" * 32, ping_interval_s=30, close_after_turn=False,  # type: ignore[arg-type]
                         leading_newline=False, port=port)
        server = http.server(app, head_timeout_s=10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve_on, sock)
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await healthy(stream)
                [connection] = server.server_state.connections
                assert connection.cycle.response_complete
                assert connection.headers == [] and connection.cycle.scope["headers"] == []
                await healthy(stream)  # the next request on it is served whole
            server.should_exit = True
