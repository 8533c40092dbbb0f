"""HttpChannel: MCP's streamable HTTP transport as the byte-stream pair a JsonRpcPeer sits on.

The peer (sidecar/rpc/peer.py, the one JSON-RPC engine) writes NDJSON lines and reads
NDJSON lines; this adapter turns them into HTTP (MCP specification 2025-06-18 and
2025-11-25, "Streamable HTTP"), so ids, pending requests, timeouts and cancellation stay
the peer's:

- every line the peer writes is one POST to the endpoint, ``Accept: application/json,
  text/event-stream``. A request's POST runs in a task of its own (calls run side by
  side); a notification's or a response's is awaited in order (so ``initialized`` reaches
  the server before the ``tools/list`` behind it) and must be answered 202;
- a request's answer is either one JSON body or an SSE stream: every message it carries
  (the response, and requests and notifications of the server) becomes a line of the
  peer's input; the stream is read until the response has come. What cannot give a
  response (202, an HTTP error status, a redirect, another content type, a stream that
  ends or breaks without one, a body over the limit) is answered to the peer as a
  JSON-RPC error for that request's id, with the server's own JSON-RPC error when an
  error status carries one;
- the ``Mcp-Session-Id`` the server gives in its answer to ``initialize`` is sent with
  every later request, and ``MCP-Protocol-Version`` once it is negotiated (``use_version``);
- once the session is up (``initialized`` accepted) a GET opens the server's own stream
  for what it sends unprompted (``tools/list_changed``); a server without one answers 405
  and its notifications then come only in the streams of our POSTs. A GET stream that ends
  is reopened after the server's ``retry``, never sooner than GET_RETRY_S (a stream that
  brings a message and ends, again and again, would otherwise be a loop) nor later than
  GET_RETRY_MAX_S, at most GET_ATTEMPTS times in a row without a message. Resuming a broken stream (``Last-Event-ID``) is not done: the
  request it carried fails and the caller may retry;
- the server being unreachable (a transport error: refused, reset, timed out) or ending
  the session (404 to a request carrying its id) closes the channel: the peer's input ends,
  every pending request fails with PeerClosed, ``closed`` is set and ``note`` says why;
- leaving ``open_channel`` ends the session with a DELETE (bounded by DELETE_TIMEOUT_S,
  failures logged) and cancels the POSTs still running.

Must stay true: what the server sends is untrusted. A JSON body and an SSE event are each
bounded by ``max_bytes`` (the stdio line limit); SSE data and JSON bodies are put on one
line (a newline in valid JSON is whitespace) and go through the same line filter and
parser as a stdio server's lines (what is not JSON is dropped); a session id that is not
visible ASCII is ignored; redirects are never followed (``follow_redirects`` off: a
redirect could leave the origin the headers were configured for). Every task is in the
channel's one task group, entered and left by the task that opened it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from sidecar.http_fields import token_problem
from sidecar.rpc.framing import LineReader, OversizedLine
from sidecar.rpc.messages import ErrorObject, OutError, encode, scan_head

if TYPE_CHECKING:
    import httpx2

__all__ = ["HttpChannel", "open_channel", "DELETE_TIMEOUT_S", "GET_ATTEMPTS"]

log = logging.getLogger(__name__)

SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
DELETE_TIMEOUT_S = 1.0
GET_ATTEMPTS = 3
GET_RETRY_S = 1.0
GET_RETRY_MAX_S = 30.0
CANCELLED = "notifications/cancelled"
CONNECTION_CLOSED = -32000
"""The code of the errors we answer for a request the HTTP exchange could not complete."""
_ACCEPT = "application/json, text/event-stream"


class _Cancelled(msgspec.Struct):
    requestId: Any = None  # noqa: N815 (the wire name)


class _Head(msgspec.Struct):
    """What routing needs of a message: request (method + id), notification, response."""

    id: Any = None
    method: Any = None
    params: msgspec.Raw = msgspec.Raw()


_head = msgspec.json.Decoder(_Head)
_cancelled = msgspec.json.Decoder(_Cancelled)


def _head_of(line: bytes | str) -> _Head | None:
    try:
        return _head.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None


def _session_id(value: str | None) -> str | None:
    """The server's session id if it is what the specification allows (visible ASCII)."""
    if value and len(value) <= 1024 and token_problem(value) is None:
        return value
    if value:
        log.warning("MCP: a session id that is not visible ASCII was ignored")
    return None


