"""ACP building blocks in-process: the line filter, update decoding, the mapping, diffs,
fs confinement, the connection over memory streams, and the engine provider config."""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.events import StreamToolCall, StreamToolResult, ToolCallStartEvent, ToolResultEvent, UsageEvent
from protocol.providers import AcpEngineConfig, ProviderUpsertParams
from protocol.types import ContentPart, DiffPart, ToolResultPart, Usage
from sidecar.acp import fs, mapping
from sidecar.acp.client import AcpConnection, PromptCall
from sidecar.children.lines import JsonLines
from sidecar.rpc.framing import LineReader
from sidecar.acp.mapping import UpdateMapper, diff_hunks
from sidecar.acp.types import (
    AgentFeatures,
    CancelledOutcome,
    RequestPermissionParams,
    RequestPermissionResult,
    TextBlock,
    UnknownUpdate,
    decode_update,
)
from sidecar.errors import InvalidParams, ProviderError, RemoteError, SidecarError
from sidecar.rpc import Handler, JsonRpcPeer
from sidecar.store import Store

pytestmark = pytest.mark.anyio
enc = msgspec.json.encode


# ---- JsonLines: the filter stage of the one line reader --------------------------------


class _Chunks(anyio.abc.ByteReceiveStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        return self._chunks.pop(0)

    async def aclose(self) -> None:
        self._chunks = []


class _Filtered:
    """What the reader hands on through a JsonLines stage, joined back as NDJSON."""

    def __init__(self, chunks: list[bytes], *, max_line_bytes: int, fast: dict | None = None, stage: JsonLines | None = None) -> None:
        self.stage = stage or JsonLines(max_line_bytes=max_line_bytes)
        self.stage.fast.update(fast or {})
        self.reader = LineReader(_Chunks(chunks), max_line_bytes, line_filter=self.stage)

    @property
    def junk_lines(self) -> int:
        return self.stage.junk_lines


async def _drain(stream: _Filtered) -> bytes:
    out = b""
    async for line in stream.reader:
        assert isinstance(line, bytes)
        out += line + b"\n"
    return out


WIRE = (
    b"Welcome banner\n"
    b'{"jsonrpc":"2.0","id":0,"result":{}}\n'
    b"\n"
    b'{"truncated": [1, 2\n'
    b'[{"jsonrpc":"2.0","id":1,"result":null}]\n'
    b"42\n"
    b'  {"jsonrpc":"2.0","method":"x"}  \n'
    b'{"jsonrpc":"2.0","id":2,"result":"tail without newline"}'
)
EXPECTED = (
    b'{"jsonrpc":"2.0","id":0,"result":{}}\n'
    b'[{"jsonrpc":"2.0","id":1,"result":null}]\n'
    b'{"jsonrpc":"2.0","method":"x"}\n'
    b'{"jsonrpc":"2.0","id":2,"result":"tail without newline"}\n'
)


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(WIRE)])
async def test_filter_drops_junk_lines_whatever_the_chunking(size: int) -> None:
    chunks = [WIRE[i : i + size] for i in range(0, len(WIRE), size)]
    stream = _Filtered(chunks, max_line_bytes=1000)
    assert await _drain(stream) == EXPECTED
    assert stream.junk_lines == 3  # banner, truncated JSON, a bare number


async def test_filter_drops_oversized_lines_with_bounded_memory() -> None:
    big = b'{"x":"' + b"a" * 5000 + b'"}\n'
    ok = b'{"jsonrpc":"2.0","id":3,"result":1}\n'
    chunks = [big[i : i + 100] for i in range(0, len(big), 100)] + [ok]
    stream = _Filtered(chunks, max_line_bytes=1000)
    assert await _drain(stream) == ok
    assert stream.junk_lines == 1
    assert len(stream.reader._partial) == 0


async def test_filter_fast_path_hands_updates_over_in_order() -> None:
    seen: list[bytes] = []
    lines = [
        enc({"jsonrpc": "2.0", "method": "session/update", "params": {"n": i}}) + b"\n" for i in range(5)
    ] + [enc({"jsonrpc": "2.0", "id": 7, "method": "session/update", "params": {}}) + b"\n"]
    stream = _Filtered(
        [b"".join(lines)], max_line_bytes=1000, fast={"session/update": lambda p: seen.append(bytes(p))}
    )
    # a request with the same method name is not a notification: it goes to the peer
    assert await _drain(stream) == lines[-1]
    assert seen == [b'{"n":%d}' % i for i in range(5)]


