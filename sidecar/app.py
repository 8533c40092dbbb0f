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
    notify:   ``await notify(method, params_struct)`` sends a notification to the client.
    store:    AsyncStore of ``<data_dir>/chat.db`` (sidecar/store), closed on exit.
    sessions: SessionService (sidecar/engine/sessions.py): chat:session:* and chat:messages:*.
    assistants: AssistantService (sidecar/engine/assistants.py): assistant:*.
    context:  ContextService (sidecar/engine/context.py): chat:context:* (the generation loop's
              RequestBuilder, shared).
    approvals: ApprovalService (sidecar/engine/approvals.py): chat:tool:approve, tool:policy:*,
              tool:audit:list, tool:pending:list; also the ACP permission flow.
    tools:    ToolService (sidecar/tools/service.py): tool:list, tool:settings:*.
    mcp:      McpManager (sidecar/tools/mcp.py): mcp:server:*; its servers stop on exit.
    sync:     SyncService (sidecar/sync/service.py): server:*, sync:*, server:conversation:*;
              its periodic task stops on exit.
    (later)   chat, ... attached by the services that own them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sidecar.config import Config
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from sidecar.engine.sessions import SessionService
    from sidecar.store import AsyncStore

Notify = Callable[[str, Any], Awaitable[None]]


class App:
    store: AsyncStore
    sessions: SessionService

    def __init__(self, config: Config, data_dir: Path, notify: Notify) -> None:
        self.config = config
        self.data_dir = data_dir
        self.notify = notify


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
        from sidecar.engine.sessions import SessionService
        from sidecar.store import AsyncStore

        app.store = await AsyncStore.open(data_dir)
        stack.push_async_callback(app.store.close)
        app.sessions = SessionService(app.store, notify)
        await _open_chat(app, stack)
        _open_context(app)
        await _open_sync(app, stack)
        yield app


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
    "sidecar.pipeline.builder",
    "sidecar.store.assistants",
    "sidecar.sync.service",
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
    from sidecar.engine.generation import INTERRUPTED_NOTE
    from sidecar.engine.providers import ProviderService
    from sidecar.engine.settings import SettingsService
    from sidecar.store.attachments import AttachmentStore
    from sidecar.tools.mcp import McpManager
    from sidecar.tools.service import ToolService

    store = app.store
    app.settings = SettingsService(get_setting=store.get_setting, set_setting=store.set_setting)
    await app.settings.load()
    app.providers = ProviderService(
        store.sync.providers, get_setting=store.get_setting, set_setting=store.set_setting
    )
    stack.push_async_callback(app.providers.aclose)
    # before the engine's task group: cancelling that group must not reach the engines
    app.acp = await _open_acp(app, stack)
    task_group = await stack.enter_async_context(anyio.create_task_group())
    # Tool calls left running by a dead process get a "cancelled" result before any send.
    await anyio.to_thread.run_sync(store.sync.tools.complete_interrupted, INTERRUPTED_NOTE)
    app.approvals = ApprovalService(store.sync.tools)
    app.mcp = McpManager(store.sync.tools, task_group)
    await app.mcp.load()
    stack.push_async_callback(app.mcp.aclose)
    app.tools = ToolService(
        data_dir=app.data_dir,
        get_setting=store.get_setting,
        set_setting=store.set_setting,
        search=store.search_messages,
        policies=app.approvals.policies_for,
        mcp=app.mcp,
    )
    await app.tools.load()
    app.tools.set_session_lookup(store.get_session)
    stack.push_async_callback(app.tools.aclose)
    app.chat = ChatEngine(
        store=store,
        notify=app.notify,
        providers=app.providers,
        attachments=AttachmentStore(app.data_dir),
        settings=app.settings,
        task_group=task_group,
        tools=app.tools,
        approvals=app.approvals,
        data_dir=app.data_dir,
        acp=app.acp,
    )
    stack.push_async_callback(app.chat.aclose)
    app.sessions.overlay_live = app.chat.overlay_live
    app.sessions.on_delete.append(
        lambda session_id: app.chat.stop_session(session_id, "the session was deleted")
    )
    app.sessions.on_delete.append(app.acp.close_session)  # after its turn has stopped


async def _open_acp(app: App, stack: AsyncExitStack) -> Any:
    """ACP mode (issue 7): the engine processes and the handler of mode 'acp' replies.

    The engines are entered on the stack before the ChatEngine's task group: they are
    stopped (stdin closed, SIGTERM, SIGKILL) only after the ChatEngine has aborted the
    running turns, and cancelling the ChatEngine's group (its aclose) does not reach them.
    """
    import anyio

    import sidecar
    from sidecar.acp.engines import AcpEngines
    from sidecar.acp.mcp import acp_mcp_servers
    from sidecar.engine.acp_turn import AcpTurnHandler
    from sidecar.store.attachments import AttachmentStore

    engines = await stack.enter_async_context(
        AcpEngines(
            client_name=sidecar.SERVER_NAME,
            client_version=sidecar.__version__,
            default_cwd=str(app.data_dir),
        )
    )
    app.acp_engines = engines
    tool_store = getattr(app.store.sync, "tools", None)

    async def mcp_servers(features: Any) -> list[Any]:
        if tool_store is None:
            return []
        rows = await anyio.to_thread.run_sync(tool_store.mcp_servers)
        return acp_mcp_servers(rows, features)

    return AcpTurnHandler(
        store=app.store,
        notify=app.notify,
        providers=app.providers,
        engines=engines,
        attachments=AttachmentStore(app.data_dir),
        settings=app.settings.current,
        data_dir=app.data_dir,
        approvals=lambda: getattr(app, "approvals", None),
        mcp_servers=mcp_servers,
    )


def _open_context(app: App) -> None:
    """Assistant profiles and chat:context:* on the RequestBuilder the generation loop uses."""
    from sidecar.engine.assistants import AssistantService
    from sidecar.engine.context import ContextService
    from sidecar.pipeline.builder import RequestBuilder
    from sidecar.store.assistants import AssistantRepo
    from sidecar.store.attachments import AttachmentStore

    builder = RequestBuilder.shared(
        app.store.sync, AttachmentStore(app.data_dir), providers=getattr(app, "providers", None)
    )
    app.assistants = AssistantService(AssistantRepo.of(app.store.sync))
    app.context = ContextService(app.store, builder)


async def _open_sync(app: App, stack: AsyncExitStack) -> None:
    """Qiming server sync: the account, sync runs, the periodic task (its own task group,
    cancelled first on exit), the server conversation calls.

    A session the sync deletes (deleted on the server, unchanged here) goes through the
    same on_delete hooks as ``chat:session:delete`` (its generation and ACP session stop).
    """
    import anyio

    from sidecar.store.sync import SyncRepo
    from sidecar.sync.service import SyncService

    async def before_delete(session_id: str) -> Any:
        done: list[Any] = []
        for hook in list(app.sessions.on_delete):
            after = await hook(session_id)
            if after is not None:
                done.append(after)

        def finished() -> None:
            for after in done:
                after()

        return finished

    app.sync = SyncService(
        SyncRepo.of(app.store.sync), app.notify, get_setting=app.store.get_setting,
        set_setting=app.store.set_setting, before_delete=before_delete,
    )
    await app.sync.load()
    stack.push_async_callback(app.sync.aclose)
    group = await stack.enter_async_context(anyio.create_task_group())
    stack.callback(group.cancel_scope.cancel)  # unwound before the group waits for its task
    app.sync.start(group)
