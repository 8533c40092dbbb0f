"""The App: the object that holds the process's services for the lifetime of a server.

``open_app(config, notify)`` builds an App, yields it while the server runs and closes
everything it opened on exit (in reverse order, even when the server is cancelled).
``sidecar/server.py`` binds method names to attribute paths on the App (for example
``"sessions.create_session"``); a service that is not attached yet makes its methods
answer NOT_IMPLEMENTED instead of failing at start-up.

How to add a service: open it inside ``open_app`` (use ``stack`` so it is closed on
exit), attach it as an attribute, document the attribute below. Must stay true:
- ``open_app`` does no slow work on the event loop (blocking I/O goes through
  ``anyio.to_thread``), and heavy imports happen inside it, not at module import, to
  keep start-up fast;
- ``notify`` is the only way a service talks to the client outside a reply.

Attributes:
    config:   the finished Config.
    data_dir: Path of the data directory (created if missing).
    notify:   ``await notify(method, params_struct)`` sends a notification to the client
              (``events.publish``).
    events:   EventHub (sidecar/engine/events.py): the same notifications, with in-process
              subscribers to the ``chat:stream`` events of a session (V1 shim, channels).
    store:    AsyncStore of ``<data_dir>/chat.db`` (sidecar/store), closed on exit: the one way
              into the database (``await store.run(lambda s: s.<repository>.<method>(...))``).
    secrets:  SecretsService (sidecar/engine/secrets.py): settles the key of secrets at rest.
    sessions: SessionService (sidecar/engine/sessions.py): chat:session:* and chat:messages:*.
    assistants: AssistantService (sidecar/engine/assistants.py): assistant:*.
    attachments: AttachmentStore (sidecar/store/attachments.py): stored attachment files.
    requests: RequestBuilder (sidecar/pipeline/builder.py), built once: the generation loop and
              chat:context:* share it (token cache, summary checks, summary locks).
    context:  ContextService (sidecar/engine/context.py): chat:context:* on ``requests``.
    approvals: ApprovalService (sidecar/engine/approvals.py): chat:tool:approve, tool:policy:*,
              tool:audit:list, tool:pending:list; also the ACP permission flow.
    tools:    ToolService (sidecar/tools/service.py): tool:list, tool:settings:*.
    mcp:      McpManager (sidecar/tools/mcp.py): mcp:server:*; its servers stop on exit.
    chat:     ChatEngine (sidecar/engine/chat.py): chat:send, abort, regenerate, editResend.
    side:     SideCalls (sidecar/engine/side.py): suggestions and the automatic summary after a
              reply (run in the engine's task group), chat:session:summarize, chat:session:title.
    compat:   CompatService (sidecar/compat/service.py): compat:*, the V1 /computer/chat
              endpoint (off until compat:start; stopped first on exit).
    channels: ChannelService (sidecar/channels/service.py): channel:*; its workers stop on
              exit before the chat engine does (their turns and deliveries resume on restart).
    (later)   ... attached by the services that own them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sidecar.config import Config
from sidecar.engine.events import EventHub
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from protocol.context import AssistantProfile
    from protocol.messages import SearchOptions
    from sidecar.providers.types import ModelInfo
    from protocol.types import SearchResult, SessionV2
    from sidecar.acp.engines import AcpEngines
    from sidecar.acp.types import AgentFeatures
    from sidecar.channels.service import ChannelService
    from sidecar.compat.service import CompatService
    from sidecar.engine.acp_turn import AcpTurnHandler
    from sidecar.engine.approvals import ApprovalService
    from sidecar.engine.assistants import AssistantService
    from sidecar.engine.chat import ChatEngine
    from sidecar.engine.context import ContextService
    from sidecar.engine.providers import ProviderService
    from sidecar.engine.secrets import SecretsService
    from sidecar.engine.sessions import SessionService
    from sidecar.engine.settings import SettingsService
    from sidecar.engine.side import SideCalls
    from sidecar.pipeline.builder import RequestBuilder
    from sidecar.store import AsyncStore
    from sidecar.store.attachments import AttachmentStore
    from sidecar.tools.mcp import McpManager
    from sidecar.tools.service import ToolService

Notify = Callable[[str, Any], Awaitable[None]]


class App:
    # attached by open_app as each service opens (absent until then: its methods answer
    # NOT_IMPLEMENTED, see sidecar/server.py)
    store: AsyncStore
    secrets: SecretsService
    sessions: SessionService
    settings: SettingsService
    providers: ProviderService
    attachments: AttachmentStore
    requests: RequestBuilder
    acp_engines: AcpEngines
    acp: AcpTurnHandler
    approvals: ApprovalService
    mcp: McpManager
    tools: ToolService
    chat: ChatEngine
    side: SideCalls
    assistants: AssistantService
    context: ContextService
    compat: CompatService
    channels: ChannelService

    def __init__(self, config: Config, data_dir: Path, notify: Notify) -> None:
        self.config = config
        self.data_dir = data_dir
        self.events = EventHub(notify)
        self.notify: Notify = self.events.publish


@asynccontextmanager
async def open_app(config: Config, notify: Notify) -> AsyncIterator[App]:
    data_dir = Path(config.data_dir)
    try:
        # One mkdir: provably short, no need for a worker thread.
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SidecarError(f"cannot create the data directory {data_dir}: {exc.strerror or exc}") from exc
    # The services' modules take most of start-up to import: import them in a worker
    # thread so the event loop keeps answering (the handshake is served meanwhile).
    await anyio.to_thread.run_sync(_import_services)
    async with AsyncExitStack() as stack:
        app = App(config, data_dir, notify)
        # Services open here and register their cleanup on ``stack`` (closed in reverse
        # order), e.g. ``app.store = await stack.enter_async_context(open_store(data_dir))``.
        # The store: migrations and crash recovery run in a worker thread (AsyncStore.open).
        from sidecar.engine.secrets import SecretsService
        from sidecar.engine.sessions import SessionService
        from sidecar.secrets.box import SecretBox
        from sidecar.store import AsyncStore

        box = SecretBox(data_dir, host_key=_host_key_from_fd(config), use_keychain=config.keychain)
        app.store = await AsyncStore.open(data_dir, secrets=box)
        stack.push_async_callback(app.store.close)
        app.secrets = SecretsService(app.store)
        if config.secret_key_fd is not None:  # the host's key is known now: settle at once
            await app.secrets.settle()
        app.sessions = SessionService(app.store, app.notify)
        await _open_chat(app, stack)
        _open_context(app)
        await _open_compat(app, stack)
        await _open_channels(app, stack)
        yield app


def _host_key_from_fd(config: Config) -> bytes | None:
    if config.secret_key_fd is None:
        return None
    from sidecar.secrets.keys import read_key_fd

    try:
        return read_key_fd(config.secret_key_fd)
    except ValueError as exc:
        raise SidecarError(f"the secrets key on fd {config.secret_key_fd} is unusable: {exc}") from exc


_SERVICE_MODULES = (
    "sidecar.store",
    "sidecar.engine.sessions",
    "sidecar.engine.approvals",
    "sidecar.engine.chat",
    "sidecar.engine.providers",
    "sidecar.engine.settings",
    "sidecar.tools.mcp",
    "sidecar.tools.service",
    "sidecar.acp.engines",
    "sidecar.acp.mcp",
    "sidecar.engine.acp_turn",
    "sidecar.engine.assistants",
    "sidecar.engine.context",
    "sidecar.engine.side",
    "sidecar.pipeline.builder",
    "sidecar.store.assistants",
    "sidecar.compat.service",
    "sidecar.channels.service",
)


def _import_services() -> None:
    import importlib

    for name in _SERVICE_MODULES:
        importlib.import_module(name)


async def _open_chat(app: App, stack: AsyncExitStack) -> None:
    """Providers, settings and the ChatEngine, whose generation jobs run in one task group.

    Exit order (the stack unwinds in reverse): the engine aborts running jobs (each stores
    its partial reply as aborted) while the store is still open, then provider clients
    close, then the store.
    """
    import anyio

    from sidecar.engine.approvals import ApprovalService
    from sidecar.engine.chat import ChatEngine
    from sidecar.engine.tool_loop import INTERRUPTED_NOTE
    from sidecar.engine.providers import ProviderService
    from sidecar.engine.settings import SettingsService
    from sidecar.engine.side import SideCalls
    from sidecar.pipeline.builder import RequestBuilder
    from sidecar.store.attachments import AttachmentStore
    from sidecar.tools.mcp import McpManager
    from sidecar.tools.service import ToolService

    store = app.store

    async def get_setting(key: str) -> str | None:
        return await store.run(lambda s: s.settings.get(key))

    async def set_setting(key: str, value: str | None) -> None:
        await store.run(lambda s: s.settings.set(key, value))

    async def search(query: str, options: SearchOptions) -> list[SearchResult]:
        return await store.run(lambda s: s.search.messages(query, options))

    async def get_session(session_id: str) -> SessionV2:
        return await store.run(lambda s: s.sessions.get(session_id))

    app.settings = SettingsService(get_setting=get_setting, set_setting=set_setting)
    await app.settings.load()
    app.providers = ProviderService(store)
    stack.push_async_callback(app.providers.aclose)
    app.attachments = AttachmentStore(app.data_dir)
    # one builder: the generation loop and chat:context:* share its token cache, summary
    # checks and per-session summary locks
    app.requests = RequestBuilder(store, app.attachments, providers=app.providers)
    app.approvals = ApprovalService(store)
    # before the engine's task group: cancelling that group must not reach the engines
    app.acp = await _open_acp(app, stack)
    # MCP servers run in the manager's own task group, also entered before the engine's:
    # they are stopped (bounded) after the engine has aborted the replies that use them
    app.mcp = await stack.enter_async_context(McpManager.open(store))
    task_group = await stack.enter_async_context(anyio.create_task_group())
    # Tool calls left running by a dead process get a "cancelled" result before any send.
    await store.run(lambda s: s.tools.complete_interrupted(INTERRUPTED_NOTE))
    app.tools = ToolService(
        data_dir=app.data_dir,
        get_setting=get_setting,
        set_setting=set_setting,
        search=search,
        policies=app.approvals.policies_for,
        mcp=app.mcp,
        all_policies=lambda: store.run(lambda s: s.tools.policies()),
        policy_version=lambda: store.sync.tools.policy_version,
    )
    await app.tools.load()
    app.tools.set_session_lookup(get_session)
    app.tools.set_context_lookup(functools.partial(_tool_context, app))
    stack.push_async_callback(app.tools.aclose)
    app.side = SideCalls(
        store=store, providers=app.providers, settings=app.settings.current, notify=app.notify, task_group=task_group,
    )
    app.chat = ChatEngine(
        store=store,
        notify=app.notify,
        providers=app.providers,
        attachments=app.attachments,
        requests=app.requests,
        settings=app.settings,
        task_group=task_group,
        tools=app.tools,
        approvals=app.approvals,
        data_dir=app.data_dir,
        acp=app.acp,
        side=app.side,
    )
    stack.push_async_callback(app.chat.aclose)
    app.sessions.overlay_live = app.chat.overlay_live
    app.sessions.on_delete.append(
        lambda session_id: app.chat.stop_session(session_id, "the session was deleted")
    )
    app.sessions.on_delete.append(app.acp.close_session)  # after its turn has stopped


async def _tool_context(app: App, session: SessionV2 | None) -> tuple[AssistantProfile | None, ModelInfo | None]:
    """What ``tool:list`` assembles for: the session's assistant profile and model (the
    default profile, and no model, without a session)."""
    store = app.store
    profiles = app.requests.profiles
    if session is None:
        return await store.run(lambda s: s.assistants.default()), None
    profile = await store.run(lambda _: profiles.for_session(session.id))
    try:
        model = (await app.providers.resolve(session.provider_id, session.model_id)).model
    except SidecarError:  # no provider yet: list what a model with tools would get
        model = None
    return profile.assistant, model


async def _open_acp(app: App, stack: AsyncExitStack) -> AcpTurnHandler:
    """ACP mode (issue 7): the engine processes and the handler of mode 'acp' replies.

    The engines are entered on the stack before the ChatEngine's task group: they are
    stopped (stdin closed, SIGTERM, SIGKILL) only after the ChatEngine has aborted the
    running turns, and cancelling the ChatEngine's group (its aclose) does not reach them.
    """
    import sidecar
    from sidecar.acp.engines import AcpEngines
    from sidecar.acp.mcp import acp_mcp_servers
    from sidecar.engine.acp_turn import AcpTurnHandler

    engines = await stack.enter_async_context(
        AcpEngines(
            client_name=sidecar.SERVER_NAME,
            client_version=sidecar.__version__,
            default_cwd=str(app.data_dir),
        )
    )
    app.acp_engines = engines
    store = app.store

    async def mcp_servers(features: AgentFeatures) -> list[Any]:
        rows = await store.run(lambda s: s.tools.mcp_servers())
        return acp_mcp_servers(rows, features)

    return AcpTurnHandler(
        store=app.store,
        providers=app.providers,
        engines=engines,
        attachments=app.attachments,
        data_dir=app.data_dir,
        approvals=app.approvals,
        mcp_servers=mcp_servers,
    )


def _open_context(app: App) -> None:
    """Assistant profiles and chat:context:* on the RequestBuilder the generation loop uses."""
    from sidecar.engine.assistants import AssistantService
    from sidecar.engine.context import ContextService

    app.assistants = AssistantService(app.store)
    app.context = ContextService(
        app.store, app.requests, providers=app.providers, tools=app.tools, settings=app.settings.current
    )


async def _open_compat(app: App, stack: AsyncExitStack) -> None:
    """The V1 endpoint's service (it imports its HTTP server only on compat:start); last
    on the stack, so it stops before the engine aborts the replies it streams."""
    from sidecar.compat.service import CompatService

    app.compat = await stack.enter_async_context(CompatService.for_app(app))


async def _open_channels(app: App, stack: AsyncExitStack) -> None:
    """IM channels: their workers run in a task group of their own, cancelled on exit before
    the chat engine closes (an interrupted wait or delivery resumes at the next start)."""
    import anyio

    from sidecar.channels.service import ChannelService

    task_group = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(task_group.cancel_scope.cancel)
    app.channels = ChannelService(
        store=app.store,
        chat=app.chat,
        events=app.events,
        notify=app.notify,
        attachments=app.attachments,
        task_group=task_group,
    )
    await app.channels.load()