async def test_filter_survives_methods_of_odd_types_and_failing_lines(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bytes] = []
    odd = [b'{"method":[1]}\n', b'{"method":{"a":1}}\n', b'{"method":null,"params":1}\n']
    after = enc({"jsonrpc": "2.0", "method": "session/update", "params": {"n": 1}}) + b"\n"
    ok = b'{"jsonrpc":"2.0","id":4,"result":1}\n'
    stream = _Filtered(
        [b"".join(odd) + after + ok], max_line_bytes=1000,
        fast={"session/update": lambda p: seen.append(bytes(p))},
    )
    # an unhashable method is no fast-path notification: the peer gets it and answers it
    with anyio.fail_after(5):
        assert await _drain(stream) == b"".join(odd) + ok
    assert seen == [b'{"n":1}']

    # whatever else goes wrong with one line is logged and that line alone is skipped
    class Boom(JsonLines):
        def _check(self, line: bytes) -> bytes | None:
            if b"boom" in line:
                raise KeyError("boom")
            return super()._check(line)

    stream = _Filtered([b'{"boom":1}\n' + ok], max_line_bytes=1000, stage=Boom(max_line_bytes=1000))
    with anyio.fail_after(5):
        assert await _drain(stream) == ok
    assert stream.junk_lines == 1 and "could not be handled" in caplog.text


# ---- decoding -------------------------------------------------------------------------


def test_unknown_and_malformed_updates_decode_as_unknown() -> None:
    assert decode_update(b'{"sessionUpdate":"brand_new","x":1}') == UnknownUpdate("brand_new")
    assert decode_update(b'{"sessionUpdate":"tool_call"}') == UnknownUpdate("tool_call")  # no toolCallId
    assert decode_update(b'{"sessionUpdate":"plan","entries":"many"}') == UnknownUpdate("plan")
    assert decode_update(b"[1,2]") == UnknownUpdate("?")
    assert decode_update(b"not json") == UnknownUpdate("?")


def test_capabilities_absent_null_or_odd_are_false() -> None:
    for result in (None, {}, {"agentCapabilities": None}, {"agentCapabilities": {"loadSession": "yes"}},
                   {"agentCapabilities": {"sessionCapabilities": {"fork": None, "close": True}}}):
        features = AgentFeatures.from_result(result)
        assert not (features.load_session or features.fork_session or features.close_session or features.prompt_image)
    features = AgentFeatures.from_result({
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": True, "embeddedContext": True},
            "sessionCapabilities": {"fork": {}, "close": {"_meta": {}}},
            "mcpCapabilities": {"http": True},
        },
        "agentInfo": {"name": "a", "title": "Agent A", "version": "2"},
    })
    assert (features.load_session, features.fork_session, features.close_session) == (True, True, True)
    assert (features.prompt_image, features.prompt_embedded_context, features.mcp_http) == (True, True, True)
    assert features.agent_name == "Agent A"


# ---- mapping --------------------------------------------------------------------------


class RecordingOutput:
    """The mapper's Output: parts as they are, deltas and events by kind and name."""

    def __init__(self) -> None:
        self.parts: list[ContentPart] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.deltas: list[tuple[str, str]] = []
        self._usage: Usage | None = None

    async def text(self, delta: str) -> None:
        self.deltas.append(("text", delta))

    async def thinking(self, delta: str, signature: str | None = None) -> None:
        self.deltas.append(("thinking", delta))

    async def part(self, part: ContentPart) -> int:
        self.parts.append(part)
        return len(self.parts) - 1

    def replace_part(self, index: int, part: ContentPart) -> None:
        self.parts[index] = part

    async def tool_call_started(self, call_id: str, name: str, arguments: str = "") -> None:
        self.events.append((ToolCallStartEvent.__name__, {"tool_call": StreamToolCall(id=call_id, name=name, arguments=arguments)}))

    async def tool_result(
        self, call_id: str, output: str, is_error: bool, *, replace: int | None = None, announce: bool = True
    ) -> int:
        part = ToolResultPart(tool_use_id=call_id, content=output, is_error=is_error)
        if replace is None:
            index = await self.part(part)
        else:
            self.replace_part(replace, part)
            index = replace
        if announce:
            result = StreamToolResult(tool_call_id=call_id, output=output, is_error=is_error)
            self.events.append((ToolResultEvent.__name__, {"tool_result": result}))
        return index

    async def report_usage(self, total: Usage, *, announce: bool = False) -> None:
        self._usage = total
        if announce:
            self.events.append((UsageEvent.__name__, {"usage": total}))

    def usage(self) -> Usage | None:
        return self._usage


