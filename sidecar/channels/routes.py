"""Routes: where a channel's messages go, and what a session of each route is made of.

Owns ``check_route`` (an upsert's route checked field by field: InvalidParams naming the
field) and ``RoutePlan``, the session a route's chats get:

    local         mode direct, the channel's providerId / modelId / systemPrompt
    assistant     mode direct with the assistant profile chosen for the session
                  (session_context.assistant_id): its system prompt, knowledge bases,
                  memory, Soul.md and tools; the channel's providerId / modelId when set
    acp           mode acp: the ACP engine provider runs every turn, in ``workspaceDir``
    remote-agent  mode remote: every turn goes to the service's V1 API (remote.py)

``route_key`` names a route's target; a chat whose linked session was made for another key
gets a new session (routing.py), so changing a channel's route never mixes two agents'
histories in one session.

Must stay true: nothing here reads the store or the network (the assistant and the provider
are looked up by the service when the channel is saved); a remote token is never part of
the key or of a session's metadata.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from protocol.channels import (
    AcpRoute,
    AssistantRoute,
    ChannelConfig,
    ChannelRoute,
    LocalRoute,
    RemoteAgentAuth,
    RemoteAgentRoute,
)
from protocol.types import SessionMode
from sidecar.errors import InvalidParams
from sidecar.http_fields import value_problem
from sidecar.store.checks import check_workspace_dir

__all__ = ["check_route", "route_key", "RoutePlan", "plan_for", "MASKED", "SESSION_PLACEHOLDER", "REMOTE_TOKEN"]

MASKED = "***"
REMOTE_TOKEN = "remote.token"
"""The channel secret (ChannelRepo) holding the remote-agent route's token."""
SESSION_PLACEHOLDER = "{session_id}"
MAX_URL_CHARS = 2_000
MAX_TOKEN_CHARS = 4_096
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
_FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "content-type", "transfer-encoding", "connection", "accept",
    "accept-encoding", "te", "upgrade", "cookie", "expect", "proxy-authorization",
})
_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/{}-]{0,500}$")


def _bad(field: str, why: str) -> InvalidParams:
    return InvalidParams(f"invalid params: route.{field} {why} - at `$.route.{field}`")


def _name(field: str, value: str) -> str:
    if not value.strip() or len(value) > 200:
        raise _bad(field, "must be 1..200 characters")
    return value


def check_route(route: ChannelRoute) -> ChannelRoute:
    if isinstance(route, AssistantRoute):
        return AssistantRoute(assistant_id=_name("assistantId", route.assistant_id))
    if isinstance(route, AcpRoute):
        try:
            workspace = check_workspace_dir("route.workspaceDir", route.workspace_dir)
        except InvalidParams as exc:
            raise _bad("workspaceDir", "must be an absolute path") from exc
        return AcpRoute(provider_id=_name("providerId", route.provider_id), workspace_dir=workspace or None)
    if isinstance(route, RemoteAgentRoute):
        return _remote(route)
    return LocalRoute()


def _remote(route: RemoteAgentRoute) -> RemoteAgentRoute:
    url = route.service_url.strip()
    parts = urlsplit(url) if len(url) <= MAX_URL_CHARS else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or parts.username or parts.password:
        raise _bad("serviceUrl", "must be an http(s) URL without credentials, query or fragment")
    for field, path in (
        ("chatEndpoint", route.chat_endpoint), ("progressEndpoint", route.progress_endpoint),
        ("cancelEndpoint", route.cancel_endpoint),
    ):
        if not _PATH.match(path) or ".." in path.split("/"):
            raise _bad(field, "must be a path starting with /")
    if route.progress_endpoint.count(SESSION_PLACEHOLDER) != 1:
        raise _bad("progressEndpoint", f"must contain {SESSION_PLACEHOLDER} once")
    for field, path in (("chatEndpoint", route.chat_endpoint), ("cancelEndpoint", route.cancel_endpoint)):
        if "{" in path or "}" in path:
            raise _bad(field, "must not contain braces")
    if not 10_000 <= route.idle_timeout_ms <= 3_600_000:
        raise _bad("idleTimeoutMs", "must be 10000..3600000")
    return RemoteAgentRoute(
        service_url=url.rstrip("/"), auth=_auth(route.auth) if route.auth is not None else None,
        chat_endpoint=route.chat_endpoint, progress_endpoint=route.progress_endpoint,
        cancel_endpoint=route.cancel_endpoint, idle_timeout_ms=route.idle_timeout_ms,
    )


def _auth(auth: RemoteAgentAuth) -> RemoteAgentAuth:
    token = auth.token
    if not token or len(token) > MAX_TOKEN_CHARS or value_problem(token):
        raise _bad("auth.token", f"must be 1..{MAX_TOKEN_CHARS} printable ASCII characters")
    header: str | None = None
    if auth.type == "custom-header":
        header = auth.header_name or ""
        if not _HEADER_NAME.match(header) or header.lower() in _FORBIDDEN_HEADERS:
            raise _bad("auth.headerName", "must be an HTTP header name (not a framing or Host header)")
    elif auth.header_name is not None:
        raise _bad("auth.headerName", "is for type custom-header only")
    return RemoteAgentAuth(type=auth.type, token=token, header_name=header)


def route_key(route: ChannelRoute) -> str:
    """The route's target, without secrets: two routes with one key share sessions."""
    if isinstance(route, AssistantRoute):
        return f"assistant:{route.assistant_id}"
    if isinstance(route, AcpRoute):
        return f"acp:{route.provider_id}:{route.workspace_dir or ''}"
    if isinstance(route, RemoteAgentRoute):
        return f"remote-agent:{route.service_url}{route.chat_endpoint}"
    return "local"


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """The session a chat of this channel gets."""

    mode: SessionMode
    provider_id: str | None
    model_id: str | None
    system_prompt: str | None
    assistant_id: str | None = None
    workspace_dir: str | None = None


def plan_for(config: ChannelConfig) -> RoutePlan:
    route = config.route
    if isinstance(route, AssistantRoute):
        return RoutePlan(
            mode="direct", provider_id=config.provider_id, model_id=config.model_id,
            system_prompt=config.system_prompt, assistant_id=route.assistant_id,
        )
    if isinstance(route, AcpRoute):
        return RoutePlan(
            mode="acp", provider_id=route.provider_id, model_id=config.model_id, system_prompt=config.system_prompt,
            workspace_dir=route.workspace_dir,
        )
    if isinstance(route, RemoteAgentRoute):
        # the remote service chooses its own model: the session names none (no local call
        # is ever made for it)
        return RoutePlan(mode="remote", provider_id="", model_id="", system_prompt=config.system_prompt)
    return RoutePlan(
        mode="direct", provider_id=config.provider_id, model_id=config.model_id, system_prompt=config.system_prompt
    )
