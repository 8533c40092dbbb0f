"""Telegram: the Bot API over HTTPS, long polling for messages, the sender of replies.

``TelegramApi.call`` is one Bot API method (``POST {apiBaseUrl}/bot<token>/<method>``, JSON or
multipart): ``{"ok": true, "result": ...}``, or ``{"ok": false, "error_code", "description",
"parameters"}``. A 429 is waited out (``parameters.retry_after``, base.retry_after_wait); 401
and 404 (a bad token) are Fatal for the poller.

``TelegramPoller`` (a Link): ``getMe`` (the bot's id and username), then ``getUpdates`` with
``offset`` (the last update's id + 1, stored as the channel's resume point once the update's
message is stored: a restart or a dropped poll gets the unconfirmed updates again, and the
inbox's dedup drops what was already received) and ``timeout`` (``pollTimeoutS``); a poll
that moved the offset nowhere takes at least MIN_IDLE_POLL_S, so a server that answers at
once, or ignores the offset, is not polled in a loop. A 409
(a webhook is set, or another process polls with this token) fails the connection with
Telegram's description, retried with backoff. Messages of private chats, groups and
supergroups become ChannelMessageParams (forum topics: ``threadId`` is the
``message_thread_id``); a photo (the largest size) or a document is downloaded through
``getFile`` into an attachment (at most media.MAX_DOWNLOAD_BYTES).

``TelegramSender``: ``sendMessage`` with ``parse_mode`` MarkdownV2 (the reply's dialect),
``message_thread_id`` and ``reply_parameters`` (the reply's first message quotes the one it
answers); images and files with ``sendPhoto``/``sendDocument`` (an http(s) URL, or the local
file uploaded); ``editMessageText`` and ``deleteMessage`` for stream mode ("message is not
modified" and "message to delete not found" count as done). A chunk Telegram cannot parse
("can't parse entities") is sent again as plain text, its escapes taken out.

Must stay true: the token is only ever in the request URL, never in a log or an error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import anyio
import httpx2
import msgspec

from protocol.channels import (
    ChannelAttachment,
    ChannelMessageParams,
    ChannelReplyParams,
    ChannelSender,
    InboundType,
    ReplyFileChunk,
    ReplyImageChunk,
    ReplyTextChunk,
)
from sidecar.channels.connections.base import CALL_TIMEOUT_S, DeliveryError, Fatal, OnMessage, retry_after_wait
from sidecar.channels.connections.media import download, local_file
from sidecar.channels.inbound.common import as_dict, as_list, as_str
from sidecar.channels.inbound.telegram import display_name
from sidecar.errors import InvalidParams
from sidecar.store.attachments import AttachmentStore

__all__ = ["TelegramApi", "TelegramError", "TelegramPoller", "TelegramSender", "to_params", "plain_of"]

log = logging.getLogger(__name__)

MIN_IDLE_POLL_S = 1.0
"""The least time a poll that confirmed no update takes (the shortest ``pollTimeoutS``)."""

_UNESCAPE = re.compile(r"\\([\x01-\x7e])")


class TelegramError(Exception):
    def __init__(self, method: str, code: int, description: str) -> None:
        super().__init__(f"Telegram {method}: {code} {description}"[:500])
        self.code = code
        self.description = description


def plain_of(markdown_v2: str) -> str:
    """A MarkdownV2 text without its escapes (sent when Telegram cannot parse it)."""
    return _UNESCAPE.sub(r"\1", markdown_v2)


class TelegramApi:
    def __init__(self, http: httpx2.AsyncClient, base_url: str, token: str) -> None:
        self._http = http
        self._base = base_url
        self._token = token

    def file_url(self, path: str) -> str:
        return f"{self._base}/file/bot{self._token}/{path}"

    async def call(
        self, method: str, payload: dict[str, Any] | None = None, *, files: dict[str, Any] | None = None,
        timeout: float = CALL_TIMEOUT_S,
    ) -> Any:
        url = f"{self._base}/bot{self._token}/{method}"
        attempt = 0
        while True:
            try:
                if files:
                    data = {k: v if isinstance(v, str) else msgspec.json.encode(v).decode() for k, v in (payload or {}).items()}
                    response = await self._http.post(url, data=data, files=files, timeout=timeout)
                else:
                    response = await self._http.post(
                        url, content=msgspec.json.encode(payload or {}), headers={"Content-Type": "application/json"},
                        timeout=timeout,
                    )
            except httpx2.HTTPError as exc:
                raise ConnectionError(f"Telegram {method}: {type(exc).__name__}") from None
            try:
                body = as_dict(msgspec.json.decode(response.content))
            except msgspec.DecodeError:
                raise TelegramError(method, response.status_code, "the answer is not JSON") from None
            if body.get("ok") is True:
                return body.get("result")
            found = body.get("error_code")
            code: int = found if isinstance(found, int) else response.status_code
            description = as_str(body.get("description")) or f"HTTP {response.status_code}"
            retry_after = as_dict(body.get("parameters")).get("retry_after")
            if code == 429 and isinstance(retry_after, (int, float)):
                try:
                    await retry_after_wait(float(retry_after), attempt, f"Telegram {method}")
                except DeliveryError:
                    raise TelegramError(method, 429, description) from None
                attempt += 1
                continue
            raise TelegramError(method, code, description)


# ---- receiving --------------------------------------------------------------------------


def _kind(message: dict[str, Any]) -> InboundType:
    if message.get("photo"):
        return "image"
    if message.get("document"):
        return "file"
    if message.get("voice") or message.get("audio"):
        return "audio"
    if message.get("video") or message.get("video_note"):
        return "video"
    if message.get("sticker"):
        return "sticker"
    if "text" in message:
        return "text"
    return "other" if "caption" not in message else "rich"


def to_params(channel: str, update: dict[str, Any], attachments: list[ChannelAttachment]) -> ChannelMessageParams | None:
    """The message of an update (None: an update of another kind, a channel post)."""
    message = as_dict(update.get("message"))
    chat = as_dict(message.get("chat"))
    chat_type = as_str(chat.get("type"))
    if not message or chat_type not in ("private", "group", "supergroup") or not isinstance(chat.get("id"), int):
        return None
    sender = as_dict(message.get("from")) or as_dict(message.get("sender_chat"))
    sender_id = sender.get("id")
    if not isinstance(sender_id, int):
        return None
    thread = message.get("message_thread_id")
    date = message.get("date")
    return ChannelMessageParams(
        channel=channel,
        chat_id=str(chat["id"]),
        chat_type="private" if chat_type == "private" else "group",
        chat_name=(as_str(chat.get("title")) or as_str(chat.get("username")) or None),
        thread_id=str(thread) if message.get("is_topic_message") and isinstance(thread, int) else None,
        sender=ChannelSender(id=str(sender_id), name=display_name(sender), is_bot=sender.get("is_bot") is True),
        message_id=str(message.get("message_id")),
        msg_type=_kind(message),
        text=as_str(message.get("text") or message.get("caption"))[:64_000],
        attachments=attachments,
        timestamp=int(date) * 1000 if isinstance(date, int) else 0,
        raw=message,
    )


class TelegramPoller:
    """The Link of a ``telegram_polling`` connection."""

    def __init__(
        self, *, api: TelegramApi, http: httpx2.AsyncClient, channel: str, poll_timeout_s: int,
        on_message: OnMessage, load_offset: Callable[[], Any], save_offset: Callable[[int], Any],
        on_identity: Callable[[list[str]], None],
    ) -> None:
        self._api = api
        self._http = http
        self._channel = channel
        self._poll_s = poll_timeout_s
        self._on_message = on_message
        self._load_offset = load_offset
        self._save_offset = save_offset
        self._on_identity = on_identity

    async def run(self, ready: Callable[[str | None], None]) -> None:
        try:
            me = as_dict(await self._api.call("getMe"))
        except TelegramError as exc:
            if exc.code in (401, 404):
                raise Fatal(f"Telegram refused the bot token ({exc.code} {exc.description})") from None
            raise
        bot_id = me.get("id")
        self._on_identity([str(bot_id), as_str(me.get("username"))] if isinstance(bot_id, int) else [])
        ready(str(bot_id) if isinstance(bot_id, int) else None)
        offset: int | None = await self._load_offset()
        while True:
            started, before = anyio.current_time(), offset
            payload: dict[str, Any] = {"timeout": self._poll_s, "allowed_updates": ["message"]}
            if offset is not None:
                payload["offset"] = offset
            try:
                updates = await self._api.call("getUpdates", payload, timeout=self._poll_s + CALL_TIMEOUT_S)
            except TelegramError as exc:
                if exc.code == 409:
                    raise ConnectionError(
                        f"Telegram getUpdates: 409 {exc.description} (a webhook is set, or another process polls"
                        " with this token)"
                    ) from None
                if exc.code in (401, 404):
                    raise Fatal(f"Telegram refused the bot token ({exc.code} {exc.description})") from None
                raise
            for update in as_list(updates):
                data = as_dict(update)
                update_id = data.get("update_id")
                if not isinstance(update_id, int):
                    continue
                await self._handle(data)
                offset = update_id + 1
                await self._save_offset(offset)
            if offset is None or (before is not None and offset <= before):
                # nothing confirmed: Telegram holds an empty poll for its timeout (>= 1 s); a
                # server that answers at once, or sends again what was confirmed, is not polled
                # in a loop
                await anyio.sleep(max(0.0, MIN_IDLE_POLL_S - (anyio.current_time() - started)))

    async def _handle(self, update: dict[str, Any]) -> None:
        message = as_dict(update.get("message"))
        attachments: list[ChannelAttachment] = []
        photo = [as_dict(p) for p in as_list(message.get("photo"))]
        document = as_dict(message.get("document"))
        if photo:
            largest = max(photo, key=lambda p: int(p["width"]) if isinstance(p.get("width"), int) else 0)
            found = await self._file(as_str(largest.get("file_id")), "image", None, None)
            attachments += [found] if found else []
        elif document:
            found = await self._file(
                as_str(document.get("file_id")), "file", as_str(document.get("file_name")) or None,
                as_str(document.get("mime_type")) or None,
            )
            attachments += [found] if found else []
        params = to_params(self._channel, update, attachments)
        if params is None:
            return
        try:
            await self._on_message(params)
        except InvalidParams as exc:  # a message the channel cannot take: confirmed and skipped
            log.warning("channel %s: Telegram message %s not taken: %s", self._channel, params.message_id, exc.message)

    async def _file(self, file_id: str, kind: Any, name: str | None, mime: str | None) -> ChannelAttachment | None:
        if not file_id:
            return None
        try:
            found = as_dict(await self._api.call("getFile", {"file_id": file_id}))
        except TelegramError as exc:
            log.warning("channel %s: getFile failed: %s", self._channel, exc)
            return None
        path = as_str(found.get("file_path"))
        if not path:
            return None
        return await download(
            self._http, self._api.file_url(path), kind=kind, name=name or path.rsplit("/", 1)[-1], mime_type=mime,
            what=f"Telegram file {file_id}",
        )


# ---- sending ----------------------------------------------------------------------------


class TelegramSender:
    def __init__(self, api: TelegramApi, attachments: AttachmentStore) -> None:
        self._api = api
        self._attachments = attachments

    async def deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        try:
            return await self._deliver(payload, target)
        except TelegramError as exc:
            raise DeliveryError(str(exc), retryable=exc.code >= 500 or exc.code == 429) from None
        except ConnectionError as exc:
            raise DeliveryError(str(exc), retryable=True) from None

    async def _deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        chat: dict[str, Any] = {"chat_id": payload.chat_id}
        if payload.kind == "delete":
            assert target is not None
            try:
                await self._api.call("deleteMessage", {**chat, "message_id": int(target)})
            except TelegramError as exc:
                if "not found" not in exc.description.lower():
                    raise
            return target
        if payload.kind == "edit":
            assert target is not None
            chunk = payload.chunks[0]
            if isinstance(chunk, ReplyTextChunk):
                try:
                    await self._text("editMessageText", {**chat, "message_id": int(target)}, chunk)
                except TelegramError as exc:
                    if "not modified" not in exc.description.lower():
                        raise
            return target
        if payload.thread_id and payload.thread_id.isdigit():
            chat["message_thread_id"] = int(payload.thread_id)
        first: str | None = None
        for number, chunk in enumerate(payload.chunks):
            extra = dict(chat)
            if number == 0 and payload.seq == 1 and payload.reply_to and payload.reply_to.isdigit():
                extra["reply_parameters"] = {"message_id": int(payload.reply_to), "allow_sending_without_reply": True}
            sent = await self._chunk(chunk, extra)
            if first is None and sent is not None:
                first = sent
        return first

    async def _text(self, method: str, fields: dict[str, Any], chunk: ReplyTextChunk) -> Any:
        if chunk.format != "telegram_md":
            return await self._api.call(method, {**fields, "text": chunk.text})
        try:
            return await self._api.call(method, {**fields, "text": chunk.text, "parse_mode": "MarkdownV2"})
        except TelegramError as exc:
            if exc.code != 400 or "parse entities" not in exc.description.lower():
                raise
            log.warning("Telegram could not parse a chunk (%s); sent as plain text", exc.description)
            return await self._api.call(method, {**fields, "text": plain_of(chunk.text)})

    async def _chunk(self, chunk: Any, fields: dict[str, Any]) -> str | None:
        if isinstance(chunk, ReplyTextChunk):
            result = await self._text("sendMessage", fields, chunk)
        elif isinstance(chunk, ReplyImageChunk):
            result = await self._media("sendPhoto", "photo", chunk.url, None, chunk.mime_type, fields, chunk.alt)
        elif isinstance(chunk, ReplyFileChunk):
            result = await self._media("sendDocument", "document", chunk.uri, chunk.name, chunk.mime_type, fields, None)
        else:  # slack blocks: not a Telegram dialect
            result = await self._api.call("sendMessage", {**fields, "text": getattr(chunk, "text", "")})
        message_id = as_dict(result).get("message_id")
        return str(message_id) if isinstance(message_id, int) else None

    async def _media(
        self, method: str, field: str, uri: str, name: str | None, mime: str | None, fields: dict[str, Any],
        caption: str | None,
    ) -> Any:
        extra = {**fields, **({"caption": caption[:1024]} if caption else {})}
        if uri.lower().startswith(("http://", "https://")):
            return await self._api.call(method, {**extra, field: uri})
        local = await local_file(self._attachments, uri, name, mime)
        if local is None:
            raise DeliveryError(f"the file {name or 'of the reply'} is not in the attachments directory", retryable=False)
        return await self._api.call(method, extra, files={field: (local.name, local.data, local.mime_type)})
