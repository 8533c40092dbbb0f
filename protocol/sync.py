"""``server:*`` and ``sync:*``: the Qiming server account, two-way sync, and the server conversation API.

The server is the Qiming (nuwax) backend; its own wire contract is summarized in the
README ("Qiming server"). Conversation ids are the server's (numbers); session ids ours.
A server conversation is addressed by the local session linked to it (``sessionId``) or
by its id (``conversationId``); exactly one of them is given.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from protocol.common import EmptyParams, MethodSpec, ProgressToken, SuccessResult
from protocol.limits import Id, Title
from protocol.types import SessionV2, Struct

__all__ = [
    "ServerState",
    "ServerConfigureParams",
    "ServerUser",
    "ServerStatus",
    "SyncParams",
    "SyncPushParams",
    "SyncConflict",
    "SyncIssue",
    "NotPushed",
    "SyncResult",
    "SyncSettings",
    "SyncSettingsUpdate",
    "ConversationRef",
    "ServerConversationUpdateParams",
    "ServerConversationDeleteParams",
    "ServerConversationShareParams",
    "ServerConversation",
    "ServerShare",
    "ChatApi",
    "SyncPhase",
    "AgentMode",
    "ServerSessionCreateParams",
    "ChatSuggestParams",
    "ServerPageResultParams",
    "MAX_PAGE_HTML_CHARS",
]

ChatApi = Literal["conversation", "computer"]
"""How a server takes forwarded chat turns: ``conversation`` (the real server:
``POST /api/agent/conversation/chat``, its AgentOutputDto stream, ``/chat/sub`` to
re-attach) or ``computer`` (``POST /api/computer/chat`` + ``GET /api/computer/progress/{id}``,
the desktop's ``/computer/progress`` frames)."""
AgentMode = Literal["yolo", "ask"]
"""TryReqDto ``agentMode``: ``ask`` makes the server's agent ask before it uses tools (its
permission requests come as pending approvals); ``yolo`` lets it act (the web UI's default)."""
MAX_PAGE_HTML_CHARS = 8_000_000

ServerState = Literal["unconfigured", "ok", "auth_required", "logged_out", "secrets_locked"]
"""``auth_required``: the server said the token expired (4010/4011); nothing is retried
until ``server:configure`` gives a new token or credentials. ``secrets_locked``: the stored
token was sealed with a key this process was not given (``sidecar:initialize`` counts it
in ``secrets.locked``); calls that need it fail with SECRETS_LOCKED until the sidecar
starts with that key or ``server:configure`` replaces the token."""


class ServerConfigureParams(Struct, kw_only=True):
    """``server:configure``: a token, or a username (phone or e-mail) and password to log in with."""

    service_url: str
    """``https://host[:port]``; the API is under ``/api``."""
    token: str | None = None
    username: str | None = None
    password: str | None = None
    """Used once to log in; never stored."""
    agent_id: int | None = None
    """The server agent new local sessions are pushed to (without it they are not pushed)."""
    messages_on_create: bool = False
    """The server accepts the seed's ``/create {agentId, title, messages}`` (the real one
    takes no messages: leave this off unless the server documents it)."""
    request_timeout_ms: int = 30_000
    """Each call to the server in all (1000..600000): connecting, sending, the whole answer,
    and its retries; for a chat stream, the time to its response head (its events are then
    bounded by ``chatIdleTimeoutMs``)."""
    tenant_id: int | None = None
    """Sent as ``x-tenant-id`` for servers that cannot tell the tenant from the host name."""
    chat_api: ChatApi = "conversation"
    """Which chat API forwarded turns (``mode: "server"`` sessions) use on this server."""
    chat_idle_timeout_ms: Annotated[int, msgspec.Meta(ge=500, le=600_000)] = 60_000
    """A forwarded turn's stream silent for this long (no event, not even a heart beat) is
    dropped and re-attached (the web client's own limit is 60 s)."""
    agent_mode: AgentMode | None = None
    """Sent as ``agentMode`` with every forwarded turn (absent: the server's default)."""


class ServerUser(Struct, omit_defaults=False, kw_only=True):
    id: int | None = None
    uid: str | None = None
    user_name: str | None = None
    nick_name: str | None = None
    email: str | None = None
    phone: str | None = None
    avatar: str | None = None


class SyncConflict(Struct, omit_defaults=False, kw_only=True):
    """Something both sides changed: what was decided (nothing is dropped silently)."""

    kind: Literal["metadata", "branches", "deleted_locally", "deleted_on_server"]
    session_id: str | None = None
    conversation_id: int | None = None
    field: str | None = None
    """For ``metadata``: ``title``."""
    winner: Literal["local", "server", "both"]
    """``both``: kept side by side (branches; a conversation kept on the side that changed)."""
    local_value: str | None = None
    server_value: str | None = None
    message: str


SyncPhase = Literal["list", "pull", "probe", "push", "delete"]
"""The part of a sync run an issue comes from."""


class SyncIssue(Struct, omit_defaults=False, kw_only=True):
    """One thing a run could not do; the next run tries again."""

    phase: SyncPhase
    kind: str
    """``network``, ``timeout``, ``http``, ``malformed``, ``envelope``, ``auth_required``,
    ``not_found``, ``no_agent``, ``store``."""
    message: str
    session_id: str | None = None
    conversation_id: int | None = None
    status: int | None = None
    code: str | None = None
    """The server's envelope code."""
    retryable: bool = False


class SkippedConversation(Struct, omit_defaults=False, kw_only=True):
    """A server conversation a pull could not read: a value outside the wire contract's
    bounds (an id or index past int64, a date past year 9999, nesting too deep). Nothing
    of it was stored; every later pull tries it again and reports it until the server
    sends it within bounds."""

    conversation_id: int | None = None
    """None when its id itself was unusable."""
    session_id: str | None = None
    """The local session linked to it, if any (left as it was)."""
    field: str | None = None
    """Where the value was, as a JSON path within the row or item (``$.modified``), when known."""
    message: str


class NotPushed(Struct, omit_defaults=False, kw_only=True):
    """Messages of a session that stay on this device only (the server cannot take them)."""

    session_id: str
    conversation_id: int | None = None
    messages: int
    reason: str


class SyncResult(Struct, omit_defaults=False, kw_only=True):
    pulled: int = 0
    """Conversations imported or updated from the server."""
    pushed: int = 0
    """Sessions created or updated on the server."""
    deleted: int = 0
    """Deletions carried over (server -> local and local -> server)."""
    messages_pulled: int = 0
    messages_pushed: int = 0
    conflicts: list[SyncConflict] = []
    errors: list[SyncIssue] = []
    skipped: list[SkippedConversation] = []
    """Conversations the server sent out of bounds: not imported, the rest of the pull went on."""
    not_pushed: list[NotPushed] = []
    complete: bool = True
    """False when the run stopped early (auth expired, the list could not be read)."""
    started_at: int = 0
    finished_at: int = 0


class ServerStatus(Struct, omit_defaults=False, kw_only=True):
    configured: bool
    service_url: str | None = None
    state: ServerState = "unconfigured"
    reachable: bool | None = None
    """None when it was not checked (not configured, or logged out)."""
    message: str | None = None
    """Why it is unreachable or needs a login."""
    user: ServerUser | None = None
    token_expires_at: int | None = None
    agent_id: int | None = None
    messages_on_create: bool = False
    syncing: bool = False
    last_sync_at: int | None = None
    last_result: SyncResult | None = None
    chat_api: ChatApi = "conversation"
    chat_idle_timeout_ms: int = 60_000
    agent_mode: AgentMode | None = None


class SyncParams(Struct, kw_only=True):
    agent_id: int | None = None
    """Only conversations with this server agent (``/list {agentId}``)."""
    progress_token: ProgressToken | None = None


class SyncPushParams(Struct, kw_only=True):
    progress_token: ProgressToken | None = None


class SyncSettings(Struct, omit_defaults=False, kw_only=True):
    auto_sync: bool = False
    """Run ``sync:run`` every ``intervalMinutes`` while an account is configured and logged in."""
    interval_minutes: int = 15
    list_page_size: int = 100
    """``/list`` page size (``limit``; the server's own default is 100)."""
    message_page_size: int = 100
    """``/message/list`` page size (``size``; the server's own default is 20)."""


class SyncSettingsUpdate(Struct, forbid_unknown_fields=True, kw_only=True):
    auto_sync: bool | None = None
    interval_minutes: int | None = None
    """1..1440."""
    list_page_size: int | None = None
    """1..1000."""
    message_page_size: int | None = None
    """1..1000."""


class ConversationRef(Struct, kw_only=True):
    session_id: str | None = None
    conversation_id: int | None = None


class ServerConversationUpdateParams(ConversationRef, kw_only=True):
    """Set the topic, or let the server make one from ``firstMessage``; the linked session's
    title follows."""

    topic: str | None = None
    first_message: str | None = None


class ServerConversationDeleteParams(ConversationRef, kw_only=True):
    delete_local: bool = False
    """Also delete the linked session; otherwise it stays on this device, unlinked (it is not
    pushed again)."""


class ServerConversationShareParams(ConversationRef, kw_only=True):
    type: Literal["CONVERSATION", "DESKTOP", "MESSAGE"] = "CONVERSATION"
    expire_seconds: int | None = None
    content: str | None = None


class ServerConversation(Struct, omit_defaults=False, kw_only=True):
    id: int
    agent_id: int | None = None
    topic: str | None = None
    summary: str | None = None
    type: str | None = None
    task_status: str | None = None
    topic_updated: int | None = None
    sandbox_server_id: str | None = None
    sandbox_session_id: str | None = None
    created: int | None = None
    modified: int | None = None
    session_id: str | None = None
    """The local session linked to it, if any."""


class ServerShare(Struct, omit_defaults=False, kw_only=True):
    share_key: str
    id: int | None = None
    type: str | None = None
    target_id: str | None = None
    expire: int | None = None
    created: int | None = None


class ServerSessionCreateParams(Struct, kw_only=True):
    """A ``mode: "server"`` session: linked to the conversation ``conversationId`` (its
    history imported; a session already linked to it becomes a server session), or to a new
    conversation of ``agentId`` (default: the account's agent)."""

    conversation_id: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] | None = None
    agent_id: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] | None = None
    title: Title | None = None
    """The new session's title (and the new conversation's topic)."""