def _one_line(data: bytes) -> bytes:
    return data.replace(b"\r", b" ").replace(b"\n", b" ").strip()


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class HttpChannel:
    def __init__(self, client: httpx2.AsyncClient, url: str, tg: anyio.abc.TaskGroup, *, max_bytes: int) -> None:
        self._client = client
        self.url = url
        self._tg = tg
        self.max_bytes = max_bytes
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self.closed = anyio.Event()
        self.note: str | None = None
        """Why the channel closed (the server unreachable, its session ended)."""
        # the peer writes to ``peer_send``, we read ``_out``; we write ``_in``, it reads ``peer_receive``
        self.peer_send, self._out = anyio.create_memory_object_stream[bytes](64)
        self._in, self.peer_receive = anyio.create_memory_object_stream[bytes](64)
        self._get_started = False
        self._posts: dict[Any, anyio.CancelScope] = {}
        """The scope of each request's POST, by the request's id."""

    def use_version(self, version: str) -> None:
        """The negotiated protocol version: sent as a header from now on."""
        self.protocol_version = version

    def exit_note(self) -> str | None:
        return self.note

    def _headers(self, accept: str = _ACCEPT) -> dict[str, str]:
        headers = {"accept": accept}
        if self.session_id:
            headers[SESSION_HEADER] = self.session_id
        if self.protocol_version:
            headers[VERSION_HEADER] = self.protocol_version
        return headers

    # ---- what the peer receives ---------------------------------------------------------

    async def _feed(self, line: bytes) -> None:
        if self.closed.is_set():
            return
        try:
            await self._in.send(line + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def _fail(self, request_id: Any, message: str, code: int = CONNECTION_CLOSED) -> None:
        """Answer our own request ``request_id`` with an error (its exchange gave no response)."""
        await self._feed(encode(OutError(id=request_id, error=ErrorObject(code, message)))[:-1])

    def close(self, note: str) -> None:
        """The server is gone: end the peer's input (its pending requests fail at once)."""
        if not self.closed.is_set():
            self.note = note
            log.info("MCP %s: %s", self.url, note)
            self.closed.set()
            self._in.close()

    # ---- what the peer sends --------------------------------------------------------------

    async def run_writer(self) -> None:
        reader = LineReader(self._out, self.max_bytes)
        try:
            async for line in reader:
                if isinstance(line, OversizedLine):  # ours: a request of ours fails at once
                    info = scan_head(line.head)
                    if info.has_method and type(info.id) is int:
                        await self._fail(info.id, f"the message is too large to send ({line.size} bytes)")
                    continue
                head = _head_of(line) or _Head()
                if isinstance(head.method, str) and head.id is not None:
                    scope = anyio.CancelScope()
                    self._posts[head.id] = scope
                    self._tg.start_soon(self._post_request, line, head.id, head.method, scope)
                else:
                    await self._post_other(line, head.method)
                    if head.method == CANCELLED:
                        self._abandon(head.params)
        finally:
            self.closed.set()

    def _abandon(self, params: msgspec.Raw) -> None:
        """A cancelled call's answer will never be read: stop waiting for it."""
        try:
            request_id = _cancelled.decode(params).requestId
        except (msgspec.DecodeError, RecursionError):
            return
        scope = self._posts.pop(request_id, None)
        if scope is not None:
            scope.cancel()

    async def _post_other(self, line: bytes, method: Any) -> None:
        """A notification or a response to the server's request: the server answers 202."""
        import httpx2

        what = method if isinstance(method, str) else "a response"
        try:
            response = await self._client.post(self.url, content=line, headers=self._json_headers())
        except httpx2.TransportError as exc:
            self.close(f"cannot reach the server: {type(exc).__name__}: {_cut(str(exc))}")
            return
        except httpx2.HTTPError as exc:
            log.warning("MCP %s: the answer to %s cannot be read: %s", self.url, what, type(exc).__name__)
            return
        if response.status_code == 404 and self.session_id:
            self.close("the server ended the session (HTTP 404)")
        elif response.status_code >= 300:
            log.warning("MCP %s: the server refused %s (HTTP %d)", self.url, what, response.status_code)
        elif method == "notifications/initialized":
            self._start_get()

    def _json_headers(self) -> dict[str, str]:
        headers = self._headers()
        headers["content-type"] = "application/json"
        return headers

    async def _post_request(self, line: bytes, request_id: Any, method: str, scope: anyio.CancelScope) -> None:
        import httpx2

        # no read timeout: how long a call may take is the caller's to say (the peer's
        # request is cancelled, and announced, when it gives up)
        timeout = httpx2.Timeout(None, connect=self._client.timeout.connect)
        try:
            with scope:
                async with self._client.stream(
                    "POST", self.url, content=line, headers=self._json_headers(), timeout=timeout
                ) as response:
                    await self._answer(response, request_id, method)
        except httpx2.TransportError as exc:
            self.close(f"cannot reach the server: {type(exc).__name__}: {_cut(str(exc))}")
        except httpx2.HTTPError as exc:  # an answer that cannot be read (a bad encoding...)
            await self._fail(request_id, f"the answer to {method} cannot be read: {type(exc).__name__}: {_cut(str(exc))}")
        finally:
            if self._posts.get(request_id) is scope:
                del self._posts[request_id]

    async def _answer(self, response: httpx2.Response, request_id: Any, method: str) -> None:
        status = response.status_code
        if method == "initialize" and status < 300:
            self.session_id = _session_id(response.headers.get(SESSION_HEADER))
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if status == 202:
            await self._fail(request_id, f"the server accepted {method} without answering it (HTTP 202)")
        elif 300 <= status < 400:
            where = _cut(response.headers.get("location", "?"))
            await self._fail(request_id, f"the server redirects to {where} (HTTP {status}); redirects are not followed")
        elif status == 404 and self.session_id and method != "initialize":
            self.close("the server ended the session (HTTP 404)")
        elif status >= 400:
            body = await self._body(response) if kind == "application/json" else None
            error = _error_of(body) if body is not None else None
            if error is not None:  # the server's own JSON-RPC error, given our id (it may say null)
                await self._feed(encode(OutError(id=request_id, error=error))[:-1])
            else:
                await self._fail(request_id, f"the server answered {method} with HTTP {status}")
        elif kind == "application/json":
            body = await self._body(response)
            if body is None:
                await self._fail(request_id, f"the answer to {method} is over {self.max_bytes} bytes")
            else:
                await self._feed(body)
        elif kind == "text/event-stream":
            await self._events(response, request_id, method)
        else:
            await self._fail(request_id, f"the server answered {method} with content type {_cut(kind or 'none')!r}")

    async def _body(self, response: httpx2.Response) -> bytes | None:
        """The body on one line, or None when it is over the limit."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
        return _one_line(b"".join(chunks))

    async def _events(self, response: httpx2.Response, request_id: Any, method: str) -> None:
        import httpx2

        try:
            async for event in httpx2.EventSource(response, max_event_size=self.max_bytes):
                if event.event != "message" or not event.data:
                    continue  # a priming event (an id, no data) or another kind
                line = _one_line(event.data.encode())
                head = _head_of(line)
                await self._feed(line)
                if head is not None and head.method is None and head.id == request_id:
                    return  # the response: the stream has nothing more for us
        except httpx2.SSEError as exc:
            await self._fail(request_id, f"the stream answering {method} broke: {_cut(str(exc))}")
            return
        await self._fail(request_id, f"the stream answering {method} ended without a response")

    # ---- the server's own stream ------------------------------------------------------------

    def _start_get(self) -> None:
        if not self._get_started and self.session_id:
            self._get_started = True
            self._tg.start_soon(self._get_stream)

    async def _get_stream(self) -> None:
        import httpx2

        timeout = httpx2.Timeout(None, connect=self._client.timeout.connect)  # it idles for long
        failures = 0
        while failures < GET_ATTEMPTS and not self.closed.is_set():
            retry_s = GET_RETRY_S
            got = False
            try:
                async with self._client.stream(
                    "GET", self.url, headers=self._headers("text/event-stream"), timeout=timeout
                ) as response:
                    if response.status_code == 405:
                        log.debug("MCP %s: no stream of its own (GET answered 405)", self.url)
                        return
                    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
                    if response.status_code != 200 or kind != "text/event-stream":
                        log.warning("MCP %s: its stream could not be opened (HTTP %d)", self.url, response.status_code)
                        return
                    async for event in httpx2.EventSource(response, max_event_size=self.max_bytes):
                        if event.retry is not None:
                            retry_s = min(max(event.retry / 1000, GET_RETRY_S), GET_RETRY_MAX_S)
                        if event.event == "message" and event.data:
                            got = True
                            await self._feed(_one_line(event.data.encode()))
            except httpx2.HTTPError as exc:  # SSEError included
                log.debug("MCP %s: its stream ended: %s", self.url, exc)
            failures = 0 if got else failures + 1
            await anyio.sleep(retry_s)

    # ---- the end ------------------------------------------------------------------------------

    def close_streams(self) -> None:
        for stream in (self.peer_send, self._out, self._in, self.peer_receive):
            stream.close()

    async def delete_session(self) -> None:
        import httpx2

        if not self.session_id:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(DELETE_TIMEOUT_S):
            try:
                response = await self._client.delete(self.url, headers=self._headers())
            except httpx2.TransportError as exc:
                log.debug("MCP %s: ending the session failed: %s", self.url, exc)
                return
            if response.status_code not in (200, 202, 204, 404, 405):
                log.warning("MCP %s: ending the session was answered HTTP %d", self.url, response.status_code)


class _ErrorBody(msgspec.Struct):
    error: ErrorObject


_error_body = msgspec.json.Decoder(_ErrorBody)


def _error_of(body: bytes) -> ErrorObject | None:
    try:
        return _error_body.decode(body).error
    except (msgspec.DecodeError, RecursionError):
        return None


@asynccontextmanager
async def open_channel(client: httpx2.AsyncClient, url: str, *, max_bytes: int) -> AsyncIterator[HttpChannel]:
    """A channel to ``url``; the peer goes on ``peer_receive`` / ``peer_send``."""
    async with anyio.create_task_group() as tg:
        channel = HttpChannel(client, url, tg, max_bytes=max_bytes)
        tg.start_soon(channel.run_writer)
        try:
            yield channel
        finally:
            await channel.delete_session()
            tg.cancel_scope.cancel()
            channel.close_streams()
