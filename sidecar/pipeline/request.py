"""The stored branch -> Draft messages, and Drafts -> provider RequestMessages.

``build_drafts`` copies stored messages into the request copy; ``finalize`` applies what the
model can take, after the input transformers ran. Rules (README "Attachments and models"):
- stored parts are used as they are; ``text_content`` when a message has no parts;
- assistant replies that ended in error with no content are left out; aborted replies
  are kept with the partial text the user saw; pending/streaming rows are left out;
- an assistant message's ``tool_calls`` missing from its parts (imported messages that
  keep calls only there) become ToolUseParts at its end;
- rows with role ``tool`` (imported from tools that store results as messages) are folded
  into the preceding assistant message as ToolResultParts;
- then, tool calls without a result in the same message are left out of the request copy
  (a provider rejects a tool call that has no result);
- a conversation never starts with a reply (``lead_with_user``, after the transformers);
- images stored as files are sent as base64 to models that accept images; a model that
  does not gets a text note ``[image omitted: ...]`` instead (never a silent drop);
- files still FileParts here (DocumentAsPrompt is off, or did not convert them): text-like
  ones are inlined as ``<file>`` text (escaped data, as DocumentAsPrompt's ``<document>``
  blocks) up to MAX_INLINE_FILE_BYTES (then truncated), any
  other becomes a note naming it (its name and type escaped: sidecar/untrusted.py).

Blocking (reads attachment files): run ``finalize`` with ``anyio.to_thread.run_sync``
when the drafts hold images or files.
"""

from __future__ import annotations

import mimetypes

import msgspec

from protocol.types import (
    ContentPart,
    FilePart,
    ImagePart,
    MessageV2,
    TextPart,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.pipeline.mime import is_text_mime
from sidecar.pipeline.transformers.base import Draft
from sidecar.pipeline.transformers.document import file_block
from sidecar.providers.types import ModelInfo, RequestMessage
from sidecar.store.attachments import AttachmentStore
from sidecar.untrusted import escape

__all__ = ["build_drafts", "finalize", "lead_with_user", "CONVERSATION_START", "MAX_INLINE_FILE_BYTES", "is_text_mime"]

MAX_INLINE_FILE_BYTES = 256 * 1024


def build_drafts(path: list[MessageV2]) -> list[Draft]:
    out: list[Draft] = []
    for message in path:
        if message.status in ("pending", "streaming"):
            continue
        if message.role == "tool":
            if out and out[-1].role == "assistant" and message.tool_call_id:
                out[-1].parts.append(
                    ToolResultPart(tool_use_id=message.tool_call_id, content=message.text_content or "")
                )
            continue
        if message.parts:
            parts: list[ContentPart] = list(message.parts)
        else:
            text = message.text_content or ""
            parts = [TextPart(text=text)] if text else []
        if message.role == "assistant" and message.tool_calls:
            parts.extend(_calls_missing_from(parts, message))
        if not parts:
            continue
        role = message.role if message.role in ("system", "user", "assistant") else "user"
        out.append(Draft(role=role, parts=parts, source_id=message.id, created_at=message.created_at))
    # only now that the tool rows are folded in is it known which calls have no result
    kept: list[Draft] = []
    for draft in out:
        if draft.role == "assistant":
            draft.parts = _drop_unanswered_tool_calls(draft.parts)
            if not draft.parts:
                continue
        kept.append(draft)
    return kept


CONVERSATION_START = "[The conversation starts with the assistant's message that follows.]"


def lead_with_user(drafts: list[Draft]) -> list[Draft]:
    """The conversation of a request starts with the user (Anthropic refuses one that
    starts with a reply): when the first message after the system prompt is an
    assistant's (a branch whose root is a reply, e.g. a pulled conversation that opens with
    the agent's greeting or an imported one; an assistant injection at the top of the
    chat), the short CONVERSATION_START user message goes before it; nothing is dropped."""
    first = 1 if drafts and drafts[0].role == "system" else 0
    if first < len(drafts) and drafts[first].role == "assistant":
        return [*drafts[:first], Draft(role="user", parts=[TextPart(text=CONVERSATION_START)]), *drafts[first:]]
    return drafts


def finalize(drafts: list[Draft], *, model: ModelInfo, attachments: AttachmentStore) -> list[RequestMessage]:
    out: list[RequestMessage] = []
    for draft in drafts:
        parts: list[ContentPart] = []
        for part in draft.parts:
            if isinstance(part, ImagePart):
                parts.append(_image_part(part, model, attachments))
            elif isinstance(part, FilePart):
                parts.append(_inline_text_file(part, attachments))
            else:
                parts.append(part)
        if parts:
            out.append(RequestMessage(role=draft.role, parts=parts))
    return out


def _image_part(part: ImagePart, model: ModelInfo, attachments: AttachmentStore) -> ContentPart:
    if not model.supports_images:
        return TextPart(text=f"[image omitted: the model {model.id} does not accept images]")
    if part.base64 is not None:
        return part
    if part.url and part.url.startswith("file:"):
        data = attachments.load_base64(part.url)
        if data is None:
            return TextPart(text="[image omitted: its stored file is missing]")
        return ImagePart(mime_type=part.mime_type, base64=data)
    return part


def _file_note(part: FilePart) -> TextPart:
    # a name and type from anyone (a server's attachment, an IM file, a dropped file)
    name = escape(part.name or part.uri.rsplit("/", 1)[-1])
    mime = escape(part.mime_type or "application/octet-stream")
    return TextPart(text=f"[attached file: {name} ({mime}); its contents cannot be shown to the model]")


def _inline_text_file(part: FilePart, attachments: AttachmentStore) -> ContentPart:
    """A text-like stored file as ``<file>`` text (the note for anything else)."""
    name = part.name or part.uri.rsplit("/", 1)[-1]
    mime = part.mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
    if is_text_mime(mime):
        data = attachments.load_bytes(part.uri, MAX_INLINE_FILE_BYTES + 1)
        if data is not None:
            text = data[:MAX_INLINE_FILE_BYTES].decode("utf-8", errors="replace")
            return TextPart(text=file_block("file", name, mime, text, len(data) > MAX_INLINE_FILE_BYTES))
    return _file_note(part)


def _drop_unanswered_tool_calls(parts: list[ContentPart]) -> list[ContentPart]:
    answered = {p.tool_use_id for p in parts if isinstance(p, ToolResultPart)}
    return [p for p in parts if not (isinstance(p, ToolUsePart) and p.id not in answered)]


def _calls_missing_from(parts: list[ContentPart], message: MessageV2) -> list[ContentPart]:
    present = {p.id for p in parts if isinstance(p, ToolUsePart)}
    missing: list[ContentPart] = []
    for call in message.tool_calls or []:
        if call.id in present:
            continue
        try:
            parsed = msgspec.json.decode(call.arguments or "{}")
        except msgspec.DecodeError:
            parsed = None
        missing.append(ToolUsePart(id=call.id, name=call.name, input=parsed if isinstance(parsed, dict) else {"_raw": call.arguments}))
    return missing
