"""The App: the object that holds the process's services for the lifetime of a server.

``open_app(config, notify)`` builds an App, yields it while the server runs and closes
everything it opened on exit (in reverse order, even when the server is cancelled).
``sidecar/server.py`` binds method names to attribute paths on the App (for example
``"sessions.create_session"``); a service that is not attached yet makes its methods
answer NOT_IMPLEMENTED instead of failing at start-up.

Cold start: the store opens first, with only the modules that read it (store, protocol,
sessions, secrets); the server answers the methods that need nothing else (listing
sessions, reading messages) from then on, while every other service's modules are
imported in a worker thread and opened once the server asks for them (``load_services``:
the first request that needs them, the first answers, or a short idle delay).

How to add a service: open it inside ``open_app`` after the store step (use ``stack`` so
it is closed on exit), attach it as an attribute, document the attribute below. Must
stay true:
- ``open_app`` does no slow work on the event loop (blocking I/O goes through
  ``anyio.to_thread``), and heavy imports happen inside it, not at module import, to
  keep start-up fast: this module and everything the store step imports must not import
  providers, pipeline, tools, acp, mcp, jsonschema, jinja2, pypdf or numpy
  (tests/test_cold_start.py checks it);
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
    provider_probe: ProviderProbe (sidecar/engine/provider_probe.py): provider:test and
              provider:models, each on a throwaway client.
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
              The replies of its remote-agent route (mode 'remote' sessions):
              RemoteAgentHandler (sidecar/channels/remote.py), the chat engine's ``remote``.
    knowledge: KnowledgeService (sidecar/retrieval/service.py): kb:*, background ingestion,
              the retriever of the KnowledgeRetrieval transformer and the knowledge_search tool.
    sync:     SyncService (sidecar/sync/service.py): server:*, sync:*, server:conversation:*,
              server:session:create, chat:suggest; its periodic task stops on exit. The
              replies of mode 'server' sessions: ServerTurnHandler (sidecar/sync/forward.py),
              the chat engine's ``server``.
    side_usage: SideUsage (sidecar/engine/usage.py): ``await record(session_id, provider_id,
              model_id, usage, kind="side:<what>")`` attributes a side call's usage to a
              session (titles, summaries, OCR, the query embeddings of its retrievals;
              every feature that spends tokens for one).
    storage:  StorageService (sidecar/engine/storage.py): storage:gc and ``release()``, which
              removes the files of deleted sessions and messages (run after every delete);
              its start-up pass (interrupted removals, orphans) runs in the background.
    memory:   MemoryService (sidecar/memory/service.py): memory:*, the memory retrieval of
              requests, the memory tools, the MemoryEncoder; its background jobs (embedding,
              encoding) run in its task group, cancelled on exit after the chat engine stopped.
    souls:    SoulService (sidecar/memory/soul.py): assistant:soul:*.
    memory_upkeep: MemoryUpkeep (sidecar/memory/upkeep.py): memory:consolidate,
              memory:consolidation:*, memory:stats, memory:export, memory:import,
              memory:settings:*; the expiry policy runs once at start in MemoryService's group.
    skills:   SkillService (sidecar/skills/service.py): skill:*; its automatic proposals run
              in a task group of their own, cancelled on exit before the chat engine closes.
    tasks:    TaskService (sidecar/tasks/service.py): task:*, and the scheduler, a task of its
              own task group, entered last (cancelled first on exit: a run in progress stays
              recorded and is followed again at the next start).
    (later)   ... attached by the services that own them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sidecar import datadir
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
    from protocol.channels import ChannelConfig
    from sidecar.channels.remote import RemoteAgentHandler
    from sidecar.channels.service import ChannelService
    from sidecar.compat.service import CompatService
    from sidecar.engine.acp_turn import AcpTurnHandler
    from sidecar.engine.approvals import ApprovalService
    from sidecar.engine.assistants import AssistantService
    from sidecar.engine.chat import ChatEngine
    from sidecar.engine.context import ContextService
    from sidecar.engine.provider_probe import ProviderProbe
    from sidecar.engine.providers import ProviderService
    from sidecar.engine.secrets import SecretsService
    from sidecar.engine.sessions import SessionService
    from sidecar.engine.settings import SettingsService
    from sidecar.engine.side import SideCalls
    from sidecar.engine.storage import StorageService
    from sidecar.engine.usage import SideUsage
    from sidecar.pipeline.builder import RequestBuilder
    from sidecar.memory.service import AssistantFor, MemoryService
    from sidecar.memory.soul import SoulService
    from sidecar.memory.upkeep import MemoryUpkeep
    from sidecar.retrieval.service import KnowledgeService
    from sidecar.skills.service import SkillService
    from sidecar.store import AsyncStore, Store
    from sidecar.store.attachments import AttachmentStore
    from sidecar.sync.service import SyncService
    from sidecar.tasks.service import TaskService
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
    provider_probe: ProviderProbe
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
    knowledge: KnowledgeService
    sync: SyncService
    storage: StorageService
    side_usage: SideUsage
    memory: MemoryService
    souls: SoulService
    memory_upkeep: MemoryUpkeep
    skills: SkillService
    tasks: TaskService

    def __init__(self, config: Config, data_dir: Path, notify: Notify) -> None:
        self.config = config
        self.data_dir = data_dir
        self.events = EventHub(notify)
        self.notify: Notify = self.events.publish


@asynccontextmanager
async def open_app(
    config: Config,
    notify: Notify,
    *,
    on_store: Callable[[App], Awaitable[None]] | None = None,
    services_wanted: Callable[[], Awaitable[bool]] | None = None,
    store: Store | None = None,
) -> AsyncIterator[App]:
    """Open the App in two steps: the store (and what reads it alone: sessions, secrets),
    then every other service once ``services_wanted()`` returns True (default: at once;
    False, when the server stops before it needed them: the App is yielded without them).

    ``on_store(app)`` is awaited between the two: from then on the methods that need only
    the store can be served (the first session list of a cold start needs nothing else),
    while the services' modules (providers, pipeline, tools, ACP, MCP...) are imported in
    a worker thread and opened. ``store``: already open (by the cold start,
    sidecar/coldstart.py); the App owns it from this call on and closes it."""
    data_dir = Path(config.data_dir)
    try:
        # A mkdir or two: provably short, no need for a worker thread.
        datadir.make_dirs(data_dir)
    except OSError as exc:
        raise SidecarError(f"cannot create the data directory {data_dir}: {exc.strerror or exc}") from exc
    async with AsyncExitStack() as stack:
        app = App(config, data_dir, notify)
        # Services open here and register their cleanup on ``stack`` (closed in reverse
        # order), e.g. ``app.store = await stack.enter_async_context(open_store(data_dir))``.
        # The store: its modules are imported, and migrations and crash recovery run, in a
        # worker thread (the loop answers the handshake meanwhile).
        await anyio.to_thread.run_sync(_import_store_modules)
        from sidecar.engine.secrets import SecretsService
        from sidecar.engine.sessions import SessionService
        from sidecar.secrets.box import SecretBox
        from sidecar.store import AsyncStore

        if store is not None:
            app.store = AsyncStore(store)
        else:
            box = SecretBox(data_dir, host_key=_host_key_from_fd(config), use_keychain=config.keychain)
            app.store = await AsyncStore.open(data_dir, secrets=box)
        stack.push_async_callback(app.store.close)
        app.secrets = SecretsService(app.store)
        if config.secret_key_fd is not None:  # the host's key is known now: settle at once
            await app.secrets.settle()
        app.sessions = SessionService(app.store, app.notify)
        if on_store is not None:
            await on_store(app)
        if services_wanted is not None and not await services_wanted():
            yield app
            return
        # The services' modules take most of start-up to import: import them in a worker
        # thread so the event loop keeps answering meanwhile.
        await anyio.to_thread.run_sync(_import_services)
        _open_storage(app)
        # before the chat engine: it closes after the engine has stopped the replies using it
        app.knowledge = await _open_knowledge(app, stack)
        # before the chat engine: its server client must outlive the forwarded turns the
        # engine aborts on exit
        await _open_sync(app, stack)
        await _open_memory(app, stack)  # before the chat engine: it closes after the engine
        remote = _open_remote_agents(app, stack)  # before the chat engine, as sync
        await _open_chat(app, stack)
        app.chat.remote = remote
        await _open_forwarding(app, stack)
        _open_context(app)
        from sidecar.skills.service import open_skills

        app.skills = await open_skills(app, stack)
        await _start_knowledge(app)
        await _start_memory(app)
        await _open_compat(app, stack)
        await _open_channels(app, stack)
        await _start_background(app, stack)
        from sidecar.tasks.service import open_tasks

        app.tasks = await open_tasks(app, stack)  # last: the scheduler is cancelled first on exit
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
    "sidecar.engine.provider_probe",
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
    "sidecar.channels.remote",
    "sidecar.retrieval.service",
    "sidecar.sync.service",
    "sidecar.sync.forward",
    "sidecar.engine.storage",
    "sidecar.memory.service",
    "sidecar.memory.soul",
    "sidecar.memory.upkeep",
    "sidecar.skills.service",
    "sidecar.tasks.service",
)


def _import_store_modules() -> None:
    import importlib

    for name in ("sidecar.store", "sidecar.engine.sessions", "sidecar.engine.secrets", "sidecar.secrets.box"):
        importlib.import_module(name)


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
    from sidecar.engine.provider_probe import ProviderProbe
    from sidecar.engine.providers import ProviderService
    from sidecar.engine.settings import SettingsService
    from sidecar.engine.side import SideCalls
    from sidecar.engine.usage import SideUsage
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
    app.provider_probe = ProviderProbe(store)
    app.side_usage = SideUsage(store, app.providers)
    app.attachments = AttachmentStore(app.data_dir)
    # one builder: the generation loop and chat:context:* share its token cache, summary
    # checks and per-session summary locks
    app.requests = RequestBuilder(
        store, app.attachments, providers=app.providers, knowledge=app.knowledge, memory=app.memory,
        side_usage=app.side_usage,
    )
    app.approvals = ApprovalService(store)
    # before the engine's task group: cancelling that group must not reach the engines
    app.acp = await _open_acp(app, stack)
    # MCP servers run in the manager's own task group, also entered before the engine's:
    # they are stopped (bounded) after the engine has aborted the replies that use them
    app.mcp = await stack.enter_async_context(McpManager.open(store))
    task_group = await stack.enter_async_context(anyio.create_task_group())
    app.tools = ToolService(
        data_dir=app.data_dir,
        get_setting=get_setting,
        set_setting=set_setting,
        search=search,
        policies=app.approvals.policies_for,
        mcp=app.mcp,
        knowledge=app.knowledge,
        all_policies=lambda: store.run(lambda s: s.tools.policies()),
        policy_version=lambda: store.blocking.tools.policy_version,
        memory=app.memory,
        spill_owners=lambda root, path: store.run(lambda s: s.files.owners(root, path)),
    )
    await app.tools.load()
    app.tools.set_session_lookup(get_session)
    app.tools.set_context_lookup(functools.partial(_tool_context, app))
    stack.push_async_callback(app.tools.aclose)
    app.side = SideCalls(
        store=store, providers=app.providers, settings=app.settings.current, notify=app.notify, task_group=task_group,
        usage=app.side_usage,
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
        side_usage=app.side_usage,
        side=app.side,
    )
    stack.push_async_callback(app.chat.aclose)
    app.sessions.overlay_live = app.chat.overlay_live
    app.sessions.on_delete.append(app.chat.stop_session)
    # agent sessions no reply uses any more (a deleted session or branch) are closed once
    # the delete is committed (AcpTurnHandler.reap_released)
    app.storage.on_release.append(app.acp.reap_released)


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
    """ACP mode: the engine processes and the handler of mode 'acp' replies.

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


