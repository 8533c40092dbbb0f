"""V1 ``/computer/chat`` attachments -> the user input of the ``chat:send`` they come with.

The Qiming server sends the agent runner's Attachment shape (rcoder ``shared_types``
``model/attachment.rs``): ``{"type": "Text" | "Image" | "Audio" | "Document", "content":
{"id", "source": {"source_type": "Url" | "Base64" | "FilePath", "data": {"url"} |
{"data", "mime_type"} | {"path"}}, "mime_type"?, "filename"?, "description"?}}``; the
type and source type are matched without regard to case. What each becomes:
- ``Url`` with an http(s) address: a FilePart (the address, the mime type, the file name),
  as sync maps the server's own attachments and as ``chat:send`` takes them (a direct
  model gets a note naming the file, an ACP agent a resource link to it);
- ``Base64``: an attachment of ``chat:send`` (decoded and stored like the renderer's; an
  image becomes an image part), within the same size limit;
- a ``FilePath`` (a path on the runner's machine), any other address, an unknown type or a
  malformed entry: VALIDATION_ERROR naming the entry (``attachments[i]...``); nothing is sent.
Untrusted: at most MAX_ATTACHMENTS entries, addresses and names bounded, names stripped to
printable text.
"""

from __future__ import annotations

import mimetypes
from typing import Any

from protocol.chat import Attachment, InputPart, UserInput
from protocol.types import FilePart, TextPart
from sidecar.compat.wire import invalid

__all__ = ["user_input", "MAX_ATTACHMENTS"]

MAX_ATTACHMENTS = 32
MAX_URL_CHARS = 4096
MAX_NAME_CHARS = 255
KINDS = ("text", "image", "audio", "document")
DEFAULT_MIME = {"text": "text/plain"}


def user_input(prompt: str, attachments: list[Any] | None) -> UserInput:
    """The prompt with its attachments as one user input; V1Error (400) for a bad entry."""
    if not attachments:
        return UserInput(content=prompt)
    if len(attachments) > MAX_ATTACHMENTS:
        raise invalid(f"attachments: at most {MAX_ATTACHMENTS} entries")
    parts: list[InputPart] = [TextPart(text=prompt)]
    files: list[Attachment] = []
    for index, entry in enumerate(attachments):
        part, file = _one(entry, f"attachments[{index}]", index)
        if part is not None:
            parts.append(part)
        if file is not None:
            files.append(file)
    return UserInput(content=parts, attachments=files or None)


def _one(entry: Any, field: str, index: int) -> tuple[FilePart | None, Attachment | None]:
    if not isinstance(entry, dict):
        raise invalid(f"{field} must be an object")
    kind = _text(entry.get("type"), f"{field}.type").lower()
    if kind not in KINDS:
        raise invalid(f"{field}.type must be one of Text, Image, Audio, Document")
    content = entry.get("content")
    if not isinstance(content, dict):
        raise invalid(f"{field}.content must be an object")
    source = content.get("source")
    if not isinstance(source, dict):
        raise invalid(f"{field}.content.source must be an object")
    source_type = _text(source.get("source_type"), f"{field}.content.source.source_type").lower()
    data = source.get("data")
    if not isinstance(data, dict):
        raise invalid(f"{field}.content.source.data must be an object")
    name = _name(content.get("filename"), f"{field}.content.filename")
    mime = _mime(content.get("mime_type"), f"{field}.content.mime_type")
    if source_type == "url":
        url = _text(data.get("url"), f"{field}.content.source.data.url").strip()
        if len(url) > MAX_URL_CHARS or not url.lower().startswith(("http://", "https://")):
            raise invalid(f"{field}.content.source.data.url must be an http(s) address of at most {MAX_URL_CHARS} characters")
        guessed = mime or _guess(name or url.split("?", 1)[0]) or DEFAULT_MIME.get(kind)
        return FilePart(uri=url, mime_type=guessed, name=name), None
    if source_type == "base64":
        encoded = _text(data.get("data"), f"{field}.content.source.data.data")
        mime = _mime(data.get("mime_type"), f"{field}.content.source.data.mime_type") or mime
        mime = mime or (_guess(name) if name else None) or DEFAULT_MIME.get(kind) or "application/octet-stream"
        extension = mimetypes.guess_extension(mime) or ""
        return None, Attachment(name=name or f"attachment-{index + 1}{extension}", data=encoded, mime_type=mime)
    if source_type == "filepath":
        raise invalid(f"{field}: a FilePath attachment names a file on the agent runner's machine; send a Url or Base64 one")
    raise invalid(f"{field}.content.source.source_type must be Url or Base64")


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(f"{field} must be a non-empty string")
    return value


def _name(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{field} must be a string")
    name = "".join(c for c in value if c.isprintable()).strip()[:MAX_NAME_CHARS]
    return name or None


def _mime(value: Any, field: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 255 or "/" not in value or not value.isprintable():
        raise invalid(f"{field} must be a mime type such as image/png")
    return value.strip().lower()


def _guess(name: str | None) -> str | None:
    return mimetypes.guess_type(name)[0] if name else None
