"""The files a channel connection moves, against a loopback HTTP server
(platform_fakes.serve): a platform file downloaded into a ChannelAttachment (at most
MAX_DOWNLOAD_BYTES, a failure is None, never an error), and a reply's local file read only
from inside the attachments directory."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from platform_fakes import serve
from sidecar.channels.connections import media
from sidecar.channels.connections.media import download, local_file
from sidecar.store.attachments import AttachmentStore

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n some image"


async def _file(request: Request) -> Response:
    name = request.path_params["name"]
    if name == "missing":
        return Response(status_code=404)
    if name == "big":
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 1024
        return StreamingResponse(chunks(), media_type="application/octet-stream")
    kind = "image/png; charset=binary" if name == "typed" else "application/octet-stream"
    return Response(PNG, headers={"content-type": kind})


@asynccontextmanager
async def file_server() -> AsyncIterator[str]:
    async with serve(Starlette(routes=[Route("/{name}", _file)])) as port:
        yield f"http://127.0.0.1:{port}"


async def test_a_download_is_the_files_bytes_with_the_type_it_was_served_with() -> None:
    async with file_server() as root:
        async with httpx2.AsyncClient() as http:
            found = await download(http, f"{root}/typed", kind="image", name="p.png", mime_type=None)
            assert found is not None and found.mime_type == "image/png" and found.name == "p.png"
            assert found.data is not None and base64.b64decode(found.data) == PNG
            # the platform's own type wins over the header's
            found = await download(http, f"{root}/typed", kind="file", name="a.bin", mime_type="application/x-thing")
            assert found is not None and found.mime_type == "application/x-thing"


async def test_an_image_served_untyped_is_given_an_image_type() -> None:
    async with file_server() as root:
        async with httpx2.AsyncClient() as http:
            named = await download(http, f"{root}/untyped", kind="image", name="photo.gif", mime_type=None)
            assert named is not None and named.mime_type == "image/gif"
            unnamed = await download(http, f"{root}/untyped", kind="image", name=None, mime_type=None)
            assert unnamed is not None and unnamed.mime_type == "image/jpeg"
            as_file = await download(http, f"{root}/untyped", kind="file", name="x", mime_type=None)
            assert as_file is not None and as_file.mime_type == "application/octet-stream"


async def test_a_failed_or_oversized_download_is_none(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(media, "MAX_DOWNLOAD_BYTES", 4096)
    async with file_server() as root:
        async with httpx2.AsyncClient() as http:
            assert await download(http, f"{root}/missing", kind="file", name=None, mime_type=None, what="doc") is None
            assert await download(http, f"{root}/big", kind="file", name=None, mime_type=None, what="big") is None
            assert await download(http, f"{root}/typed", kind="file", name=None, mime_type=None) is not None
    async with httpx2.AsyncClient() as http:  # nothing listens there any more
        assert await download(http, f"{root}/typed", kind="file", name=None, mime_type=None, what="gone") is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("doc: download answered HTTP 404" in m for m in messages)
    assert any("big is larger than 4096 bytes" in m for m in messages)
    assert any(m.startswith("gone: download failed") for m in messages)


async def test_a_local_file_is_read_only_from_inside_the_attachments(tmp_path: Path) -> None:
    attachments = AttachmentStore(tmp_path)
    attachments.root.mkdir(parents=True)
    (attachments.root / "report.pdf").write_bytes(b"%PDF-1.7")
    (tmp_path / "secret.txt").write_text("not yours")
    found = await local_file(attachments, (attachments.root / "report.pdf").as_uri(), None, None)
    assert found is not None and (found.name, found.data, found.mime_type) == ("report.pdf", b"%PDF-1.7", "application/pdf")
    named = await local_file(attachments, (attachments.root / "report.pdf").as_uri(), "q3.pdf", "application/x-pdf")
    assert named is not None and (named.name, named.mime_type) == ("q3.pdf", "application/x-pdf")
    assert await local_file(attachments, (tmp_path / "secret.txt").as_uri(), None, None) is None
    escape = attachments.root.as_uri() + "/../secret.txt"
    assert await local_file(attachments, escape, None, None) is None
    assert await local_file(attachments, (attachments.root / "gone.png").as_uri(), None, None) is None
    assert await local_file(attachments, "https://example.com/a.png", None, None) is None
