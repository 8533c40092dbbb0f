"""QimingClient: the HTTP client of one Qiming (nuwax) server account.

Owns: building requests (JSON bodies, ``Authorization: Bearer <token>``, ``X-Client-Type``
so the server hands out and renews tokens for clients, ``x-tenant-id`` when configured),
decoding the ``ReqResult`` envelope into the endpoint's Struct, the error mapping of
``sidecar.sync.errors``, retries, and opening the chat event streams.

Must stay true:
- Errors come back as HTTP 200 with a non-"0000" code; 4010/4011 raise AuthRequired and
  are never retried (a new token is needed: retrying would only repeat the failure).
- Retries (with backoff, honouring Retry-After) happen only for network failures,
  timeouts, 429 and 5xx, and only for calls that are safe to repeat; a call that creates
  something (``/create``, ``/chat``) is retried only when the request never left (connect
  errors), so a retry cannot create a second conversation or start a second turn.
- A body is read up to MAX_BODY_BYTES; more is a ServerMalformed, never an unbounded read.
- Deadlines: a call (every attempt, and the waits between them) is answered or failed
  within ``timeout_s`` (``requestTimeoutMs``) in all, however slowly the server sends
  (httpx's own timeouts bound each read only: a server dripping a byte a second never
  trips them). A stream's response head must arrive within the same bound; after that,
  its events are bounded by the caller's idle timer (sidecar.sync.chatstream).
- What the server sends is decoded with the bounds of sidecar.sync.wire; a value outside
  them is BadServerData naming the field. ``list_conversations`` decodes each row on its
  own, so one bad row is reported (``ConversationPage.bad``) and the others are read.
- The token never appears in a log line or an error message (server text is redacted);
  the client keeps no cookies between calls (each call carries only its own credentials).
"""

from __future__ import annotations

import http.cookiejar
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import quote

import anyio
import httpx2
import msgspec

from sidecar.http_fields import token_problem
from sidecar.providers.redact import Redactor, install_http_log_filter, safe_url
from sidecar.providers.transport import (
    RETRY_STATUSES,
    IdleTimeoutTransport,
    close_quietly,
    read_error_body,
    retry_delay,
)
from sidecar.providers.types import ProviderSettings
from sidecar.sync.bodies import (
    ChatAttachment,
    ComputerCancelBody,
    ComputerChatBody,
    ComputerOutcome,
    ComputerPermissionBody,
    ComputerPermissionResponse,
    ComputerResolve,
    CreateBody,
    CreateWithMessages,
    ListQuery,
    LoginBody,
    MessageQuery,
    PageResultBody,
    PermissionBody,
    PermissionOption,
    PushedMessage,
    ShareBody,
    SuggestBody,
    TryReqDto,
    UpdateBody,
)
from sidecar.sync.errors import (
    CONVERSATION_NOT_FOUND,
    AuthRequired,
    BadServerData,
    ConversationGone,
    QimingError,
    ServerHttpError,
    ServerMalformed,
    ServerRejected,
    ServerUnreachable,
)
from sidecar.sync.streams import agent_outputs, session_frames
from sidecar.sync.wire import (
    AUTH_CODES,
    SUCCESS,
    AgentOutputDto,
    ChatMessageDto,
    ComputerChatResponse,
    ConversationDto,
    ConversationPage,
    Envelope,
    LoginResDto,
    SessionFrame,
    UserDto,
    UserShareDto,
    conversation_page,
)

