"""sidecar.store: the SQLite (apsw) storage of sessions, messages, search and settings.

Layout (each module says what it owns):
    db.py          connections, pragmas (WAL, foreign keys, busy timeout), transactions
    migrations/    the numbered schema migrations (PRAGMA user_version): the runner and
                   the ordered list (__init__.py), the migrations in modules by era
    ids.py         UUIDv7 ids and the ms clock
    rows.py        row <-> protocol Struct mapping
    stored_json.py reading a JSON column (its depth bound, strict and lenient reads)
    checks.py      argument checks -> InvalidParams
    sessions.py    SessionRepo      (the sessions repository: one transaction per call)
    session_table.py                (sessions_v2, session_tags, counters: SQL on a connection)
    messages.py    MessageRepo      (the messages repository: tree, streaming, final rows)
    message_table.py                (messages_v2 rows and tree walks: SQL on a connection)
    search.py      SearchRepo       (FTS5 index and queries)
    fts.py         CJK-bigram text for the index, quoted MATCH expressions, snippets
    bm25.py        the BM25 ranking function every connection registers
    settings.py    SettingsRepo     (key/value settings)
    transfer.py    fork, export, import
    sync.py        SyncRepo         (Qiming server account, session <-> conversation links, message map)
    store.py       Store            (its repositories as attributes: one call = one transaction)
    layout.py      the folders the store keeps in the data dir
    recovery.py    what a dead process left behind, told by one read at open
    async_store.py AsyncStore       (the gateway: ``await run(fn)`` calls fn(store) in a worker thread)

Errors: StoreError / NotFound (sidecar.errors) for database and reference failures,
InvalidParams for bad arguments; a failed call changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.store.async_store import AsyncStore
    from sidecar.store.messages import ACTIVE_LEAF
    from sidecar.store.store import Store

__all__ = ["Store", "AsyncStore", "ACTIVE_LEAF"]

_EXPORTS = {"Store": "sidecar.store.store", "AsyncStore": "sidecar.store.async_store", "ACTIVE_LEAF": "sidecar.store.messages"}


def __getattr__(name: str) -> Any:
    """The package's names, imported at first use: opening the store (``sidecar.store.store``)
    runs this package's code first, and must not pay for the async gateway or the messages."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
