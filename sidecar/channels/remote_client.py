"""RemoteAgentClient: another agent service's V1 API, as the remote-agent route calls it.

The wire is the V1 agent runner's (the sidecar's own ``compat:start`` endpoint serves it;
README "V1 /computer/chat"):

    POST {serviceUrl}{chatEndpoint}          JSON {user_id, project_id, session_id?, prompt,
                                             message, request_id}; the answer is the
                                             envelope {code, message, data: {session_id,
                                             ...}, success}, code "0000" on success
    GET  {serviceUrl}{progressEndpoint}      SSE frames (``event: <subType>``, ``data:`` a
                                             UnifiedSessionMessage), read by
                                             sidecar.sync.streams.session_frames
    POST {serviceUrl}{cancelEndpoint}        ?user_id=&project_id=&session_id= (the query, as
                                             the Qiming server sends it), no body

``prompt`` is the V1 name of the user's text; ``message`` carries the same text under the
name 05-CHANNELS §4.1 gives it. Authentication (``auth``): ``Authorization: Bearer``,
``x-api-key``, or a custom header.

Errors are the follower's (sidecar/sync/errors.py), so a progress stream is re-attached the
way a forwarded turn's is: no answer (ServerUnreachable, retryable), an HTTP error status
(ServerHttpError; 5xx and 429 retryable), 401/403 (AuthRequired: never retried), 404 on the
progress stream (ConversationGone: the service does not know the session), a body that is
not the envelope (ServerMalformed), an envelope with another code (ServerRejected).
Must stay true: the chat call is never retried (the service may have started the turn);
the token never appears in a message (redacted).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any
from urllib.parse import quote, urlencode

import httpx2
import msgspec

from protocol.channels import RemoteAgentAuth, RemoteAgentRoute
from sidecar.channels.routes import SESSION_PLACEHOLDER
from sidecar.providers.redact import Redactor
from sidecar.providers.transport import close_quietly, read_error_body
from sidecar.sync.streams import session_frames
from sidecar.sync.errors import (
    AuthRequired,
    ConversationGone,
    ServerHttpError,
    ServerMalformed,
    ServerRejected,
    ServerUnreachable,
)
from sidecar.sync.wire import SessionFrame

__all__ = ["RemoteAgentClient", "ChatBody", "auth_headers", "SUCCESS"]

SUCCESS = "0000"
CONNECT_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 30.0


class ChatBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    user_id: str
    project_id: str
    prompt: str
    message: str
    request_id: str
    session_id: str | None = None


class _Envelope(msgspec.Struct, kw_only=True):
    code: str | int | None = None
    message: str | None = None
    data: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    success: bool | None = None


class _ChatData(msgspec.Struct, kw_only=True):
    session_id: str | int | None = None
    error: str | None = None


def auth_headers(auth: RemoteAgentAuth | None, token: str | None) -> dict[str, str]:
    if auth is None or not token:
        return {}
    if auth.type == "bearer":
        return {"Authorization": f"Bearer {token}"}
    if auth.type == "api-key":
        return {"x-api-key": token}
    assert auth.header_name is not None  # checked with the route
    return {auth.header_name: token}


class RemoteAgentClient:
    def __init__(self, http: httpx2.AsyncClient, route: RemoteAgentRoute, token: str | None) -> None:
        self._http = http
        self._route = route
        self._headers = auth_headers(route.auth, token)
        self._redactor = Redactor(token, self._headers, route.service_url)

    def _url(self, path: str) -> str:
        return self._route.service_url + path

    def _describe(self, text: str) -> str:
        return self._redactor.redact(f"remote agent {self._route.service_url}: {text}")

    async def chat(self, body: ChatBody) -> str:
        """Start the turn; the remote session id its progress stream is under."""
        try:
            response = await self._http.post(
                self._url(self._route.chat_endpoint), content=msgspec.json.encode(body),
                headers={**self._headers, "Content-Type": "application/json"},
                timeout=httpx2.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            )
        except httpx2.TransportError as exc:
            raise ServerUnreachable(self._describe(f"the chat call failed ({type(exc).__name__})")) from exc
        try:
            data = msgspec.convert(_envelope_data(self, response.status_code, response.content, "the chat call"), _ChatData)
        except msgspec.ValidationError as exc:
            raise ServerMalformed(self._describe(f"the chat call answered unexpected data ({exc})")) from exc
        if data.error:
            raise ServerRejected(self._describe(f"the chat call failed: {data.error}"))
        if data.session_id is None or str(data.session_id) == "":
            raise ServerMalformed(self._describe("the chat call answered no session id"))
        return str(data.session_id)

    @asynccontextmanager
    async def progress(self, session_id: str, *, read_timeout_s: float) -> AsyncIterator[AsyncIterator[SessionFrame]]:
        """The session's progress frames (up to the one that ends the prompt)."""
        path = self._route.progress_endpoint.replace(SESSION_PLACEHOLDER, quote(session_id, safe=""))
        timeout = httpx2.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S, read=read_timeout_s)
        request = self._http.build_request(
            "GET", self._url(path), headers={**self._headers, "Accept": "text/event-stream"}, timeout=timeout
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx2.TransportError as exc:
            raise ServerUnreachable(self._describe(f"the progress stream failed ({type(exc).__name__})")) from exc
        try:
            content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if response.status_code != 200 or content_type != "text/event-stream":
                try:
                    raw = await read_error_body(response)
                except httpx2.TransportError:
                    raw = b""
                if response.status_code == 404:
                    raise ConversationGone(self._describe(f"the service does not know session {session_id}"))
                _envelope_data(self, response.status_code, raw, "the progress stream")
                raise ServerMalformed(self._describe(f"the progress stream is not an event stream ({content_type!r})"))
            async with aclosing(session_frames(response, self._describe)) as frames:
                yield frames
        finally:
            await close_quietly(response)

    async def cancel(self, *, user_id: str, project_id: str, session_id: str) -> None:
        query = urlencode({"user_id": user_id, "project_id": project_id, "session_id": session_id})
        try:
            response = await self._http.post(
                f"{self._url(self._route.cancel_endpoint)}?{query}", headers=self._headers,
                timeout=httpx2.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            )
        except httpx2.TransportError as exc:
            raise ServerUnreachable(self._describe(f"the cancel call failed ({type(exc).__name__})")) from exc
        _envelope_data(self, response.status_code, response.content, "the cancel call")


def _envelope_data(client: RemoteAgentClient, status: int, raw: bytes, what: str) -> dict[str, Any]:
    """The envelope's ``data`` object, or the QimingError of what came instead."""
    message = ""
    envelope: _Envelope | None = None
    try:
        envelope = msgspec.json.decode(raw, type=_Envelope) if raw else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        envelope = None
    if envelope is not None and envelope.message:
        message = " ".join(envelope.message.split())[:300]
    if status in (401, 403):
        raise AuthRequired(client._describe(f"{what}: the service refused the credentials ({status})"), server_code=str(status))
    if status >= 400:
        raise ServerHttpError(
            client._describe(f"{what}: HTTP {status}{': ' + message if message else ''}"), status=status,
            retryable=status >= 500 or status == 429,
        )
    if envelope is None:
        raise ServerMalformed(client._describe(f"{what}: the answer is not the V1 envelope"), status=status)
    if str(envelope.code) != SUCCESS or envelope.success is False:
        raise ServerRejected(client._describe(f"{what}: {message or 'refused'} ({envelope.code})"), server_code=str(envelope.code))
    try:
        data = msgspec.json.decode(envelope.data)
    except msgspec.DecodeError:
        data = None
    return data if isinstance(data, dict) else {}

