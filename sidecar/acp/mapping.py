"""UpdateMapper: ``session/update`` notifications -> ChatStreamEvents and message parts.

Owns the meaning of every update kind for the chat:

    agent_message_chunk   text -> text delta; image -> ImagePart; resource(_link) -> FilePart
    agent_thought_chunk   text -> thinking delta
    tool_call             ToolUsePart + tool_call_start (name: title, else kind)
    tool_call_update      changed title/rawInput replace the ToolUsePart; ``diff`` contents
                          become DiffParts (one per tool call and path, replaced when resent);
                          completed/failed -> ToolResultPart + tool_result (text contents,
                          else rawOutput as JSON)
    plan                  StepStartPart per entry when it first appears, StepFinishPart when
                          it is completed (entries are identified by their text); a plan
                          event with the whole plan
    usage_update          Usage.contextUsed/contextSize + a usage event
    anything else         kept raw only (user_message_chunk, available_commands_update,
                          current_mode_update, session_info_update, unknown kinds...)

Must stay true: every update is appended to ``raw`` verbatim before it is interpreted, and
``apply`` never raises for anything the agent sends (a malformed update of a known kind
is treated as unknown). The mapper feeds an ``Output`` (content; each piece's event goes
with it), so it knows nothing of relays or the database; the engine's reply lifecycle
(sidecar/engine/lifecycle/, its ReplyFeed) is the Output.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Protocol

import anyio
import msgspec

from protocol.events import PlanEntry
from protocol.types import (
    ContentPart,
    DiffPart,
    FilePart,
    ImagePart,
    StepFinishPart,
    StepStartPart,
    ToolUsePart,
    Usage,
)
from sidecar.acp.types import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentIn,
    ContextUsageUpdate,
    PlanUpdate,
    ToolCallFields,
    ToolCallProgress,
    ToolCallStart,
    UnknownUpdate,
    decode_update,
)

log = logging.getLogger(__name__)

MAX_DIFF_CHARS = 2_000_000
"""Above this (old + new text) a diff is one hunk replacing the changed range."""
MAX_DIFF_LINE_PAIRS = 2_000_000
"""Above this (old lines x new lines, once the common head and tail are cut) a diff is one
hunk replacing the changed range: difflib's worst case (many repeated lines) grows about
cubically, measured ~0.3 s at 1,500 x 1,500 lines, ~23 s at 6,300 x 6,300."""
THREAD_DIFF_LINE_PAIRS = 50_000
"""Above this a diff runs in a worker thread so the event loop is never held by it."""
FINAL_TOOL_STATUSES = ("completed", "failed")
_json = msgspec.json.Encoder()


class Output(Protocol):
    """Where mapped content goes (the subset of the engine's ReplyFeed the mapper uses)."""

    async def text(self, delta: str) -> None:
        """A text delta (the content and its event move together)."""

    async def thinking(self, delta: str, signature: str | None = None) -> None:
        """A thinking delta."""

    async def part(self, part: ContentPart) -> int:
        """Append a part after any pending deltas; returns its index."""
        ...

    def replace_part(self, index: int, part: ContentPart) -> None:
        """Replace the part at ``index``."""

    async def tool_call_started(self, call_id: str, name: str, arguments: str = "") -> None:
        """A ``tool_call_start`` event."""

    async def tool_result(
        self, call_id: str, output: str, is_error: bool, *, replace: int | None = None, announce: bool = True
    ) -> int:
        """A ToolResultPart (appended, or replacing the one at ``replace``) and its event."""
        ...

    async def report_usage(self, total: Usage, *, announce: bool = False) -> None:
        """The usage so far (``announce``: a ``usage`` event)."""

    async def plan(self, entries: list[PlanEntry]) -> None:
        """A ``plan`` event with the agent's whole plan."""


class _Tool:
    __slots__ = (
        "content",
        "diff_texts",
        "diffs",
        "id",
        "input",
        "kind",
        "name",
        "raw_output",
        "result_index",
        "status",
        "use_index",
    )

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.name = "tool"
        self.kind: str | None = None
        self.input: dict[str, Any] = {}
        self.use_index = -1
        self.result_index = -1
        self.diffs: dict[str, int] = {}
        self.diff_texts: dict[str, tuple[str, str]] = {}
        """The (old, new) texts each path's DiffPart was made from: a resend is not re-diffed."""
        self.content: list[Any] = []
        self.raw_output: Any = msgspec.UNSET
        self.status: str | None = None


class UpdateMapper:
    def __init__(self, out: Output) -> None:
        self._out = out
        self.raw: list[msgspec.Raw] = []
        """Every update of the turn, verbatim, in arrival order (-> acp_parts)."""
        self.raw_dirty = False
        self.acp_message_id: str | None = None
        self.kinds: dict[str, int] = {}
        """How many updates of each kind arrived (unknown kinds included)."""
        self._tools: dict[str, _Tool] = {}
        self._steps: dict[str, tuple[str, bool]] = {}
        self._total: Usage | None = None
        """The usage reported so far (context fields merged into it)."""

    async def apply(self, raw: msgspec.Raw) -> None:
        self.raw.append(raw)
        self.raw_dirty = True
        update = decode_update(raw)
        kind = "?"
        try:
            if isinstance(update, AgentMessageChunk):
                kind = "agent_message_chunk"
                if update.message_id and self.acp_message_id is None:
                    self.acp_message_id = update.message_id
                await self._content(update.content, "text")
            elif isinstance(update, AgentThoughtChunk):
                kind = "agent_thought_chunk"
                await self._content(update.content, "thinking")
            elif isinstance(update, ToolCallStart):
                kind = "tool_call"
                await self._tool(update)
            elif isinstance(update, ToolCallProgress):
                kind = "tool_call_update"
                await self._tool(update)
            elif isinstance(update, PlanUpdate):
                kind = "plan"
                await self._plan(update)
            elif isinstance(update, ContextUsageUpdate):
                kind = "usage_update"
                await self._usage(update)
            elif isinstance(update, UnknownUpdate):
                kind = update.kind
            else:  # a known kind kept raw only (user_message_chunk): its tag names it
                kind = str(type(update).__struct_config__.tag)
        except Exception:  # an update must never end the turn; it stays in raw
            log.exception("could not map a %s update", kind)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    # -- content ---------------------------------------------------------------------

    async def _content(self, block: ContentIn, delta_kind: str) -> None:
        if block.type == "text":
            if block.text:
                if delta_kind == "text":
                    await self._out.text(block.text)
                else:
                    await self._out.thinking(block.text)
        elif delta_kind == "thinking":
            return  # only text is meaningful as thinking; the rest stays raw
        elif block.type == "image" and (block.data or block.uri):
            await self._out.part(ImagePart(mime_type=block.mime_type or "image/png", base64=block.data, url=block.uri))
        elif block.type == "resource_link" and block.uri:
            await self._out.part(FilePart(uri=block.uri, mime_type=block.mime_type, name=block.name))
        elif block.type == "resource" and isinstance(block.resource, dict) and isinstance(block.resource.get("uri"), str):
            res = block.resource
            mime = res.get("mimeType") if isinstance(res.get("mimeType"), str) else None
            await self._out.part(FilePart(uri=res["uri"], mime_type=mime))

    # -- tool calls ------------------------------------------------------------------

    async def _tool(self, update: ToolCallFields) -> None:
        tool = self._tools.get(update.tool_call_id)
        created = tool is None
        if tool is None:
            tool = self._tools[update.tool_call_id] = _Tool(update.tool_call_id)
        changed = False
        if isinstance(update.kind, str):
            tool.kind = update.kind
        if isinstance(update.title, str) and update.title:
            changed = changed or tool.name != update.title
            tool.name = update.title
        elif created:
            tool.name = tool.kind or "tool"
        if update.raw_input is not msgspec.UNSET:
            value = update.raw_input
            tool.input = value if isinstance(value, dict) else ({} if value is None else {"_raw": value})
            changed = True
        use = ToolUsePart(id=tool.id, name=tool.name, input=tool.input)
        if created:
            tool.use_index = await self._out.part(use)
            await self._out.tool_call_started(tool.id, tool.name, _json.encode(tool.input).decode())
        elif changed:
            self._out.replace_part(tool.use_index, use)
        touched = False
        if isinstance(update.content, list):
            tool.content = update.content  # an update's content replaces the whole collection
            await self._diffs(tool)
            touched = True
        if update.raw_output is not msgspec.UNSET:
            tool.raw_output = update.raw_output
            touched = True
        if isinstance(update.status, str):
            touched = touched or tool.status != update.status
            tool.status = update.status
        if tool.status in FINAL_TOOL_STATUSES and (touched or tool.result_index < 0):
            await self._result(tool)

    async def _diffs(self, tool: _Tool) -> None:
        for item in tool.content:
            if not isinstance(item, dict) or item.get("type") != "diff" or not isinstance(item.get("path"), str):
                continue
            old_text, new_text = item.get("oldText"), item.get("newText")
            old = old_text if isinstance(old_text, str) else ""
            new = new_text if isinstance(new_text, str) else ""
            index = tool.diffs.get(item["path"])
            if index is not None and tool.diff_texts.get(item["path"]) == (old, new):
                continue
            tool.diff_texts[item["path"]] = (old, new)
            part = DiffPart(file_path=item["path"], hunks=await diff_hunks_async(old, new))
            if index is None:
                tool.diffs[item["path"]] = await self._out.part(part)
            else:
                self._out.replace_part(index, part)

    async def _result(self, tool: _Tool) -> None:
        texts: list[str] = []
        for item in tool.content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "content" and isinstance(item.get("content"), dict):
                inner = item["content"]
                if inner.get("type") == "text" and isinstance(inner.get("text"), str):
                    texts.append(inner["text"])
            elif item.get("type") == "diff" and isinstance(item.get("path"), str):
                texts.append(f"[diff of {item['path']}]")
            elif item.get("type") == "terminal":
                texts.append(f"[terminal {item.get('terminalId', '')}]")
        output = "\n".join(texts)
        if not output and tool.raw_output is not msgspec.UNSET and tool.raw_output is not None:
            raw = tool.raw_output
            output = raw if isinstance(raw, str) else _json.encode(raw).decode()
        is_error = tool.status == "failed"
        tool.result_index = await self._out.tool_result(
            tool.id, output, is_error, replace=tool.result_index if tool.result_index >= 0 else None
        )

    # -- plan and usage --------------------------------------------------------------

    async def _plan(self, update: PlanUpdate) -> None:
        for entry in update.entries:
            known = self._steps.get(entry.content)
            if known is None:
                step_id = f"plan-{len(self._steps) + 1}"
                self._steps[entry.content] = (step_id, False)
                await self._out.part(StepStartPart(step_id=step_id, title=entry.content))
                known = (step_id, False)
            if entry.status == "completed" and not known[1]:
                self._steps[entry.content] = (known[0], True)
                await self._out.part(StepFinishPart(step_id=known[0], result="completed"))
        await self._out.plan([PlanEntry(content=e.content, priority=e.priority, status=e.status) for e in update.entries])

    async def _usage(self, update: ContextUsageUpdate) -> None:
        current = self._total or Usage()
        self._total = usage = msgspec.structs.replace(
            current,
            context_used=update.used if update.used is not None else current.context_used,
            context_size=update.size if update.size is not None else current.context_size,
        )
        await self._out.report_usage(usage, announce=True)


async def diff_hunks_async(old: str, new: str) -> list[dict[str, Any]]:
    """``diff_hunks`` off the event loop when it may take more than a moment."""
    if old.count("\n") * new.count("\n") <= THREAD_DIFF_LINE_PAIRS:
        return diff_hunks(old, new)
    # abandoned on cancel: the thread's work is bounded by MAX_DIFF_LINE_PAIRS
    return await anyio.to_thread.run_sync(diff_hunks, old, new, abandon_on_cancel=True)


def diff_hunks(old: str, new: str, context: int = 3) -> list[dict[str, Any]]:
    """Unified-diff hunks: ``{oldStart, oldLines, newStart, newLines, lines}`` where each line
    starts with ``' '``, ``'-'`` or ``'+'`` (the shape of jsdiff's structuredPatch)."""
    if old == new:
        return []
    a = old.splitlines()
    b = new.splitlines()
    # the common head and tail are cut (but for the context lines a hunk shows), so a small
    # edit of a big file costs what the edit costs
    head = 0
    for x, y in zip(a, b):
        if x != y:
            break
        head += 1
    tail = 0
    for x, y in zip(reversed(a[head:]), reversed(b[head:])):
        if x != y:
            break
        tail += 1
    if len(old) + len(new) > MAX_DIFF_CHARS or (len(a) - head - tail) * (len(b) - head - tail) > MAX_DIFF_LINE_PAIRS:
        changed_a, changed_b = a[head : len(a) - tail], b[head : len(b) - tail]
        return [_hunk(head, len(changed_a), head, len(changed_b), [f"-{x}" for x in changed_a] + [f"+{x}" for x in changed_b])]
    start = max(0, head - context)
    skip_tail = max(0, tail - context)
    hunks: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(None, a[start : len(a) - skip_tail], b[start : len(b) - skip_tail], autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        group = [(tag, i1 + start, i2 + start, j1 + start, j2 + start) for tag, i1, i2, j1, j2 in group]
        lines: list[str] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines.extend(f" {x}" for x in a[i1:i2])
                continue
            if tag in ("replace", "delete"):
                lines.extend(f"-{x}" for x in a[i1:i2])
            if tag in ("replace", "insert"):
                lines.extend(f"+{x}" for x in b[j1:j2])
        first, last = group[0], group[-1]
        hunks.append(_hunk(first[1], last[2] - first[1], first[3], last[4] - first[3], lines))
    return hunks


def _hunk(old_start: int, old_lines: int, new_start: int, new_lines: int, lines: list[str]) -> dict[str, Any]:
    # 1-based starts as in unified diffs; a side with no lines starts at the line before
    return {
        "oldStart": old_start + 1 if old_lines else old_start,
        "oldLines": old_lines,
        "newStart": new_start + 1 if new_lines else new_start,
        "newLines": new_lines,
        "lines": lines,
    }