def _open_storage(app: App) -> None:
    """File ownership's disk side: every delete is followed by the release of its files."""
    from sidecar.engine.storage import StorageService

    app.storage = StorageService(app.store, app.notify)
    app.sessions.on_deleted.append(app.storage.release)


async def _start_background(app: App, stack: AsyncExitStack) -> None:
    """The start-up passes that must not delay the first answers: interrupted removals and
    orphans (storage), the titles that were due and never written. Their task group is
    cancelled on exit, before the services they use close."""
    import anyio

    task_group = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(task_group.cancel_scope.cancel)
    app.storage.start(task_group)
    app.chat.start_background(task_group)
    app.acp.start_background(task_group)


def _open_context(app: App) -> None:
    """Assistant profiles and chat:context:* on the RequestBuilder the generation loop uses."""
    from sidecar.engine.assistants import AssistantService
    from sidecar.engine.context import ContextService

    app.assistants = AssistantService(app.store, check_tools=app.tools.check_enabled_tools)
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
        remote_agents=app.chat.remote is not None,
    )
    stack.push_async_callback(app.channels.aclose)  # its connections stop first
    await app.channels.load()


def _open_remote_agents(app: App, stack: AsyncExitStack) -> RemoteAgentHandler:
    """Mode 'remote' replies (a channel's remote-agent route). Entered before the chat
    engine: its HTTP client must outlive the turns the engine aborts on exit."""
    from sidecar.channels.remote import RemoteAgentHandler

    def config_of(channel_id: str) -> ChannelConfig | None:
        channels: ChannelService | None = getattr(app, "channels", None)
        return channels.config(channel_id) if channels is not None else None

    handler = RemoteAgentHandler(app.store, config_of)
    stack.push_async_callback(handler.aclose)
    return handler


