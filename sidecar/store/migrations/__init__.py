"""Schema migrations: a list applied in order, the version in PRAGMA user_version.

Owns: the schema, and the runner (this module). A migration's version is its position in
``MIGRATIONS`` below (counted from 1), never its name or its module: the number in
``m001_...`` to ``m009_...`` is only a label, and ``m_context_window`` (version 10) and
``m_acp_engines`` (version 11) carry none. Each is applied once, in its own
``BEGIN IMMEDIATE`` transaction together with the new ``user_version``, so a crash or an
error leaves the database at the previous version, never half-migrated. A database
already at the current version is only read (``user_version``), not write-locked.
The migrations live in modules by era, each named by the first version it holds:
v01_chat.py (1-12), v13_features.py (13-19), v20_memory_tasks.py (20-25),
v26_refinements.py (26 on).

Adding one: write ``def m_<what>(conn: apsw.Connection) -> None`` at the end of the
newest era module (or start ``vNN_<era>.py`` named by its version when that module
nears the size limit), add it to that module's ``__all__``, and append it at the END of
``MIGRATIONS`` here. Nothing else numbers it.

Must stay true: migrations are only ever APPENDED at the end of ``MIGRATIONS``; a shipped
migration is never edited, renamed in a way that moves it, or reordered. Migration 1 is
seed 004 section 3 verbatim (columns, defaults, cascade, its five indexes).

Decisions recorded here:
- The active branch of a session is ``sessions_v2.active_leaf_id`` (migration 2), kept by
  the store (no foreign key: a session row and its messages reference each other).
- ``messages_v2.seq`` is the last stream event number of a streamed message (migration 2).
- ``session_tags`` mirrors the JSON ``tags`` column, one row per tag, so "all given tags"
  is an indexed lookup instead of JSON parsing of every session (migration 4).
- Search: ``search_docs`` gives every indexed message a stable integer docid (the implicit
  rowid of messages_v2 may change on VACUUM); ``messages_fts`` is a contentless FTS5 table
  (the original text stays in messages_v2; snippets are cut from it) whose rows a trigger
  deletes with their search_docs row, which in turn cascades from messages_v2 (migration 6).
  ``search_docs.created_at`` copies the message's created_at (a trigger fills it on insert)
  so search's date filter needs no message row (migration 12).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import apsw

from sidecar.errors import StoreError
from sidecar.logging_setup import EarlyLogger
from sidecar.store.db import Database
from sidecar.store.migrations.v01_chat import (
    m001_seed_tables,
    m002_active_leaf_and_seq,
    m003_settings,
    m004_session_tags,
    m005_query_indexes,
    m006_search_index,
    m007_providers,
    m008_session_workspace_dir,
    m009_tool_calls,
    m012_search_docs_created_at,
    m_acp_engines,
    m_context_window,
)
from sidecar.store.migrations.v13_features import (
    m_channels,
    m_citations,
    m_data_lifecycle,
    m_generation_completeness,
    m_knowledge,
    m_qiming_forward,
    m_qiming_sync,
)
from sidecar.store.migrations.v20_memory_tasks import (
    m_channel_dedup_per_chat,
    m_memory,
    m_memory_upkeep,
    m_provider_limits,
    m_skill_proposals,
    m_tasks,
)
from sidecar.store.migrations.v26_refinements import (
    m_channel_routes_access,
    m_fts_fold,
    m_kb_chunk_ids,
    m_kb_embedding_retry,
    m_kb_fts_per_base,
    m_kb_common_lines,
)

__all__ = ["Migration", "MIGRATIONS", "migrate", "schema_is_current", "schema_version"]

log = EarlyLogger(__name__)

Migration = Callable[[apsw.Connection], None]

MIGRATIONS: list[Migration] = [
    m001_seed_tables,  # 1
    m002_active_leaf_and_seq,  # 2
    m003_settings,  # 3
    m004_session_tags,  # 4
    m005_query_indexes,  # 5
    m006_search_index,  # 6
    m007_providers,  # 7
    m008_session_workspace_dir,  # 8
    m009_tool_calls,  # 9
    m_context_window,  # 10
    m_acp_engines,  # 11
    m012_search_docs_created_at,  # 12
    m_channels,  # 13
    m_knowledge,  # 14
    m_qiming_sync,  # 15
    m_citations,  # 16
    m_qiming_forward,  # 17
    m_data_lifecycle,  # 18
    m_generation_completeness,  # 19
    m_memory,  # 20
    m_channel_dedup_per_chat,  # 21
    m_tasks,  # 22
    m_provider_limits,  # 23
    m_memory_upkeep,  # 24
    m_skill_proposals,  # 25
    m_fts_fold,  # 26
    m_kb_embedding_retry,  # 27
    m_kb_chunk_ids,  # 28
    m_channel_routes_access,  # 29
    m_kb_fts_per_base,  # 30
    m_kb_common_lines,  # 31
]
"""Every migration, in order: a migration's version is its position here, from 1."""


def schema_version(conn: apsw.Connection) -> int:
    return cast(int, conn.execute("PRAGMA user_version").fetchall()[0][0])


def schema_is_current(db: Database) -> bool:
    """The database is at this program's schema version (``migrate`` has nothing to do)."""
    return int(db.pragma("user_version")) == len(MIGRATIONS)


def migrate(db: Database) -> int:
    """Apply every pending migration; returns the resulting version. A database already
    at the current version is only read (no write transaction on every start)."""
    target = len(MIGRATIONS)
    version = int(db.pragma("user_version"))
    if version == target:
        return version
    while True:
        with db.write() as conn:
            # Read inside the write lock: another process may have migrated meanwhile.
            version = schema_version(conn)
            if version > target:
                raise StoreError(
                    f"the database is at schema version {version}, newer than this program "
                    f"({target}); refusing to touch it"
                )
            if version == target:
                return version
            fn = MIGRATIONS[version]
            log.info("applying migration %d (%s)", version + 1, fn.__name__)
            fn(conn)
            conn.execute(f"PRAGMA user_version = {version + 1}")