def _raw(update: dict[str, Any]) -> msgspec.Raw:
    return msgspec.Raw(enc(update))


async def test_tool_call_lifecycle_maps_to_parts_and_events() -> None:
    out = RecordingOutput()
    mapper = UpdateMapper(out)
    for update in (
        # an update that comes before its tool_call is tolerated (it starts the call)
        {"sessionUpdate": "tool_call_update", "toolCallId": "c0", "status": "in_progress"},
        {"sessionUpdate": "tool_call", "toolCallId": "c1", "kind": "edit", "status": "pending"},
        {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "title": "Edit a.py", "rawInput": ["not", "a dict"]},
        {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "content": [
            {"type": "diff", "path": "/w/a.py", "oldText": "x\n", "newText": "y\n"}]},
        {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "content": [
            {"type": "diff", "path": "/w/a.py", "oldText": "x\n", "newText": "z\n"},
            {"type": "content", "content": {"type": "text", "text": "edited"}}]},
        {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "failed"},
        {"sessionUpdate": "tool_call_update", "toolCallId": "c0", "status": "completed", "rawOutput": {"ok": 1}},
    ):
        await mapper.apply(_raw(update))
    types = [type(p).__name__ for p in out.parts]
    assert types == ["ToolUsePart", "ToolUsePart", "DiffPart", "ToolResultPart", "ToolResultPart"]
    assert out.parts[0].name == "tool" and out.parts[1].name == "Edit a.py"
    assert out.parts[1].input == {"_raw": ["not", "a dict"]}
    assert out.parts[2].hunks[0]["lines"] == ["-x", "+z"]  # replaced, not appended
    assert out.parts[3].content == "[diff of /w/a.py]\nedited" and out.parts[3].is_error
    assert out.parts[4].content == '{"ok":1}' and not out.parts[4].is_error
    assert [name for name, _ in out.events] == [
        ToolCallStartEvent.__name__, ToolCallStartEvent.__name__, ToolResultEvent.__name__, ToolResultEvent.__name__,
    ]
    assert len(mapper.raw) == 7 and mapper.kinds == {"tool_call_update": 6, "tool_call": 1}


async def test_text_thinking_plan_usage_and_unknown_kinds() -> None:
    out = RecordingOutput()
    mapper = UpdateMapper(out)
    for update in (
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}},
        {"sessionUpdate": "agent_message_chunk", "messageId": "m-1", "content": {"type": "text", "text": "Hi"}},
        {"sessionUpdate": "agent_message_chunk", "messageId": "m-1", "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "resource_link", "uri": "file:///a", "name": "a"}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "audio", "data": "AA=="}},
        {"sessionUpdate": "plan", "entries": [{"content": "A", "status": "in_progress"}, {"content": "B"}]},
        {"sessionUpdate": "plan", "entries": [{"content": "A", "status": "completed"}, {"content": "B"}]},
        {"sessionUpdate": "plan", "entries": [{"content": "A", "status": "completed"}]},
        {"sessionUpdate": "usage_update", "used": 10, "size": 100},
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "echo of the user"}},
        {"sessionUpdate": "compaction_update", "anything": True},
    ):
        await mapper.apply(_raw(update))
    assert out.deltas == [("thinking", "hmm"), ("text", "Hi")]
    assert mapper.acp_message_id == "m-1"
    types = [type(p).__name__ for p in out.parts]
    assert types == ["ImagePart", "FilePart", "StepStartPart", "StepStartPart", "StepFinishPart"]
    assert out.parts[4].step_id == out.parts[2].step_id == "plan-1"
    assert out.usage() == Usage(context_used=10, context_size=100)
    assert out.events[-1][0] == UsageEvent.__name__
    assert mapper.kinds["compaction_update"] == 1 and len(mapper.raw) == 11


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
kinds = st.sampled_from([
    "agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan", "usage_update", "x",
])
fields = st.sampled_from(["content", "toolCallId", "title", "kind", "status", "rawInput", "entries", "used", "text"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(kinds, st.dictionaries(fields, json_values, max_size=5)), max_size=8))
def test_mapping_never_raises_and_keeps_every_update(updates: list[tuple[str, dict[str, Any]]]) -> None:
    async def run() -> None:
        mapper = UpdateMapper(RecordingOutput())
        for kind, body in updates:
            await mapper.apply(_raw({"sessionUpdate": kind, **body}))
        assert len(mapper.raw) == len(updates)

    # RecordingOutput never suspends, so the coroutine runs to its end in one step (an
    # event loop per example would make this test take seconds)
    coro = run()
    with pytest.raises(StopIteration):
        coro.send(None)