def _assistant_for(app: App) -> AssistantFor:
    """The assistant a session runs with (None: the default one), as the knowledge and
    memory services ask for it."""
    from sidecar.pipeline.profiles import ProfileResolver

    store = app.store
    profiles = ProfileResolver(store.blocking.assistants, store.blocking.context)

    async def assistant_for(session_id: str | None) -> AssistantProfile:
        if session_id is None:
            return await store.run(lambda s: s.assistants.default())
        return await store.run(lambda _: profiles.for_session(session_id).assistant)

    return assistant_for


async def _open_knowledge(app: App, stack: AsyncExitStack) -> KnowledgeService:
    """Knowledge bases: the service runs its ingestion task group until exit."""
    from sidecar.retrieval.service import KnowledgeService

    service = KnowledgeService(
        store=app.store, notify=app.notify, connections=None, assistant_for=_assistant_for(app)
    )
    return await stack.enter_async_context(service)


async def _open_memory(app: App, stack: AsyncExitStack) -> None:
    """Long-term memory and Soul.md. Embeddings go through the knowledge service's embedders
    (one per model key, the same provider transport)."""
    from sidecar.memory.service import MemoryService
    from sidecar.memory.soul import SoulService

    store = app.store
    assistant_for = _assistant_for(app)

    app.souls = SoulService(store, app.data_dir)
    app.memory = await stack.enter_async_context(
        MemoryService(store=store, notify=app.notify, embedder_for=app.knowledge.embedder_for,
                      assistant_for=assistant_for)
    )
    app.memory.souls = app.souls


