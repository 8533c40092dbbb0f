"""ServerAccount: ``server:configure``, ``server:status``, ``server:logout`` and the account's client.

Owns: checking what ``server:configure`` is given (URL, a token or credentials), logging in
(``passwordLogin`` with ``X-Client-Type`` so the token comes back), reading who the token
belongs to (``getLoginInfo``: the account key is URL + user id, so the links of one
account never mix with another's), the token (stored sealed by the store's Sealer:
SyncRepo seals it on write and opens it on read), and the account state.

Must stay true:
- The token is never returned, logged or put in an error; the password is used for the one
  login call and not kept anywhere.
- ``auth_required`` (the server answered 4010/4011) is sticky: no call is made with that
  token again until ``server:configure`` gives a new one (``server:status`` may check it
  once when asked: if the server accepts it again the state returns to ``ok``). A
  ``server:status:updated`` notification announces every state change.
- A stored token this process cannot open (sealed with a key it was not given) is the
  state ``secrets_locked``: ``server:status`` says so, every call that needs the token
  fails with SecretsLocked (nothing is sent, the stored token is kept as it is); it opens
  again at a start with the right key, or ``server:configure`` replaces it.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx2
import msgspec

from protocol.sync import (
    AgentMode,
    ChatApi,
    ServerConfigureParams,
    ServerState,
    ServerStatus,
    ServerUser,
    SyncResult,
)
from sidecar.errors import InvalidParams, SecretsLocked
from sidecar.http_fields import token_problem
from sidecar.store import AsyncStore, Store
from sidecar.store.ids import now_ms
from sidecar.store.sync_records import AccountRow
from sidecar.sync.client import ClientSettings, QimingClient
from sidecar.sync.errors import AuthRequired, NotConfigured, QimingError, ServerMalformed
from sidecar.sync.run import AccountConfig
from sidecar.sync.wire import UserDto, to_int, to_ms
from sidecar.notify import Notifier
from protocol.notifications import SERVER_STATUS_UPDATED

__all__ = ["ServerAccount", "StoredConfig", "normalize_service_url", "jwt_expiry", "usable_account"]

log = logging.getLogger(__name__)

STATUS_PROBE_TIMEOUT_S = 5.0
MAX_TOKEN_CHARS = 8192
LOCKED_MESSAGE = (
    "the stored server token was sealed with another key: start the sidecar with that key"
    " (sidecar:initialize secretKey) or server:configure again"
)


class StoredConfig(msgspec.Struct, kw_only=True):
    """What ``sync_account.config`` holds (JSON)."""

    agent_id: int | None = None
    messages_on_create: bool = False
    request_timeout_ms: int = 30_000
    tenant_id: int | None = None
    chat_api: ChatApi = "conversation"
    chat_idle_timeout_ms: int = 60_000
    agent_mode: AgentMode | None = None


class _Claims(msgspec.Struct):
    exp: int | float | None = None


_config_json = msgspec.json.Decoder(StoredConfig)
_user_json = msgspec.json.Decoder(ServerUser)
_result_json = msgspec.json.Decoder(SyncResult)
_claims_json = msgspec.json.Decoder(_Claims)
_encode = msgspec.json.Encoder().encode


def normalize_service_url(raw: str) -> str:
    """``scheme://host[:port][/prefix]`` without a trailing slash; InvalidParams otherwise."""
    text = (raw or "").strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidParams(f"serviceUrl is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidParams("serviceUrl must be an http(s) URL with a host, e.g. https://agent.example.com")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise InvalidParams("serviceUrl must not carry credentials, a query or a fragment")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def jwt_expiry(token: str) -> int | None:
    """The ``exp`` claim (ms) of a JWT-shaped token, read without verifying it; None otherwise."""
    pieces = token.split(".")
    if len(pieces) != 3:
        return None
    payload = pieces[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = _claims_json.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return None if claims.exp is None else int(claims.exp * 1000)


def _check_token(token: str) -> str:
    text = token.strip()
    if not text or len(text) > MAX_TOKEN_CHARS or token_problem(text):
        raise InvalidParams(
            f"token must be a non-empty string of at most {MAX_TOKEN_CHARS} printable ASCII characters without spaces"
        )
    return text


_STORED_STATES: dict[str, ServerState] = {"ok": "ok", "auth_required": "auth_required", "logged_out": "logged_out"}


def _stored_state(state: str) -> ServerState:
    """The state column as the wire type (a value this build does not know reads as ``ok``:
    the next call to the server tells)."""
    return _STORED_STATES.get(state, "ok")


def usable_account(s: Store) -> tuple[AccountRow, StoredConfig]:
    """The account when calls can be made with it (in the store's worker thread): else
    NotConfigured (none, or logged out), AuthRequired (the server refused its token) or
    SecretsLocked (its token was sealed with a key this process was not given)."""
    row = s.sync.account()
    if row is None:
        raise NotConfigured("no Qiming server is configured (server:configure)")
    if not row.has_token or row.state == "logged_out":
        raise NotConfigured("logged out of the Qiming server: server:configure with a token or a login")
    if row.state == "auth_required":
        raise AuthRequired("the server token expired: server:configure with a new token or a login")
    if s.sync.token()[1]:
        raise SecretsLocked(LOCKED_MESSAGE)
    return row, _config_json.decode(row.config)


def _user(dto: UserDto) -> ServerUser:
    return ServerUser(
        id=to_int(dto.id), uid=dto.uid, user_name=dto.user_name, nick_name=dto.nick_name, email=dto.email,
        phone=dto.phone, avatar=dto.avatar,
    )


class ServerAccount:
    def __init__(
        self,
        store: AsyncStore,
        notify: Notifier,
        *,
        syncing: Callable[[], bool] = lambda: False,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._store = store
        self._notify = notify
        self._syncing = syncing
        self._transport = transport
        self._client: QimingClient | None = None
        self._lock = anyio.Lock()

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # ---- server:configure -------------------------------------------------------------

    async def configure(self, params: ServerConfigureParams) -> ServerStatus:
        url = normalize_service_url(params.service_url)
        if not 1000 <= params.request_timeout_ms <= 600_000:
            raise InvalidParams("requestTimeoutMs must be between 1000 and 600000")
        if params.agent_id is not None and params.agent_id <= 0:
            raise InvalidParams("agentId must be a positive server agent id")
        has_login = params.username is not None or params.password is not None
        if (params.token is not None) == has_login:
            raise InvalidParams("give either token, or username and password")
        if has_login and not (params.username and params.username.strip() and params.password):
            raise InvalidParams("username and password must both be given and non-empty")
        token = _check_token(params.token) if params.token is not None else None
        config = StoredConfig(
            agent_id=params.agent_id, messages_on_create=params.messages_on_create,
            request_timeout_ms=params.request_timeout_ms, tenant_id=params.tenant_id,
            chat_api=params.chat_api, chat_idle_timeout_ms=params.chat_idle_timeout_ms, agent_mode=params.agent_mode,
        )
        client = QimingClient(self._settings(url, config), token=token, transport=self._transport)
        try:
            if token is None:
                assert params.username is not None and params.password is not None
                token, login = await client.login(params.username.strip(), params.password)
                expires = to_ms(login.expire_date) or jwt_expiry(token)
            else:
                expires = jwt_expiry(token)
            user = _user(await client.login_info())
        except BaseException:
            await client.aclose()
            raise
        if user.id is None:
            await client.aclose()
            raise ServerMalformed("getLoginInfo returned a user without an id")
        async with self._lock:
            account_key, user_json, config_json = f"{url}#{user.id}", _encode(user).decode(), _encode(config).decode()
            await self._store.run(lambda s: s.sync.save_account(
                service_url=url, account_key=account_key, token=token, token_expires_at=expires,
                user=user_json, config=config_json, now=now_ms(),
            ))
            old, self._client = self._client, client
        if old is not None:
            await old.aclose()
        log.info("server account configured: %s (user %s)", url, user.id)
        status = await self.status(probe=False)
        status.reachable = True
        await self._notify(SERVER_STATUS_UPDATED, status)
        return status

    def _settings(self, url: str, config: StoredConfig) -> ClientSettings:
        return ClientSettings(
            service_url=url, timeout_s=config.request_timeout_ms / 1000,
            connect_timeout_s=min(10.0, config.request_timeout_ms / 1000), tenant_id=config.tenant_id,
        )

    # ---- the account for a run ----------------------------------------------------------

    async def open(self) -> tuple[QimingClient, AccountConfig]:
        """The client and account of a run or a forwarded turn; NotConfigured / AuthRequired
        / SecretsLocked (see ``usable_account``; no call is made)."""
        row, config = await self._store.run(usable_account)
        user = _user_json.decode(row.user) if row.user else None
        return await self._client_for(row, config), AccountConfig(
            account_key=row.account_key, agent_id=config.agent_id, messages_on_create=config.messages_on_create,
            user_id=user.id if user is not None else None, chat_api=config.chat_api,
            chat_idle_timeout_s=config.chat_idle_timeout_ms / 1000, agent_mode=config.agent_mode,
        )

    async def _client_for(self, row: AccountRow, config: StoredConfig) -> QimingClient:
        async with self._lock:
            if self._client is None or self._client.settings != self._settings(row.service_url, config):
                token, locked = await self._store.run(lambda s: s.sync.token())
                if locked:
                    raise SecretsLocked(LOCKED_MESSAGE)
                if token is None:
                    raise NotConfigured("no server token is stored: server:configure again")
                old, self._client = self._client, QimingClient(
                    self._settings(row.service_url, config), token=token, transport=self._transport
                )
                if old is not None:
                    await old.aclose()
            return self._client

    async def auth_expired(self, exc: AuthRequired) -> None:
        """The server refused the token: ``auth_required`` until a new one is configured."""
        await self._set_state("auth_required", exc.message)

    async def _set_state(self, state: ServerState, message: str | None = None) -> None:
        row = await self._store.run(lambda s: s.sync.account())
        if row is None or row.state == state:
            return
        await self._store.run(lambda s: s.sync.set_state(state, now_ms()))
        log.warning("server account: %s%s", state, f" ({message})" if message else "")
        status = await self.status(probe=False)
        status.message = message
        await self._notify(SERVER_STATUS_UPDATED, status)

    async def record_result(self, result: SyncResult) -> None:
        encoded = _encode(result).decode()
        await self._store.run(lambda s: s.sync.record_sync(result.finished_at, encoded))

    # ---- server:status / server:logout --------------------------------------------------

    async def status(self, *, probe: bool = True) -> ServerStatus:
        row = await self._store.run(lambda s: s.sync.account())
        if row is None:
            return ServerStatus(configured=False, syncing=self._syncing())
        config = _config_json.decode(row.config)
        status = ServerStatus(
            configured=True, service_url=row.service_url, state=_stored_state(row.state),
            user=_user_json.decode(row.user) if row.user else None, token_expires_at=row.token_expires_at,
            agent_id=config.agent_id, messages_on_create=config.messages_on_create, syncing=self._syncing(),
            last_sync_at=row.last_sync_at,
            last_result=_result_json.decode(row.last_result) if row.last_result else None,
            chat_api=config.chat_api, chat_idle_timeout_ms=config.chat_idle_timeout_ms, agent_mode=config.agent_mode,
        )
        if row.has_token and row.state != "logged_out" and (await self._store.run(lambda s: s.sync.token()))[1]:
            status.state, status.message = "secrets_locked", LOCKED_MESSAGE
            return status
        if not probe or not row.has_token or row.state == "logged_out":
            return status
        try:
            client = await self._client_for(row, config)
            await client.login_info(timeout_s=min(STATUS_PROBE_TIMEOUT_S, config.request_timeout_ms / 1000), retries=0)
        except AuthRequired as exc:
            status.reachable, status.message = True, exc.message
            if row.state != "auth_required":
                await self._set_state("auth_required", exc.message)
            status.state = "auth_required"
        except QimingError as exc:
            status.reachable, status.message = False, exc.message
        else:
            status.reachable = True
            if row.state == "auth_required":
                await self._set_state("ok")
                status.state = "ok"
        return status

    async def logout(self) -> None:
        row = await self._store.run(lambda s: s.sync.account())
        if row is None:
            raise NotConfigured("no Qiming server is configured")
        if row.has_token and row.state != "auth_required":
            try:
                client = await self._client_for(row, _config_json.decode(row.config))
                with anyio.move_on_after(STATUS_PROBE_TIMEOUT_S):
                    await client.logout()
            except (QimingError, SecretsLocked) as exc:  # the local logout stands whatever happens
                log.info("server logout call failed: %s", exc.message)
        await self._store.run(lambda s: s.sync.clear_token(now_ms()))
        await self.aclose()
        status = await self.status(probe=False)
        await self._notify(SERVER_STATUS_UPDATED, status)
