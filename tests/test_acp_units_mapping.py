"""ACP building blocks in-process, the mapping of session updates to parts and stream
events (sidecar.acp.mapping: UpdateMapper) and its diffs (diff_hunks, the line-pair cap)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.events import StreamToolCall, StreamToolResult, ToolCallStartEvent, ToolResultEvent, UsageEvent
from protocol.types import ContentPart, DiffPart, ToolResultPart, Usage
from sidecar.acp import mapping
from sidecar.acp.mapping import UpdateMapper, diff_hunks

pytestmark = pytest.mark.anyio
enc = msgspec.json.encode


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
