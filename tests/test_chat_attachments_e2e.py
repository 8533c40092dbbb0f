"""Multipart input over the subprocess: bytes stored as files, sent as the model allows."""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from chat_helpers import configure_provider, wait_final
from scripted_server import scripted_provider
from sidecar_proc import spawn_sidecar

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
        assert image["type"] == "image" and "base64" not in image
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
        assert any("line one\nline two" in t and "notes.txt" in t for t in texts)
        assert any("blob.bin" in t and "cannot be shown" in t for t in texts)
        await proc.close()
