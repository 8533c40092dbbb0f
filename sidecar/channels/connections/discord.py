"""Discord: the REST API for sending, the gateway (WebSocket) for messages.

``DiscordRest.request`` is one REST call (``{apiBaseUrl}{path}``, ``Authorization: Bot
<token>``). Rate limits as Discord documents them: a response with ``X-RateLimit-Remaining:
0`` makes the next call on the same route (method and channel) wait ``X-RateLimit-Reset-After``
seconds first; a 429 is waited out (``retry_after`` of its body, else ``Retry-After``,
base.retry_after_wait), for a global limit too.

``DiscordGateway`` (a Link), the gateway as Discord documents it:
- the URL: ``gatewayUrl``, else ``GET /gateway/bot``; ``?v=10&encoding=json``;
- HELLO (op 10): heartbeats (op 1 with the last sequence number) every
  ``heartbeat_interval``, the first after a random part of it (jitter); a heartbeat whose
  ACK (op 11) has not come when the next is due means a zombie connection: it is closed and
  resumed; a heartbeat the gateway asks for (op 1) is sent at once;
- IDENTIFY (op 2: token, ``intents``, properties), or with a session RESUME (op 6:
  token, ``session_id``, ``seq``) on the session's ``resume_gateway_url``; READY gives the
  session and the bot's user id; the session (id, resume URL, sequence) is kept as the
  channel's resume point, so a dropped connection, and a restart, resume and Discord replays
  what was missed (the inbox's dedup drops repeats);
- RECONNECT (op 7): resume at once; INVALID_SESSION (op 9): resume when ``d`` is true, else
  a new session after 1-5 s; close codes 4004 (authentication) and 4010-4014 (shard,
  version, intents) are Fatal, 4007 and 4009 start a new session, others resume;
- dispatches: MESSAGE_CREATE (default messages and replies) becomes ChannelMessageParams
  (``guild_id``: a group chat; a message in a known thread, from GUILD_CREATE,
  THREAD_CREATE, THREAD_UPDATE and THREAD_LIST_SYNC: the thread's parent channel as the chat
  and the thread as ``threadId``; attachments as URLs).

``DiscordSender``: ``POST /channels/{id}/messages`` (``content``, ``message_reference`` on
the reply's first message, ``allowed_mentions: {parse: []}`` unless the channel allows mentions; an
image as an embed, a local file uploaded), ``PATCH`` and ``DELETE`` of a message for stream
mode (a deleted message that is already gone counts as done); into the thread when the
reply has one.

Must stay true: the token is only in the Authorization header and the IDENTIFY/RESUME
payloads, never in a log or an error; websockets is imported only when a gateway opens.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
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
from sidecar.channels.connections.media import local_file
from sidecar.channels.inbound.common import as_dict, as_list, as_str
from sidecar.channels.inbound.discord import discord_author_name
from sidecar.errors import InvalidParams
from sidecar.store.attachments import AttachmentStore

__all__ = ["DiscordRest", "DiscordError", "DiscordGateway", "DiscordSender", "to_params"]

log = logging.getLogger(__name__)

USER_AGENT = "DiscordBot (https://github.com/chat-sidecar, 0.1)"
FATAL_CLOSE = frozenset({4004, 4010, 4011, 4012, 4013, 4014})
NEW_SESSION_CLOSE = frozenset({4007, 4009})
THREAD_TYPES = frozenset({10, 11, 12})
MESSAGE_TYPES = frozenset({0, 19})
"""Default messages and replies (not joins, pins and other system messages)."""

_enc = msgspec.json.Encoder()


class DiscordError(Exception):
    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"Discord {what}: {status} {message}"[:500])
        self.status = status


class DiscordRest:
    def __init__(self, http: httpx2.AsyncClient, base_url: str, token: str) -> None:
        self._http = http
        self._base = base_url
        self._headers = {"Authorization": f"Bot {token}", "User-Agent": USER_AGENT}
        self._reset_at: dict[str, float] = {}

    async def request(
        self, method: str, path: str, body: Any = None, *, route: str | None = None,
        files: dict[str, Any] | None = None,
    ) -> Any:
        key = f"{method} {route or path}"
        attempt = 0
        while True:
            wait = self._reset_at.get(key, 0.0) - time.monotonic()
            if wait > 0:
                await anyio.sleep(wait)
            try:
                if files:
                    response = await self._http.request(
                        method, self._base + path, headers=self._headers, timeout=CALL_TIMEOUT_S,
                        data={"payload_json": _enc.encode(body).decode()}, files=files,
                    )
                else:
                    response = await self._http.request(
                        method, self._base + path, timeout=CALL_TIMEOUT_S,
                        headers={**self._headers, **({"Content-Type": "application/json"} if body is not None else {})},
                        content=_enc.encode(body) if body is not None else None,
                    )
            except httpx2.HTTPError as exc:
                raise ConnectionError(f"Discord {method} {route or path}: {type(exc).__name__}") from None
            self._note_limits(key, response.headers)
            if response.status_code == 429:
                retry = _retry_after(response)
                try:
                    await retry_after_wait(retry, attempt, f"Discord {method} {route or path}")
                except DeliveryError:
                    raise DiscordError(f"{method} {route or path}", 429, "rate limited") from None
                attempt += 1
                continue
            if response.status_code == 204:
                return None
            try:
                data = msgspec.json.decode(response.content) if response.content else None
            except msgspec.DecodeError:
                data = None
            if response.status_code >= 400:
                message = as_str(as_dict(data).get("message")) or f"HTTP {response.status_code}"
                raise DiscordError(f"{method} {route or path}", response.status_code, message)
            return data

    def _note_limits(self, key: str, headers: httpx2.Headers) -> None:
        remaining, after = headers.get("x-ratelimit-remaining"), headers.get("x-ratelimit-reset-after")
        try:
            if remaining is not None and after is not None and int(float(remaining)) <= 0:
                self._reset_at[key] = time.monotonic() + min(float(after), 300.0)
        except ValueError:
            pass


def _retry_after(response: httpx2.Response) -> float:
    try:
        value = as_dict(msgspec.json.decode(response.content)).get("retry_after")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    except msgspec.DecodeError:
        pass
    try:
        return float(response.headers.get("retry-after", "1"))
    except ValueError:
        return 1.0


# ---- receiving --------------------------------------------------------------------------


def _ms(stamp: Any) -> int:
    try:
        return int(dt.datetime.fromisoformat(as_str(stamp)).timestamp() * 1000)
    except ValueError:
        return 0


def to_params(channel: str, message: dict[str, Any], threads: dict[str, str]) -> ChannelMessageParams | None:
    """A MESSAGE_CREATE (None: a system message, or one without the ids it needs)."""
    author = as_dict(message.get("author"))
    channel_id, message_id = as_str(message.get("channel_id")), as_str(message.get("id"))
    author_id = as_str(author.get("id"))
    kind = message.get("type", 0)
    if not (channel_id and message_id and author_id) or kind not in MESSAGE_TYPES:
        return None
    parent = threads.get(channel_id)
    attachments = []
    for item in as_list(message.get("attachments"))[:16]:
        a = as_dict(item)
        url = as_str(a.get("url"))
        if url.lower().startswith(("http://", "https://")):
            mime = as_str(a.get("content_type")) or None
            attachments.append(ChannelAttachment(
                kind="image" if (mime or "").startswith("image/") else "file", name=as_str(a.get("filename")) or None,
                mime_type=mime, url=url,
            ))
    return ChannelMessageParams(
        channel=channel,
        chat_id=parent or channel_id,
        chat_type="group" if message.get("guild_id") else "private",
        thread_id=channel_id if parent else None,
        sender=ChannelSender(id=author_id, name=discord_author_name(message), is_bot=author.get("bot") is True),
        message_id=message_id,
        msg_type="text" if not attachments else "rich",
        text=as_str(message.get("content"))[:64_000],
        mention_all=message.get("mention_everyone") is True,
        attachments=attachments,
        timestamp=_ms(message.get("timestamp")),
        raw=message,
    )


class DiscordGateway:
    """The Link of a ``discord_gateway`` connection."""

    def __init__(
        self, *, rest: DiscordRest, token: str, intents: int, gateway_url: str | None, channel: str,
        on_message: OnMessage, resume: dict[str, Any] | None, save_resume: Callable[[dict[str, Any] | None], Any],
        on_identity: Callable[[list[str]], None],
    ) -> None:
        self._rest = rest
        self._token = token
        self._intents = intents
        self._url = gateway_url
        self._channel = channel
        self._on_message = on_message
        self._save_resume = save_resume
        self._on_identity = on_identity
        self.session_id: str | None = as_str((resume or {}).get("sessionId")) or None
        self.resume_url: str | None = as_str((resume or {}).get("url")) or None
        seq = (resume or {}).get("seq")
        self.seq: int | None = seq if isinstance(seq, int) else None
        self.threads: dict[str, str] = {}
        self._acked = True

    def _resume_state(self) -> dict[str, Any] | None:
        if self.session_id is None:
            return None
        return {"sessionId": self.session_id, "url": self.resume_url, "seq": self.seq}

    async def _gateway(self) -> str:
        if self._url is None:
            found = as_dict(await self._rest.request("GET", "/gateway/bot"))
            url = as_str(found.get("url"))
            if not url.startswith(("ws://", "wss://")):
                raise ConnectionError("Discord GET /gateway/bot answered no gateway URL")
            self._url = url.rstrip("/")
        return self._url

    async def run(self, ready: Callable[[str | None], None]) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

        try:
            base = self.resume_url if self.session_id and self.resume_url else await self._gateway()
        except DiscordError as exc:
            if exc.status == 401:
                raise Fatal(f"Discord refused the bot token ({exc})") from None
            raise
        try:
            async with connect(
                f"{base.rstrip('/')}/?v=10&encoding=json", max_size=MAX_FRAME_BYTES, ping_interval=None,
                open_timeout=HELLO_TIMEOUT_S, close_timeout=5, compression=None, user_agent_header=USER_AGENT,
            ) as ws:
                await self._session(ws, ready)
        except Exception as exc:  # (the session's task group wraps what it raises)
            leaf = first_leaf(exc)
            if isinstance(leaf, ConnectionClosed):
                code = leaf.rcvd.code if leaf.rcvd is not None else None
                if code in FATAL_CLOSE:
                    reason = leaf.rcvd.reason if leaf.rcvd is not None else ""
                    raise Fatal(f"Discord closed the gateway: {code} {reason}".strip()) from None
                if code in NEW_SESSION_CLOSE:
                    self._forget_session()
                raise ConnectionError(f"the Discord gateway closed the connection ({code})") from None
            if isinstance(leaf, (OSError, InvalidHandshake, InvalidURI, TimeoutError)):
                raise ConnectionError(f"cannot connect to the Discord gateway ({type(leaf).__name__})") from None
            raise leaf from None
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await self._save_resume(self._resume_state())
                except Exception:  # the store is closing: the next start identifies instead
                    log.debug("channel %s: the gateway session was not stored", self._channel, exc_info=True)

    def _forget_session(self) -> None:
        self.session_id = self.resume_url = None
        self.seq = None

    async def _session(self, ws: Any, ready: Callable[[str | None], None]) -> None:
        with anyio.fail_after(HELLO_TIMEOUT_S):
            hello = as_dict(msgspec.json.decode(await ws.recv()))
        if hello.get("op") != 10:
            raise ConnectionError("the Discord gateway sent no HELLO")
        interval = as_dict(hello.get("d")).get("heartbeat_interval")
        if not isinstance(interval, (int, float)) or interval <= 0:
            raise ConnectionError("the Discord gateway's HELLO has no heartbeat interval")
        self._acked = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeats, ws, interval / 1000)
            if self.session_id is not None and self.seq is not None:
                await ws.send(_enc.encode({"op": 6, "d": {"token": self._token, "session_id": self.session_id, "seq": self.seq}}).decode())
            else:
                await ws.send(_enc.encode({"op": 2, "d": {
                    "token": self._token, "intents": self._intents,
                    "properties": {"os": "linux", "browser": "chat-sidecar", "device": "chat-sidecar"},
                }}).decode())
            async for raw in ws:
                await self._frame(ws, raw, ready)

    async def _heartbeats(self, ws: Any, interval: float) -> None:
        await anyio.sleep(interval * random.random())
        while True:
            if not self._acked:
                await ws.close(4000, "no heartbeat ACK")
                raise ConnectionError("the Discord gateway did not acknowledge a heartbeat (zombie connection)")
            self._acked = False
            await ws.send(_enc.encode({"op": 1, "d": self.seq}).decode())
            await anyio.sleep(interval)

    async def _frame(self, ws: Any, raw: Any, ready: Callable[[str | None], None]) -> None:
        try:
            frame = as_dict(msgspec.json.decode(raw))
        except msgspec.DecodeError:
            log.warning("channel %s: a gateway frame that is not JSON", self._channel)
            return
        op, data = frame.get("op"), frame.get("d")
        if op == 11:
            self._acked = True
        elif op == 1:
            await ws.send(_enc.encode({"op": 1, "d": self.seq}).decode())
        elif op == 7:
            raise Reconnect("the Discord gateway asked for a reconnect")
        elif op == 9:
            if data is not True:
                self._forget_session()
                await anyio.sleep(1 + 4 * random.random())
            raise Reconnect("the Discord gateway invalidated the session")
        elif op == 0:
            if isinstance(frame.get("s"), int):
                self.seq = frame["s"]
            await self._dispatch(as_str(frame.get("t")), as_dict(data), ready)

    async def _dispatch(self, kind: str, data: dict[str, Any], ready: Callable[[str | None], None]) -> None:
        if kind == "READY":
            self.session_id = as_str(data.get("session_id")) or None
            self.resume_url = as_str(data.get("resume_gateway_url")) or None
            bot_id = as_str(as_dict(data.get("user")).get("id"))
            self._on_identity([bot_id] if bot_id else [])
            ready(bot_id or None)
            await self._save_resume(self._resume_state())
        elif kind == "RESUMED":
            ready(None)
        elif kind == "MESSAGE_CREATE":
            params = to_params(self._channel, data, self.threads)
            if params is not None:
                try:
                    await self._on_message(params)
                except InvalidParams as exc:  # a message the channel cannot take: skipped
                    log.warning("channel %s: Discord message %s not taken: %s", self._channel, params.message_id,
                                exc.message)
        elif kind in ("THREAD_CREATE", "THREAD_UPDATE"):
            self._thread(data)
        elif kind == "GUILD_CREATE" or kind == "THREAD_LIST_SYNC":
            for thread in as_list(data.get("threads")):
                self._thread(as_dict(thread))

    def _thread(self, channel: dict[str, Any]) -> None:
        thread_id, parent = as_str(channel.get("id")), as_str(channel.get("parent_id"))
        if thread_id and parent and channel.get("type") in THREAD_TYPES:
            if len(self.threads) > 50_000:
                self.threads.clear()
            self.threads[thread_id] = parent


# ---- sending ----------------------------------------------------------------------------


class DiscordSender:
    def __init__(self, rest: DiscordRest, attachments: AttachmentStore, *, allow_mentions: bool) -> None:
        self._rest = rest
        self._attachments = attachments
        self._mentions: dict[str, Any] = (
            {"parse": ["users", "roles", "everyone"], "replied_user": True} if allow_mentions
            else {"parse": [], "replied_user": False}
        )

    async def deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        try:
            return await self._deliver(payload, target)
        except DiscordError as exc:
            raise DeliveryError(str(exc), retryable=exc.status >= 500 or exc.status == 429) from None
        except ConnectionError as exc:
            raise DeliveryError(str(exc), retryable=True) from None

    async def _deliver(self, payload: ChannelReplyParams, target: str | None) -> str | None:
        where = payload.thread_id or payload.chat_id
        route = f"/channels/{where}/messages"
        if payload.kind == "delete":
            try:
                await self._rest.request("DELETE", f"{route}/{target}", route=route)
            except DiscordError as exc:
                if exc.status != 404:
                    raise
            return target
        if payload.kind == "edit":
            text = getattr(payload.chunks[0], "text", "")
            await self._rest.request("PATCH", f"{route}/{target}", {"content": text, "allowed_mentions": self._mentions},
                                     route=route)
            return target
        first: str | None = None
        for number, chunk in enumerate(payload.chunks):
            body: dict[str, Any] = {"allowed_mentions": self._mentions}
            if number == 0 and payload.seq == 1 and payload.reply_to:
                body["message_reference"] = {"message_id": payload.reply_to, "fail_if_not_exists": False}
            files = None
            if isinstance(chunk, ReplyImageChunk) and chunk.url.lower().startswith(("http://", "https://")):
                body["embeds"] = [{"image": {"url": chunk.url}, **({"description": chunk.alt[:4096]} if chunk.alt else {})}]
            elif isinstance(chunk, (ReplyImageChunk, ReplyFileChunk)):
                uri = chunk.url if isinstance(chunk, ReplyImageChunk) else chunk.uri
                name = chunk.name if isinstance(chunk, ReplyFileChunk) else None
                local = await local_file(self._attachments, uri, name, chunk.mime_type)
                if local is None:
                    raise DeliveryError(f"the file {name or 'of the reply'} is not in the attachments directory",
                                        retryable=False)
                body["attachments"] = [{"id": 0, "filename": local.name}]
                files = {"files[0]": (local.name, local.data, local.mime_type)}
            else:
                body["content"] = getattr(chunk, "text", "")
            sent = as_dict(await self._rest.request("POST", route, body, route=route, files=files))
            if first is None and as_str(sent.get("id")):
                first = as_str(sent.get("id"))
        return first