def _apply_hunks(old: str, hunks: list[dict[str, Any]]) -> list[str]:
    lines = old.splitlines()
    out: list[str] = []
    pos = 0
    for hunk in hunks:
        start = hunk["oldStart"] - 1 if hunk["oldLines"] else hunk["oldStart"]
        out.extend(lines[pos:start])
        pos = start
        for line in hunk["lines"]:
            if line[0] == " ":
                assert lines[pos] == line[1:]
                out.append(line[1:])
                pos += 1
            elif line[0] == "-":
                assert lines[pos] == line[1:]
                pos += 1
            else:
                out.append(line[1:])
    out.extend(lines[pos:])
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", ""]), max_size=30),
       st.lists(st.sampled_from(["a", "b", "c", "e", ""]), max_size=30))
def test_diff_hunks_turn_the_old_text_into_the_new(old: list[str], new: list[str]) -> None:
    old_text, new_text = "\n".join(old), "\n".join(new)
    assert _apply_hunks(old_text, diff_hunks(old_text, new_text)) == new_text.splitlines()


async def test_known_kinds_kept_raw_are_counted_without_an_error(caplog: pytest.LogCaptureFixture) -> None:
    mapper = UpdateMapper(RecordingOutput())
    await mapper.apply(_raw({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "echo"}}))
    assert mapper.kinds == {"user_message_chunk": 1}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_resent_diff_is_not_diffed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = mapping.diff_hunks

    def counting(old: str, new: str, context: int = 3) -> list[dict[str, Any]]:
        calls.append((old, new))
        return real(old, new, context)

    monkeypatch.setattr(mapping, "diff_hunks", counting)
    out = RecordingOutput()
    mapper = UpdateMapper(out)
    diff = {"type": "diff", "path": "/w/a.py", "oldText": "x\n", "newText": "y\n"}
    text = {"type": "content", "content": {"type": "text", "text": "t"}}
    for content in ([diff], [diff, text], [diff, text], [{**diff, "newText": "z\n"}]):
        await mapper.apply(_raw({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "content": content}))
    assert calls == [("x\n", "y\n"), ("x\n", "z\n")]
    diffs = [p for p in out.parts if isinstance(p, DiffPart)]
    assert len(diffs) == 1 and diffs[0].hunks[0]["lines"] == ["-x", "+z"]


def test_a_small_edit_of_a_big_file_is_a_small_hunk() -> None:
    old = "\n".join("}" if i % 3 == 0 else f"x = {i % 50}" for i in range(16_000))
    new = old.replace("x = 7\n", "x = seven\n", 1)
    hunks = diff_hunks(old, new)
    assert len(hunks) == 1 and len(hunks[0]["lines"]) == 8  # 3 + 3 context lines, - and +
    assert hunks[0]["oldStart"] == hunks[0]["newStart"] == 5 and hunks[0]["oldLines"] == 7
    assert _apply_hunks(old, hunks) == new.splitlines()


async def test_a_diff_past_the_line_pair_limit_is_one_hunk_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # many repeated lines: difflib's worst case (the reviewer's file took 23 s)
    old_lines = ["}" if i % 3 == 0 else f"x = {i % 50}" for i in range(6_300)]
    new_lines = ["}" if i % 3 == 0 else f"x = {(i * 7) % 50}" for i in range(6_300)]
    old = "\n".join(["head"] * 5 + old_lines + ["tail"] * 5)
    new = "\n".join(["head"] * 5 + new_lines + ["tail"] * 5)
    threads: list[str] = []
    real = mapping.diff_hunks

    def recording(old: str, new: str, context: int = 3) -> list[dict[str, Any]]:
        threads.append(threading.current_thread().name)
        return real(old, new, context)

    monkeypatch.setattr(mapping, "diff_hunks", recording)
    with anyio.fail_after(60):
        hunks = await mapping.diff_hunks_async(old, new)
    assert threads and threads[0] != threading.main_thread().name
    assert len(hunks) == 1
    changed = hunks[0]
    assert (changed["oldStart"], changed["newStart"]) == (7, 7)  # the unchanged head stays out
    assert changed["oldLines"] < 6_300 and changed["lines"][0].startswith("-")
    assert _apply_hunks(old, hunks) == new.splitlines()
    assert await mapping.diff_hunks_async("a\n", "b\n") == [
        {"oldStart": 1, "oldLines": 1, "newStart": 1, "newLines": 1, "lines": ["-a", "+b"]}
    ]
    assert threads[-1] == threading.main_thread().name  # a small diff stays on the loop


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", ""]), max_size=30),
       st.lists(st.sampled_from(["a", "b", "c", "e", ""]), max_size=30))
