"""Request-history splitting shared by the adapters, and the small part helpers."""

from __future__ import annotations

import base64

from protocol.types import (
    CodePart,
    DiffPart,
    FilePart,
    ImagePart,
    StepStartPart,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.providers.history import MISSING_RESULT, image_data, part_text, split_messages
from sidecar.providers.types import RequestMessage


def roles(messages: list[RequestMessage]) -> list[str]:
    return [s.role for s in split_messages(messages)]


def test_results_close_a_segment_and_text_after_them_starts_a_new_one() -> None:
    segments = split_messages(
        [
            RequestMessage(
                role="assistant",
                parts=[
                    TextPart(text="a"),
                    ToolUsePart(id="1", name="f", input={}),
                    ToolResultPart(tool_use_id="1", content="r1"),
                    TextPart(text="b"),
                    ToolUsePart(id="2", name="g", input={}),
                    ToolResultPart(tool_use_id="2", content="r2"),
                    TextPart(text="c"),
                ],
            )
        ]
    )
    assert [(s.role, len(s.parts)) for s in segments] == [
        ("assistant", 2),
        ("tool", 1),
        ("assistant", 2),
        ("tool", 1),
        ("assistant", 1),
    ]


def test_unsigned_thinking_steps_diffs_and_files_are_left_out() -> None:
    segments = split_messages(
        [
            RequestMessage(role="user", parts=[TextPart(text="q"), FilePart(uri="file:///x")]),
            RequestMessage(
                role="assistant",
                parts=[
                    ThinkingPart(text="t"),
                    ThinkingPart(text="signed", signature="s"),
                    StepStartPart(step_id="s1"),
                    DiffPart(file_path="a.py", hunks=[]),
                    TextPart(text="answer"),
                ],
            ),
        ]
    )
    assert segments[0].parts == [TextPart(text="q")]
    assert segments[1].parts == [ThinkingPart(text="signed", signature="s"), TextPart(text="answer")]


def test_assistant_message_with_only_unsigned_thinking_disappears() -> None:
    messages = [
        RequestMessage(role="user", parts=[TextPart(text="q")]),
        RequestMessage(role="assistant", parts=[ThinkingPart(text="t")]),
        RequestMessage(role="user", parts=[TextPart(text="q2")]),
    ]
    segments = split_messages(messages)
    # the two user turns read as one
    assert [(s.role, s.parts) for s in segments] == [("user", [TextPart(text="q"), TextPart(text="q2")])]


def test_tool_results_in_a_user_message_answer_the_previous_calls() -> None:
    messages = [
        RequestMessage(role="assistant", parts=[ToolUsePart(id="1", name="f", input={})]),
        RequestMessage(role="user", parts=[ToolResultPart(tool_use_id="1", content="ok"), TextPart(text="next")]),
    ]
    assert roles(messages) == ["assistant", "tool", "user"]
    assert split_messages(messages)[1].parts == [ToolResultPart(tool_use_id="1", content="ok")]


def test_partly_answered_calls_get_the_missing_results_in_order() -> None:
    messages = [
        RequestMessage(
            role="assistant",
            parts=[
                ToolUsePart(id="1", name="f", input={}),
                ToolUsePart(id="2", name="f", input={}),
                ToolResultPart(tool_use_id="2", content="two"),
            ],
        ),
    ]
    tool = split_messages(messages)[1]
    assert tool.parts == [
        ToolResultPart(tool_use_id="2", content="two"),
        ToolResultPart(tool_use_id="1", content=MISSING_RESULT, is_error=True),
    ]


def test_part_text_and_image_data() -> None:
    assert part_text(CodePart(language="py", code="x = 1")) == "```py\nx = 1\n```"
    assert part_text(FilePart(uri="file:///x")) is None
    assert image_data(ImagePart(mime_type="image/png", base64="QUJD")) == ("image/png", "QUJD", None)
    assert image_data(ImagePart(mime_type="image/png", url="data:image/webp;base64,QUJD")) == ("image/webp", "QUJD", None)
    svg = image_data(ImagePart(mime_type="image/svg+xml", url="data:image/svg+xml,%3Csvg%2F%3E"))
    assert svg == ("image/svg+xml", base64.b64encode(b"<svg/>").decode(), None)
    assert image_data(ImagePart(mime_type="image/png", url="https://x/a.png")) == ("image/png", None, "https://x/a.png")
