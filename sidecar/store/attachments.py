"""AttachmentStore: user-supplied bytes as files in the data dir, referenced from parts.

The wire carries attachments and inline images as base64; stored messages never do.
``store_input`` turns a UserInput into the parts that are saved (images become
ImagePart(url=file://...), other attachments FilePart(uri=file://...)); ``load_base64``
reads a stored file back for a provider request. Only files under the attachments
directory are ever read back, whatever a stored part claims.

Size: an attachment arrives base64-encoded (4/3 of its size) inside one JSON-RPC line,
and a line is at most 16 MiB by default (``--max-line-bytes``), so MAX_ATTACHMENT_BYTES
is what still fits in such a line next to the rest of the request; a bigger file could
never arrive whole anyway.

Blocking file I/O: call these through ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import re
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from protocol.chat import UserInput
from protocol.types import ContentPart, FilePart, ImagePart, TextPart
from sidecar.config import DEFAULT_MAX_LINE_BYTES
from sidecar.confine import inside
from sidecar.errors import InvalidParams
from sidecar.store.ids import new_id

_REQUEST_ROOM = 64 * 1024
"""Room left in a line for the rest of the request (ids, names, text)."""
MAX_ATTACHMENT_BYTES = (DEFAULT_MAX_LINE_BYTES - _REQUEST_ROOM) * 3 // 4
"""12 MiB - 48 KiB: its base64 plus the request fits in a default 16 MiB line."""
MAX_READ_BYTES = 64 * 1024 * 1024
"""Reads stop here: the limit of older builds, whose stored files must still load whole."""
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class StoredInput:
    """What a UserInput becomes once its bytes are on disk."""

    __slots__ = ("content_type", "text_content", "parts")

    def __init__(self, content_type: str, text_content: str, parts: list[ContentPart] | None) -> None:
        self.content_type = content_type
        self.text_content = text_content
        self.parts = parts


class AttachmentStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = (data_dir / "attachments").resolve()

    def store_input(self, user_input: UserInput) -> StoredInput:
        """Validate and persist a UserInput; raises InvalidParams for empty or bad input."""
        parts: list[ContentPart] = []
        if isinstance(user_input.content, str):
            if user_input.content:
                parts.append(TextPart(text=user_input.content))
        else:
            for index, part in enumerate(user_input.content):
                parts.append(self._store_part(part, f"input.content[{index}]"))
        for index, att in enumerate(user_input.attachments or []):
            field = f"input.attachments[{index}]"
            data = _decode_base64(att.data, f"{field}.data")
            uri = self._write(data, att.name)
            if att.mime_type.startswith("image/"):
                parts.append(ImagePart(mime_type=att.mime_type, url=uri))
            else:
                parts.append(FilePart(uri=uri, mime_type=att.mime_type, name=att.name))
        has_text = any(isinstance(p, TextPart) and p.text.strip() for p in parts)
        has_other = any(not isinstance(p, TextPart) for p in parts)
        if not has_text and not has_other:
            raise InvalidParams("input is empty: give text, parts or attachments")
        text = "\n".join(p.text for p in parts if isinstance(p, TextPart))
        if all(isinstance(p, TextPart) for p in parts):
            return StoredInput("text", text, None)
        return StoredInput("multipart", text, parts)

    def _store_part(self, part: ContentPart, field: str) -> ContentPart:
        if isinstance(part, ImagePart) and part.base64 is not None:
            data = _decode_base64(part.base64, f"{field}.base64")
            ext = mimetypes.guess_extension(part.mime_type) or ".bin"
            return ImagePart(mime_type=part.mime_type, url=self._write(data, "image" + ext))
        if isinstance(part, (TextPart, ImagePart, FilePart)):
            return part
        raise InvalidParams(f"{field}: a user message may hold text, image and file parts only")

    def _write(self, data: bytes, name: str) -> str:
        if len(data) > MAX_ATTACHMENT_BYTES:
            raise InvalidParams(
                f"attachment {name!r} is {len(data)} bytes, larger than the limit of"
                f" {MAX_ATTACHMENT_BYTES} bytes (its base64 must fit in one"
                f" {DEFAULT_MAX_LINE_BYTES}-byte JSON-RPC line)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        safe = _SAFE_NAME.sub("_", Path(name).name)[-80:] or "file"
        path = self.root / f"{new_id()}-{safe}"
        path.write_bytes(data)
        return path.as_uri()

    def local_path(self, uri: str) -> Path | None:
        """The stored file behind a ``file://`` URI, or None if it is not one of ours."""
        local = uri_to_path(uri)
        if local is None:
            return None
        path = inside(self.root, local)  # the confinement rule (sidecar/confine.py)
        if path is None or not path.is_file():
            return None
        return path

    def load_bytes(self, uri: str, limit: int = MAX_READ_BYTES) -> bytes | None:
        path = self.local_path(uri)
        if path is None:
            return None
        with path.open("rb") as fh:
            return fh.read(limit)

    def load_base64(self, uri: str) -> str | None:
        data = self.load_bytes(uri)
        return None if data is None else base64.b64encode(data).decode("ascii")


def uri_to_path(uri: str) -> str | None:
    """The OS path a ``file:`` URI names (``Path.as_uri`` inverted on every platform:
    ``file:///C:/a%20b`` is ``C:\\a b`` on Windows), or None for another scheme."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    host = parsed.netloc if parsed.netloc not in ("", "localhost") else ""
    return url2pathname(("//" + host if host else "") + parsed.path)


def _decode_base64(data: str, field: str) -> bytes:
    if data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParams(f"invalid params: {field} is not valid base64") from exc
