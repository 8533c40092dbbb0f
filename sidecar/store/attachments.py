"""AttachmentStore: user-supplied bytes as files in the data dir, referenced from parts.

The wire carries attachments and inline images as base64; stored messages never do.
A UserInput becomes the parts that are saved (images become ImagePart(url=file://...),
other attachments FilePart(uri=file://...)) in two steps, so the bytes reach the disk in
the same unit of work as the message that owns them: ``prepare_input`` checks and decodes
everything (nothing written: bad input or a refused send leaves no file), ``write`` puts
the bytes on disk and gives the parts, and ``discard`` removes them again when storing
the message failed. ``store_input`` does both at once (a caller that references the files
from its own row at once). ``load_base64`` reads a stored file back for a provider
request. Only files under the attachments directory are ever read back, whatever a stored
part claims. The files (and the folder) are the user's alone: 0600 and 0700 from
creation (sidecar/datadir.py).

Size: an attachment arrives base64-encoded (4/3 of its size) inside one JSON-RPC line,
and a line is at most 16 MiB by default (``--max-line-bytes``), so MAX_ATTACHMENT_BYTES
is what still fits in such a line next to the rest of the request; a bigger file could
never arrive whole anyway.

Blocking file I/O: call these through ``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import mimetypes
import re
from pathlib import Path
from urllib.parse import urlparse

from protocol.chat import UserInput
from protocol.types import ContentPart, FilePart, ImagePart, TextPart
from sidecar import datadir
from sidecar.config import DEFAULT_MAX_LINE_BYTES
from sidecar.confine import inside
from sidecar.errors import InvalidParams
from sidecar.store.ids import new_id

log = logging.getLogger(__name__)

_REQUEST_ROOM = 64 * 1024
"""Room left in a line for the rest of the request (ids, names, text)."""
MAX_ATTACHMENT_BYTES = (DEFAULT_MAX_LINE_BYTES - _REQUEST_ROOM) * 3 // 4
"""12 MiB - 48 KiB: its base64 plus the request fits in a default 16 MiB line."""
MAX_READ_BYTES = 64 * 1024 * 1024
"""Reads stop here: the limit of older builds, whose stored files must still load whole."""
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class StoredInput:
    """What a UserInput becomes once its bytes are on disk."""

    __slots__ = ("content_type", "text_content", "parts", "files")

    def __init__(
        self, content_type: str, text_content: str, parts: list[ContentPart] | None, files: list[Path] | None = None
    ) -> None:
        self.content_type = content_type
        self.text_content = text_content
        self.parts = parts
        self.files: list[Path] = files or []
        """The files ``write`` created for it (what ``discard`` removes)."""


class _Blob:
    """Bytes of one attachment, checked and decoded, not on disk yet."""

    __slots__ = ("data", "name", "mime_type", "image", "file_name")

    def __init__(self, data: bytes, name: str, mime_type: str, *, image: bool, file_name: str | None) -> None:
        self.data = data
        self.name = name
        self.mime_type = mime_type
        self.image = image
        self.file_name = file_name


class PreparedInput:
    """A checked UserInput: its parts in order, attachments still as bytes in memory."""

    __slots__ = ("content_type", "text_content", "slots")

    def __init__(self, content_type: str, text_content: str, slots: list[ContentPart | _Blob]) -> None:
        self.content_type = content_type
        self.text_content = text_content
        self.slots = slots


class AttachmentStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = (data_dir / "attachments").resolve()

    def store_input(self, user_input: UserInput) -> StoredInput:
        """Validate and persist a UserInput; raises InvalidParams for empty or bad input."""
        return self.write(self.prepare_input(user_input))

    def prepare_input(self, user_input: UserInput) -> PreparedInput:
        """Validate and decode a UserInput, writing nothing; InvalidParams for empty or bad input."""
        slots: list[ContentPart | _Blob] = []
        if isinstance(user_input.content, str):
            if user_input.content:
                slots.append(TextPart(text=user_input.content))
        else:
            for index, part in enumerate(user_input.content):
                slots.append(self._prepare_part(part, f"input.content[{index}]"))
        for index, att in enumerate(user_input.attachments or []):
            field = f"input.attachments[{index}]"
            data = _checked_size(_decode_base64(att.data, f"{field}.data"), att.name)
            image = att.mime_type.startswith("image/")
            slots.append(_Blob(data, att.name, att.mime_type, image=image, file_name=None if image else att.name))
        has_text = any(isinstance(p, TextPart) and p.text.strip() for p in slots)
        has_other = any(not isinstance(p, TextPart) for p in slots)
        if not has_text and not has_other:
            raise InvalidParams("input is empty: give text, parts or attachments")
        text = "\n".join(p.text for p in slots if isinstance(p, TextPart))
        if all(isinstance(p, TextPart) for p in slots):
            return PreparedInput("text", text, slots)
        return PreparedInput("multipart", text, slots)

    def write(self, prepared: PreparedInput) -> StoredInput:
        """Put the prepared bytes on disk (blocking); the files are removed again if one
        of them cannot be written."""
        files: list[Path] = []
        parts: list[ContentPart] = []
        try:
            for slot in prepared.slots:
                if not isinstance(slot, _Blob):
                    parts.append(slot)
                    continue
                path = self._write_file(slot.data, slot.name)
                files.append(path)
                if slot.image:
                    parts.append(ImagePart(mime_type=slot.mime_type, url=path.as_uri()))
                else:
                    parts.append(FilePart(uri=path.as_uri(), mime_type=slot.mime_type, name=slot.file_name))
        except BaseException:
            self.discard_files(files)
            raise
        if prepared.content_type == "text":
            return StoredInput("text", prepared.text_content, None, files)
        return StoredInput("multipart", prepared.text_content, parts, files)

    def discard(self, stored: StoredInput) -> None:
        """Remove the files ``write`` created for ``stored`` (its message was not stored)."""
        self.discard_files(stored.files)
        stored.files = []

    def discard_files(self, files: list[Path]) -> None:
        for path in files:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # left to the orphan sweep (storage:gc, the start-up pass)
                log.warning("could not remove the unused attachment %s: %s", path, exc)

    def _prepare_part(self, part: ContentPart, field: str) -> ContentPart | _Blob:
        if isinstance(part, ImagePart) and part.base64 is not None:
            ext = mimetypes.guess_extension(part.mime_type) or ".bin"
            data = _checked_size(_decode_base64(part.base64, f"{field}.base64"), "image" + ext)
            return _Blob(data, "image" + ext, part.mime_type, image=True, file_name=None)
        if isinstance(part, (TextPart, ImagePart, FilePart)):
            return part
        raise InvalidParams(f"{field}: a user message may hold text, image and file parts only")

    def _write(self, data: bytes, name: str) -> str:
        return self._write_file(_checked_size(data, name), name).as_uri()

    def _write_file(self, data: bytes, name: str) -> Path:
        datadir.make_dirs(self.root)
        safe = _SAFE_NAME.sub("_", Path(name).name)[-80:] or "file"
        path = self.root / f"{new_id()}-{safe}"
        datadir.write_private(path, data, exclusive=True)  # a fresh name: never an existing file
        return path

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
    from urllib.request import url2pathname  # urllib.request (http.client, email) is ~15 ms: not at start-up

    host = parsed.netloc if parsed.netloc not in ("", "localhost") else ""
    return url2pathname(("//" + host if host else "") + parsed.path)


def _checked_size(data: bytes, name: str) -> bytes:
    if len(data) > MAX_ATTACHMENT_BYTES:
        raise InvalidParams(
            f"attachment {name!r} is {len(data)} bytes, larger than the limit of"
            f" {MAX_ATTACHMENT_BYTES} bytes (its base64 must fit in one"
            f" {DEFAULT_MAX_LINE_BYTES}-byte JSON-RPC line)"
        )
    return data


def _decode_base64(data: str, field: str) -> bytes:
    if data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParams(f"invalid params: {field} is not valid base64") from exc