async def _start_memory(app: App) -> None:
    """Deleting an assistant deletes its memories and Soul.md (README "Memory"); what a
    previous run left without vectors is embedded; memory upkeep (its expiry runs once now,
    in the background)."""
    from sidecar.memory.encoder import MemoryEncoder
    from sidecar.memory.upkeep import MemoryUpkeep

    app.assistants.on_delete.append(app.memory.forget_assistant)
    memory = app.memory

    async def assistant_of(session_id: str) -> AssistantProfile:
        return await memory.assistant_for(session_id)

    memory.encoder = MemoryEncoder(memory, app.providers, app.side_usage, assistant_of)
    app.chat.on_completed.append(memory.reply_completed)
    await memory.start(usage=app.side_usage)
    app.memory_upkeep = MemoryUpkeep(memory, app.providers, app.notify)
    await app.memory_upkeep.load()
    app.memory_upkeep.start()


async def _start_knowledge(app: App) -> None:
    """The providers are there now (embedding calls): resume ingestion; a session's query
    embeddings are charged to it through the SideUsage."""
    await app.knowledge.start(connections=app.providers, usage=app.side_usage)


async def _open_sync(app: App, stack: AsyncExitStack) -> None:
    """Qiming server sync: the account, sync runs, the periodic task (its own task group,
    cancelled first on exit), the server conversation calls.

    A session the sync deletes (deleted on the server, unchanged here) takes the delete path
    of ``chat:session:delete`` (SessionService.delete_path: its generation and ACP session
    stop first, its files are removed once it is gone).
    """
    import anyio

    from sidecar.sync.service import SyncService

    app.sync = SyncService(app.store, app.notify, delete_path=app.sessions.delete_path)
    await app.sync.load()
    stack.push_async_callback(app.sync.aclose)
    group = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(group.cancel_scope.cancel)  # unwound before the group waits for its task
    app.sync.start(group)


async def _open_forwarding(app: App, stack: AsyncExitStack) -> None:
    """Mode 'server' replies: forwarded to the Qiming server by the chat engine's jobs; the
    handler's side tasks (message mapping, topics) run in a task group of their own,
    cancelled on exit before the chat engine aborts the turns."""
    import anyio

    from sidecar.sync.forward import ServerTurnHandler

    group = await stack.enter_async_context(anyio.create_task_group())
    handler = ServerTurnHandler(
        store=app.store, account=app.sync.account, approvals=app.approvals, task_group=group, notify=app.notify,
    )

    def close() -> None:
        handler.closing = True
        group.cancel_scope.cancel()

    stack.callback(close)
    app.chat.server = handler