class ChatSuggestParams(Struct, kw_only=True):
    session_id: Id


class ServerPageResultParams(Struct, kw_only=True):
    """``/chat/page/result`` (ModelPageRequestResultDto): the HTML of a page the server's
    agent asked the client to fetch, under the request id it gave."""

    request_id: Id
    html: Annotated[str, msgspec.Meta(max_length=MAX_PAGE_HTML_CHARS)]


METHODS: dict[str, MethodSpec] = {
    "server:configure": MethodSpec(
        ServerConfigureParams, ServerStatus, "Set the Qiming server account (token, or log in)."
    ),
    "server:status": MethodSpec(EmptyParams, ServerStatus, "Account, reachability, token expiry, last sync."),
    "server:logout": MethodSpec(EmptyParams, SuccessResult, "Forget the token (links and data stay)."),
    "sync:pull": MethodSpec(SyncParams, SyncResult, "Import new and changed server conversations."),
    "sync:push": MethodSpec(SyncPushParams, SyncResult, "Send sessions created or changed here to the server."),
    "sync:run": MethodSpec(SyncParams, SyncResult, "Pull, then push."),
    "sync:settings:get": MethodSpec(EmptyParams, SyncSettings, "Sync settings."),
    "sync:settings:update": MethodSpec(SyncSettingsUpdate, SyncSettings, "Change sync settings."),
    "server:conversation:update": MethodSpec(
        ServerConversationUpdateParams, ServerConversation, "Set a server conversation's topic."
    ),
    "server:conversation:delete": MethodSpec(
        ServerConversationDeleteParams, SuccessResult, "Delete a server conversation."
    ),
    "server:conversation:share": MethodSpec(
        ServerConversationShareParams, ServerShare, "Share a server conversation; returns the share key."
    ),
    "server:session:create": MethodSpec(
        ServerSessionCreateParams, SessionV2, "A session whose turns are forwarded to a server conversation."
    ),
    "chat:suggest": MethodSpec(
        ChatSuggestParams, list[str], "Suggested next questions of a server-linked session (/chat/suggest)."
    ),
    "server:chat:pageResult": MethodSpec(
        ServerPageResultParams, SuccessResult, "Hand the server the HTML of a page its agent asked for."
    ),
}
"""The methods of this domain (see ``protocol.methods``)."""