__all__ = [
    "ClientSettings",
    "QimingClient",
    "TryReqDto",
    "ChatAttachment",
    "ComputerChatBody",
    "MAX_BODY_BYTES",
    "CLIENT_TYPE",
    "CONVERSATION_API",
    "COMPUTER_API",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BODY_BYTES = 64 * 1024 * 1024
CLIENT_TYPE = "desktop"
"""Sent as ``X-Client-Type``: the server returns ``data.token`` on login only when the header
is present, and renews such tokens server-side instead of rotating a cookie."""
CONVERSATION_API = "/api/agent/conversation"
COMPUTER_API = "/api/computer"
"""The seed's chat API (``/chat``, ``/progress/{sessionId}``, ``/cancel``) where a server offers it."""
_MIN_AUTH_HEADER = 36
"""The server ignores an ``Authorization`` of 35 characters or fewer (then the token goes
in the ``ticket`` cookie, which it reads first)."""

_encode = msgspec.json.Encoder().encode
_envelope = msgspec.json.Decoder(Envelope)
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    found = _decoders.get(kind)
    if found is None:
        found = _decoders[kind] = msgspec.json.Decoder(kind)
    return found


class ClientSettings(msgspec.Struct, frozen=True, kw_only=True):
    service_url: str
    """Scheme, host and optional port (and path prefix) of the server; ``/api/...`` follows."""
    timeout_s: float = 30.0
    """Each call in all (its retries included); a stream's response head."""
    connect_timeout_s: float = 10.0
    max_retries: int = 2
    retry_backoff_s: float = 0.5
    retry_after_cap_s: float = 30.0
    tenant_id: int | None = None


class QimingClient:
    """One server account's calls; ``aclose`` when done."""

    def __init__(
        self,
        settings: ClientSettings,
        *,
        token: str | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self._token = token
        try:
            self._base = httpx2.URL(settings.service_url.rstrip("/"))
        except httpx2.InvalidURL as exc:
            raise ServerMalformed(f"invalid server URL: {exc}") from exc
        self._label = safe_url(settings.service_url)
        self._redactor = Redactor(token, {}, settings.service_url)
        # retry_delay's own rules (Retry-After first, else backoff with jitter, capped)
        self._retry_rules = ProviderSettings(
            type="openai-compat", base_url="", retry_backoff=settings.retry_backoff_s,
            retry_after_cap=settings.retry_after_cap_s, max_retries=settings.max_retries,
        )
        timeout = httpx2.Timeout(
            connect=settings.connect_timeout_s, read=settings.timeout_s, write=settings.timeout_s,
            pool=settings.connect_timeout_s,
        )
        if transport is not None and not isinstance(transport, httpx2.AsyncHTTPTransport):
            transport = IdleTimeoutTransport(transport)
        install_http_log_filter()
        # no cookie is kept between calls: each call carries only this account's token
        jar = http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self._http = httpx2.AsyncClient(
            transport=transport, timeout=timeout, follow_redirects=False, cookies=jar
        )

    def __repr__(self) -> str:
        return f"QimingClient({self._label!r}, token={'***' if self._token else None})"

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._http.aclose()

    async def __aenter__(self) -> QimingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- endpoints ------------------------------------------------------------------

    async def login(self, account: str, password: str) -> tuple[str, LoginResDto]:
        """``passwordLogin``; returns the token (``data.token``, else the ``ticket`` cookie)."""
        body = LoginBody(phone_or_email=account, password=password)
        response_cookies: dict[str, str] = {}
        self._redactor = Redactor(password, {}, self.settings.service_url)  # whatever the server echoes
        try:
                result: LoginResDto | None = await self.call(
                "POST", "/api/user/passwordLogin", body, LoginResDto, auth=False, cookies_out=response_cookies
            )
        finally:
            self._redactor = Redactor(self._token, {}, self.settings.service_url)
        assert result is not None
        token = result.token or response_cookies.get("ticket") or ""
        if not token:
            raise ServerMalformed(f"{self._label}: the login succeeded but returned no token")
        if token_problem(token):
            raise ServerMalformed(f"{self._label}: the login returned a token that an HTTP header cannot carry")
        self.set_token(token)
        return token, result

    async def login_info(self, *, timeout_s: float | None = None, retries: int | None = None) -> UserDto:
        user: UserDto | None = await self.call(
            "GET", "/api/user/getLoginInfo", None, UserDto, timeout_s=timeout_s, retries=retries
        )
        if user is None:
            raise ServerMalformed(f"{self._label}: getLoginInfo returned no user")
        return user

    async def logout(self) -> None:
        await self.call("GET", "/api/user/logout", None, None, retries=0)

    async def list_conversations(
        self, *, agent_id: int | None = None, last_id: int | None = None, limit: int | None = None,
        topic: str | None = None,
    ) -> ConversationPage:
        body = ListQuery(agent_id=agent_id, last_id=last_id, limit=limit, topic=topic)
        path = f"{CONVERSATION_API}/list"
        raws: list[msgspec.Raw] = await self.call("POST", path, body, list[msgspec.Raw]) or []
        return conversation_page(raws, lambda what, exc: self._bad(f"{path}: {what}", exc))

    async def list_messages(
        self, conversation_id: int, *, index: int | None = None, size: int | None = None
    ) -> list[ChatMessageDto]:
        """One page of a conversation's messages; BadServerData when any of them is out of
        bounds (a conversation is imported whole or not at all)."""
        body = MessageQuery(conversation_id=conversation_id, index=index, size=size)
        return await self.call("POST", f"{CONVERSATION_API}/message/list", body, list[ChatMessageDto]) or []

    async def get_conversation(self, conversation_id: int) -> ConversationDto:
        found: ConversationDto | None = await self.call(
            "POST", f"{CONVERSATION_API}/{conversation_id}", None, ConversationDto
        )
        if found is None:
            raise ServerMalformed(f"{self._label}: conversation {conversation_id} came back empty")
        return found

    async def create_conversation(
        self, agent_id: int, *, title: str | None = None, messages: list[tuple[str, str]] | None = None
    ) -> ConversationDto:
        """``/create``. ``title``/``messages`` are sent only to servers that accept them (the
        caller knows: the real server silently ignores them)."""
        body: CreateBody
        if messages is not None:
            body = CreateWithMessages(
                agent_id=agent_id, title=title or "",
                messages=[PushedMessage(role=role, content=text) for role, text in messages],
            )
        else:
            body = CreateBody(agent_id=agent_id)
        created: ConversationDto | None = await self.call(
            "POST", f"{CONVERSATION_API}/create", body, ConversationDto, idempotent=False
        )
        if created is None:
            raise ServerMalformed(f"{self._label}: /create returned no conversation")
        return created

    async def update_conversation(
        self, conversation_id: int, *, topic: str | None = None, first_message: str | None = None
    ) -> ConversationDto:
        body = UpdateBody(id=conversation_id, topic=topic, first_message=first_message)
        updated: ConversationDto | None = await self.call("POST", f"{CONVERSATION_API}/update", body, ConversationDto)
        return updated if updated is not None else ConversationDto()

    async def delete_conversation(self, conversation_id: int) -> None:
        await self.call("POST", f"{CONVERSATION_API}/delete/{conversation_id}", None, None)

    async def share_conversation(
        self, conversation_id: int, *, share_type: str = "CONVERSATION", expire_seconds: int | None = None,
        content: str | None = None,
    ) -> UserShareDto:
        body = ShareBody(
            conversation_id=conversation_id, type=share_type, expire_seconds=expire_seconds, content=content
        )
        share: UserShareDto | None = await self.call("POST", f"{CONVERSATION_API}/share", body, UserShareDto)
        if share is None or not share.share_key:
            raise ServerMalformed(f"{self._label}: /share returned no share key")
        return share

    async def chat_stop(self, conversation_id: int) -> None:
        await self.call("POST", f"{CONVERSATION_API}/chat/stop/{conversation_id}", None, None)

    async def permission_response(
        self, conversation_id: int, tool_id: str, option_id: str, *, outcome: str = "selected"
    ) -> None:
        body = PermissionBody(
            conversation_id=conversation_id, tool_id=tool_id,
            option=PermissionOption(option_id=option_id, outcome=outcome),
        )
        await self.call("POST", f"{CONVERSATION_API}/chat/permission-request/response", body, None)

    async def suggest(self, conversation_id: int) -> list[str]:
        """``/chat/suggest``; the server answers ``[]`` when it has none (or timed out)."""
        body = SuggestBody(conversation_id=conversation_id)
        found = await self.call("POST", f"{CONVERSATION_API}/chat/suggest", body, list[str])
        return found or []

    async def page_result(self, request_id: str, html: str) -> None:
        """``/chat/page/result``: the HTML of a page the server's agent asked for."""
        await self.call(
            "POST", f"{CONVERSATION_API}/chat/page/result", PageResultBody(request_id=request_id, html=html), None
        )

    @asynccontextmanager
    async def chat(
        self, request: TryReqDto, *, read_timeout_s: float | None = None
    ) -> AsyncIterator[AsyncIterator[AgentOutputDto]]:
        """``POST /chat``; yields its AgentOutputDto events (the last one has ``completed:
        true``). Starting a turn is never retried."""
        async with self._open_stream(
            "POST", f"{CONVERSATION_API}/chat", request, idempotent=False, read_timeout_s=read_timeout_s
        ) as events:
            yield events

    @asynccontextmanager
    async def chat_sub(
        self, conversation_id: int, *, read_timeout_s: float | None = None
    ) -> AsyncIterator[AsyncIterator[AgentOutputDto]]:
        """``GET /chat/sub/{id}``: the running turn's events, replayed then live."""
        async with self._open_stream(
            "GET", f"{CONVERSATION_API}/chat/sub/{conversation_id}", None, read_timeout_s=read_timeout_s
        ) as events:
            yield events

    async def computer_chat(self, body: ComputerChatBody) -> ComputerChatResponse:
        """``POST /api/computer/chat``: starts the prompt; the answer names the session whose
        progress stream carries it. Never retried once sent."""
        answer: ComputerChatResponse | None = await self.call(
            "POST", f"{COMPUTER_API}/chat", body, ComputerChatResponse, idempotent=False
        )
        if answer is None:
            raise ServerMalformed(f"{self._label}: /api/computer/chat answered no session")
        return answer

    @asynccontextmanager
    async def computer_progress(
        self, session_id: str, *, read_timeout_s: float | None = None
    ) -> AsyncIterator[AsyncIterator[SessionFrame]]:
        """``GET /api/computer/progress/{sessionId}``: the session's progress frames."""
        async with self._open_stream(
            "GET", f"{COMPUTER_API}/progress/{quote(session_id, safe='')}", None, parse=session_frames,
            read_timeout_s=read_timeout_s,
        ) as events:
            yield events

    async def computer_cancel(self, *, user_id: str, project_id: str, session_id: str) -> None:
        body = ComputerCancelBody(user_id=user_id, project_id=project_id, session_id=session_id)
        await self.call("POST", f"{COMPUTER_API}/cancel", body, None)

    async def computer_permission(
        self, *, user_id: str, project_id: str, session_id: str, tool_call_id: str, option_id: str, outcome: str
    ) -> None:
        body = ComputerPermissionBody(
            user_id=user_id, project_id=project_id,
            permission_resolve_request=ComputerResolve(
                session_id=session_id, tool_call_id=tool_call_id,
                request_permission_response=ComputerPermissionResponse(
                    outcome=ComputerOutcome(outcome=outcome, optionId=option_id)
                ),
            ),
        )
        await self.call("POST", f"{COMPUTER_API}/notify-resolved", body, None)

    # ---- the one request path -------------------------------------------------------

    def set_token(self, token: str | None) -> None:
        self._token = token
        self._redactor = Redactor(token, {}, self.settings.service_url)

    def _headers(self, auth: bool, accept: str = "application/json") -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": accept, "X-Client-Type": CLIENT_TYPE}
        if self.settings.tenant_id is not None:
            headers["x-tenant-id"] = str(self.settings.tenant_id)
        if auth and self._token:
            if token_problem(self._token):  # stored by a version that did not check it
                raise AuthRequired(self._describe("the stored token cannot be sent in an HTTP header:"
                                                  " server:configure with a new token or a login"))
            value = f"Bearer {self._token}"
            if len(value) >= _MIN_AUTH_HEADER:
                headers["Authorization"] = value
            else:
                headers["Cookie"] = f"ticket={self._token}"
        return headers

    def _url(self, path: str) -> httpx2.URL:
        return self._base.copy_with(path=self._base.path.rstrip("/") + path)

    def _describe(self, text: str) -> str:
        return self._redactor.redact(f"{self._label}: {text}")

    async def call(
        self,
        method: str,
        path: str,
        body: msgspec.Struct | None,
        kind: Any,
        *,
        idempotent: bool = True,
        auth: bool = True,
        timeout_s: float | None = None,
        retries: int | None = None,
        cookies_out: dict[str, str] | None = None,
    ) -> Any:
        """One call: the envelope's ``data`` decoded into ``kind`` (None: not decoded),
        answered or failed within ``timeout_s`` (default: the account's) in all."""
        content = _encode(body) if body is not None else None
        max_retries = self.settings.max_retries if retries is None else retries
        total = self.settings.timeout_s if timeout_s is None else timeout_s
        timeout = self._http.timeout
        if timeout_s is not None:
            timeout = httpx2.Timeout(timeout_s, connect=min(timeout_s, self.settings.connect_timeout_s))
        deadline = anyio.current_time() + total
        attempt = 0
        while True:
            request = self._http.build_request(
                method, self._url(path), content=content, headers=self._headers(auth), timeout=timeout,
            )
            with anyio.move_on_after(deadline - anyio.current_time()) as scope:
                outcome = await self._attempt(request, path, idempotent, cookies_out)
            if scope.cancelled_caught:
                raise ServerUnreachable(self._describe(f"{path}: no complete answer within {total:g} s"), timeout=True)
            if isinstance(outcome, bytes):
                return self._decode(outcome, kind, path)
            failure, may_retry, headers_for_delay = outcome
            if not (failure.retryable and may_retry) or attempt >= max_retries:
                raise failure
            delay = retry_delay(self._retry_rules, attempt, headers_for_delay)
            if anyio.current_time() + delay >= deadline:
                raise failure  # no time left for another attempt
            attempt += 1
            log.warning("%s; retry %d/%d in %.2fs", failure.message, attempt, max_retries, delay)
            await anyio.sleep(delay)

    async def _attempt(
        self, request: httpx2.Request, path: str, idempotent: bool, cookies_out: dict[str, str] | None
    ) -> bytes | tuple[QimingError, bool, httpx2.Headers | None]:
        """One attempt: the body of a 200 answer, or the failure, whether it may be retried,
        and the headers that say when."""
        try:
            response = await self._http.send(request, stream=True)
        except httpx2.TransportError as exc:
            return self._transport_failure(exc), idempotent or isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)), None
        try:
            raw = await self._read_body(response, path)
            if cookies_out is not None:
                cookies_out.update({k: v for k, v in response.cookies.items()})
        except QimingError as exc:
            return exc, idempotent, None
        except httpx2.TransportError as exc:
            return self._transport_failure(exc), idempotent, None
        finally:
            await close_quietly(response)
        status = response.status_code
        if status == 200:
            return raw
        return self._status_failure(status, raw, response.headers), idempotent or status in (429, 503), response.headers

    async def _read_body(self, response: httpx2.Response, path: str) -> bytes:
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > MAX_BODY_BYTES:
                raise ServerMalformed(self._describe(f"{path}: the answer is larger than {MAX_BODY_BYTES} bytes"))
        return bytes(data)

    def _transport_failure(self, exc: httpx2.TransportError) -> ServerUnreachable:
        if isinstance(exc, httpx2.TimeoutException):
            return ServerUnreachable(self._describe(f"no answer in time ({type(exc).__name__})"), timeout=True)
        if isinstance(exc, httpx2.ConnectError):
            return ServerUnreachable(self._describe(f"cannot connect ({exc})"))
        return ServerUnreachable(self._describe(f"connection failed ({type(exc).__name__}: {exc})"))

    def _status_failure(self, status: int, raw: bytes, headers: httpx2.Headers) -> QimingError:
        if _looks_like_html(raw, headers):
            detail = "an HTML error page"
        else:
            detail = _clip(raw.decode("utf-8", "replace")) or "no body"
        if status == 401:
            return AuthRequired(self._describe(f"HTTP 401: {detail}"), status=status)
        if 300 <= status < 400:
            where = headers.get("location")
            detail = f"redirected to {safe_url(where)}; check the server URL" if where else detail
        return ServerHttpError(
            self._describe(f"HTTP {status}: {detail}"), status=status, retryable=status in RETRY_STATUSES
        )

    def _decode(self, raw: bytes, kind: Any, path: str) -> Any:
        if _looks_like_html(raw, None):
            raise ServerMalformed(self._describe(f"{path}: an HTML page instead of the JSON envelope"), status=200)
        try:
            envelope = _envelope.decode(raw)
        except RecursionError as exc:
            raise self._bad(f"{path}: the envelope", exc) from None
        except msgspec.DecodeError as exc:  # ValidationError included: not the envelope's shape
            raise ServerMalformed(self._describe(f"{path}: not the JSON envelope ({exc})"), status=200) from exc
        code = None if envelope.code is None else str(envelope.code)
        if code is None:
            raise ServerMalformed(self._describe(f"{path}: the envelope has no code"), status=200)
        if code != SUCCESS:
            message = self._describe(f"{path}: {envelope.message or 'error'} (code {code})")
            if code in AUTH_CODES:
                raise AuthRequired(message, server_code=code)
            if envelope.message and CONVERSATION_NOT_FOUND.lower() in envelope.message.lower():
                raise ConversationGone(message, server_code=code)
            raise ServerRejected(message, server_code=code)
        if kind is None:
            return None
        try:
            return _decoder(kind | None).decode(envelope.data)
        except RecursionError as exc:
            raise self._bad(f"{path}", exc) from None
        except msgspec.DecodeError as exc:  # ValidationError included: well-formed, refused
            raise self._bad(f"{path}", exc) from exc

    def _bad(self, what: str, exc: Exception) -> ServerMalformed:
        """What the decoder refused in ``what``: a value inside it (a field of a row, of a
        message) out of the wire's bounds, or nested too deep, is BadServerData naming the
        field; ``what`` as a whole of the wrong shape is plain ServerMalformed."""
        if isinstance(exc, RecursionError):
            return BadServerData(self._describe(f"{what} is nested too deep to read"))
        text = str(exc)
        field = text.rpartition(" - at `")[2].rstrip("`") if " - at `" in text else None
        if field is None or field == "$":
            return ServerMalformed(self._describe(f"{what}: unexpected data ({text})"), status=200)
        return BadServerData(self._describe(f"{what}: a value the wire contract does not allow ({text})"), field=field)

    @asynccontextmanager
    async def _open_stream(
        self, method: str, path: str, body: Any, *, idempotent: bool = True,
        parse: Callable[[httpx2.Response, Callable[[str], str]], AsyncGenerator[Any, None]] | None = None,
        read_timeout_s: float | None = None,
    ) -> AsyncIterator[AsyncIterator[Any]]:
        content = _encode(body) if body is not None else None
        reader = parse or agent_outputs
        timeout = self._http.timeout
        if read_timeout_s is not None:
            timeout = httpx2.Timeout(
                connect=self.settings.connect_timeout_s, read=read_timeout_s, write=self.settings.timeout_s,
                pool=self.settings.connect_timeout_s,
            )
        head_s = self.settings.timeout_s
        attempt = 0
        while True:
            failure: QimingError
            may_retry = idempotent
            request = self._http.build_request(
                method, self._url(path), content=content,
                headers=self._headers(True, accept="text/event-stream"), timeout=timeout,
            )
            response: httpx2.Response | None = None
            with anyio.move_on_after(head_s) as head:
                try:
                    response = await self._http.send(request, stream=True)
                except httpx2.TransportError as exc:
                    failure = self._transport_failure(exc)
                    may_retry = idempotent or isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout))
            if head.cancelled_caught:
                failure = ServerUnreachable(self._describe(f"{path}: no response head within {head_s:g} s"), timeout=True)
            elif response is not None:
                content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
                if response.status_code == 200 and content_type == "text/event-stream":
                    try:
                        source = reader(response, self._describe)
                        async with aclosing(source) as events:
                            yield events
                    finally:
                        await close_quietly(response)
                    return
                raw = b""
                with anyio.move_on_after(head_s):
                    try:
                        raw = await read_error_body(response)
                    except httpx2.TransportError:
                        pass
                    finally:
                        await close_quietly(response)
                if response.status_code == 200:
                    # an envelope instead of a stream: the server refused before streaming
                    self._decode(raw, None, path)
                    raise ServerMalformed(self._describe(f"{path}: expected an event stream, got {content_type!r}"))
                failure = self._status_failure(response.status_code, raw, response.headers)
            if not (failure.retryable and may_retry) or attempt >= self.settings.max_retries:
                raise failure
            delay = retry_delay(self._retry_rules, attempt, None)
            attempt += 1
            await anyio.sleep(delay)


def _looks_like_html(raw: bytes, headers: httpx2.Headers | None) -> bool:
    if headers is not None and "html" in headers.get("content-type", "").lower():
        return True
    head = raw[:64].lstrip().lower()
    return head.startswith(b"<!doctype html") or head.startswith(b"<html") or head.startswith(b"<")


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
