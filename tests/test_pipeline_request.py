"""request.py: stored rows -> Drafts (tool rows folded before unanswered calls are dropped)
and Drafts -> RequestMessages (files that no transformer converted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol.types import (
    FilePart,
    MessageV2,
    TextPart,
    ToolCall,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.pipeline.request import MAX_INLINE_FILE_BYTES, build_drafts, finalize
from sidecar.pipeline.transformers.base import Draft
from sidecar.pipeline.transformers.document import FILE_HEADER
from sidecar.providers.types import ModelInfo
from sidecar.store.attachments import AttachmentStore


def _message(**fields: Any) -> MessageV2:
    base: dict[str, Any] = {"session_id": "s", "role": "user", "text_content": "", "created_at": 0, "updated_at": 0}
    base.update(fields)
    return MessageV2(**base)


def _shape(drafts: list[Draft]) -> list[tuple[str, list[str]]]:
    def name(part: Any) -> str:
        if isinstance(part, ToolUsePart):
            return f"use:{part.id}"
        if isinstance(part, ToolResultPart):
            return f"result:{part.tool_use_id}:{part.content}"
        return type(part).__name__

    return [(d.role, [name(p) for p in d.parts]) for d in drafts]


def test_tool_rows_are_folded_before_unanswered_calls_are_dropped() -> None:
    calls = _message(
        id="a", role="assistant", content_type="multipart", text_content="let me",
        parts=[TextPart(text="let me"), ToolUsePart(id="c1", name="ls", input={}),
               ToolUsePart(id="c2", name="cat", input={})],
        tool_calls=[ToolCall(id="c1", name="ls", arguments="{}"), ToolCall(id="c2", name="cat", arguments="{}")],
    )
    result = _message(id="t", role="tool", tool_call_id="c1", text_content="file.txt")
    drafts = build_drafts([_message(id="u", text_content="hi"), calls, result])
    # c1 has its result (from the tool row), c2 has none and is left out
    assert _shape(drafts) == [("user", ["TextPart"]), ("assistant", ["TextPart", "use:c1", "result:c1:file.txt"])]


def test_calls_kept_only_in_tool_calls_reach_the_request() -> None:
    only_calls = _message(
        id="b", role="assistant", text_content="", tool_calls=[ToolCall(id="c9", name="ls", arguments='{"path": "."}')]
    )
    result = _message(id="t", role="tool", tool_call_id="c9", text_content="out")
    drafts = build_drafts([_message(id="u", text_content="hi"), only_calls, result])
    assert _shape(drafts) == [("user", ["TextPart"]), ("assistant", ["use:c9", "result:c9:out"])]
    use = drafts[1].parts[0]
    assert isinstance(use, ToolUsePart) and use.input == {"path": "."}
    # and a call without any result is still left out, with the message if nothing remains
    assert _shape(build_drafts([_message(id="u", text_content="hi"), only_calls])) == [("user", ["TextPart"])]


def test_text_files_are_inlined_when_no_transformer_converted_them(tmp_path: Path) -> None:
    attachments = AttachmentStore(tmp_path)
    attachments.root.mkdir(parents=True)
    notes = attachments.root / "notes.md"
    notes.write_text("# Plan\nship it", encoding="utf-8")
    big = attachments.root / "big.txt"
    big.write_bytes(b"x" * (MAX_INLINE_FILE_BYTES + 10))
    blob = attachments.root / "blob.bin"
    blob.write_bytes(b"\x00\x01")
    draft = Draft(role="user", parts=[
        TextPart(text="read these"),
        FilePart(uri=notes.as_uri(), mime_type="text/markdown", name="notes.md"),
        FilePart(uri=big.as_uri(), name="big.txt"),  # no MIME type: guessed from the name
        FilePart(uri=blob.as_uri(), mime_type="application/octet-stream", name="blob.bin"),
    ])
    [message] = finalize([draft], model=ModelInfo(id="m"), attachments=attachments)
    texts = [p.text for p in message.parts if isinstance(p, TextPart)]
    assert texts[1] == FILE_HEADER + '\n<file name="notes.md" type="text/markdown"># Plan\\nship it</file>'
    assert texts[2].startswith(FILE_HEADER + '\n<file name="big.txt" type="text/plain">xxx') and texts[2].endswith(" [... truncated]</file>")
    assert len(texts[2]) < MAX_INLINE_FILE_BYTES + len(FILE_HEADER) + 100
    assert "blob.bin" in texts[3] and "cannot be shown" in texts[3]
