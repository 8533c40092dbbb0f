"""Store: the database of one data dir, and its repositories (one attribute each).

Owns: opening (the data dir made private, migrations, crash recovery, the data dir
lock), closing, and which repositories exist. Every repository is an attribute built here
on the one Database, each in its own module:

    sessions    SessionRepo    sessions_v2, tags, counters (sessions.py; SQL: session_table.py)
    messages    MessageRepo    messages_v2, the message tree, streaming and final rows (messages.py; SQL: message_table.py)
    search      SearchRepo     full-text search of messages (search.py)
    settings    SettingsRepo   the key/value settings (settings.py)
    secrets     SecretsRepo    secrets at rest: settling the key, re-sealing (secrets.py)
    providers   ProviderRepo   provider:* configuration, keys sealed (providers.py)
    acp         AcpRepo        ACP agent sessions per reply, raw ACP columns (acp.py)
    tools       ToolStore      tool loop runs and calls, approvals, policies, audit, MCP (tools.py)
    assistants  AssistantRepo  assistant profiles and the default one (assistants.py)
    context     ContextRepo    rolling summaries, session context settings, token counts (context.py)
    channels    ChannelRepo    IM channels: configs, chat links, the inbox, deliveries (channels.py)
    knowledge   KnowledgeRepo  knowledge bases, documents, chunks, vectors, chunk FTS (knowledge.py)
    sync        SyncRepo       Qiming server: the account (token sealed), links, message map (sync.py)
    citations   Citations      the citations of replies (citations.py; read onto MessageV2 by MessageRepo)
    files       FileRepo       files on disk owned by sessions and messages, the deletion journal (files.py)
    memory      MemoryRepo     long-term memories, their vectors and FTS, encoder proposals (memory.py)
    souls       SoulRepo       every version of every Soul.md (souls.py)
    tasks       TaskRepo       scheduled tasks and their runs (tasks.py)
    memory_upkeep MemoryUpkeepRepo memory statistics, expiry, merges, consolidation proposals (memory_upkeep.py)
    skills      SkillProposalRepo the skills the model proposed (skills.py)

Every repository but ``secrets`` is built at its first use (``_Repository``): opening the
store imports only what opening needs (the database, the migrations, the secrets, the
check of what a dead process left behind, sidecar/store/recovery.py), so the handshake's
answer waits for no repository module; the recovery builds the repositories it needs only
when there is something to recover. A new repository takes the Database in its
constructor and is attached here; nothing outside the store package sees the Database. Each repository method
is one transaction (``Database.write`` or ``Database.read``); ``Store.transaction()`` joins
several calls, of any repositories, into one. SQL another repository's transaction needs
(a session's counters, a message row, the search index, a setting) is a function on a
connection in the module of its table.

Thread-safe (see ``db.Database``): any thread may call any method; writes are serialized,
reads run on pooled reader connections. Async code reaches the Store only through
``AsyncStore`` (async_store.py), which runs the calls in worker threads.

Conventions:
- Timestamps come from ``clock`` (ms); ids from ``ids.new_id`` (UUIDv7).
- One process per data dir: opening a Store runs crash recovery, which turns every row
  still 'pending'/'streaming' into 'aborted' (a second process opening the same dir would
  abort the first one's in-flight replies), so a Store holds ``dirlock.DirLock`` from open
  to close and a second Store on the same dir fails with StoreError ("another
  chat-sidecar is using <dir>") before touching the database.
- Deleting messages: see messages.py; on the wire ``chat:messages:delete``
  (SessionService.delete_messages, which also stops a reply the delete reaches).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Generic, TypeVar, cast, overload

from sidecar import datadir
from sidecar.errors import StoreError
from sidecar.secrets.box import SecretBox
from sidecar.secrets.keys import KEY_FILE
from sidecar.store import recovery
from sidecar.store.db import DB_FILENAME, Database
from sidecar.store.dirlock import LOCK_FILENAME, DirLock
from sidecar.store.ids import now_ms
from sidecar.store.layout import MANAGED_DIRS
from sidecar.store.migrations import migrate, schema_is_current
from sidecar.store.secrets import SecretsRepo, Sealer

if TYPE_CHECKING:
    from pathlib import Path

    from sidecar.store.acp import AcpRepo
    from sidecar.store.citations import Citations
    from sidecar.store.files import FileRepo
    from sidecar.store.messages import MessageRepo
    from sidecar.store.search import SearchRepo
    from sidecar.store.sessions import SessionRepo
    from sidecar.store.settings import SettingsRepo
    from sidecar.store.tools import ToolStore
    from sidecar.store.assistants import AssistantRepo
    from sidecar.store.channels import ChannelRepo
    from sidecar.store.context import ContextRepo
    from sidecar.store.knowledge import KnowledgeRepo
    from sidecar.store.memory import MemoryRepo
    from sidecar.store.souls import SoulRepo
    from sidecar.store.providers import ProviderRepo
    from sidecar.store.sync import SyncRepo
    from sidecar.store.tasks import TaskRepo
    from sidecar.store.memory_upkeep import MemoryUpkeepRepo
    from sidecar.store.skills import SkillProposalRepo

__all__ = ["Store", "open_store"]


R = TypeVar("R")


class _Repository(Generic[R]):
    """A repository of the Store built at its first use (under the Store's lock, once), so
    what opening the store and the first answers need nothing of is not imported by them. A
    non-data descriptor: once built it is a plain instance attribute. The lock is reentrant,
    so a builder may look up another repository."""

    def __init__(self, build: Callable[[Store], R]) -> None:
        self._build = build
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, store: None, owner: type) -> _Repository[R]: ...
    @overload
    def __get__(self, store: Store, owner: type) -> R: ...
    def __get__(self, store: Store | None, owner: type) -> R | _Repository[R]:
        if store is None:
            return self
        with store._repos_lock:
            if self._name not in store.__dict__:
                store.__dict__[self._name] = self._build(store)
            return cast(R, store.__dict__[self._name])


def _sessions(store: Store) -> SessionRepo:
    from sidecar.store.sessions import SessionRepo

    return SessionRepo(store._db, store._clock)


def _messages(store: Store) -> MessageRepo:
    from sidecar.store.messages import MessageRepo

    return MessageRepo(store._db, store._clock)


def _search(store: Store) -> SearchRepo:
    from sidecar.store.search import SearchRepo

    return SearchRepo(store._db)


def _settings(store: Store) -> SettingsRepo:
    from sidecar.store.settings import SettingsRepo

    return SettingsRepo(store._db)


def _acp(store: Store) -> AcpRepo:
    from sidecar.store.acp import AcpRepo

    return AcpRepo(store._db)


def _tools(store: Store) -> ToolStore:
    from sidecar.store.tools import ToolStore

    return ToolStore(store._db, store._clock, store._sealer)


def _citations(store: Store) -> Citations:
    from sidecar.store.citations import Citations

    return Citations(store._db)


def _files(store: Store) -> FileRepo:
    from sidecar.store.files import FileRepo

    return FileRepo(store._db, store.data_dir, store._clock)


def _assistants(store: Store) -> AssistantRepo:
    from sidecar.store.assistants import AssistantRepo

    return AssistantRepo(store._db)


def _context(store: Store) -> ContextRepo:
    from sidecar.store.context import ContextRepo

    return ContextRepo(store._db)


def _channels(store: Store) -> ChannelRepo:
    from sidecar.store.channels import ChannelRepo

    return ChannelRepo(store._db, store._clock, store._sealer)


def _knowledge(store: Store) -> KnowledgeRepo:
    from sidecar.store.knowledge import KnowledgeRepo

    return KnowledgeRepo(store._db, store._clock)


def _sync(store: Store) -> SyncRepo:
    from sidecar.store.sync import SyncRepo

    return SyncRepo(store._db, store._sealer)


def _memory(store: Store) -> MemoryRepo:
    from sidecar.store.memory import MemoryRepo

    return MemoryRepo(store._db, store._clock)


def _souls(store: Store) -> SoulRepo:
    from sidecar.store.souls import SoulRepo

    return SoulRepo(store._db, store._clock)


def _tasks(store: Store) -> TaskRepo:
    from sidecar.store.tasks import TaskRepo

    return TaskRepo(store._db, store._clock)


def _memory_upkeep(store: Store) -> MemoryUpkeepRepo:
    from sidecar.store.memory_upkeep import MemoryUpkeepRepo

    return MemoryUpkeepRepo(store._db, lambda: store.memory, store._clock)


def _skills(store: Store) -> SkillProposalRepo:
    from sidecar.store.skills import SkillProposalRepo

    return SkillProposalRepo(store._db, store._clock)


def _providers(store: Store) -> ProviderRepo:
    from sidecar.store.providers import ProviderRepo

    return ProviderRepo(store._db, store._sealer)


def _private_data_dir(path: str) -> None:
    """The data dir, made (0700) or narrowed: what the store writes in it is the user's
    alone (sidecar/datadir.py); these are the names of what is ours there."""
    datadir.make_dirs(path)
    datadir.tighten(
        path,
        files=[DB_FILENAME, *(DB_FILENAME + s for s in ("-wal", "-shm", "-journal")), LOCK_FILENAME, KEY_FILE],
        folders=(*MANAGED_DIRS, "skills"),  # skills/: the managed skill folders (sidecar/skills)
        filled=("attachments", "tool_outputs"),
    )


class Store:
    """The database of one data dir. Open = migrate + recover interrupted messages.

    Its repositories are attributes, built at first use (``secrets`` at open)."""

    sessions = _Repository(_sessions)
    messages = _Repository(_messages)
    search = _Repository(_search)
    settings = _Repository(_settings)
    acp = _Repository(_acp)
    tools = _Repository(_tools)
    citations = _Repository(_citations)
    files = _Repository(_files)
    providers = _Repository(_providers)
    assistants = _Repository(_assistants)
    context = _Repository(_context)
    channels = _Repository(_channels)
    knowledge = _Repository(_knowledge)
    sync = _Repository(_sync)
    memory = _Repository(_memory)
    souls = _Repository(_souls)
    tasks = _Repository(_tasks)
    memory_upkeep = _Repository(_memory_upkeep)
    skills = _Repository(_skills)

    def __init__(
        self,
        data_dir: datadir.StrPath,
        *,
        clock: Callable[[], int] = now_ms,
        readers: int = 2,
        secrets: SecretBox | None = None,
        migrate_schema: bool = True,
    ) -> None:
        """``secrets`` seals the stored secrets (default: a box with the data dir's key file).
        ``migrate_schema=False``: open only a database already at the current schema version
        (StoreError otherwise, nothing changed)."""
        path = os.fspath(data_dir)
        try:
            _private_data_dir(path)
        except OSError as exc:
            raise StoreError(f"cannot create the data dir {path}: {exc}") from exc
        self._lock = DirLock(path)
        self.path = os.path.join(path, DB_FILENAME)
        self._clock = clock
        try:
            self._db = Database(self.path, readers=readers)
        except BaseException:
            self._lock.release()
            raise
        db = self._db
        self._resolved_dir = os.path.realpath(path)
        self._sealer = sealer = Sealer(secrets if secrets is not None else SecretBox(path, use_keychain=False))
        self._repos_lock = threading.RLock()
        self.secrets = SecretsRepo(db, sealer, path)
        self.recovered = 0
        try:
            if not migrate_schema and not schema_is_current(db):
                raise StoreError("the database needs a schema migration")
            self.schema_version = migrate(db)
            self._left = recovery.left_behind(db)
            if recovery.MESSAGES in self._left:
                self.recovered = self.messages.recover_interrupted()
            if recovery.ACP_CHUNKS in self._left:
                self.acp.join_left_chunks()
        except BaseException:
            self._db.close()
            self._lock.release()
            raise

    @cached_property
    def data_dir(self) -> Path:
        """The data dir, resolved (a Path made at first use: opening needs no pathlib)."""
        from pathlib import Path  # here: pathlib and urllib.parse are ~3 ms of the first answer

        return Path(self._resolved_dir)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Several repository calls as one write transaction (they join it; all or nothing)."""
        with self._db.write():
            yield

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Repository calls that fail alone inside a transaction (db.py ``savepoint``)."""
        with self._db.savepoint():
            yield

    def close(self) -> None:
        try:
            self._db.close()
        finally:
            self._lock.release()


def open_store(
    data_dir: datadir.StrPath,
    *,
    clock: Callable[[], int] = now_ms,
    readers: int = 2,
    secrets: SecretBox | None = None,
    migrate_schema: bool = True,
) -> Store:
    """The Store as the process opens it: ``Store(...)``, then the tool calls left running
    by a dead process get their "cancelled" result, before anything reads their messages."""
    store = Store(data_dir, clock=clock, readers=readers, secrets=secrets, migrate_schema=migrate_schema)
    try:
        if recovery.TOOL_RUNS in store._left:
            store.tools.complete_interrupted()
    except BaseException:
        store.close()
        raise
    return store
