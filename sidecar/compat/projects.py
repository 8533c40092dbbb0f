"""Projects: V1 ``(user_id, project_id)`` -> a local session, and the provider that runs it.

Mapping rules:
- a project is one session with ``channelId`` ``v1-computer`` and ``channelMeta``
  ``{origin, userId, projectId}`` (visible and filterable in ``chat:session:list``),
  created on the project's first prompt with the request's ``system_prompt``; a request's
  ``session_id`` is used when it names a V1 session of the same user and project (a
  session of another project, or any other local session, is never reachable from here);
- ``agent_config.agent_server`` with a command -> an ``acp-engine`` provider, one per
  command / args / env (id ``v1-acp-<digest>``, so the same engine is reused), started
  and supervised by ACP mode; only commands listed in ``agentCommands`` may run, with the
  entry's ``args`` (a request's args only when the entry sets ``requestArgs``, else a
  request that sends some is refused), and a request's env may set only the names the
  entry lists in ``requestEnv``, never a loader variable (LD_*, DYLD_*, PATH, NODE_OPTIONS...). The
  env placeholders ``{MODEL_PROVIDER_BASE_URL}``, ``{MODEL_PROVIDER_API_KEY}``,
  ``{MODEL_PROVIDER_MODEL}`` come from ``model_provider``; ``{PREFIX_WORKSPACE_DIR}`` (in
  the command, args and env) is ``<root>/computer-project-workspace/<user_id>``;
- else ``model_provider`` -> a direct provider (``openai-compat``, ``anthropic`` or
  ``ollama`` by ``api_protocol``; id ``v1-model-<digest of protocol, base_url, id>``,
  replaced when its key changes) and the model ``model`` or ``default_model``;
- else the default provider (``provider:setDefault``);
- a project whose mode changes (agent <-> direct) gets a new session (an agent session
  cannot continue a direct conversation); provider, model or working directory changes
  update the session;
- the working directory (session ``workspaceDir``, the agent's cwd) is
  ``<root>/computer-project-workspace/<user_id>/<agent_work_dir or project_id>``, or
  an absolute ``agent_work_dir`` that exists inside that user's directory or one of the
  host's ``workDirRoots`` (never another user's directory, never ``/``).

Must stay true: every id that reaches a path or the store was checked
(sidecar.compat.validate); the index of projects is rebuilt from the store on first use
(the store is the truth: a session deleted by the renderer is simply gone).
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import msgspec

from protocol.chat import UserInput
from protocol.common import IdParams
from protocol.compat import CompatAgentCommand
from protocol.providers import AcpEngineConfig, ProviderInfo, ProviderKind, ProviderUpsertParams
from protocol.sessions import CreateSessionOptions, SessionFilter, SessionListResult, SessionUpdateParams, SessionUpdates
from protocol.types import SessionV2
from sidecar.compat import attachments, validate
from sidecar.compat.rules import Rule, compile_rules
from sidecar.compat.wire import INTERNAL, ComputerChatRequest, V1Error, invalid, text_id
from sidecar.errors import NotFound, SidecarError
from sidecar.http_fields import value_problem

log = logging.getLogger(__name__)

CHANNEL_ID = "v1-computer"
ORIGIN = "v1 /computer/chat"
PROTOCOL_TYPES: dict[str, ProviderKind] = {"anthropic": "anthropic", "openai": "openai-compat", "ollama": "ollama"}
MAX_PROMPT_CHARS = 10 * 1024 * 1024
MAX_ENV = 256
MAX_ARGS = 256
MAX_REQUEST_ID = 256
LOADER_ENV_PREFIXES = ("LD_", "DYLD_")
LOADER_ENV = frozenset({
    "PATH", "NODE_OPTIONS", "NODE_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
    "BASH_ENV", "ENV", "PERL5OPT", "PERL5LIB", "RUBYOPT", "RUBYLIB",
})
"""Variables that make an allowed program load or run other code: a request may not set them."""
MAX_REQUEST_ENV = 64


def is_loader_env(name: str) -> bool:
    """Whether ``name`` is a variable that makes a program load or run other code."""
    return name.upper() in LOADER_ENV or name.upper().startswith(LOADER_ENV_PREFIXES)


class Sessions(Protocol):
    async def create_session(self, params: CreateSessionOptions) -> SessionV2: ...

    async def list_sessions(self, params: SessionFilter) -> SessionListResult: ...

    async def get_session(self, params: IdParams) -> SessionV2: ...

    async def update_session(self, params: SessionUpdateParams) -> SessionV2: ...


class Providers(Protocol):
    async def list_providers(self, params: Any = None) -> list[ProviderInfo]: ...

    async def upsert_provider(self, params: ProviderUpsertParams) -> ProviderInfo: ...


class Target(msgspec.Struct, frozen=True):
    mode: Literal["direct", "acp"]
    provider_id: str | None
    model_id: str | None


class Prepared(msgspec.Struct, kw_only=True):
    """A checked /computer/chat request, its session and how to run it."""

    user_id: str
    project_id: str
    session: SessionV2
    is_new: bool
    input: UserInput
    """The prompt with its attachments (sidecar.compat.attachments)."""
    request_id: str | None
    rules: tuple[Rule, ...]
    yolo: bool
    target: Target


class Project(msgspec.Struct, frozen=True):
    user_id: str
    project_id: str
    session_id: str


def _digest(*parts: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()[:20]


class Projects:
    def __init__(
        self,
        *,
        sessions: Sessions,
        providers: Providers,
        root: Path,
        agent_commands: dict[str, CompatAgentCommand],
        work_dir_roots: tuple[Path, ...] = (),
    ) -> None:
        self._sessions = sessions
        self._providers = providers
        self.root = root
        self._agent_commands = agent_commands
        self._work_dir_roots = work_dir_roots
        self._by_key: dict[tuple[str, str], str] | None = None
        self._by_session: dict[str, Project] = {}
        self._ensured: dict[str, str] = {}
        """Provider id -> the fingerprint of the configuration upserted in this process."""
        self._load_lock = anyio.Lock()

    # -- the index ------------------------------------------------------------------

    async def _index(self) -> dict[tuple[str, str], str]:
        if self._by_key is not None:
            return self._by_key
        async with self._load_lock:
            if self._by_key is not None:
                return self._by_key
            by_key: dict[tuple[str, str], str] = {}
            created: dict[tuple[str, str], int] = {}
            offset = 0
            while True:
                page = await self._sessions.list_sessions(
                    SessionFilter(channel_id=CHANNEL_ID, limit=500, offset=offset, sort_by="created_at")
                )
                for session in page.sessions:
                    project = _project_of(session)
                    if project is None:
                        continue
                    self._by_session[session.id] = project
                    key = (project.user_id, project.project_id)
                    # the newest session of a project is its session (a mode change made a new one)
                    if created.get(key, -1) <= session.created_at:
                        by_key[key] = session.id
                        created[key] = session.created_at
                offset += len(page.sessions)
                if not page.sessions or offset >= page.total:
                    break
            self._by_key = by_key
            return by_key

    async def session(self, session_id: str) -> tuple[SessionV2, Project] | None:
        """A V1 session by id (None for an unknown id or any other local session)."""
        await self._index()
        project = self._by_session.get(session_id)
        if project is None:
            return None
        try:
            session = await self._sessions.get_session(IdParams(id=session_id))
        except NotFound:
            self._forget(session_id)
            return None
        return session, project

    async def find(self, user_id: str, project_id: str) -> SessionV2 | None:
        index = await self._index()
        session_id = index.get((user_id, project_id))
        if session_id is None:
            return None
        found = await self.session(session_id)
        return found[0] if found is not None else None

    def count(self) -> int:
        return len(self._by_key or {})

    def _forget(self, session_id: str) -> None:
        project = self._by_session.pop(session_id, None)
        if project is not None and self._by_key is not None:
            if self._by_key.get((project.user_id, project.project_id)) == session_id:
                del self._by_key[(project.user_id, project.project_id)]

    # -- a chat request -------------------------------------------------------------

    async def prepare(self, req: ComputerChatRequest, user_id: str, project_id: str) -> Prepared:
        """Check the rest of the request (``user_id`` and ``project_id`` are checked ids),
        find or create its session and provider. V1Error on bad input."""
        session_id = validate.identifier(text_id(req.session_id), "session_id")
        work = text_id(req.agent_work_dir)
        request_id = text_id(req.request_id)
        if request_id is not None and (len(request_id) > MAX_REQUEST_ID or not request_id.isprintable()):
            raise invalid(f"request_id must be at most {MAX_REQUEST_ID} printable characters")
        if not req.prompt or not req.prompt.strip():
            raise invalid("prompt is required")
        if len(req.prompt) > MAX_PROMPT_CHARS:
            raise invalid("prompt is too long")
        if req.data_source_attachments:
            raise invalid("data_source_attachments are not supported by this endpoint")
        user_input = attachments.user_input(req.prompt, req.attachments)
        server = req.agent_config.agent_server if req.agent_config is not None else None
        rules = compile_rules(server.tool_approval_rules if server is not None else None)
        yolo = server is not None and (server.agent_mode or "").strip().lower() == "yolo"
        # the provider (its checks and an idempotent upsert), then the directory (checked and
        # made in one worker-thread hop), then the session
        target = await self._target(req, user_id)
        work_dir = await anyio.to_thread.run_sync(_work_dir, work or project_id, self.user_dir(user_id), self._work_dir_roots)
        session, is_new = await self._session(user_id, project_id, session_id, target, work_dir, req.system_prompt)
        return Prepared(
            user_id=user_id,
            project_id=project_id,
            session=session,
            is_new=is_new,
            input=user_input,
            request_id=request_id,
            rules=rules,
            yolo=yolo,
            target=target,
        )

    def user_dir(self, user_id: str) -> Path:
        return self.root / "computer-project-workspace" / user_id

    async def _target(self, req: ComputerChatRequest, user_id: str) -> Target:
        server = req.agent_config.agent_server if req.agent_config is not None else None
        if server is not None and server.command:
            return await self._engine(req, user_id)
        mp = req.model_provider
        if mp is not None and mp.base_url:
            return await self._model_provider(req)
        return Target(mode="direct", provider_id=None, model_id=None)

    async def _engine(self, req: ComputerChatRequest, user_id: str) -> Target:
        assert req.agent_config is not None and req.agent_config.agent_server is not None
        server = req.agent_config.agent_server
        requested = server.command or ""
        allowed = self._agent_commands.get(requested)
        if allowed is None:
            raise V1Error(
                200, INTERNAL,
                f"the agent command {requested!r} is not allowed on this computer "
                "(the sidecar's compat:start agentCommands lists the ones that are)",
            )
        # what runs is the host's to choose: a request's arguments and environment reach the
        # program only as far as the host's entry for it lets them
        if allowed.args is not None:
            args = list(allowed.args)
        elif server.args and not allowed.request_args:
            raise invalid(
                f"agent_server.args: the command {requested[:64]!r} takes no arguments from a request "
                "(the sidecar's compat:start agentCommands entry decides them)"
            )
        else:
            args = list(server.args or [])
        env = dict(server.env or {})
        if len(args) > MAX_ARGS or len(env) > MAX_ENV:
            raise invalid(f"agent_server: at most {MAX_ARGS} args and {MAX_ENV} env entries")
        settable = set(allowed.request_env)
        for name, value in env.items():
            if not name or "=" in name or "\x00" in name or "\x00" in value:
                raise invalid(f"agent_server.env has an invalid entry {name[:64]!r}")
            if is_loader_env(name):
                raise invalid(f"agent_server.env may not set {name[:64]}")
            if name not in settable:
                raise invalid(
                    f"agent_server.env may not set {name[:64]} for the command {requested[:64]!r} "
                    "(the sidecar's compat:start agentCommands entry lists the names a request may set)"
                )
        if any("\x00" in a for a in args):
            raise invalid("agent_server.args contains a NUL character")
        mp = req.model_provider
        values = {
            "{MODEL_PROVIDER_BASE_URL}": (mp.base_url if mp else None) or "",
            "{MODEL_PROVIDER_API_KEY}": (mp.api_key if mp else None) or "",
            "{MODEL_PROVIDER_MODEL}": ((mp.model or mp.default_model) if mp else None) or "",
        }
        prefix = {"{PREFIX_WORKSPACE_DIR}": str(self.user_dir(user_id))}
        command = _fill(allowed.command or requested, prefix)
        args = [_fill(a, prefix) for a in args]
        env = {k: _fill(v, {**values, **prefix}) for k, v in sorted(env.items())}
        config = AcpEngineConfig(command=command, args=args, env=env)
        provider_id = "v1-acp-" + _digest(command, args, env)
        name = f"V1 agent {server.agent_id or requested}"[:200]
        await self._ensure(provider_id, _digest("acp", command, args, env), ProviderUpsertParams(
            id=provider_id, name=name, type="acp-engine", engine=config,
        ), replace=False)
        return Target(mode="acp", provider_id=provider_id, model_id=(server.agent_id or "agent")[:200])

    async def _model_provider(self, req: ComputerChatRequest) -> Target:
        mp = req.model_provider
        assert mp is not None and mp.base_url
        protocol = (mp.api_protocol or "openai").strip().lower()
        kind = PROTOCOL_TYPES.get(protocol)
        if kind is None:
            raise invalid("model_provider.api_protocol must be anthropic, openai or ollama")
        if not mp.base_url.startswith(("http://", "https://")):
            raise invalid("model_provider.base_url must be an http(s) URL")
        if mp.api_key and (problem := value_problem(mp.api_key)):
            raise invalid(f"model_provider.api_key {problem}")
        model = mp.model or mp.default_model
        if not model:
            raise invalid("model_provider needs model or default_model")
        provider_id = "v1-model-" + _digest(kind, mp.base_url, text_id(mp.id) or "")
        params = ProviderUpsertParams(
            id=provider_id,
            name=f"V1 model {mp.name or mp.base_url}"[:200],
            type=kind,
            base_url=mp.base_url,
            api_key=mp.api_key or "",
        )
        await self._ensure(provider_id, _digest(kind, mp.base_url, mp.api_key or ""), params, replace=True)
        return Target(mode="direct", provider_id=provider_id, model_id=model[:200])

    async def _ensure(self, provider_id: str, fingerprint: str, params: ProviderUpsertParams, *, replace: bool) -> None:
        """The provider exists with this configuration (upserted at most once per change)."""
        if self._ensured.get(provider_id) == fingerprint:
            return
        existing = next((p for p in await self._providers.list_providers() if p.id == provider_id), None)
        if existing is not None and not existing.enabled:
            raise V1Error(200, INTERNAL, f"the provider {existing.name!r} is disabled on this computer")
        if existing is None or replace:
            try:
                await self._providers.upsert_provider(params)
            except SidecarError as exc:
                raise V1Error(200, INTERNAL, exc.message) from exc
        self._ensured[provider_id] = fingerprint

    async def _session(
        self,
        user_id: str,
        project_id: str,
        session_id: str | None,
        target: Target,
        work_dir: Path,
        system_prompt: str | None,
    ) -> tuple[SessionV2, bool]:
        session: SessionV2 | None = None
        if session_id is not None:
            found = await self.session(session_id)
            if found is not None and (found[1].user_id, found[1].project_id) == (user_id, project_id):
                session = found[0]
        if session is None:
            session = await self.find(user_id, project_id)
        if session is not None and session.mode != target.mode:
            log.info("V1 project %s changed between agent and direct mode: a new session", project_id)
            session = None
        if session is not None:
            updates: dict[str, Any] = {}
            if target.provider_id is not None and session.provider_id != target.provider_id:
                updates["provider_id"] = target.provider_id
            if target.model_id is not None and session.model_id != target.model_id:
                updates["model_id"] = target.model_id
            if session.workspace_dir != str(work_dir):
                updates["workspace_dir"] = str(work_dir)
            if updates:
                session = await self._sessions.update_session(
                    SessionUpdateParams(id=session.id, updates=SessionUpdates(**updates))
                )
            return session, False
        meta = {"origin": ORIGIN, "userId": user_id, "projectId": project_id}
        session = await self._sessions.create_session(CreateSessionOptions(
            provider_id=target.provider_id,
            model_id=target.model_id,
            system_prompt=system_prompt or None,
            mode=target.mode,
            channel_id=CHANNEL_ID,
            channel_meta=meta,
            workspace_dir=str(work_dir),
        ))
        index = await self._index()
        index[(user_id, project_id)] = session.id
        self._by_session[session.id] = Project(user_id=user_id, project_id=project_id, session_id=session.id)
        return session, True


def _work_dir(value: str, user_dir: Path, roots: tuple[Path, ...]) -> Path:
    path = validate.work_dir(value, user_dir, roots)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise V1Error(200, INTERNAL, f"cannot create the project directory: {exc.strerror or exc}") from exc
    return path


def _fill(value: str, table: dict[str, str]) -> str:
    for key, replacement in table.items():
        if key in value:
            value = value.replace(key, replacement)
    return value


def _project_of(session: SessionV2) -> Project | None:
    meta = session.channel_meta or {}
    user_id, project_id = meta.get("userId"), meta.get("projectId")
    if not isinstance(user_id, str) or not isinstance(project_id, str):
        return None
    if not validate.IDENTIFIER.fullmatch(user_id) or not validate.IDENTIFIER.fullmatch(project_id):
        return None
    return Project(user_id=user_id, project_id=project_id, session_id=session.id)


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as V1's ISO-8601 text (``2026-03-09T02:25:01.120Z``)."""
    if ms is None:
        return None
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
