"""Output transforms of an assistant reply (seed 000 section 7).

Three stages with different purposes:
- visual, while streaming (``split_think_tags``): ``<think>...</think>`` in text deltas
  becomes thinking deltas, so the renderer shows reasoning as reasoning and the stored reply
  gets a ThinkingPart. A tag split across deltas (``<thi`` + ``nk>``) is recognised: a
  delta ending in a possible tag prefix is held back until the next delta decides. Newlines
  right after ``</think>`` are dropped. Reasoning a provider sends as reasoning passes through.
- finish (``OutputProcessor.finish``), on the final content before it is stored:
  * think tags still in text parts (a reply that ended inside ``<think>``, a model that only
    emits ``</think>`` because its template opened the tag) are split into thinking and text,
    the unclosed one closed at the end;
  * base64 images in the text (Markdown ``![alt](data:image/png;base64,...)``) and inline
    image parts are written to ``<dataDir>/attachments/generated-<sha256>.<ext>`` and
    replaced by ``file://`` references (the attachment store serves these back);
- persisted transforms: the assistant's ``assistant``-scope regex rules rewrite the text
  parts, last, so they see the final visible text.
Must stay true: only text parts change (tool calls, tool results, reasoning signatures stay
as they are); ``textContent`` is the concatenated text parts of the result.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import mimetypes
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio
import msgspec

from protocol.context import AssistantProfile
from protocol.types import ContentPart, ImagePart, SessionV2, TextPart, ThinkingPart
from sidecar import datadir
from sidecar.errors import SidecarError
from sidecar.pipeline.transformers.regex import apply_rules, compile_rules
from sidecar.providers.types import (
    Finish,
    StreamPart,
    TextDelta,
    ThinkingDelta,
    ToolCallStart,
)

__all__ = ["ThinkTagSplitter", "split_think_tags", "OutputProcessor", "finish_parts", "MAX_IMAGE_BYTES"]

log = logging.getLogger(__name__)

OPEN = "<think>"
CLOSE = "</think>"
MAX_IMAGE_BYTES = 32 * 1024 * 1024
_DATA_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(\s*data:(image/[A-Za-z0-9.+-]+);base64,([A-Za-z0-9+/=\s]+?)\s*\)")
S = TypeVar("S")
T = TypeVar("T")


class Offload(Protocol):
    """Runs a blocking function in a worker thread."""

    async def __call__(self, fn: Callable[[], T], /) -> T: ...


class ThinkTagSplitter:
    """Splits streamed text into ("text" | "thinking", chunk) runs."""

    def __init__(self) -> None:
        self.inside = False
        self._held = ""
        self._after_close = False

    def passes_through(self, text: str) -> bool:
        """True when ``feed(text)`` would return ``text`` unchanged as one text run."""
        return not self.inside and not self._held and not self._after_close and "<" not in text and bool(text)

    def feed(self, text: str) -> list[tuple[str, str]]:
        data = self._held + text
        self._held = ""
        out: list[tuple[str, str]] = []
        while data:
            tag = CLOSE if self.inside else OPEN
            at = data.find(tag)
            if at >= 0:
                self._emit(out, data[:at])
                data = data[at + len(tag) :]
                self.inside = not self.inside
                self._after_close = not self.inside
                continue
            keep = _partial_suffix(data, tag)
            self._emit(out, data[: len(data) - keep])
            self._held = data[len(data) - keep :]
            break
        return out

    def end(self) -> list[tuple[str, str]]:
        """Flush what is held; an open think block ends (is closed) here."""
        out: list[tuple[str, str]] = []
        self._emit(out, self._held)
        self._held = ""
        self.inside = False
        return out

    def _emit(self, out: list[tuple[str, str]], text: str) -> None:
        if not self.inside and self._after_close:
            text = text.lstrip("\r\n")
            if not text:
                return
            self._after_close = False
        if not text:
            return
        kind = "thinking" if self.inside else "text"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))


def _partial_suffix(data: str, tag: str) -> int:
    """Length of the longest end of ``data`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(data)), 0, -1):
        if data.endswith(tag[:n]):
            return n
    return 0


def _parts(runs: list[tuple[str, str]]) -> list[StreamPart]:
    return [TextDelta(text=t) if kind == "text" else ThinkingDelta(text=t) for kind, t in runs]


async def split_think_tags(parts: AsyncIterator[StreamPart]) -> AsyncGenerator[StreamPart, None]:
    """The provider stream with think tags in text turned into thinking deltas."""
    splitter = ThinkTagSplitter()
    async with aclosing(parts):  # type: ignore[type-var]
        try:
            async for part in parts:
                if isinstance(part, TextDelta):
                    if splitter.passes_through(part.text):
                        yield part  # the hot path: plain text outside any tag
                        continue
                    for out in _parts(splitter.feed(part.text)):
                        yield out
                    continue
                if isinstance(part, (Finish, ToolCallStart)):
                    for out in _parts(splitter.end()):
                        yield out
                yield part
        except SidecarError:
            for out in _parts(splitter.end()):  # what was held back is part of the reply
                yield out
            raise
    for out in _parts(splitter.end()):
        yield out


# ---- finish processing ----------------------------------------------------------------


def _split_text_thinking(text: str) -> list[ContentPart]:
    if OPEN not in text and CLOSE in text:
        # the template opened the block: everything before the first </think> is reasoning
        head, _, rest = text.partition(CLOSE)
        text = OPEN + head + CLOSE + rest
    splitter = ThinkTagSplitter()
    runs = splitter.feed(text) + splitter.end()
    return [TextPart(text=t) if kind == "text" else ThinkingPart(text=t) for kind, t in runs]


def _store_image(data: bytes, mime: str, image_dir: Path) -> str:
    digest = hashlib.sha256(data).hexdigest()[:32]
    ext = mimetypes.guess_extension(mime) or ".bin"
    datadir.make_dirs(image_dir)
    path = image_dir / f"generated-{digest}{ext}"
    try:
        # stored already for another reply: touched, so a delete that released it just now
        # keeps it for this one (a file written after its release is kept: store/janitor.py)
        os.utime(path)
    except FileNotFoundError:
        tmp = path.with_suffix(path.suffix + ".tmp")
        datadir.write_private(tmp, data)  # 0600 from creation, like every data-dir file
        tmp.replace(path)
    return path.as_uri()


def _decode_image(raw: str) -> bytes | None:
    try:
        data = base64.b64decode(re.sub(r"\s+", "", raw), validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if 0 < len(data) <= MAX_IMAGE_BYTES else None


def _replace_images(text: str, image_dir: Path) -> str:
    def swap(match: re.Match[str]) -> str:
        data = _decode_image(match.group(3))
        if data is None:
            return match.group(0)
        return f"![{match.group(1)}]({_store_image(data, match.group(2), image_dir)})"

    return _DATA_IMAGE.sub(swap, text) if "base64," in text else text


def finish_parts(parts: list[ContentPart], *, assistant: AssistantProfile | None, image_dir: Path) -> list[ContentPart]:
    """The final parts of a reply (blocking: writes image files)."""
    split: list[ContentPart] = []
    for part in parts:
        if isinstance(part, TextPart) and (OPEN in part.text or CLOSE in part.text):
            split.extend(_split_text_thinking(part.text))
        else:
            split.append(part)
    rules = compile_rules(assistant.regex_rules, "assistant") if assistant is not None else []
    out: list[ContentPart] = []
    for part in split:
        if isinstance(part, TextPart):
            text = apply_rules(_replace_images(part.text, image_dir), rules)
            if not text:
                continue
            if out and isinstance(out[-1], TextPart):
                out[-1] = TextPart(text=out[-1].text + text)
            else:
                out.append(TextPart(text=text))
        elif isinstance(part, ThinkingPart) and out and isinstance(out[-1], ThinkingPart) and not out[-1].signature:
            out[-1] = ThinkingPart(text=out[-1].text + part.text, signature=part.signature)
        elif isinstance(part, ImagePart) and part.base64:
            data = _decode_image(part.base64)
            out.append(ImagePart(mime_type=part.mime_type, url=_store_image(data, part.mime_type, image_dir))
                       if data is not None else part)
        else:
            out.append(part)
    return out


class OutputProcessor:
    """The finish stage for a GenerationHandler: ``stream()`` wraps the provider stream,
    ``await finish(session, snapshot)`` returns the snapshot to store."""

    def __init__(
        self,
        *,
        assistant_for: Callable[[SessionV2], AssistantProfile | None],
        image_dir: Path,
        offload: Offload | None = None,
    ) -> None:
        """``assistant_for`` is blocking and runs with the finish work in one worker-thread
        hop: ``offload`` makes it (the request builder passes its store's ``run``, since the
        profile is a database read); without it, anyio's own thread pool."""
        self._assistant_for = assistant_for
        self._image_dir = image_dir
        self._offload = offload

    def stream(self, parts: AsyncIterator[StreamPart]) -> AsyncGenerator[StreamPart, None]:
        return split_think_tags(parts)

    async def finish(self, session: SessionV2, snapshot: S) -> S:
        """``snapshot``: a Struct with ``content_type``, ``text_content`` and ``parts`` (the
        engine's ReplySnapshot); the same type comes back with final content."""
        snap: Any = snapshot

        def work() -> S:
            parts: list[ContentPart] = list(snap.parts) if snap.parts else (
                [TextPart(text=snap.text_content)] if snap.text_content else []
            )
            try:
                assistant = self._assistant_for(session)
            except SidecarError as exc:
                log.warning("no assistant profile for session %s: %s", session.id, exc.message)
                assistant = None
            final = finish_parts(parts, assistant=assistant, image_dir=self._image_dir)
            only_text = all(isinstance(p, TextPart) for p in final)
            return msgspec.structs.replace(  # type: ignore[no-any-return]
                snap,
                content_type="text" if only_text else "multipart",
                text_content="".join(p.text for p in final if isinstance(p, TextPart)),
                parts=None if only_text else final,
            )

        try:
            if self._offload is not None:
                return await self._offload(work)
            return await anyio.to_thread.run_sync(work)
        except OSError as exc:  # a full disk must not lose the reply: store it unprocessed
            log.error("finishing the reply of session %s failed: %s", session.id, exc)
            return snapshot
