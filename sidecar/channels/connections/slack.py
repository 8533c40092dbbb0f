"""Slack: the Web API for sending, Socket Mode (WebSocket) for events.

``SlackApi.call`` is one Web API method (``POST {apiBaseUrl}/<method>``, a bearer token):
``{"ok": true, ...}`` or ``{"ok": false, "error"}``; a 429 is waited out (``Retry-After``,
base.retry_after_wait). The body is JSON, except for the two file-upload methods, which get
their arguments form-encoded as Slack's own SDKs send them (``form=True``; a JSON body on
``files.getUploadURLExternal`` has been seen refused with ``invalid_arguments``).

``SlackSocket`` (a Link), Socket Mode as Slack documents it: ``apps.connections.open`` with
the app-level token gives a WebSocket URL; ``auth.test`` with the bot token gives the bot's
user id. The socket sends ``hello``, then envelopes (``envelope_id``, ``type``,
``payload``, ``retry_attempt``), each acknowledged with ``{"envelope_id"}``: an
``events_api`` envelope after its message is stored (a dropped socket before the ack makes
Slack send it again, ``retry_attempt`` counting up: the inbox's dedup drops the repeat),
other types at once. A ``disconnect`` envelope (``refresh_requested``, ``warning``)
connects again at once; ``link_disabled`` is Fatal. Events ``message`` (plain, thread
broadcasts and file shares) and ``app_mention`` become ChannelMessageParams (the same ``ts``
in both: one turn): the chat is the conversation (``im``: private, else a group),
``threadId`` its ``thread_ts``; files (``url_private``, downloaded with the bot token)
become attachments.

``SlackSender``: ``chat.postMessage`` (``text`` and ``blocks``, in the thread the message came
from; ``link_names`` off), images as an image block, local files through
``files.getUploadURLExternal`` / ``files.completeUploadExternal``; ``chat.update`` and
``chat.delete`` for stream mode (``message_not_found`` on a delete counts as done).

Must stay true: tokens are only in the Authorization headers, never in a log or an error;
websockets is imported only when a socket opens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import anyio
import httpx2
import msgspec

from protocol.channels import (
    ChannelAttachment,
    ChannelMessageParams,
    ChannelReplyParams,
    ChannelSender,
    ReplyBlocksChunk,
    ReplyFileChunk,
    ReplyImageChunk,
)
from sidecar.channels.connections.base import (
    DeliveryError,
    Fatal,
    OnMessage,
    Reconnect,
    first_leaf,
    retry_after_wait,
    CALL_TIMEOUT_S,
    HELLO_TIMEOUT_S,
    MAX_FRAME_BYTES,
)
from sidecar.channels.connections.media import download, local_file
from sidecar.channels.inbound.common import as_dict, as_list, as_str
from sidecar.errors import InvalidParams
from sidecar.store.attachments import AttachmentStore

__all__ = ["SlackApi", "SlackError", "SlackSocket", "SlackSender", "to_params"]

log = logging.getLogger(__name__)

MESSAGE_SUBTYPES = frozenset({"", "thread_broadcast", "file_share"})
AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "not_allowed_token_type"})

_enc = msgspec.json.Encoder()


class SlackError(Exception):
    def __init__(self, method: str, error: str, status: int = 200) -> None:
        super().__init__(f"Slack {method}: {error}"[:500])
        self.error = error
        self.status = status


class SlackApi:
    def __init__(self, http: httpx2.AsyncClient, base_url: str) -> None:
        self._http = http
        self._base = base_url

    async def call(
        self, method: str, token: str, body: dict[str, Any] | None = None, *, form: bool = False
    ) -> dict[str, Any]:
        """``form``: the arguments form-encoded (a value that is not a string as its JSON
        text, as Slack's SDKs send ``length`` and ``files``), else the body is JSON."""
        if form:
            content = urlencode({
                k: v if isinstance(v, str) else _enc.encode(v).decode() for k, v in (body or {}).items()
            }).encode()
            kind = "application/x-www-form-urlencoded"
        else:
            content, kind = _enc.encode(body or {}), "application/json; charset=utf-8"
        attempt = 0
        while True:
            try:
                response = await self._http.post(
                    f"{self._base}/{method}", content=content, timeout=CALL_TIMEOUT_S,
                    headers={"Authorization": f"Bearer {token}", "Content-Type": kind},
                )
            except httpx2.HTTPError as exc:
                raise ConnectionError(f"Slack {method}: {type(exc).__name__}") from None
            if response.status_code == 429:
                try:
                    retry = float(response.headers.get("retry-after", "1"))
                except ValueError:
                    retry = 1.0
                try:
                    await retry_after_wait(retry, attempt, f"Slack {method}")
                except DeliveryError:
                    raise SlackError(method, "ratelimited", 429) from None
                attempt += 1
                continue
            try:
                data = as_dict(msgspec.json.decode(response.content))
            except msgspec.DecodeError:
                raise SlackError(method, f"HTTP {response.status_code}, not JSON", response.status_code) from None
            if data.get("ok") is not True:
                raise SlackError(method, as_str(data.get("error")) or f"HTTP {response.status_code}", response.status_code)
            return data


# ---- receiving --------------------------------------------------------------------------


def to_params(channel: str, event: dict[str, Any], attachments: list[ChannelAttachment]) -> ChannelMessageParams | None:
    kind, subtype = as_str(event.get("type")), as_str(event.get("subtype"))
    if kind not in ("message", "app_mention") or (kind == "message" and subtype not in MESSAGE_SUBTYPES):
        return None
    conversation, ts, user = as_str(event.get("channel")), as_str(event.get("ts")), as_str(event.get("user"))
    if not (conversation and ts and user):
        return None
    try:
        stamp = int(float(ts) * 1000)
    except ValueError:
        stamp = 0
    private = as_str(event.get("channel_type")) == "im" or (kind == "message" and conversation.startswith("D"))
    return ChannelMessageParams(
        channel=channel,
        chat_id=conversation,
        chat_type="private" if private else "group",
        thread_id=as_str(event.get("thread_ts")) or None,
        sender=ChannelSender(id=user, is_bot=bool(event.get("bot_id"))),
        message_id=ts,
        msg_type="rich" if attachments or event.get("blocks") else "text",
        text=as_str(event.get("text"))[:64_000],
        attachments=attachments,
        timestamp=stamp,
        raw=event,
    )


class SlackSocket:
    """The Link of a ``slack_socket`` connection."""

    def __init__(
        self, *, api: SlackApi, http: httpx2.AsyncClient, bot_token: str, app_token: str, channel: str,
        on_message: OnMessage, on_identity: Callable[[list[str]], None],
    ) -> None:
        self._api = api
        self._http = http
        self._bot = bot_token
        self._app = app_token
        self._channel = channel
        self._on_message = on_message
        self._on_identity = on_identity

    async def run(self, ready: Callable[[str | None], None]) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

        try:
            me = await self._api.call("auth.test", self._bot)
            opened = await self._api.call("apps.connections.open", self._app)
        except SlackError as exc:
            if exc.error in AUTH_ERRORS:
                raise Fatal(f"Slack refused a token ({exc.error})") from None
            raise
        bot_user = as_str(me.get("user_id"))
        self._on_identity([v for v in (bot_user, as_str(me.get("bot_id"))) if v])
        url = as_str(opened.get("url"))
        if not url.startswith(("ws://", "wss://")):
            raise ConnectionError("Slack apps.connections.open answered no WebSocket URL")
        try:
            async with connect(
                url, max_size=MAX_FRAME_BYTES, open_timeout=HELLO_TIMEOUT_S, close_timeout=5, compression=None,
            ) as ws:
                await self._session(ws, ready, bot_user)
        except Exception as exc:
            leaf = first_leaf(exc)
            if isinstance(leaf, ConnectionClosed):
                code = leaf.rcvd.code if leaf.rcvd is not None else None
                raise ConnectionError(f"the Slack socket closed ({code})") from None
            if isinstance(leaf, (OSError, InvalidHandshake, InvalidURI, TimeoutError)):
                raise ConnectionError(f"cannot connect to the Slack socket ({type(leaf).__name__})") from None
            raise leaf from None

    async def _session(self, ws: Any, ready: Callable[[str | None], None], bot_user: str) -> None:
        with anyio.fail_after(HELLO_TIMEOUT_S):
            hello = as_dict(msgspec.json.decode(await ws.recv()))
        if as_str(hello.get("type")) != "hello":
            raise ConnectionError("the Slack socket sent no hello")
        ready(bot_user or None)
        async for raw in ws:
            try:
                envelope = as_dict(msgspec.json.decode(raw))
            except msgspec.DecodeError:
                continue
            kind = as_str(envelope.get("type"))
            if kind == "disconnect":
                reason = as_str(envelope.get("reason"))
                if reason == "link_disabled":
                    raise Fatal("Slack disabled the app's Socket Mode link")
                raise Reconnect(f"Slack asked for a new socket ({reason or 'no reason'})")
            envelope_id = as_str(envelope.get("envelope_id"))
            if kind == "events_api":
                await self._event(as_dict(as_dict(envelope.get("payload")).get("event")))
            if envelope_id:
                await ws.send(_enc.encode({"envelope_id": envelope_id}).decode())

    async def _event(self, event: dict[str, Any]) -> None:
        attachments: list[ChannelAttachment] = []
        for item in as_list(event.get("files"))[:16]:
            f = as_dict(item)
            url = as_str(f.get("url_private_download") or f.get("url_private"))
            if not url.lower().startswith(("http://", "https://")):
                continue
            mime = as_str(f.get("mimetype")) or None
            found = await download(
                self._http, url, kind="image" if (mime or "").startswith("image/") else "file",
                name=as_str(f.get("name")) or None, mime_type=mime, headers={"Authorization": f"Bearer {self._bot}"},
                what=f"Slack file {as_str(f.get('id'))}",
            )
            attachments += [found] if found else []
        params = to_params(self._channel, event, attachments)
        if params is None:
            return
        try:
            await self._on_message(params)
        except InvalidParams as exc:  # a message the channel cannot take: acknowledged and skipped
            log.warning("channel %s: Slack message %s not taken: %s", self._channel, params.message_id, exc.message)


# ---- sending ----------------------------------------------------------------------------


class SlackSender:
    def __init__(self, api: SlackApi, http: httpx2.AsyncClient, bot_token: str, attachments: AttachmentStore) -> None:
        self._api = api
        self._http = http
        self._token = bot_token
        self._attachments = attachments

    async def deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        try:
            return await self._deliver(payload, target)
        except SlackError as exc:
            raise DeliveryError(str(exc), retryable=exc.status >= 500 or exc.status == 429) from None
        except ConnectionError as exc:
            raise DeliveryError(str(exc), retryable=True) from None

    def _content(self, chunk: Any) -> dict[str, Any]:
        if isinstance(chunk, ReplyBlocksChunk):
            return {"text": chunk.text, "blocks": [msgspec.to_builtins(b) for b in chunk.blocks]}
        if isinstance(chunk, ReplyImageChunk):
            alt = chunk.alt or "image"
            return {"text": alt, "blocks": [{"type": "image", "image_url": chunk.url, "alt_text": alt[:2000]}]}
        return {"text": getattr(chunk, "text", "")}

    async def _deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        where: dict[str, Any] = {"channel": payload.chat_id}
        if payload.kind == "delete":
            try:
                await self._api.call("chat.delete", self._token, {**where, "ts": target})
            except SlackError as exc:
                if exc.error != "message_not_found":
                    raise
            return target
        if payload.kind == "edit":
            await self._api.call("chat.update", self._token, {**where, "ts": target, **self._content(payload.chunks[0])})
            return target
        if payload.thread_id:
            where["thread_ts"] = payload.thread_id
        first: str | None = None
        for chunk in payload.chunks:
            if isinstance(chunk, ReplyFileChunk) or (
                isinstance(chunk, ReplyImageChunk) and not chunk.url.lower().startswith(("http://", "https://"))
            ):
                await self._upload(chunk, where)
                continue
            sent = await self._api.call(
                "chat.postMessage", self._token, {**where, **self._content(chunk), "link_names": False, "unfurl_links": False},
            )
            if first is None and as_str(sent.get("ts")):
                first = as_str(sent.get("ts"))
        return first

    async def _upload(self, chunk: ReplyFileChunk | ReplyImageChunk, where: dict[str, Any]) -> None:
        uri = chunk.uri if isinstance(chunk, ReplyFileChunk) else chunk.url
        name = chunk.name if isinstance(chunk, ReplyFileChunk) else None
        local = await local_file(self._attachments, uri, name, chunk.mime_type)
        if local is None:
            raise DeliveryError(f"the file {name or 'of the reply'} is not in the attachments directory", retryable=False)
        slot = await self._api.call("files.getUploadURLExternal", self._token,
                                    {"filename": local.name, "length": len(local.data)}, form=True)
        upload_url, file_id = as_str(slot.get("upload_url")), as_str(slot.get("file_id"))
        if not upload_url.lower().startswith(("http://", "https://")) or not file_id:
            raise DeliveryError("Slack files.getUploadURLExternal answered no upload URL", retryable=True)
        try:
            response = await self._http.post(upload_url, content=local.data, timeout=CALL_TIMEOUT_S * 4,
                                             headers={"Content-Type": local.mime_type})
        except httpx2.HTTPError as exc:
            raise DeliveryError(f"the Slack upload failed ({type(exc).__name__})", retryable=True) from None
        if response.status_code != 200:
            raise DeliveryError(f"the Slack upload answered HTTP {response.status_code}", retryable=response.status_code >= 500)
        body = {"files": [{"id": file_id, "title": local.name}], "channel_id": where["channel"]}
        if "thread_ts" in where:
            body["thread_ts"] = where["thread_ts"]
        await self._api.call("files.completeUploadExternal", self._token, body, form=True)
