"""build_request_messages: the active branch -> provider RequestMessages.

Rules (documented in README "Attachments and models"):
- the session's system prompt comes first as a system message;
- stored parts are used as they are; ``text_content`` when a message has no parts;
- images stored as files are sent as base64 to models that accept images; a model that
  does not gets a text note ``[image omitted: ...]`` instead (never a silent drop);
- text-like files (text/*, JSON, XML, YAML, CSV, Markdown, source code) are inlined as
  text, up to MAX_INLINE_FILE_BYTES; other files become a text note naming them;
- assistant replies that ended in error with no content are left out; aborted replies
  are kept with the partial text the user saw;
- tool calls without a result in the same message are left out of the request copy
  (a provider rejects a tool call that has no result).

Blocking (reads attachment files): run it with ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

from protocol.types import (
    ContentPart,
    FilePart,
    ImagePart,
    MessageV2,
    TextPart,
    ToolResultPart,
    ToolUsePart,
)
from sidecar.store.attachments import AttachmentStore
from sidecar.providers.types import ModelInfo, RequestMessage

MAX_INLINE_FILE_BYTES = 256 * 1024
_TEXT_MIME_PREFIXES = ("text/",)
_TEXT_MIMES = {
    "application/json",
    "application/xml",
    "application/x-yaml",
    "application/yaml",
    "application/javascript",
    "application/typescript",
    "application/x-python",
    "application/x-sh",
    "application/sql",
    "application/toml",
}


def build_request_messages(
    path: list[MessageV2],
    *,
    system_prompt: str | None,
    model: ModelInfo,
    attachments: AttachmentStore,
) -> list[RequestMessage]:
    out: list[RequestMessage] = []
    if system_prompt and system_prompt.strip():
        out.append(RequestMessage(role="system", parts=[TextPart(text=system_prompt)]))
    for message in path:
        if message.status in ("pending", "streaming"):
            continue
        if message.role == "tool":
            # rows imported from tools that store results as separate messages: fold them
            # into the preceding assistant message as the seed's tool_result parts
            if out and out[-1].role == "assistant" and message.tool_call_id:
                out[-1].parts.append(
                    ToolResultPart(tool_use_id=message.tool_call_id, content=message.text_content or "")
                )
            continue
        parts = _message_parts(message, model, attachments)
        if message.role == "assistant":
            parts = _drop_unanswered_tool_calls(parts)
        if not parts:
            continue
        role = message.role if message.role in ("system", "user", "assistant") else "user"
        out.append(RequestMessage(role=role, parts=parts))
    return out


def _message_parts(
    message: MessageV2, model: ModelInfo, attachments: AttachmentStore
) -> list[ContentPart]:
    if not message.parts:
        text = message.text_content or ""
        return [TextPart(text=text)] if text else []
    parts: list[ContentPart] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            parts.append(_image_part(part, model, attachments))
        elif isinstance(part, FilePart):
            parts.append(_file_part(part, attachments))
        else:
            parts.append(part)
    return parts


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


def _file_part(part: FilePart, attachments: AttachmentStore) -> ContentPart:
    name = part.name or part.uri.rsplit("/", 1)[-1]
    mime = part.mime_type or "application/octet-stream"
    if _is_text_mime(mime):
        data = attachments.load_bytes(part.uri, MAX_INLINE_FILE_BYTES + 1)
        if data is not None:
            truncated = len(data) > MAX_INLINE_FILE_BYTES
            text = data[:MAX_INLINE_FILE_BYTES].decode("utf-8", errors="replace")
            note = "\n[... truncated]" if truncated else ""
            return TextPart(text=f'<file name="{name}" type="{mime}">\n{text}{note}\n</file>')
    return TextPart(text=f"[attached file: {name} ({mime}); its contents cannot be shown to the model]")


def _is_text_mime(mime: str) -> bool:
    mime = mime.split(";", 1)[0].strip().lower()
    return (
        mime.startswith(_TEXT_MIME_PREFIXES)
        or mime in _TEXT_MIMES
        or mime.endswith("+json")
        or mime.endswith("+xml")
    )


def _drop_unanswered_tool_calls(parts: list[ContentPart]) -> list[ContentPart]:
    answered = {p.tool_use_id for p in parts if isinstance(p, ToolResultPart)}
    return [p for p in parts if not (isinstance(p, ToolUsePart) and p.id not in answered)]
