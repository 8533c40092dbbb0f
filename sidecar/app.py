"""The App: the object that holds the process's services for the lifetime of a server.

``open_app(config, send)`` builds an App, yields it while the server runs and closes
everything it opened on exit (in reverse order, even when the server is cancelled).
``sidecar/server.py`` binds method names to attribute paths on the App (for example
``"sessions.create_session"``); a service that is not attached yet makes its methods
answer NOT_IMPLEMENTED instead of failing at start-up.

Cold start: the store opens first, with only the modules that read it (store, protocol,
sessions, secrets); the server answers the methods that need nothing else (listing
sessions, reading messages) from then on, while every other service's modules are
imported in a worker thread and opened once the server asks for them (``load_services``:
the first request that needs them, the first answers, or a short idle delay).

How to add a service: open it in ``open_services`` (sidecar/app_services.py, which owns the
services' wiring and their order on the exit stack; use ``stack`` so it is closed on exit),
attach it as an attribute, document the attribute below. Must stay true:
- ``open_app`` does no slow work on the event loop (blocking I/O goes through
  ``anyio.to_thread``), and heavy imports happen inside it, not at module import, to
  keep start-up fast: this module and everything the store step imports must not import
  providers, pipeline, tools, acp, mcp, jsonschema, jinja2, pypdf or numpy
  (tests/test_cold_start.py checks it);
- ``notify`` is the only way a service talks to the client outside a reply.

Attributes:
    config:   the finished Config.
    data_dir: Path of the data directory (created if missing).
    notify:   ``await notify(NOTIFICATION, params_struct)`` sends a notification to the client
              (a Notifier over ``events.publish``; the names are protocol/notifications.py's).
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
from sidecar.app_state import App
from sidecar.notify import Send
from sidecar.errors import SidecarError

if TYPE_CHECKING:
    from sidecar.store import Store

__all__ = ["App", "open_app"]

@asynccontextmanager
async def open_app(
    config: Config,
    send: Send,
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
    a worker thread and opened (``open_services``). ``store``: already open (by the early
    answers, sidecar/coldstart.py, with the same ``sidecar.store_open.open_store``); the App
    owns it from this call on and closes it."""
    data_dir = Path(config.data_dir)
    try:
        # A mkdir or two: provably short, no need for a worker thread.
        datadir.make_dirs(data_dir)
    except OSError as exc:
        raise SidecarError(f"cannot create the data directory {data_dir}: {exc.strerror or exc}") from exc
    async with AsyncExitStack() as stack:
        app = App(config, data_dir, send)
        # Services open here and register their cleanup on ``stack`` (closed in reverse
        # order), e.g. ``app.store = await stack.enter_async_context(open_store(data_dir))``.
        # The store: its modules are imported, and migrations and crash recovery run, in a
        # worker thread (the loop answers the handshake meanwhile).
        await anyio.to_thread.run_sync(_import_store_modules)
        from sidecar.engine.secrets import SecretsService
        from sidecar.engine.sessions import SessionService
        from sidecar.store import AsyncStore
        from sidecar.store_open import open_store

        if store is None:
            store = await anyio.to_thread.run_sync(functools.partial(open_store, config, migrate=True))
        app.store = AsyncStore(store)
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
        from sidecar.app_services import open_services

        await open_services(app, stack)
        yield app


def _import_store_modules() -> None:
    import importlib

    for name in ("sidecar.store", "sidecar.store_open", "sidecar.engine.sessions", "sidecar.engine.secrets"):
        importlib.import_module(name)

