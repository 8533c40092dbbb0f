"""Fake Telegram, Discord and Slack servers on loopback, written from the platforms' public API
documents, for the tests of the connections the sidecar owns.

Each runs in the test's own event loop (starlette on uvicorn, one port for REST and
WebSocket) and records what the sidecar sent; the test drives it (``post`` a message,
``drop`` the connection, make the next call answer 429...). The quirks they keep:

- Telegram Bot API: ``{"ok": false, "error_code", "description", "parameters":
  {"retry_after"}}``; ``getUpdates`` long polls (``timeout``) and confirms what is below
  ``offset``; 409 while a webhook is set; sendMessage refuses MarkdownV2 Telegram could not
  parse ("can't parse entities", by the validator of test_channels_telegram_discord) and texts
  over 4,096 characters; "message is not modified" for an edit to the same text.
- Discord: ``GET /gateway/bot``; the gateway's HELLO, IDENTIFY -> READY, heartbeats -> ACK,
  RESUME -> the missed dispatches then RESUMED, INVALID_SESSION, RECONNECT; REST with
  X-RateLimit-* headers (5 messages per channel, then a 429 with ``retry_after``) and
  ``content`` up to 2,000 characters.
- Slack: ``apps.connections.open`` (an app token), ``auth.test``, ``chat.postMessage`` /
  ``update`` / ``delete`` (429 with Retry-After); the socket's ``hello``, envelopes that must
  be acknowledged (unacknowledged ones come again with ``retry_attempt`` + 1 on the next
  socket), ``disconnect``.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from test_channels_telegram_discord import MarkdownV2Error, check_markdown_v2

TELEGRAM_TOKEN = "123456:TEST-telegram-TOKEN-abcdef"
DISCORD_TOKEN = "discord.TEST.token-xyz"
SLACK_BOT_TOKEN = "xoxb-test-slack-bot"
SLACK_APP_TOKEN = "xapp-test-slack-app"


@asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    # "critical": a long poll cut off when the fake stops is not an error worth a traceback
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off", ws="websockets-sansio"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(10):
                while not server.started:
                    await anyio.sleep(0.01)
            try:
                yield port
            finally:
                server.should_exit = True
                server.force_exit = True
                tg.cancel_scope.cancel()
    finally:
        sock.close()


async def wait_until(predicate: Any, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# ---- Telegram -----------------------------------------------------------------------------


class FakeTelegram:
    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.confirmed = 0
        self.sent: list[tuple[str, dict[str, Any]]] = []
        """(method, payload) of every call but getUpdates, in order."""
        self.sent_at: list[float] = []
        """When each of ``sent`` arrived (time.perf_counter)."""
        self.webhook = False
        self.limit_next: float | None = None
        """The next send answers 429 with this retry_after."""
        self.limited = 0
        self.drop_next_poll = False
        self.dropped = 0
        """Long polls cut off mid-answer so far."""
        self.polls = 0
        self.ignore_offset = False
        """Answer every poll at once with every update, whatever its offset (a broken server)."""
        self._ids = itertools.count(1)
        self._update_ids = itertools.count(100)
        self._new = anyio.Event()
        self.messages: dict[tuple[str, int], str] = {}
        self.uploaded: dict[str, tuple[str, bytes, str]] = {}
        """form field -> (file name, bytes, content type) of the last multipart upload in it."""
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, text: str, *, chat_id: int = 777, user_id: int = 7, name: str = "Alice", chat_type: str = "private",
             message_id: int | None = None, **extra: Any) -> dict[str, Any]:
        message = {
            "message_id": message_id if message_id is not None else next(self._ids) + 1000,
            "date": 1_700_000_000, "text": text,
            "chat": {"id": chat_id, "type": chat_type, **({"title": "Team"} if chat_type != "private" else {})},
            "from": {"id": user_id, "is_bot": False, "first_name": name},
            **extra,
        }
        self.redeliver(message)
        return message

    def redeliver(self, message: dict[str, Any]) -> None:
        self.updates.append({"update_id": next(self._update_ids), "message": message})
        self._new.set()

    def texts(self, method: str = "sendMessage") -> list[str]:
        return [p["text"] for m, p in self.sent if m == method]

    def app(self) -> Starlette:
        async def method(request: Request) -> Response:
            token, name = request.path_params["token"], request.path_params["method"]
            if token != TELEGRAM_TOKEN:
                return JSONResponse({"ok": False, "error_code": 401, "description": "Unauthorized"}, 401)
            if "multipart" in request.headers.get("content-type", ""):
                form = await request.form()
                payload: dict[str, Any] = {k: (v if isinstance(v, str) else f"<upload {v.filename}>") for k, v in form.items()}
                for field, value in form.items():
                    if not isinstance(value, str):
                        self.uploaded[field] = (value.filename or "", await value.read(), value.content_type or "")
                await form.close()
            else:
                payload = json.loads(await request.body() or b"{}")
            return await self._handle(name, payload)

        async def file(request: Request) -> Response:
            if request.path_params["token"] != TELEGRAM_TOKEN:
                return Response(status_code=404)
            return Response(b"\x89PNG fake image bytes", media_type="image/png")

        return Starlette(routes=[
            Route("/bot{token}/{method}", method, methods=["POST"]),
            Route("/file/bot{token}/{path:path}", file),
        ])

    async def _handle(self, name: str, payload: dict[str, Any]) -> Response:
        if name == "getMe":
            return _ok({"id": 4242, "is_bot": True, "first_name": "Sidecar", "username": "sidecar_bot"})
        if name == "getUpdates":
            return await self._poll(payload)
        if name == "getFile":
            return _ok({"file_id": payload["file_id"], "file_path": f"photos/{payload['file_id']}.png"})
        if self.limit_next is not None:
            retry, self.limit_next = self.limit_next, None
            self.limited += 1
            return JSONResponse({"ok": False, "error_code": 429, "description": f"Too Many Requests: retry after {retry:g}",
                                 "parameters": {"retry_after": retry}}, 429)
        if name in ("sendMessage", "editMessageText"):
            text = payload.get("text", "")
            if payload.get("parse_mode") == "MarkdownV2":
                try:
                    check_markdown_v2(text)
                except MarkdownV2Error as exc:
                    return _bad(f"Bad Request: can't parse entities: {exc}")
            if utf16_len(text) > 4096:
                return _bad("Bad Request: message is too long")
            if name == "editMessageText":
                key = (str(payload["chat_id"]), int(payload["message_id"]))
                if self.messages.get(key) == text:
                    return _bad("Bad Request: message is not modified: specified new message content and reply markup"
                                " are exactly the same as a current content and reply markup of the message")
                self.messages[key] = text
                self.sent.append((name, payload))
                self.sent_at.append(time.perf_counter())
                return _ok({"message_id": key[1], "text": text})
        self.sent.append((name, payload))
        self.sent_at.append(time.perf_counter())
        if name in ("sendMessage", "sendPhoto", "sendDocument"):
            message_id = next(self._ids)
            if name == "sendMessage":
                self.messages[(str(payload["chat_id"]), message_id)] = payload["text"]
            return _ok({"message_id": message_id, "chat": {"id": payload["chat_id"]}, "date": 1_700_000_000})
        return _ok(True)

    async def _poll(self, payload: dict[str, Any]) -> Response:
        self.polls += 1
        if self.webhook:
            return JSONResponse({"ok": False, "error_code": 409, "description": "Conflict: can't use getUpdates method"
                                 " while webhook is active; use deleteWebhook to delete the webhook first"}, 409)
        offset = payload.get("offset")
        if isinstance(offset, int):
            self.confirmed = max(self.confirmed, offset)
        if self.ignore_offset:
            return _ok(self.updates)
        with anyio.move_on_after(min(float(payload.get("timeout", 0)), 5.0)):
            while not self._pending():
                self._new = anyio.Event()
                await self._new.wait()
        pending = self._pending()
        if self.drop_next_poll and pending:
            self.drop_next_poll = False
            self.dropped += 1
            body = json.dumps({"ok": True, "result": pending}).encode()

            async def cut() -> AsyncIterator[bytes]:
                yield body[: len(body) // 2]
                raise ConnectionResetError("the fake drops the long poll mid-answer")

            return StreamingResponse(cut(), media_type="application/json")
        return _ok(pending)

    def _pending(self) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["update_id"] >= self.confirmed]


def _ok(result: Any) -> JSONResponse:
    return JSONResponse({"ok": True, "result": result})


def _bad(description: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error_code": 400, "description": description}, 400)


@asynccontextmanager
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram()
    async with serve(fake.app()) as port:
        fake.port = port
        yield fake


# ---- Discord ------------------------------------------------------------------------------


class FakeDiscord:
    HEARTBEAT_MS = 400
    BUCKET = 5

    def __init__(self) -> None:
        self.port = 0
        self.uploaded: dict[str, tuple[str, bytes, str]] = {}
        """multipart field (``files[n]``) -> (file name, bytes, content type) of the last upload in it."""
        self.events: list[dict[str, Any]] = []
        """Dispatches of the current session, with their ``s``."""
        self.session_id: str | None = None
        self.sessions = 0
        self.identifies = 0
        self.resumes = 0
        self.heartbeats = 0
        self.acks = True
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        """(method, path, body) of the REST calls that changed something."""
        self.limit_next: float | None = None
        self.limited = 0
        self.disconnect_at_hello = False
        """Every new socket is asked at once to be replaced (a broken Slack)."""
        self._socket: WebSocket | None = None
        self._ids = itertools.count(5000)
        self._bucket: dict[str, tuple[int, float]] = {}
        self.connected = anyio.Event()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    def message(self, content: str, *, channel_id: str = "3001", guild_id: str | None = "2001", author: str = "1001",
                name: str = "alice", **extra: Any) -> dict[str, Any]:
        return {
            "id": str(next(self._ids)), "channel_id": channel_id, **({"guild_id": guild_id} if guild_id else {}),
            "author": {"id": author, "username": name}, "content": content, "timestamp": "2026-01-01T00:00:00+00:00",
            "type": 0, "mentions": [], "mention_everyone": False, "attachments": [], **extra,
        }

    async def post(self, message: dict[str, Any]) -> None:
        """A MESSAGE_CREATE: sent now when the gateway is connected, else replayed on RESUME."""
        await self.dispatch("MESSAGE_CREATE", message)

    async def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        event = {"op": 0, "t": kind, "s": len(self.events) + 1, "d": data}
        self.events.append(event)
        if self._socket is not None:
            try:
                await self._socket.send_text(json.dumps(event))
            except (RuntimeError, WebSocketDisconnect):
                pass

    async def drop(self) -> None:
        """The connection dies (close code 4000: resumable)."""
        if self._socket is not None:
            socket_, self._socket = self._socket, None
            self.connected = anyio.Event()
            await socket_.close(code=4000)

    async def send_op(self, op: int, data: Any = None) -> None:
        assert self._socket is not None
        await self._socket.send_text(json.dumps({"op": op, "d": data}))

    def contents(self) -> list[str]:
        return [b.get("content", "") for m, _, b in self.sent if m == "POST"]

    def app(self) -> Starlette:
        async def gateway_bot(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bot {DISCORD_TOKEN}":
                return JSONResponse({"message": "401: Unauthorized", "code": 0}, 401)
            return JSONResponse({"url": f"ws://127.0.0.1:{self.port}/gateway", "shards": 1,
                                 "session_start_limit": {"total": 1000, "remaining": 999}})

        async def messages(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bot {DISCORD_TOKEN}":
                return JSONResponse({"message": "401: Unauthorized", "code": 0}, 401)
            channel = request.path_params["channel"]
            headers = self._limit_headers(channel)
            if self.limit_next is not None or headers is None:
                retry = self.limit_next if self.limit_next is not None else 0.3
                self.limit_next = None
                self.limited += 1
                return JSONResponse({"message": "You are being rate limited.", "retry_after": retry, "global": False},
                                    429, headers={"Retry-After": str(max(1, int(retry))), "X-RateLimit-Scope": "user"})
            if request.method == "DELETE":
                self.sent.append(("DELETE", request.url.path, {}))
                return Response(status_code=204, headers=headers)
            if "multipart" in request.headers.get("content-type", ""):
                form = await request.form()
                body = json.loads(str(form["payload_json"]))
                ids = {str(a.get("id")) for a in body.get("attachments", [])}
                for field, value in form.items():
                    if isinstance(value, str):
                        continue
                    if not (field.startswith("files[") and field[6:-1] in ids):  # files[n] needs attachments id n
                        await form.close()
                        return JSONResponse({"message": "Invalid Form Body", "code": 50035}, 400, headers=headers)
                    self.uploaded[field] = (value.filename or "", await value.read(), value.content_type or "")
                await form.close()
            else:
                body = json.loads(await request.body())
            if len(body.get("content", "")) > 2000:
                return JSONResponse({"message": "Invalid Form Body", "code": 50035}, 400, headers=headers)
            self.sent.append((request.method, request.url.path, body))
            message_id = request.path_params.get("message") or str(next(self._ids))
            return JSONResponse({"id": message_id, "channel_id": channel, "content": body.get("content", "")},
                                headers=headers)

        async def gateway(websocket: WebSocket) -> None:
            await self._gateway(websocket)

        return Starlette(routes=[
            Route("/api/v10/gateway/bot", gateway_bot),
            Route("/api/v10/channels/{channel}/messages", messages, methods=["POST"]),
            Route("/api/v10/channels/{channel}/messages/{message}", messages, methods=["PATCH", "DELETE"]),
            WebSocketRoute("/gateway/", gateway),
            WebSocketRoute("/gateway", gateway),
        ])

    def _limit_headers(self, channel: str) -> dict[str, str] | None:
        """Five messages per channel, then the bucket is empty until its reset, 0.3 s later
        (None: a request inside that time, answered 429)."""
        now = time.monotonic()
        left, reset_at = self._bucket.get(channel, (self.BUCKET, 0.0))
        if left <= 0:
            if now < reset_at:
                return None
            left = self.BUCKET
        left -= 1
        self._bucket[channel] = (left, now + 0.3 if left == 0 else reset_at)
        return {"X-RateLimit-Limit": str(self.BUCKET), "X-RateLimit-Remaining": str(left),
                "X-RateLimit-Reset-After": "0.3", "X-RateLimit-Bucket": f"bucket-{channel}"}

    async def _gateway(self, websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(json.dumps({"op": 10, "d": {"heartbeat_interval": self.HEARTBEAT_MS}}))
        try:
            while True:
                frame = json.loads(await websocket.receive_text())
                op = frame.get("op")
                if op == 1:
                    self.heartbeats += 1
                    if self.acks:
                        await websocket.send_text(json.dumps({"op": 11}))
                elif op == 2:
                    assert frame["d"]["token"] == DISCORD_TOKEN and frame["d"]["intents"] & (1 << 15)
                    self.identifies += 1
                    self.sessions += 1
                    self.session_id = f"session-{self.sessions}"
                    self.events = []
                    self._socket = websocket
                    await self.dispatch("READY", {
                        "v": 10, "session_id": self.session_id, "user": {"id": "9001", "username": "sidecar", "bot": True},
                        "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gateway", "guilds": [],
                    })
                    self.connected.set()
                elif op == 6:
                    data = frame["d"]
                    if data.get("session_id") != self.session_id:
                        await websocket.send_text(json.dumps({"op": 9, "d": False}))
                        continue
                    self.resumes += 1
                    for event in self.events:
                        if event["s"] > data["seq"]:
                            await websocket.send_text(json.dumps(event))
                    self._socket = websocket
                    await self.dispatch("RESUMED", {})
                    self.connected.set()
        except WebSocketDisconnect:
            pass
        finally:
            if self._socket is websocket:
                self._socket = None
                self.connected = anyio.Event()


@asynccontextmanager
async def fake_discord() -> AsyncIterator[FakeDiscord]:
    fake = FakeDiscord()
    async with serve(fake.app()) as port:
        fake.port = port
        yield fake


# ---- Slack --------------------------------------------------------------------------------


class FakeSlack:
    def __init__(self) -> None:
        self.port = 0
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.unacked: dict[str, dict[str, Any]] = {}
        """Envelopes sent and not acknowledged yet (sent again on the next socket)."""
        self.acked: list[str] = []
        self.sockets = 0
        self.limit_next: float | None = None
        self.limited = 0
        self.disconnect_at_hello = False
        """Every new socket is asked at once to be replaced (a broken Slack)."""
        self._socket: WebSocket | None = None
        self._envelopes = itertools.count(1)
        self._ts = itertools.count(1)
        self.connected = anyio.Event()
        self._file_ids = itertools.count(1)
        self.upload_slots: dict[str, dict[str, Any]] = {}
        """file_id -> the getUploadURLExternal arguments (filename, length) it was given for."""
        self.uploads: dict[str, tuple[bytes, str]] = {}
        """file_id -> (the bytes POSTed to its upload URL, their content type)."""
        self.files: dict[str, tuple[bytes, str]] = {}
        """name -> (bytes, type) served at ``file_url(name)`` to the bot token only (url_private)."""

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def file_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/files-pri/T1-F1/{name}"

    def event(self, text: str, *, channel: str = "C1", user: str = "U1", kind: str = "message",
              channel_type: str = "channel", **extra: Any) -> dict[str, Any]:
        return {"type": kind, "channel": channel, "user": user, "text": text, "ts": f"1700000000.{next(self._ts):06d}",
                "channel_type": channel_type, **extra}

    async def post(self, event: dict[str, Any]) -> str:
        envelope_id = f"env-{next(self._envelopes)}"
        envelope = {"envelope_id": envelope_id, "type": "events_api", "accepts_response_payload": False,
                    "retry_attempt": 0, "retry_reason": "",
                    "payload": {"type": "event_callback", "event": event, "event_id": f"Ev{envelope_id}"}}
        self.unacked[envelope_id] = envelope
        if self._socket is not None:
            await self._socket.send_text(json.dumps(envelope))
        return envelope_id

    async def drop(self) -> None:
        if self._socket is not None:
            socket_, self._socket = self._socket, None
            self.connected = anyio.Event()
            await socket_.close(code=1011)

    async def disconnect(self, reason: str = "refresh_requested") -> None:
        assert self._socket is not None
        await self._socket.send_text(json.dumps({"type": "disconnect", "reason": reason,
                                                 "debug_info": {"host": "fake"}}))

    def posts(self) -> list[dict[str, Any]]:
        return [p for m, p in self.sent if m == "chat.postMessage"]

    def app(self) -> Starlette:
        async def method(request: Request) -> Response:
            name = request.path_params["method"]
            auth = request.headers.get("authorization", "")
            form = request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
            body: dict[str, Any] = dict(await request.form()) if form else json.loads(await request.body() or b"{}")
            if name == "apps.connections.open":
                if auth != f"Bearer {SLACK_APP_TOKEN}":
                    return JSONResponse({"ok": False, "error": "invalid_auth"})
                return JSONResponse({"ok": True, "url": f"ws://127.0.0.1:{self.port}/link/?ticket=t{self.sockets + 1}"})
            if auth != f"Bearer {SLACK_BOT_TOKEN}":
                return JSONResponse({"ok": False, "error": "invalid_auth"})
            if name == "auth.test":
                return JSONResponse({"ok": True, "user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1"})
            if self.limit_next is not None:
                retry, self.limit_next = self.limit_next, None
                self.limited += 1
                return JSONResponse({"ok": False, "error": "ratelimited"}, 429, headers={"Retry-After": f"{retry:g}"})
            self.sent.append((name, body))
            if name == "files.getUploadURLExternal":
                return self._upload_slot(body, form)
            if name == "files.completeUploadExternal":
                return self._complete_upload(body, form)
            return JSONResponse({"ok": True, "channel": body.get("channel"), "ts": body.get("ts") or f"1800000000.{next(self._ts):06d}"})

        async def upload(request: Request) -> Response:
            file_id = request.path_params["file_id"]
            if file_id not in self.upload_slots:
                return Response(b"unknown upload", status_code=404)
            self.uploads[file_id] = (await request.body(), request.headers.get("content-type", ""))
            return Response(f"OK - {len(self.uploads[file_id][0])}".encode())

        async def private_file(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {SLACK_BOT_TOKEN}":
                return Response(b"<html>sign in</html>", status_code=403, media_type="text/html")
            found = self.files.get(request.path_params["name"])
            if found is None:
                return Response(status_code=404)
            return Response(found[0], media_type=found[1])

        async def link(websocket: WebSocket) -> None:
            await websocket.accept()
            self.sockets += 1
            await websocket.send_text(json.dumps({"type": "hello", "num_connections": 1,
                                                  "connection_info": {"app_id": "A1"}}))
            if self.disconnect_at_hello:
                await websocket.send_text(json.dumps({"type": "disconnect", "reason": "refresh_requested"}))
            self._socket = websocket
            for envelope in list(self.unacked.values()):
                envelope["retry_attempt"] += 1
                envelope["retry_reason"] = "timeout"
                await websocket.send_text(json.dumps(envelope))
            self.connected.set()
            try:
                while True:
                    frame = json.loads(await websocket.receive_text())
                    envelope_id = frame.get("envelope_id")
                    if envelope_id in self.unacked:
                        del self.unacked[envelope_id]
                        self.acked.append(envelope_id)
            except WebSocketDisconnect:
                pass
            finally:
                if self._socket is websocket:
                    self._socket = None
                    self.connected = anyio.Event()

        return Starlette(routes=[
            Route("/api/{method}", method, methods=["POST"]),
            Route("/upload/{file_id}", upload, methods=["POST"]),
            Route("/files-pri/T1-F1/{name}", private_file),
            WebSocketRoute("/link/", link),
        ])

    def _upload_slot(self, body: dict[str, Any], form: bool) -> Response:
        # as the live service was seen to answer a JSON body here (its documents list both)
        if not form or not body.get("filename") or not str(body.get("length", "")).isdigit():
            return JSONResponse({"ok": False, "error": "invalid_arguments"})
        file_id = f"F{next(self._file_ids):04d}"
        self.upload_slots[file_id] = {"filename": body["filename"], "length": int(body["length"])}
        return JSONResponse({"ok": True, "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}", "file_id": file_id})

    def _complete_upload(self, body: dict[str, Any], form: bool) -> Response:
        files = json.loads(body.get("files", "[]")) if form else body.get("files", [])
        if not files or any(f.get("id") not in self.uploads for f in files):
            return JSONResponse({"ok": False, "error": "file_not_found"})
        if any(len(self.uploads[f["id"]][0]) != self.upload_slots[f["id"]]["length"] for f in files):
            return JSONResponse({"ok": False, "error": "invalid_arguments"})
        return JSONResponse({"ok": True, "files": [{"id": f["id"], "title": f.get("title")} for f in files]})


@asynccontextmanager
async def fake_slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    async with serve(fake.app()) as port:
        fake.port = port
        yield fake
