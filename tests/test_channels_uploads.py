"""A reply's local file sent to a platform, in process against the fake platforms on
loopback: Slack's upload flow as Slack documents it (``files.getUploadURLExternal`` with
its arguments form-encoded, the bytes POSTed to the URL it gives,
``files.completeUploadExternal`` into the conversation and thread), Telegram's multipart
``sendDocument`` (the other fields as JSON text), Discord's ``payload_json`` with
``files[0]`` named in its ``attachments``, and a file outside the attachments never
leaves."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from platform_fakes import DISCORD_TOKEN, SLACK_BOT_TOKEN, TELEGRAM_TOKEN, fake_discord, fake_slack, fake_telegram
from protocol.channels import ChannelReplyParams, ReplyFileChunk, ReplyImageChunk, ReplyTextChunk
from sidecar.channels.delivery import DeliveryError
from sidecar.channels.connections.discord import DiscordRest, DiscordSender
from sidecar.channels.connections.slack import SlackApi, SlackSender
from sidecar.channels.connections.telegram import TelegramApi, TelegramSender
from sidecar.store.attachments import AttachmentStore

pytestmark = pytest.mark.anyio


def reply(
    *chunks: ReplyFileChunk | ReplyImageChunk | ReplyTextChunk, thread: str | None = None, chat: str = "C1", reply_to: str | None = None,
) -> ChannelReplyParams:
    return ChannelReplyParams(
        delivery_id="d1", channel="sl", chat_id=chat, session_id="s1", seq=1, final=True, chunks=list(chunks),
        thread_id=thread, reply_to=reply_to,
    )


def stored(data_dir: Path, name: str, data: bytes) -> tuple[AttachmentStore, Path]:
    """The attachments of ``data_dir``, holding the file ``name``."""
    attachments = AttachmentStore(data_dir)
    attachments.root.mkdir(parents=True)
    path = attachments.root / name
    path.write_bytes(data)
    return attachments, path


async def test_a_local_file_is_uploaded_into_the_thread(tmp_path: Path) -> None:
    attachments, report = stored(tmp_path, "q3-report.pdf", b"%PDF-1.7 quarterly numbers")
    async with fake_slack() as fake, httpx2.AsyncClient() as http:
        sender = SlackSender(SlackApi(http, fake.api_url), http, SLACK_BOT_TOKEN, attachments)
        first = await sender.deliver(
            reply(ReplyTextChunk(text="Here is the report.", format="plain"), ReplyFileChunk(uri=report.as_uri(), name="Q3 report.pdf"),
                  thread="1700000000.000001"),
            None,
        )
        assert first is not None  # the text's ts
        methods = [m for m, _ in fake.sent]
        assert methods == ["chat.postMessage", "files.getUploadURLExternal", "files.completeUploadExternal"]
        slot = fake.sent[1][1]
        assert slot == {"filename": "Q3 report.pdf", "length": str(len(b"%PDF-1.7 quarterly numbers"))}
        ((file_id, (data, kind)),) = fake.uploads.items()
        assert data == b"%PDF-1.7 quarterly numbers" and kind == "application/pdf"
        complete = fake.sent[2][1]
        assert json.loads(complete["files"]) == [{"id": file_id, "title": "Q3 report.pdf"}]
        assert complete["channel_id"] == "C1" and complete["thread_ts"] == "1700000000.000001"


async def test_a_file_outside_the_attachments_is_not_sent(tmp_path: Path) -> None:
    attachments = AttachmentStore(tmp_path / "data")
    attachments.root.mkdir(parents=True)
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    async with fake_slack() as fake, httpx2.AsyncClient() as http:
        sender = SlackSender(SlackApi(http, fake.api_url), http, SLACK_BOT_TOKEN, attachments)
        with pytest.raises(DeliveryError, match="not in the attachments directory") as err:
            await sender.deliver(reply(ReplyFileChunk(uri=secret.as_uri(), name="id_rsa")), None)
        assert err.value.retryable is False
        assert fake.sent == [] and fake.uploads == {}


async def test_a_local_file_is_sent_to_telegram_as_a_document_in_reply(tmp_path: Path) -> None:
    attachments, notes = stored(tmp_path, "notes.txt", "会议纪要 minutes".encode())
    async with fake_telegram() as fake, httpx2.AsyncClient() as http:
        sender = TelegramSender(TelegramApi(http, fake.base_url, TELEGRAM_TOKEN), attachments)
        sent = await sender.deliver(reply(ReplyFileChunk(uri=notes.as_uri()), chat="777", reply_to="1001"), None)
        assert sent is not None
        ((method, payload),) = fake.sent
        assert method == "sendDocument" and payload["chat_id"] == "777" and payload["document"] == "<upload notes.txt>"
        assert json.loads(payload["reply_parameters"]) == {"message_id": 1001, "allow_sending_without_reply": True}
        assert fake.uploaded["document"] == ("notes.txt", "会议纪要 minutes".encode(), "text/plain")
        with pytest.raises(DeliveryError, match="not in the attachments directory"):
            await sender.deliver(reply(ReplyFileChunk(uri=(tmp_path / "chat.db").as_uri()), chat="777"), None)
        assert len(fake.sent) == 1


async def test_a_local_image_is_attached_to_a_discord_message(tmp_path: Path) -> None:
    attachments, chart = stored(tmp_path, "chart.png", b"\x89PNG discord chart")
    async with fake_discord() as fake, httpx2.AsyncClient() as http:
        sender = DiscordSender(DiscordRest(http, fake.api_url, DISCORD_TOKEN), attachments, allow_mentions=False)
        sent = await sender.deliver(
            reply(ReplyImageChunk(url=chart.as_uri(), mime_type="image/png"), chat="555", reply_to="9001"), None,
        )
        assert sent is not None
        ((method, path, body),) = fake.sent
        assert (method, path) == ("POST", "/api/v10/channels/555/messages")
        assert body["attachments"] == [{"id": 0, "filename": "chart.png"}]
        assert body["message_reference"] == {"message_id": "9001", "fail_if_not_exists": False}
        assert body["allowed_mentions"] == {"parse": [], "replied_user": False}
        assert fake.uploaded["files[0]"] == ("chart.png", b"\x89PNG discord chart", "image/png")
