"""Files a connection moves: attachments downloaded from a platform, local files uploaded.

Owns ``download`` (a platform file into memory, at most MAX_DOWNLOAD_BYTES, as the base64
``data`` of a ChannelAttachment) and ``local_file`` (a reply's ``file://`` chunk as bytes, only
inside the attachments directory: AttachmentStore.local_path, the confinement rule).

Must stay true: nothing bigger than the limit is read into memory; a failed download is
None (the message still goes in, with the platform's placeholder), never an error.
"""

from __future__ import annotations

import base64
import logging
import mimetypes

import anyio
import httpx2

from protocol.channels import AttachmentKind, ChannelAttachment
from sidecar.store.attachments import AttachmentStore

__all__ = ["download", "local_file", "MAX_DOWNLOAD_BYTES", "LocalFile"]

log = logging.getLogger(__name__)

MAX_DOWNLOAD_BYTES = 10 * 1024 * 1024
DOWNLOAD_TIMEOUT_S = 60.0


async def download(
    http: httpx2.AsyncClient, url: str, *, kind: AttachmentKind, name: str | None, mime_type: str | None,
    headers: dict[str, str] | None = None, what: str = "a file",
) -> ChannelAttachment | None:
    try:
        async with http.stream("GET", url, headers=headers or {}, timeout=DOWNLOAD_TIMEOUT_S) as response:
            if response.status_code != 200:
                log.warning("%s: download answered HTTP %d", what, response.status_code)
                return None
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_DOWNLOAD_BYTES:
                    log.warning("%s is larger than %d bytes: not downloaded", what, MAX_DOWNLOAD_BYTES)
                    return None
            mime = mime_type or response.headers.get("content-type", "").partition(";")[0].strip() or None
    except httpx2.HTTPError as exc:
        log.warning("%s: download failed (%s)", what, type(exc).__name__)
        return None
    if kind == "image" and not (mime or "").startswith("image/"):
        mime = mimetypes.guess_type(name or "")[0] or "image/jpeg"
    return ChannelAttachment(kind=kind, name=name, mime_type=mime, data=base64.b64encode(bytes(data)).decode())


class LocalFile:
    __slots__ = ("name", "data", "mime_type")

    def __init__(self, name: str, data: bytes, mime_type: str) -> None:
        self.name = name
        self.data = data
        self.mime_type = mime_type


async def local_file(attachments: AttachmentStore, uri: str, name: str | None, mime_type: str | None) -> LocalFile | None:
    path = attachments.local_path(uri)
    if path is None:
        return None
    data = await anyio.to_thread.run_sync(attachments.load_bytes, uri)
    if data is None:
        return None
    filename = name or path.name
    return LocalFile(filename, data, mime_type or mimetypes.guess_type(filename)[0] or "application/octet-stream")