def test_capped_diff_hunks_still_turn_the_old_text_into_the_new(old: list[str], new: list[str]) -> None:
    old_text, new_text = "\n".join(old), "\n".join(new)
    saved = mapping.MAX_DIFF_LINE_PAIRS
    mapping.MAX_DIFF_LINE_PAIRS = 4  # hypothesis forbids function-scoped fixtures here
    try:
        hunks = diff_hunks(old_text, new_text)
    finally:
        mapping.MAX_DIFF_LINE_PAIRS = saved
    assert _apply_hunks(old_text, hunks) == new_text.splitlines()


# ---- fs confinement --------------------------------------------------------------------


def test_confine_refuses_everything_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("x")
    os.symlink(tmp_path / "outside.txt", root / "out-link")
    os.symlink(tmp_path, root / "dir-link")
    os.symlink(root / "sub", root / "in-link")
    assert fs.confine(root, str(root / "sub" / "new.txt")) == (root / "sub" / "new.txt").resolve()
    assert fs.confine(root, str(root / "in-link" / "f")) == (root / "sub" / "f").resolve()
    for bad, why in (
        (str(tmp_path / "outside.txt"), "outside"),
        (f"{root}/../outside.txt", "outside"),
        (f"{root}/sub/../../outside.txt", "outside"),
        (str(root / "out-link"), "outside"),
        (str(root / "dir-link" / "outside.txt"), "outside"),
        (str(root) + "x/file", "outside"),  # a sibling whose name starts like the root
        ("relative/path", "absolute"),
        (str(root / "a\0b"), "NUL"),
        (str(root / ("a" * 5000)), "longer"),
        ("", "non-empty"),
    ):
        with pytest.raises(InvalidParams) as err:
            fs.confine(root, bad)
        assert why in err.value.message, (bad, err.value.message)


