"""Output transforms: think tags while streaming (split tags too), finish processing (unclosed
tags, template-opened blocks, base64 images to files), assistant regex rules."""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.context import AssistantProfile, RegexRule
from protocol.types import ImagePart, SessionV2, TextPart, ThinkingPart, ToolUsePart
from sidecar.errors import ProviderError
from sidecar.pipeline.output import OutputProcessor, ThinkTagSplitter, finish_parts, split_think_tags
from sidecar.providers.types import Finish, StreamPart, TextDelta, ThinkingDelta

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


async def _source(parts: list[StreamPart], fail: bool = False) -> AsyncGenerator[StreamPart, None]:
    for part in parts:
        yield part
    if fail:
        raise ProviderError("connection lost")


async def _collect(parts: list[StreamPart], fail: bool = False) -> list[StreamPart]:
    out: list[StreamPart] = []
    with anyio.fail_after(5):
        async for part in split_think_tags(_source(parts, fail)):
            out.append(part)
    return out


def _runs(parts: list[StreamPart]) -> list[tuple[str, str]]:
    runs: list[tuple[str, str]] = []
    for p in parts:
        if isinstance(p, (TextDelta, ThinkingDelta)):
            kind = "text" if isinstance(p, TextDelta) else "thinking"
            if runs and runs[-1][0] == kind:
                runs[-1] = (kind, runs[-1][1] + p.text)
            else:
                runs.append((kind, p.text))
    return runs


@pytest.mark.anyio
async def test_think_tag_split_across_deltas() -> None:
    deltas = ["<th", "ink>let me ", "reason</thi", "nk>\n\nThe answer", " is 42.", "<", "3 ok"]
    out = await _collect([TextDelta(text=d) for d in deltas] + [Finish(reason="stop")])
    assert _runs(out) == [("thinking", "let me reason"), ("text", "The answer is 42.<3 ok")]
    assert isinstance(out[-1], Finish)
    assert not any(isinstance(p, TextDelta) and "<" in p.text and "think" in p.text for p in out)


@pytest.mark.anyio
async def test_unclosed_think_is_closed_at_the_end_and_reasoning_passes_through() -> None:
    out = await _collect([ThinkingDelta(text="native "), TextDelta(text="<think>never closed")])
    assert _runs(out) == [("thinking", "native never closed")]
    # a failing stream still yields what was held back before the error
    parts: list[StreamPart] = []
    with pytest.raises(ProviderError):
        async for part in split_think_tags(_source([TextDelta(text="partial <thi")], fail=True)):
            parts.append(part)
    assert _runs(parts) == [("text", "partial <thi")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12))
def test_any_split_of_the_text_gives_the_same_runs(cuts: list[int]) -> None:
    text = "Intro <think>step 1 < 2, step <b>2</b></think>\nAnswer <thin and <think>more</think>end"
    whole = ThinkTagSplitter()
    expected = whole.feed(text) + whole.end()
    splitter = ThinkTagSplitter()
    runs: list[tuple[str, str]] = []
    pos = 0
    for cut in cuts:
        runs += splitter.feed(text[pos : pos + cut])
        pos += cut
    runs += splitter.feed(text[pos:]) + splitter.end()
    merged: list[tuple[str, str]] = []
    for kind, chunk in runs:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + chunk)
        else:
            merged.append((kind, chunk))
    assert merged == expected
    assert expected == [
        ("text", "Intro "), ("thinking", "step 1 < 2, step <b>2</b>"), ("text", "Answer <thin and "),
        ("thinking", "more"), ("text", "end"),
    ]


def test_finish_closes_tags_writes_images_and_applies_output_regex(tmp_path: Path) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    profile = AssistantProfile(
        id="a", name="A",
        regex_rules=[
            RegexRule(pattern=r"\bcolour\b", replacement="color", scope="assistant"),
            RegexRule(pattern="secret", replacement="[redacted]", scope="user"),  # not for output
        ],
    )
    parts: list[Any] = [
        TextPart(text="reasoning first</think>The colour is red. secret "),
        ToolUsePart(id="c1", name="t", input={"x": 1}),
        TextPart(text=f"Here: ![chart]({data_url}) and <think>unclosed thoughts"),
    ]
    final = finish_parts(parts, assistant=profile, image_dir=tmp_path / "attachments")
    assert isinstance(final[0], ThinkingPart) and final[0].text == "reasoning first"
    assert isinstance(final[1], TextPart) and final[1].text == "The color is red. secret "
    assert isinstance(final[2], ToolUsePart)
    assert isinstance(final[3], TextPart) and final[3].text.startswith("Here: ![chart](file://")
    assert "base64" not in final[3].text
    assert isinstance(final[4], ThinkingPart) and final[4].text == "unclosed thoughts"
    files = list((tmp_path / "attachments").iterdir())
    assert len(files) == 1 and files[0].read_bytes() == PNG and files[0].suffix == ".png"
    assert files[0].as_uri() in final[3].text
    # an inline image part is stored too; broken base64 is left as it was
    img = finish_parts([ImagePart(mime_type="image/png", base64=base64.b64encode(PNG).decode()),
                        TextPart(text="![x](data:image/png;base64,@@@)")], assistant=None, image_dir=tmp_path / "attachments")
    assert isinstance(img[0], ImagePart) and img[0].base64 is None and img[0].url == files[0].as_uri()
    assert isinstance(img[1], TextPart) and img[1].text == "![x](data:image/png;base64,@@@)"


class Snap(msgspec.Struct, frozen=True):
    content_type: str
    text_content: str
    parts: list[Any] | None
    tool_calls: list[Any] | None


@pytest.mark.anyio
async def test_output_processor_finish_recomputes_the_snapshot(tmp_path: Path) -> None:
    profile = AssistantProfile(id="a", name="A", regex_rules=[RegexRule(pattern="x+", replacement="y", scope="both")])
    proc = OutputProcessor(assistant_for=lambda s: profile, image_dir=tmp_path)
    session = SessionV2(id="s", provider_id="p", model_id="m", created_at=1, updated_at=1)
    text_only = await proc.finish(session, Snap(content_type="text", text_content="axxb", parts=None, tool_calls=None))
    assert text_only == Snap(content_type="text", text_content="ayb", parts=None, tool_calls=None)
    mixed = await proc.finish(session, Snap(content_type="text", text_content="<think>hm</think>ok", parts=None, tool_calls=None))
    assert mixed.content_type == "multipart" and mixed.text_content == "ok"
    assert mixed.parts == [ThinkingPart(text="hm"), TextPart(text="ok")]
