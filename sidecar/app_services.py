"""The App's services: how each is built, wired to the others and ordered on the exit stack.

``open_services(app, stack)`` is the second step of ``sidecar.app.open_app``: once the store
step is open (the store, secrets, sessions), it imports the services' modules in a worker
thread and opens every other service, attaching each to the App (the attributes
sidecar/app.py documents). Must stay true:
- the order on ``stack`` is the order of the exit in reverse: a service is entered before
  the ones whose work it must outlive (the chat engine aborts its replies while the
  knowledge, sync, memory and ACP services and the store are still open; channels, compat
  and the task scheduler stop first);
- heavy modules are imported inside the functions, never at this module's import;
- ``open_app`` attaches a service for every binding (tests/test_rpc_server.py).
"""

from __future__ import annotations

import functools
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import anyio

from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from protocol.channels import ChannelConfig
    from protocol.context import AssistantProfile
    from protocol.messages import SearchOptions
    from protocol.types import SearchResult, SessionV2
    from sidecar.acp.types import AgentFeatures
    from sidecar.app_state import App
    from sidecar.channels.remote import RemoteAgentHandler
    from sidecar.channels.service import ChannelService
    from sidecar.engine.acp_turn import AcpTurnHandler
    from sidecar.memory.service import AssistantFor
    from sidecar.providers.types import ModelInfo
    from sidecar.retrieval.service import KnowledgeService


async def open_services(app: App, stack: AsyncExitStack) -> None:
    """Open every service of the App after its store step (see the module doc)."""
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

    tools = app.tools
    app.skills = await open_skills(
        stack, store=app.store, data_dir=app.data_dir, skills_dirs=lambda: list(tools.settings.skills_dirs),
        notify=app.notify, providers=app.providers, usage=app.side_usage, chat=app.chat,
    )
    await _start_knowledge(app)
    await _start_memory(app)
    await _open_compat(app, stack)
    await _open_channels(app, stack)
    await _start_background(app, stack)
    from sidecar.tasks.service import open_tasks

    app.tasks = await open_tasks(  # last: the scheduler is cancelled first on exit
        stack, store=app.store, chat=app.chat, events=app.events, notify=app.notify, channels=app.channels,
        consolidate=app.memory_upkeep.consolidate_scope, test_clock_ms=app.config.test_clock_ms,
    )


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
    from sidecar.memory.tools import MemoryTools
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
        memory=MemoryTools(app.memory),
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
        def read(s: Any) -> tuple[list[tuple[str, str]], set[str]]:
            rows = s.tools.mcp_servers()
            policies = s.tools.policies(f"mcp:{name}" for name, _ in rows)
            return rows, {key[4:] for key, p in policies.items() if p.policy == "deny"}

        rows, denied = await store.run(read)
        return acp_mcp_servers(rows, features, denied=denied)

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
