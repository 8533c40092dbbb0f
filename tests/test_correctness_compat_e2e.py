"""The V1 ``/computer/chat`` endpoint, over the real server, as the Qiming
server's SandboxAgentClient calls it: a turn with ``attachments`` (the agent runner's shape)
runs, an http(s) one stored as a file part and a base64 one as a stored file, as
``chat:send`` takes them; an attachment that cannot be taken is a 400 naming it. The
progress stream of a session the endpoint does not know ends with one ``end_turn``
(electron, as V1 Electron did) or is 404 ``SESSION_NOT_FOUND`` (rcoder)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx2
import pytest

from compat_helpers import v1_sidecar
from fixtures.v1_client import ChatFailed
from sidecar_proc import SidecarProcess

pytestmark = pytest.mark.anyio

UNKNOWN = "01a230f5-0000-7000-8000-000000000000"


def url_attachment(url: str, kind: str = "Image", **content: Any) -> dict[str, Any]:
    return {"type": kind, "content": {"id": "a-url", "source": {"source_type": "Url", "data": {"url": url}}, **content}}


def base64_attachment(data: bytes, mime: str, name: str) -> dict[str, Any]:
    source = {"source_type": "Base64", "data": {"data": base64.b64encode(data).decode(), "mime_type": mime}}
    return {"type": "Document", "content": {"id": "a-b64", "source": source, "mime_type": mime, "filename": name}}


async def user_message(proc: SidecarProcess, session_id: str) -> dict[str, Any]:
    messages = await proc.call("chat:messages:get", {"sessionId": session_id})
    return next(m for m in messages if m["role"] == "user")


async def test_a_turn_with_attachments_runs_and_stores_them_as_file_parts(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        attachments = [
            url_attachment("https://files.example.com/pics/cat.png?sig=1", mime_type="image/png", filename="cat.png"),
            base64_attachment(b"the meeting is on Tuesday", "text/plain", "notes.txt"),
            url_attachment("https://files.example.com/spec.pdf", kind="Document", mime_type="application/pdf"),
        ]
        turn = await v1.client.run_turn(v1.direct("what do these say?", attachments=attachments))
        assert turn.completed and turn.error is None, turn
        stored = await user_message(v1.proc, turn.session_id)
        parts = stored["parts"]
        assert parts[0] == {"type": "text", "text": "what do these say?"}
        assert [p["type"] for p in parts[1:]] == ["file", "file", "file"]
        cat, spec, notes = parts[1], parts[2], parts[3]
        assert (cat["uri"], cat["mimeType"], cat["name"]) == ("https://files.example.com/pics/cat.png?sig=1", "image/png", "cat.png")
        assert (spec["uri"], spec["mimeType"]) == ("https://files.example.com/spec.pdf", "application/pdf")
        assert notes["uri"].startswith("file:") and notes["name"] == "notes.txt" and notes["mimeType"] == "text/plain"
        assert v1.server is not None
        turns = [r for r in await v1.server.requests() if r.get("stream")]  # not the title's side call
        sent = str(turns[-1]["messages"])
        assert "the meeting is on Tuesday" in sent and "cat.png" in sent and "what do these say?" in sent

        # what cannot be taken is refused, naming the entry; nothing is sent
        before = len([r for r in await v1.server.requests() if r.get("stream")])
        for bad, text in (
            ({"type": "Image", "content": {"id": "x", "source": {"source_type": "FilePath", "data": {"path": "a.png"}}}}, "FilePath"),
            (url_attachment("ftp://files.example.com/a.png"), "http(s)"),
            (url_attachment("file:///etc/passwd"), "http(s)"),
            ({"type": "Video", "content": {}}, "type"),
            ({"type": "Image", "content": {"id": "x", "source": {"source_type": "Base64", "data": {"data": "***", "mime_type": "image/png"}}}}, "base64"),
        ):
            with pytest.raises(ChatFailed) as err:
                await v1.client.chat(v1.direct("again", project_id="d2", attachments=[bad]))
            assert err.value.status == 400 and "attachments[0]" in err.value.body and text in err.value.body, err.value.body
        assert len([r for r in await v1.server.requests() if r.get("stream")]) == before
        await v1.proc.close()


async def test_the_progress_of_an_unknown_session_is_one_end_turn_on_electron(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path) as v1:
        own = await v1.proc.call("chat:session:create", {})  # the renderer's: not the endpoint's
        for session_id in (UNKNOWN, own["id"]):
            async with v1.client.progress(session_id) as (response, events):
                assert response.status_code == 200
                received = [e async for e in events]  # the stream closes by itself
            assert [e.type for e in received] == ["end_turn"]
            message = received[0].json()
            assert message["sessionId"] == session_id and message["messageType"] == "sessionPromptEnd"
            assert message["data"] == {"reason": "EndTurn", "description": "Agent 当前无在执行任务"}
        assert (await v1.status())["sseClients"] == 0
        assert (await v1.proc.call("chat:session:get", {"id": own["id"]}))["messageCount"] == 0
        await v1.proc.close()


async def test_the_progress_of_an_unknown_session_is_404_on_rcoder(tmp_path: Path) -> None:
    async with v1_sidecar(tmp_path, flavor="rcoder") as v1, httpx2.AsyncClient() as client:
        response = await client.get(f"{v1.url}/computer/progress/{UNKNOWN}", headers={"x-api-key": v1.token})
        assert response.status_code == 404 and response.json()["code"] == "SESSION_NOT_FOUND"
        await v1.proc.close()
