"""Multipart input over the subprocess: bytes stored as files, sent as the model allows."""

from __future__ import annotations

import base64
import math
import nturl2path
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from chat_helpers import configure_provider, wait_final
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

from protocol.chat import Attachment, UserInput
from sidecar.config import DEFAULT_MAX_LINE_BYTES
from sidecar.errors import InvalidParams
from sidecar.store.attachments import MAX_ATTACHMENT_BYTES, AttachmentStore, uri_to_path

pytestmark = pytest.mark.anyio

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def _path(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path))


@pytest.mark.parametrize("supports_images", [True, False])
async def test_attachments_are_files_and_reach_the_model_as_it_allows(tmp_path, supports_images):
    data_dir = tmp_path / "data"
    async with scripted_provider() as server, spawn_sidecar(data_dir) as proc:
        provider = await configure_provider(proc, server.base_url)
        await proc.call(
            "provider:upsert",
            {
                "id": provider["id"], "name": "Scripted", "type": "openai-compat", "baseUrl": server.base_url,
                "models": [{"id": "scripted-1", "supportsImages": supports_images}],
            },
        )
        await proc.call("settings:update", {"generateTitles": False})
        session = await proc.call("chat:session:create", {"title": "files"})
        notes = "line one\nline two"
        sent = await proc.call(
            "chat:send",
            {
                "sessionId": session["id"],
                "input": {
                    "content": [
                        {"type": "text", "text": "look at these"},
                        {"type": "image", "mimeType": "image/png", "base64": base64.b64encode(PNG).decode()},
                    ],
                    "attachments": [
                        {"name": "notes.txt", "data": base64.b64encode(notes.encode()).decode(), "mimeType": "text/plain"},
                        {"name": "blob.bin", "data": base64.b64encode(b"\x00\x01").decode(), "mimeType": "application/octet-stream"},
                    ],
                },
            },
        )
        assert (await wait_final(proc, sent["messageId"]))["type"] == "stream_end"

        user = (await proc.call("chat:messages:get", {"sessionId": session["id"]}))[0]
        assert user["contentType"] == "multipart" and user["textContent"] == "look at these"
        text, image, note_file, blob = user["parts"]
        assert image["type"] == "image" and image.get("base64") is None
        assert _path(image["url"]).read_bytes() == PNG
        assert note_file["type"] == "file" and note_file["name"] == "notes.txt"
        assert _path(note_file["uri"]).read_text() == notes
        assert _path(blob["uri"]).is_relative_to(data_dir.resolve())

        body = (await server.requests())[-1]
        content = body["messages"][-1]["content"]
        if isinstance(content, str):  # all parts became text: the adapter sends one string
            content = [{"type": "text", "text": content}]
        texts = [c["text"] for c in content if c["type"] == "text"]
        images = [c for c in content if c["type"] == "image_url"]
        if supports_images:
            assert images and images[0]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
        else:
            assert not images
            assert any("image omitted" in t for t in texts)
        # the file is untrusted text: one element on one line, its line breaks shown as \n
        assert any("line one\\nline two" in t and "notes.txt" in t for t in texts)
        assert any("blob.bin" in t and "cannot be shown" in t for t in texts)
        await proc.close()


# ---- AttachmentStore units -------------------------------------------------------------


def test_file_uris_map_back_to_the_stored_file_even_with_escaped_characters(tmp_path: Path) -> None:
    store = AttachmentStore(tmp_path / "my data %20 dir")  # as_uri escapes the space and the %
    uri = store._write(b"hello", "a b.txt")
    assert "%20" in uri and "%25" in uri
    assert store.load_bytes(uri) == b"hello"
    assert store.local_path(uri) == Path(uri_to_path(uri) or "").resolve()
    assert store.local_path("http://example.com/x") is None
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"secret")
    assert store.load_bytes(outside.as_uri()) is None  # only files under the attachments dir


def test_windows_file_uris_become_windows_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # What urllib.request.url2pathname is on Windows, checked here on any OS.
    import urllib.request

    monkeypatch.setattr(urllib.request, "url2pathname", nturl2path.url2pathname)
    assert uri_to_path("file:///C:/Users/me/a%20b.png") == "C:\\Users\\me\\a b.png"
    assert uri_to_path("file://localhost/D:/x.txt") == "D:\\x.txt"
    assert uri_to_path("file://server/share/f.txt") == "\\\\server\\share\\f.txt"


def test_largest_attachment_fits_in_a_default_line_and_a_bigger_one_is_refused(tmp_path: Path) -> None:
    envelope = (
        b'{"jsonrpc":"2.0","id":123,"method":"chat:send","params":{"sessionId":"0190c9a4-0000-7000-8000-000000000000",'
        b'"input":{"content":"' + b"t" * 4000 + b'","attachments":[{"name":"' + b"n" * 200
        + b'","mimeType":"application/octet-stream","data":""}]}}}'
    )
    assert len(envelope) + 4 * math.ceil(MAX_ATTACHMENT_BYTES / 3) <= DEFAULT_MAX_LINE_BYTES
    store = AttachmentStore(tmp_path)
    too_big = base64.b64encode(bytes(MAX_ATTACHMENT_BYTES + 1)).decode()
    with pytest.raises(InvalidParams) as info:
        store.store_input(UserInput(content="x", attachments=[
            Attachment(name="big.bin", data=too_big, mime_type="application/octet-stream")
        ]))
    assert str(MAX_ATTACHMENT_BYTES) in info.value.message and str(DEFAULT_MAX_LINE_BYTES) in info.value.message
    assert not (tmp_path / "attachments").exists() or not any((tmp_path / "attachments").iterdir())