async def test_read_and_write_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    assert await fs.read_text_file(str(tmp_path), str(tmp_path / "a.txt")) == "one\ntwo\nthree\n"
    assert await fs.read_text_file(str(tmp_path), str(tmp_path / "a.txt"), line=2, limit=1) == "two\n"
    with pytest.raises(SidecarError) as err:
        await fs.read_text_file(str(tmp_path), str(tmp_path / "missing.txt"))
    assert int(err.value.code) == -32002
    with pytest.raises(InvalidParams):
        await fs.read_text_file(str(tmp_path), str(tmp_path / "a.txt"), line=0)
    await fs.write_text_file(str(tmp_path), str(tmp_path / "new" / "deep" / "b.txt"), "written")
    assert (tmp_path / "new" / "deep" / "b.txt").read_text() == "written"
    assert not [p for p in (tmp_path / "new" / "deep").iterdir() if p.name.startswith(".acp-write-")]
    with pytest.raises(InvalidParams):
        await fs.write_text_file(str(tmp_path), str(tmp_path / "new"), "a directory")


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
async def test_writes_keep_the_mode_of_the_file_they_replace(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("old")
    script.chmod(0o754)
    await fs.write_text_file(str(tmp_path), str(script), "new")
    assert script.read_text() == "new" and stat.S_IMODE(script.stat().st_mode) == 0o754
    # a new file gets what open() would give it, not mkstemp's 0600
    mask = os.umask(0o022)
    os.umask(mask)
    await fs.write_text_file(str(tmp_path), str(tmp_path / "fresh.txt"), "x")
    assert stat.S_IMODE((tmp_path / "fresh.txt").stat().st_mode) == 0o666 & ~mask


# ---- the connection over memory streams ------------------------------------------------


class _Lines:
    """Messages from a memory stream of bytes (the peer's writer may join several lines)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> Any:
        while b"\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return msgspec.json.decode(line)


class QueueSink:
    def __init__(self) -> None:
        self.updates: list[bytes] = []
        self.asked = anyio.Event()
        self.cancelled = anyio.Event()

    def on_update(self, update: msgspec.Raw) -> None:
        self.updates.append(bytes(update))

    async def request_permission(self, params: RequestPermissionParams) -> RequestPermissionResult:
        self.asked.set()
        await self.cancelled.wait()
        return RequestPermissionResult(outcome=CancelledOutcome())

    def cancel_permissions(self) -> None:
        self.cancelled.set()


async def test_updates_arrive_before_the_prompt_result_and_exit_fails_the_prompt() -> None:
    """Through the peer path (no line filter): 500 updates then the result in one burst."""
    agent_out_send, agent_out_recv = anyio.create_memory_object_stream[bytes](1000)
    client_out_send, client_out_recv = anyio.create_memory_object_stream[bytes](1000)
    async with anyio.create_task_group() as tg:
        async with JsonRpcPeer(agent_out_recv, client_out_send, cancel_method=None, autostart=False) as peer:
            conn = AcpConnection(peer=peer, agent=None, task_group=tg, engine_id="e", name="fake")
            sink = QueueSink()
            conn.attach("s1", sink)
            peer.start_reading()
            out = _Lines(client_out_recv)
            seen_at_done: list[int] = []
            call = conn.start_prompt("s1", [TextBlock(text="go")], lambda: seen_at_done.append(len(sink.updates)))
            request = await out.next()
            assert request["method"] == "session/prompt" and request["params"]["prompt"] == [{"type": "text", "text": "go"}]
            burst = b"".join(
                enc({"jsonrpc": "2.0", "method": "session/update",
                     "params": {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk", "n": i}}}) + b"\n"
                for i in range(500)
            ) + enc({"jsonrpc": "2.0", "id": request["id"], "result": {"stopReason": "end_turn"}}) + b"\n"
            await agent_out_send.send(burst)
            with anyio.fail_after(5):
                await call.done.wait()
            assert seen_at_done == [500] and call.result is not None and call.result.stop_reason == "end_turn"

            # a permission request waits for the sink; cancel() answers it "cancelled"
            await agent_out_send.send(enc({"jsonrpc": "2.0", "id": 9, "method": "session/request_permission", "params": {
                "sessionId": "s1", "toolCall": {"toolCallId": "t"}, "options": []}}) + b"\n")
            with anyio.fail_after(5):
                await sink.asked.wait()
                await conn.cancel("s1")
                replies = [await out.next() for _ in range(2)]
            assert {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}} in replies
            assert {"jsonrpc": "2.0", "id": 9, "result": {"outcome": {"outcome": "cancelled"}}} in replies

            # fs for a session this connection never opened is refused
            await agent_out_send.send(enc({"jsonrpc": "2.0", "id": 10, "method": "fs/read_text_file",
                                           "params": {"sessionId": "nope", "path": "/etc/hostname"}}) + b"\n")
            with anyio.fail_after(5):
                reply = await out.next()
            assert reply["id"] == 10 and reply["error"]["code"] == -32602

            # the agent goes away mid-prompt: the prompt fails at once with a ProviderError
            second: PromptCall = conn.start_prompt("s1", [TextBlock(text="again")], lambda: None)
            await out.next()
            await agent_out_send.aclose()
            with anyio.fail_after(5):
                await second.done.wait()
            assert isinstance(second.error, ProviderError) and "closed its connection" in second.error.message
            assert not conn.alive
            with pytest.raises(ProviderError):
                await conn.new_session("/tmp", [])
        tg.cancel_scope.cancel()
    await client_out_recv.aclose()


async def test_remote_errors_and_timeouts_become_provider_errors(tmp_path: Path) -> None:
    (a_recv, a_send), (b_recv, b_send) = _pair()
    async with anyio.create_task_group() as tg:
        async with (
            JsonRpcPeer(a_recv, a_send, cancel_method=None, shutdown_grace=0.1) as client,
            JsonRpcPeer(b_recv, b_send, shutdown_grace=0.1) as agent,
        ):
            async def fail_new(params: Any) -> Any:
                raise SidecarError("no sessions today", code=-32000)  # type: ignore[arg-type]

            async def slow_load(params: Any) -> Any:
                await anyio.sleep_forever()

            agent.dispatcher.add("session/new", Handler(msgspec.Raw, fail_new))
            agent.dispatcher.add("session/load", Handler(msgspec.Raw, slow_load))
            conn = AcpConnection(peer=client, agent=None, task_group=tg, engine_id="e", name="fake", request_timeout_s=0.2)
            with pytest.raises(ProviderError) as err:
                await conn.new_session("/tmp", [])
            assert "failed session/new: no sessions today" in err.value.message
            with pytest.raises(ProviderError) as err:
                await conn.load_session("x", str(tmp_path), [])
            assert "did not answer session/load within 0.2 s" in err.value.message
            # a session that failed to load serves no fs requests
            (tmp_path / "f.txt").write_text("private")
            with anyio.fail_after(5), pytest.raises(RemoteError) as refused:
                await agent.request("fs/read_text_file", {"sessionId": "x", "path": str(tmp_path / "f.txt")})
            assert refused.value.code == -32602 and "unknown session" in refused.value.message
            with pytest.raises(ProviderError):  # -32601 from a peer without the method
                await conn.fork_session("x", "/tmp", [])
        tg.cancel_scope.cancel()


def _pair() -> tuple[Any, Any]:
    from sidecar.rpc import connected_pair

    return connected_pair()


# ---- engine provider configuration -------------------------------------------------------


def test_engine_spec_reprs_keep_env_values_out() -> None:
    from sidecar.children.stdio import ChildSpec

    spec = ChildSpec(name="e", kind="agent engine", command="agent", env={"SECRET_TOKEN": "env-secret-1"})
    for text in (repr(spec), str(spec), repr(list(spec.__rich_repr__()))):
        assert "env-secret-1" not in text and "SECRET_TOKEN" in text


def test_engine_config_is_validated_stored_and_masked(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        repo = store.providers
        with pytest.raises(InvalidParams):
            repo.upsert(ProviderUpsertParams(name="E", type="acp-engine"))
        with pytest.raises(InvalidParams):
            repo.upsert(ProviderUpsertParams(name="E", type="acp-engine", engine=AcpEngineConfig(command="x", env={"A=B": "1"})))
        record = repo.upsert(ProviderUpsertParams(
            name="E", type="acp-engine",
            engine=AcpEngineConfig(command="agent", args=["--x"], env={"SECRET_TOKEN": "t-1", "MODE": "a"}, auto_allow=["read"]),
        ))
        assert record.engine is not None and record.engine.env["SECRET_TOKEN"] == "t-1"
        info = record.to_info(is_default=False)
        assert info.engine is not None and info.engine.env == {"SECRET_TOKEN": "***", "MODE": "***"}
        assert "t-1" not in repr(record)
        again = repo.upsert(ProviderUpsertParams(
            id=record.id, name="E", type="acp-engine",
            engine=AcpEngineConfig(command="agent", env={"SECRET_TOKEN": "***", "MODE": "b"}),
        ))
        assert again.engine is not None and again.engine.env == {"SECRET_TOKEN": "t-1", "MODE": "b"}
        assert repo.get(record.id).engine == again.engine
    finally:
        store.close()


def test_acp_turns_record_and_raw_columns(tmp_path: Path) -> None:
    from protocol.sessions import CreateSessionOptions

    store = Store(tmp_path)
    try:
        session = store.sessions.create(CreateSessionOptions(mode="acp", provider_id="e", model_id="m"))
        user = store.messages.append(session.id, role="user", text_content="hi")
        reply = store.messages.append(session.id, role="assistant", status="pending")
        store.acp.record_turn(reply.id, session.id, "e", "agent-1")
        assert store.sessions.get(session.id).acp_session_id == "agent-1"
        turn = store.acp.turn(reply.id)
        assert turn is not None and turn.agent_session_id == "agent-1" and store.acp.turn(user.id) is None
        store.acp.append_raw(reply.id, 0, [msgspec.Raw(b'{"sessionUpdate":"x","y":[1]}')], "m-1")
        store.acp.finish_raw(reply.id)
        got = store.messages.get(reply.id)
        assert got.acp_message_id == "m-1" and got.acp_parts == [{"sessionUpdate": "x", "y": [1]}]
        assert store.acp.head("e", "agent-1") == reply.id
        store.sessions.delete(session.id)
        assert store.acp.turn(reply.id) is None  # cascades with the message
        assert store.acp.released() == [("e", "agent-1")]  # no reply runs on it any more
    finally:
        store.close()
