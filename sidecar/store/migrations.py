"""Schema migrations: a list applied in order, the version in PRAGMA user_version.

Owns: the schema. A migration's version is its position in MIGRATIONS (the order of the
``@migration`` decorators in this file, counted from 1), never its name: the number in
``m001_...`` to ``m009_...`` is only a label, and ``m_context_window`` (version 10) and
``m_acp_engines`` (version 11) carry none. Each is applied once, in its own
``BEGIN IMMEDIATE`` transaction together with the new ``user_version``, so a crash or an
error leaves the database at the previous version, never half-migrated. A database
already at the current version is only read (``user_version``), not write-locked.
Must stay true: migrations are only ever APPENDED at the end of this file (later issues
add providers, summaries, tool approvals...); a shipped migration is never edited,
renamed in a way that moves it, or reordered. Migration 1 is seed 004 section 3 verbatim
(columns, defaults, cascade, its five indexes).

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

import logging
from collections.abc import Callable
from typing import cast

import apsw

from sidecar.errors import StoreError
from sidecar.store.db import Database

__all__ = ["migration", "MIGRATIONS", "migrate", "schema_is_current", "schema_version"]

log = logging.getLogger(__name__)

Migration = Callable[[apsw.Connection], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    """Register ``fn`` as the next migration (its number is its position, from 1)."""
    MIGRATIONS.append(fn)
    return fn


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


# ---- the migrations (append only) ---------------------------------------------------


@migration
def m001_seed_tables(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE sessions_v2 (
          id              TEXT PRIMARY KEY,
          title           TEXT NOT NULL DEFAULT 'New Chat',
          summary         TEXT,
          provider_id     TEXT NOT NULL,
          model_id        TEXT NOT NULL,
          system_prompt   TEXT,
          mode            TEXT NOT NULL DEFAULT 'direct',
          acp_session_id  TEXT,
          tags            TEXT,
          folder          TEXT,
          is_pinned       INTEGER DEFAULT 0,
          is_archived     INTEGER DEFAULT 0,
          message_count   INTEGER DEFAULT 0,
          total_tokens    INTEGER DEFAULT 0,
          total_cost      REAL DEFAULT 0,
          channel_id      TEXT,
          channel_meta    TEXT,
          created_at      INTEGER NOT NULL,
          updated_at      INTEGER NOT NULL,
          last_message_at INTEGER
        );
        CREATE INDEX idx_sessions_updated ON sessions_v2(updated_at DESC);
        CREATE INDEX idx_sessions_folder ON sessions_v2(folder);
        CREATE INDEX idx_sessions_channel ON sessions_v2(channel_id);

        CREATE TABLE messages_v2 (
          id              TEXT PRIMARY KEY,
          session_id      TEXT NOT NULL REFERENCES sessions_v2(id) ON DELETE CASCADE,
          parent_id       TEXT,
          role            TEXT NOT NULL,
          content_type    TEXT NOT NULL DEFAULT 'text',
          text_content    TEXT,
          parts           TEXT,
          tool_calls      TEXT,
          tool_call_id    TEXT,
          tool_name       TEXT,
          model_id        TEXT,
          usage           TEXT,
          latency_ms      INTEGER,
          acp_message_id  TEXT,
          acp_parts       TEXT,
          status          TEXT DEFAULT 'completed',
          error           TEXT,
          created_at      INTEGER NOT NULL,
          updated_at      INTEGER NOT NULL
        );
        CREATE INDEX idx_messages_session ON messages_v2(session_id, created_at);
        CREATE INDEX idx_messages_parent ON messages_v2(parent_id);
        """
    )


@migration
def m002_active_leaf_and_seq(conn: apsw.Connection) -> None:
    conn.execute(
        """
        ALTER TABLE sessions_v2 ADD COLUMN active_leaf_id TEXT;
        ALTER TABLE messages_v2 ADD COLUMN seq INTEGER;
        """
    )


@migration
def m003_settings(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE settings (
          key   TEXT PRIMARY KEY,
          value TEXT NOT NULL
        ) WITHOUT ROWID;
        """
    )


@migration
def m004_session_tags(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE session_tags (
          session_id TEXT NOT NULL REFERENCES sessions_v2(id) ON DELETE CASCADE,
          tag        TEXT NOT NULL,
          PRIMARY KEY (session_id, tag)
        ) WITHOUT ROWID;
        CREATE INDEX idx_session_tags_tag ON session_tags(tag, session_id);
        INSERT OR IGNORE INTO session_tags(session_id, tag)
          SELECT s.id, j.value FROM sessions_v2 s, json_each(s.tags) j
          WHERE json_valid(s.tags) AND j.type = 'text';
        """
    )


@migration
def m005_query_indexes(conn: apsw.Connection) -> None:
    # chat:session:list orders by (is_pinned DESC, <sortBy> DESC, id DESC): with these the
    # first page is read in index order without sorting every session. The partial index
    # lets crash recovery at start-up find unfinished rows without scanning every message.
    conn.execute(
        """
        CREATE INDEX idx_sessions_pin_updated ON sessions_v2(is_pinned, updated_at, id);
        CREATE INDEX idx_sessions_pin_created ON sessions_v2(is_pinned, created_at, id);
        CREATE INDEX idx_sessions_pin_last ON sessions_v2(is_pinned, last_message_at, id);
        CREATE INDEX idx_sessions_folder_pin_updated
          ON sessions_v2(folder, is_pinned, updated_at, id);
        CREATE INDEX idx_messages_unfinished ON messages_v2(status)
          WHERE status IN ('pending', 'streaming');
        """
    )


@migration
def m006_search_index(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE search_docs (
          docid      INTEGER PRIMARY KEY,
          message_id TEXT NOT NULL UNIQUE REFERENCES messages_v2(id) ON DELETE CASCADE
        );
        CREATE VIRTUAL TABLE messages_fts USING fts5(
          body, sid, role,
          content = '', contentless_delete = 1,
          tokenize = 'unicode61 remove_diacritics 2'
        );
        INSERT INTO messages_fts(messages_fts, rank) VALUES ('rank', 'bm25(1.0, 0.0, 0.0)');
        CREATE TRIGGER search_docs_after_delete AFTER DELETE ON search_docs BEGIN
          DELETE FROM messages_fts WHERE rowid = old.docid;
        END;
        """
    )
    from sidecar.store.search import MessageSearch

    MessageSearch.reindex_all(conn)


@migration
def m007_providers(conn: apsw.Connection) -> None:
    # provider:* configuration. JSON columns hold the typed values of
    # protocol.ModelConfig / headers / body; api_key never leaves sidecar/store/providers.py
    # except inside the provider adapter's request headers.
    conn.execute(
        """
        CREATE TABLE providers (
          id          TEXT PRIMARY KEY,
          name        TEXT NOT NULL,
          type        TEXT NOT NULL,
          base_url    TEXT NOT NULL,
          api_key     TEXT,
          api_key_env TEXT,
          headers     TEXT NOT NULL DEFAULT '{}',
          body        TEXT NOT NULL DEFAULT '{}',
          models      TEXT NOT NULL DEFAULT '[]',
          enabled     INTEGER NOT NULL DEFAULT 1,
          created_at  INTEGER NOT NULL,
          updated_at  INTEGER NOT NULL
        );
        """
    )


@migration
def m008_session_workspace_dir(conn: apsw.Connection) -> None:
    # The session's working directory (the workspace tools, the ACP cwd).
    conn.execute("ALTER TABLE sessions_v2 ADD COLUMN workspace_dir TEXT;")


@migration
def m009_tool_calls(conn: apsw.Connection) -> None:
    # Issue 5 (sidecar/store/tools.py): the tool loop's per-reply state (tool_runs), every
    # tool call's approval state (tool_calls), stored policies, the audit trail of every
    # decision (kept when its session is deleted: no foreign key) and MCP server configs.
    conn.execute(
        """
        CREATE TABLE tool_runs (
          message_id  TEXT PRIMARY KEY REFERENCES messages_v2(id) ON DELETE CASCADE,
          session_id  TEXT NOT NULL,
          provider_id TEXT NOT NULL,
          model_id    TEXT NOT NULL,
          temperature REAL,
          steps       INTEGER NOT NULL DEFAULT 0,
          state       TEXT NOT NULL,
          updated_at  INTEGER NOT NULL
        );
        CREATE INDEX idx_tool_runs_session ON tool_runs(session_id, state);
        CREATE TABLE tool_calls (
          message_id   TEXT NOT NULL REFERENCES messages_v2(id) ON DELETE CASCADE,
          tool_call_id TEXT NOT NULL,
          session_id   TEXT NOT NULL,
          tool_name    TEXT NOT NULL,
          arguments    TEXT NOT NULL,
          source       TEXT NOT NULL DEFAULT 'tool',
          policy_key   TEXT,
          options      TEXT,
          state        TEXT NOT NULL,
          answer       TEXT,
          option_id    TEXT,
          step         INTEGER NOT NULL DEFAULT 0,
          created_at   INTEGER NOT NULL,
          updated_at   INTEGER NOT NULL,
          PRIMARY KEY (message_id, tool_call_id)
        );
        CREATE INDEX idx_tool_calls_open ON tool_calls(session_id, state)
          WHERE state IN ('pending', 'approved', 'denied', 'answered', 'running');
        CREATE INDEX idx_tool_calls_id ON tool_calls(tool_call_id);
        CREATE TABLE tool_policies (
          key        TEXT PRIMARY KEY,
          policy     TEXT NOT NULL,
          updated_at INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE tool_audit (
          id           INTEGER PRIMARY KEY,
          at           INTEGER NOT NULL,
          session_id   TEXT NOT NULL,
          message_id   TEXT NOT NULL,
          tool_call_id TEXT NOT NULL,
          tool_name    TEXT NOT NULL,
          arguments    TEXT NOT NULL,
          decision     TEXT NOT NULL,
          actor        TEXT NOT NULL,
          source       TEXT NOT NULL DEFAULT 'tool',
          answer       TEXT,
          note         TEXT
        );
        CREATE INDEX idx_tool_audit_session ON tool_audit(session_id, id);
        CREATE INDEX idx_tool_audit_call ON tool_audit(tool_call_id, id);
        CREATE TABLE mcp_servers (
          name       TEXT PRIMARY KEY,
          config     TEXT NOT NULL,
          created_at INTEGER NOT NULL,
          updated_at INTEGER NOT NULL
        ) WITHOUT ROWID;
        """
    )


@migration
def m_context_window(conn: apsw.Connection) -> None:
    # Issue 6 (sidecar/store/context.py, sidecar/store/assistants.py): rolling summaries,
    # a session's assistant profile and truncation strategy, the per-message token-count
    # cache, and assistant profiles with the built-in default one.
    conn.execute(
        """
        CREATE TABLE rolling_summaries (
          session_id      TEXT PRIMARY KEY REFERENCES sessions_v2(id) ON DELETE CASCADE,
          text            TEXT NOT NULL,
          covered_ids     TEXT NOT NULL,
          last_covered_id TEXT NOT NULL,
          covered_count   INTEGER NOT NULL,
          tokens          INTEGER NOT NULL,
          model_id        TEXT,
          updated_at      INTEGER NOT NULL
        );
        CREATE TABLE session_context (
          session_id          TEXT PRIMARY KEY REFERENCES sessions_v2(id) ON DELETE CASCADE,
          assistant_id        TEXT,
          truncation_strategy TEXT
        ) WITHOUT ROWID;
        CREATE TABLE message_tokens (
          message_id   TEXT NOT NULL REFERENCES messages_v2(id) ON DELETE CASCADE,
          encoding     TEXT NOT NULL,
          content_hash TEXT NOT NULL,
          tokens       INTEGER NOT NULL,
          PRIMARY KEY (message_id, encoding)
        ) WITHOUT ROWID;
        CREATE TABLE assistants (
          id         TEXT PRIMARY KEY,
          name       TEXT NOT NULL,
          config     TEXT NOT NULL DEFAULT '{}',
          created_at INTEGER NOT NULL,
          updated_at INTEGER NOT NULL
        );
        INSERT INTO assistants(id, name, config, created_at, updated_at)
          VALUES ('default', 'Default', '{}', 0, 0);
        """
    )


@migration
def m_acp_engines(conn: apsw.Connection) -> None:
    # Issue 7 (sidecar/store/acp.py, sidecar/store/providers.py): the engine configuration of
    # acp-engine providers (JSON of protocol.AcpEngineConfig; env values may be secrets), and
    # for every ACP reply the agent session that holds the conversation up to and including
    # that reply (regenerate / edit-and-resend fork it; a send continues from it).
    conn.execute(
        """
        ALTER TABLE providers ADD COLUMN engine TEXT;
        CREATE TABLE acp_turns (
          message_id       TEXT PRIMARY KEY REFERENCES messages_v2(id) ON DELETE CASCADE,
          session_id       TEXT NOT NULL,
          engine_id        TEXT NOT NULL,
          agent_session_id TEXT NOT NULL,
          created_at       INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX idx_acp_turns_session ON acp_turns(session_id);
        """
    )


@migration
def m012_search_docs_created_at(conn: apsw.Connection) -> None:
    # A copy of each indexed message's created_at (never changed once written) beside its
    # docid, so search's date filter reads the small search_docs row of a candidate instead
    # of its message row (about 4x less per candidate). A trigger fills it on every insert,
    # so indexing code (and migration 6's reindex, which runs before this column exists)
    # stays as it is.
    conn.execute(
        """
        ALTER TABLE search_docs ADD COLUMN created_at INTEGER;
        UPDATE search_docs SET created_at =
          (SELECT m.created_at FROM messages_v2 m WHERE m.id = search_docs.message_id);
        CREATE TRIGGER search_docs_created_at AFTER INSERT ON search_docs BEGIN
          UPDATE search_docs SET created_at =
            (SELECT m.created_at FROM messages_v2 m WHERE m.id = new.message_id)
          WHERE docid = new.docid;
        END;
        """
    )


@migration
def m_channels(conn: apsw.Connection) -> None:
    # IM channels (sidecar/store/channels.py): the configured channels; the link of a chat's
    # scope (chat, chat + sender, thread) to its session (the real server's ImSession); every
    # received message, kept for the dedup window (its platform message id, or a content
    # hash, is unique per channel) and as the durable queue of turns; every channel:reply
    # delivery with its acknowledgement state; and on messages_v2 the delivery summary of a
    # reply (JSON of protocol.MessageDelivery, shown by chat:messages:get). Written to be
    # re-runnable (IF NOT EXISTS, the column checked first): tests that step user_version
    # back to replay an earlier migration replay this one too.
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS channel_configs (
          id         TEXT PRIMARY KEY,
          platform   TEXT NOT NULL,
          config     TEXT NOT NULL,
          created_at INTEGER NOT NULL,
          updated_at INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS channel_links (
          channel_id TEXT NOT NULL REFERENCES channel_configs(id) ON DELETE CASCADE,
          scope_key  TEXT NOT NULL,
          session_id TEXT NOT NULL REFERENCES sessions_v2(id) ON DELETE CASCADE,
          chat_id    TEXT NOT NULL,
          created_at INTEGER NOT NULL,
          updated_at INTEGER NOT NULL,
          PRIMARY KEY (channel_id, scope_key)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS idx_channel_links_session ON channel_links(session_id);
        CREATE TABLE IF NOT EXISTS channel_inbox (
          id                  TEXT PRIMARY KEY,
          channel_id          TEXT NOT NULL REFERENCES channel_configs(id) ON DELETE CASCADE,
          dedup_key           TEXT NOT NULL,
          chat_id             TEXT NOT NULL,
          thread_id           TEXT,
          platform_message_id TEXT,
          session_id          TEXT REFERENCES sessions_v2(id) ON DELETE SET NULL,
          action              TEXT NOT NULL,
          state               TEXT NOT NULL,
          input               TEXT,
          user_message_id     TEXT,
          reply_message_id    TEXT,
          error               TEXT,
          received_at         INTEGER NOT NULL,
          updated_at          INTEGER NOT NULL,
          UNIQUE (channel_id, dedup_key)
        );
        CREATE INDEX IF NOT EXISTS idx_channel_inbox_received ON channel_inbox(channel_id, received_at);
        CREATE INDEX IF NOT EXISTS idx_channel_inbox_open ON channel_inbox(session_id, id)
          WHERE state IN ('queued', 'running');
        CREATE INDEX IF NOT EXISTS idx_channel_inbox_platform ON channel_inbox(channel_id, platform_message_id)
          WHERE platform_message_id IS NOT NULL;
        CREATE TABLE IF NOT EXISTS channel_deliveries (
          id                  TEXT PRIMARY KEY,
          channel_id          TEXT NOT NULL REFERENCES channel_configs(id) ON DELETE CASCADE,
          chat_id             TEXT NOT NULL,
          message_id          TEXT REFERENCES messages_v2(id) ON DELETE CASCADE,
          inbox_id            TEXT,
          seq                 INTEGER NOT NULL,
          kind                TEXT NOT NULL,
          target              INTEGER NOT NULL,
          payload             TEXT NOT NULL,
          state               TEXT NOT NULL,
          attempts            INTEGER NOT NULL DEFAULT 0,
          error               TEXT,
          platform_message_id TEXT,
          created_at          INTEGER NOT NULL,
          updated_at          INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS idx_channel_deliveries_open ON channel_deliveries(channel_id, chat_id, id)
          WHERE state IN ('pending', 'sent');
        CREATE INDEX IF NOT EXISTS idx_channel_deliveries_message ON channel_deliveries(message_id, seq);
        CREATE INDEX IF NOT EXISTS idx_channel_deliveries_platform ON channel_deliveries(channel_id, platform_message_id)
          WHERE platform_message_id IS NOT NULL;
        """
    )
    columns = {row[1] for row in conn.execute("PRAGMA table_info(messages_v2)")}
    if "delivery" not in columns:
        conn.execute("ALTER TABLE messages_v2 ADD COLUMN delivery TEXT")


@migration
def m_knowledge(conn: apsw.Connection) -> None:
    # Knowledge bases (sidecar/store/knowledge.py). Chunk rows get AUTOINCREMENT rowids (never
    # reused) that the contentless FTS table and the in-memory vector index use as their key;
    # ``kb_chunks.id`` is the content-addressed id citations keep. A chunk's vectors cascade
    # with it, chunks with their document, documents with their base. ``vector_model`` is the
    # model whose vectors answer searches; ``embed_model`` the one new vectors are made with
    # (they differ while a change of model is re-embedded). The document's extracted text is
    # kept: chunk offsets refer to it and a re-chunk needs no file. IF NOT EXISTS: a database
    # whose version was set back (tests re-run an earlier migration) passes through unchanged.
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS kb_bases (
          id                TEXT PRIMARY KEY,
          name              TEXT NOT NULL,
          description       TEXT NOT NULL DEFAULT '',
          embed_provider_id TEXT,
          embed_model_id    TEXT,
          chunk_size        INTEGER NOT NULL,
          chunk_overlap     INTEGER NOT NULL,
          vector_model      TEXT,
          vector_dims       INTEGER,
          created_at        INTEGER NOT NULL,
          updated_at        INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS kb_documents (
          id           TEXT PRIMARY KEY,
          kb_id        TEXT NOT NULL REFERENCES kb_bases(id) ON DELETE CASCADE,
          name         TEXT NOT NULL,
          kind         TEXT NOT NULL,
          source       TEXT NOT NULL,
          path         TEXT,
          size_bytes   INTEGER NOT NULL DEFAULT 0,
          content_hash TEXT,
          body         TEXT,
          pages        TEXT,
          status       TEXT NOT NULL,
          error        TEXT,
          error_code   TEXT,
          chunk_count  INTEGER NOT NULL DEFAULT 0,
          revision     INTEGER NOT NULL DEFAULT 0,
          created_at   INTEGER NOT NULL,
          updated_at   INTEGER NOT NULL,
          indexed_at   INTEGER
        );
        CREATE UNIQUE INDEX IF NOT EXISTS idx_kb_documents_hash ON kb_documents(kb_id, content_hash);
        CREATE INDEX IF NOT EXISTS idx_kb_documents_kb ON kb_documents(kb_id, created_at, id);
        CREATE INDEX IF NOT EXISTS idx_kb_documents_open ON kb_documents(status)
          WHERE status IN ('pending', 'indexing');
        CREATE TABLE IF NOT EXISTS kb_chunks (
          rowid       INTEGER PRIMARY KEY AUTOINCREMENT,
          id          TEXT NOT NULL UNIQUE,
          kb_id       TEXT NOT NULL,
          document_id TEXT NOT NULL REFERENCES kb_documents(id) ON DELETE CASCADE,
          ordinal     INTEGER NOT NULL,
          heading     TEXT NOT NULL DEFAULT '[]',
          char_start  INTEGER NOT NULL,
          char_end    INTEGER NOT NULL,
          page        INTEGER,
          tokens      INTEGER NOT NULL,
          embed_hash  TEXT NOT NULL,
          text        TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS idx_kb_chunks_document ON kb_chunks(document_id, ordinal);
        CREATE INDEX IF NOT EXISTS idx_kb_chunks_kb ON kb_chunks(kb_id);
        CREATE TABLE IF NOT EXISTS kb_vectors (
          kb_id       TEXT NOT NULL,
          model       TEXT NOT NULL,
          chunk_rowid INTEGER NOT NULL REFERENCES kb_chunks(rowid) ON DELETE CASCADE,
          embed_hash  TEXT NOT NULL,
          dims        INTEGER NOT NULL,
          vector      BLOB NOT NULL,
          PRIMARY KEY (kb_id, model, chunk_rowid)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS idx_kb_vectors_chunk ON kb_vectors(chunk_rowid);
        CREATE VIRTUAL TABLE IF NOT EXISTS kb_chunks_fts USING fts5(
          body, kb,
          content = '', contentless_delete = 1,
          tokenize = 'porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER IF NOT EXISTS kb_chunks_after_delete AFTER DELETE ON kb_chunks BEGIN
          DELETE FROM kb_chunks_fts WHERE rowid = old.rowid;
        END;
        """
    )


@migration
def m_qiming_sync(conn: apsw.Connection) -> None:
    # Qiming server sync (sidecar/store/sync.py): the one server account (its token only in
    # the form sidecar/sync/secrets.py seals), the link of each local session to a server
    # conversation (also the tombstone once either side deleted it: no foreign key, so the
    # row outlives its session), and which local message is which server message (by the
    # server's message index, unique per account) so repeated pulls add nothing twice.
    # IF NOT EXISTS: a database rolled back to an earlier user_version re-runs it harmlessly.
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS sync_account (
          id               INTEGER PRIMARY KEY CHECK (id = 1),
          service_url      TEXT NOT NULL,
          account_key      TEXT NOT NULL,
          token            TEXT,
          token_expires_at INTEGER,
          user             TEXT,
          config           TEXT NOT NULL DEFAULT '{}',
          state            TEXT NOT NULL,
          last_sync_at     INTEGER,
          last_result      TEXT,
          watermarks       TEXT NOT NULL DEFAULT '{}',
          updated_at       INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS sync_links (
          account_key        TEXT NOT NULL,
          conversation_id    INTEGER NOT NULL,
          session_id         TEXT NOT NULL,
          agent_id           INTEGER,
          state              TEXT NOT NULL,
          server_modified    INTEGER,
          server_topic       TEXT,
          local_title        TEXT,
          pulled_index       INTEGER,
          open_index         INTEGER,
          local_synced_at    INTEGER,
          reported_local     INTEGER NOT NULL DEFAULT 0,
          sandbox_session_id TEXT,
          pulled_at          INTEGER,
          pushed_at          INTEGER,
          created_at         INTEGER NOT NULL,
          updated_at         INTEGER NOT NULL,
          PRIMARY KEY (account_key, conversation_id)
        ) WITHOUT ROWID;
        CREATE UNIQUE INDEX IF NOT EXISTS idx_sync_links_session ON sync_links(account_key, session_id);
        CREATE INDEX IF NOT EXISTS idx_sync_links_any_session ON sync_links(session_id);
        CREATE TABLE IF NOT EXISTS sync_messages (
          message_id      TEXT PRIMARY KEY REFERENCES messages_v2(id) ON DELETE CASCADE,
          session_id      TEXT NOT NULL,
          account_key     TEXT NOT NULL,
          conversation_id INTEGER NOT NULL,
          server_index    INTEGER NOT NULL,
          server_id       TEXT,
          digest          TEXT NOT NULL,
          finished        INTEGER NOT NULL DEFAULT 1
        ) WITHOUT ROWID;
        CREATE UNIQUE INDEX IF NOT EXISTS idx_sync_messages_index ON sync_messages(account_key, server_index);
        CREATE INDEX IF NOT EXISTS idx_sync_messages_conversation
          ON sync_messages(account_key, conversation_id, server_index);
        CREATE INDEX IF NOT EXISTS idx_sync_messages_session ON sync_messages(session_id);
        """
    )


@migration
def m_citations(conn: apsw.Connection) -> None:
    # Citations of assistant replies (sidecar/store/citations.py): one row per marker of a
    # message, with the cited chunk's snapshot (or a dangling marker: no chunk). No foreign
    # key to the knowledge tables, on purpose: deleting or re-indexing a document must leave
    # the citations readable (their state is computed when they are read). Re-runnable.
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS message_citations (
          message_id    TEXT NOT NULL REFERENCES messages_v2(id) ON DELETE CASCADE,
          marker        INTEGER NOT NULL,
          session_id    TEXT NOT NULL,
          chunk_id      TEXT,
          kb_id         TEXT,
          document_id   TEXT,
          document_name TEXT,
          heading       TEXT NOT NULL DEFAULT '[]',
          char_start    INTEGER,
          char_end      INTEGER,
          page          INTEGER,
          score         REAL NOT NULL DEFAULT 0,
          mode          TEXT NOT NULL,
          text          TEXT NOT NULL DEFAULT '',
          dangling      INTEGER NOT NULL DEFAULT 0,
          PRIMARY KEY (message_id, marker)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS idx_message_citations_session ON message_citations(session_id);
        """
    )


@migration
def m_qiming_forward(conn: apsw.Connection) -> None:
    # Server-forwarded chat (sidecar/sync/forward.py): the server-side session a server
    # session's last turn ran in (the computer API continues it), per session (cascades).
    # IF NOT EXISTS: a database rolled back to an earlier user_version re-runs it harmlessly.
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS sync_forward (
          session_id        TEXT PRIMARY KEY REFERENCES sessions_v2(id) ON DELETE CASCADE,
          chat_api          TEXT NOT NULL,
          remote_session_id TEXT NOT NULL,
          updated_at        INTEGER NOT NULL
        ) WITHOUT ROWID;
        """
    )


@migration
def m_data_lifecycle(conn: apsw.Connection) -> None:
    # The data lifecycle (sidecar/store/files.py, sidecar/store/acp.py, SessionRepo):
    # - owned_files: every file on disk that belongs to a session (ACP default workspace)
    #   or one of its messages (attachments, generated images, tool output spills), written
    #   in the transaction of the row that references it. A file is shared by every row
    #   naming it (a fork copies references): it is released when the last row goes;
    # - file_deletions: the journal of released files, filled by the trigger below in the
    #   same transaction as the delete that released them (a session, a branch, an import
    #   that replaces), emptied once the file is gone: a delete cut by a crash is finished
    #   at the next start. A file owned again before it is removed leaves the journal;
    # - acp_raw_chunks: the raw ACP updates of a reply while it streams, one row per
    #   persistence tick (appended, never rewritten), joined into acp_parts at its ending;
    # - acp_released: agent sessions no reply uses any more (filled by a trigger when the
    #   last acp_turns row naming one goes), to be closed at the engine;
    # - sessions_v2.usage_by_kind: usage and cost per kind of call (replies, side calls);
    #   sessions_v2.title_attempted: a title was asked for (the start-up pass asks for the
    #   titles that were due and never written; existing sessions count as asked).
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS owned_files (
          session_id TEXT NOT NULL REFERENCES sessions_v2(id) ON DELETE CASCADE,
          message_id TEXT REFERENCES messages_v2(id) ON DELETE CASCADE,
          root       TEXT NOT NULL,
          path       TEXT NOT NULL,
          kind       TEXT NOT NULL,
          created_at INTEGER NOT NULL
        );
        CREATE UNIQUE INDEX IF NOT EXISTS idx_owned_files_owner ON owned_files(session_id, coalesce(message_id, ''), root, path);
        CREATE INDEX IF NOT EXISTS idx_owned_files_path ON owned_files(root, path);
        CREATE INDEX IF NOT EXISTS idx_owned_files_message ON owned_files(message_id);
        CREATE TABLE IF NOT EXISTS file_deletions (
          root      TEXT NOT NULL,
          path      TEXT NOT NULL,
          kind      TEXT NOT NULL,
          queued_at INTEGER NOT NULL,
          PRIMARY KEY (root, path)
        ) WITHOUT ROWID;
        CREATE TRIGGER IF NOT EXISTS owned_files_released AFTER DELETE ON owned_files
        WHEN NOT EXISTS (SELECT 1 FROM owned_files WHERE root = OLD.root AND path = OLD.path)
        BEGIN
          INSERT OR IGNORE INTO file_deletions (root, path, kind, queued_at)
          VALUES (OLD.root, OLD.path, OLD.kind, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
        END;
        CREATE TRIGGER IF NOT EXISTS owned_files_owned AFTER INSERT ON owned_files
        BEGIN
          DELETE FROM file_deletions WHERE root = NEW.root AND path = NEW.path;
        END;

        CREATE TABLE IF NOT EXISTS acp_raw_chunks (
          message_id TEXT NOT NULL REFERENCES messages_v2(id) ON DELETE CASCADE,
          first      INTEGER NOT NULL,
          body       TEXT NOT NULL,
          PRIMARY KEY (message_id, first)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS acp_released (
          engine_id        TEXT NOT NULL,
          agent_session_id TEXT NOT NULL,
          queued_at        INTEGER NOT NULL,
          PRIMARY KEY (engine_id, agent_session_id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS idx_acp_turns_agent ON acp_turns(engine_id, agent_session_id);
        CREATE TRIGGER IF NOT EXISTS acp_turns_released AFTER DELETE ON acp_turns
        WHEN NOT EXISTS (
          SELECT 1 FROM acp_turns WHERE engine_id = OLD.engine_id AND agent_session_id = OLD.agent_session_id
        )
        BEGIN
          INSERT OR IGNORE INTO acp_released (engine_id, agent_session_id, queued_at)
          VALUES (OLD.engine_id, OLD.agent_session_id, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
        END;
        CREATE TRIGGER IF NOT EXISTS acp_turns_used AFTER INSERT ON acp_turns
        BEGIN
          DELETE FROM acp_released WHERE engine_id = NEW.engine_id AND agent_session_id = NEW.agent_session_id;
        END;
        """
    )
    # re-runnable (tests that step user_version back replay it): columns checked first
    columns = {row[1] for row in conn.execute("PRAGMA table_info(sessions_v2)")}
    if "usage_by_kind" not in columns:
        conn.execute("ALTER TABLE sessions_v2 ADD COLUMN usage_by_kind TEXT")
    if "title_attempted" not in columns:
        conn.execute("ALTER TABLE sessions_v2 ADD COLUMN title_attempted INTEGER NOT NULL DEFAULT 0")
        conn.execute("UPDATE sessions_v2 SET title_attempted = 1")
    from sidecar.store.files import backfill_owned_files

    backfill_owned_files(conn)


@migration
def m_generation_completeness(conn: apsw.Connection) -> None:
    # Generation completeness: follow-up suggestions and the user's correction mark of a
    # reply (messages_v2.suggestions JSON list, edited_at ms); who wrote a session's summary
    # (sessions_v2.summary_source 'user' | 'ai'; a summary stored before is the user's); a
    # provider endpoint that cannot stream (providers.stream); the reasoning override of a
    # reply in the tool loop (tool_runs.reasoning, so a resumed reply keeps it); and the
    # stored assistant profiles' "enabledTools": [] dropped: it was the default value and
    # ignored until now, and [] now means "no tools" (omitted means every tool).
    # Re-runnable (each column checked first), like m_channels.
    def columns(table: str) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}

    for table, column, ddl in (
        ("messages_v2", "suggestions", "TEXT"),
        ("messages_v2", "edited_at", "INTEGER"),
        ("sessions_v2", "summary_source", "TEXT"),
        ("providers", "stream", "INTEGER NOT NULL DEFAULT 1"),
        ("tool_runs", "reasoning", "TEXT"),
    ):
        if column not in columns(table):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}")
    conn.execute(
        "UPDATE sessions_v2 SET summary_source = 'user'"
        " WHERE summary IS NOT NULL AND summary <> '' AND summary_source IS NULL"
    )
    conn.execute(
        "UPDATE assistants SET config = json_remove(config, '$.enabledTools')"
        " WHERE json_valid(config) AND json_type(config, '$.enabledTools') = 'array'"
        " AND json_array_length(config, '$.enabledTools') = 0"
    )


@migration
def m_memory(conn: apsw.Connection) -> None:
    # Long-term memory and Soul.md versions (sidecar/store/memory.py). A memory row is one
    # version: its content never changes, a newer version supersedes it (``superseded_by``
    # / ``supersedes`` by id), a soft delete sets ``deleted_at``. Rows get AUTOINCREMENT rowids
    # (never reused) that the contentless FTS table and the in-memory vector index key on;
    # vectors cascade with their row. Proposals of the encoder go with their session. Soul.md
    # versions are numbered per scope (``global`` or an assistant id) and never rewritten.
    # IF NOT EXISTS: a database whose version was set back passes through unchanged.
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS memories (
          rowid         INTEGER PRIMARY KEY AUTOINCREMENT,
          id            TEXT NOT NULL UNIQUE,
          scope         TEXT NOT NULL,
          kind          TEXT NOT NULL,
          text          TEXT NOT NULL,
          task          TEXT,
          outcome       TEXT,
          context       TEXT,
          topic_key     TEXT,
          norm_hash     TEXT NOT NULL,
          source_kind   TEXT NOT NULL,
          session_id    TEXT,
          message_id    TEXT,
          tool_call_id  TEXT,
          flags         TEXT NOT NULL DEFAULT '[]',
          supersedes    TEXT,
          superseded_by TEXT,
          deleted_at    INTEGER,
          use_count     INTEGER NOT NULL DEFAULT 0,
          last_used_at  INTEGER,
          tokens        INTEGER NOT NULL DEFAULT 0,
          created_at    INTEGER NOT NULL,
          updated_at    INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS idx_memories_active ON memories(scope, created_at)
          WHERE superseded_by IS NULL AND deleted_at IS NULL;
        CREATE INDEX IF NOT EXISTS idx_memories_used ON memories(scope, use_count, created_at)
          WHERE superseded_by IS NULL AND deleted_at IS NULL;
        CREATE INDEX IF NOT EXISTS idx_memories_hash ON memories(scope, norm_hash);
        CREATE INDEX IF NOT EXISTS idx_memories_key ON memories(scope, topic_key) WHERE topic_key IS NOT NULL;
        CREATE INDEX IF NOT EXISTS idx_memories_created ON memories(created_at);
        CREATE TABLE IF NOT EXISTS memory_vectors (
          memory_rowid INTEGER NOT NULL REFERENCES memories(rowid) ON DELETE CASCADE,
          model        TEXT NOT NULL,
          scope        TEXT NOT NULL,
          dims         INTEGER NOT NULL,
          vector       BLOB NOT NULL,
          PRIMARY KEY (scope, model, memory_rowid)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS idx_memory_vectors_row ON memory_vectors(memory_rowid);
        CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
          body, scope,
          content = '', contentless_delete = 1,
          tokenize = 'porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER IF NOT EXISTS memories_after_delete AFTER DELETE ON memories BEGIN
          DELETE FROM memories_fts WHERE rowid = old.rowid;
        END;
        CREATE TABLE IF NOT EXISTS memory_proposals (
          id           TEXT PRIMARY KEY,
          session_id   TEXT NOT NULL REFERENCES sessions_v2(id) ON DELETE CASCADE,
          message_id   TEXT NOT NULL,
          assistant_id TEXT NOT NULL,
          scope        TEXT NOT NULL,
          kind         TEXT NOT NULL,
          text         TEXT NOT NULL,
          task         TEXT,
          outcome      TEXT,
          context      TEXT,
          topic_key    TEXT,
          action       TEXT NOT NULL,
          supersedes   TEXT,
          reason       TEXT NOT NULL DEFAULT '',
          flags        TEXT NOT NULL DEFAULT '[]',
          status       TEXT NOT NULL DEFAULT 'pending',
          created_at   INTEGER NOT NULL,
          decided_at   INTEGER
        );
        CREATE INDEX IF NOT EXISTS idx_memory_proposals_open ON memory_proposals(session_id, created_at)
          WHERE status = 'pending';
        CREATE TABLE IF NOT EXISTS soul_versions (
          scope         TEXT NOT NULL,
          version       INTEGER NOT NULL,
          content       TEXT NOT NULL,
          source        TEXT NOT NULL,
          reason        TEXT,
          session_id    TEXT,
          message_id    TEXT,
          reverted_from INTEGER,
          created_at    INTEGER NOT NULL,
          PRIMARY KEY (scope, version)
        ) WITHOUT ROWID;
        """
    )


@migration
def m_channel_dedup_per_chat(conn: apsw.Connection) -> None:
    # A platform message id is unique within its chat, not across a channel's chats (Slack's
    # ``ts`` is per channel): the inbox's dedup key becomes UNIQUE(channel_id, chat_id,
    # dedup_key), so the same id in another chat is a new message. SQLite cannot change a
    # table constraint in place: the table is rebuilt (rows, indexes). Nothing references
    # channel_inbox, so dropping the old table needs no foreign-key dance.
    conn.execute(
        """
        CREATE TABLE channel_inbox_per_chat (
          id                  TEXT PRIMARY KEY,
          channel_id          TEXT NOT NULL REFERENCES channel_configs(id) ON DELETE CASCADE,
          dedup_key           TEXT NOT NULL,
          chat_id             TEXT NOT NULL,
          thread_id           TEXT,
          platform_message_id TEXT,
          session_id          TEXT REFERENCES sessions_v2(id) ON DELETE SET NULL,
          action              TEXT NOT NULL,
          state               TEXT NOT NULL,
          input               TEXT,
          user_message_id     TEXT,
          reply_message_id    TEXT,
          error               TEXT,
          received_at         INTEGER NOT NULL,
          updated_at          INTEGER NOT NULL,
          UNIQUE (channel_id, chat_id, dedup_key)
        );
        INSERT INTO channel_inbox_per_chat(id, channel_id, dedup_key, chat_id, thread_id,
          platform_message_id, session_id, action, state, input, user_message_id, reply_message_id,
          error, received_at, updated_at)
        SELECT id, channel_id, dedup_key, chat_id, thread_id, platform_message_id, session_id,
          action, state, input, user_message_id, reply_message_id, error, received_at, updated_at
        FROM channel_inbox;
        DROP TABLE channel_inbox;
        ALTER TABLE channel_inbox_per_chat RENAME TO channel_inbox;
        CREATE INDEX idx_channel_inbox_received ON channel_inbox(channel_id, received_at);
        CREATE INDEX idx_channel_inbox_open ON channel_inbox(session_id, id)
          WHERE state IN ('queued', 'running');
        CREATE INDEX idx_channel_inbox_platform ON channel_inbox(channel_id, platform_message_id)
          WHERE platform_message_id IS NOT NULL;
        """
    )


@migration
def m_tasks(conn: apsw.Connection) -> None:
    """Scheduled tasks (sidecar/store/tasks.py). ``spec`` is the task's definition (JSON of
    its wire fields); ``next_run_at`` is the next time of its schedule (NULL: disabled, or
    a one-shot that ran). A run of the schedule is claimed by inserting its row: the unique
    index on (task, scheduled_for) makes a time run at most once, also across a crash."""
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS tasks (
          id          TEXT PRIMARY KEY,
          name        TEXT NOT NULL,
          kind        TEXT NOT NULL,
          spec        TEXT NOT NULL,
          enabled     INTEGER NOT NULL DEFAULT 1,
          next_run_at INTEGER,
          created_at  INTEGER NOT NULL,
          updated_at  INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS idx_tasks_due ON tasks(next_run_at)
          WHERE enabled = 1 AND next_run_at IS NOT NULL;
        CREATE TABLE IF NOT EXISTS task_runs (
          id             TEXT PRIMARY KEY,
          task_id        TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
          trigger        TEXT NOT NULL,
          scheduled_for  INTEGER NOT NULL,
          status         TEXT NOT NULL,
          session_id     TEXT,
          message_id     TEXT,
          error          TEXT,
          delivery_error TEXT,
          created_at     INTEGER NOT NULL,
          started_at     INTEGER,
          finished_at    INTEGER
        );
        CREATE UNIQUE INDEX IF NOT EXISTS idx_task_runs_fire ON task_runs(task_id, scheduled_for)
          WHERE trigger != 'manual';
        CREATE INDEX IF NOT EXISTS idx_task_runs_task ON task_runs(task_id, created_at);
        CREATE INDEX IF NOT EXISTS idx_task_runs_open ON task_runs(status)
          WHERE status IN ('queued', 'running', 'paused');
        """
    )


@migration
def m_provider_limits(conn: apsw.Connection) -> None:
    """Per-provider ``timeoutS`` and ``maxRetries`` (NULL: the transport's defaults).
    Re-runnable (each column checked first), like m_channels."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(providers)")}
    for column, ddl in (("timeout_s", "REAL"), ("max_retries", "INTEGER")):
        if column not in columns:
            conn.execute(f"ALTER TABLE providers ADD COLUMN {column} {ddl}")


@migration
def m_memory_upkeep(conn: apsw.Connection) -> None:
    """Consolidation proposals and applied merges (sidecar/store/memory_upkeep.py): the
    memories of one scope that become one version chain, and the merged text."""
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS memory_merges (
          id            TEXT PRIMARY KEY,
          scope         TEXT NOT NULL,
          memory_ids    TEXT NOT NULL,
          text          TEXT NOT NULL,
          kind          TEXT NOT NULL,
          reason        TEXT NOT NULL DEFAULT '',
          contradiction INTEGER NOT NULL DEFAULT 0,
          status        TEXT NOT NULL,
          result_id     TEXT,
          created_at    INTEGER NOT NULL,
          decided_at    INTEGER
        );
        CREATE INDEX IF NOT EXISTS idx_memory_merges_open ON memory_merges(scope, created_at)
          WHERE status = 'pending';
        """
    )


@migration
def m_skill_proposals(conn: apsw.Connection) -> None:
    """Skills the model proposed (sidecar/store/skills.py): nothing on disk until accepted;
    they go with their session."""
    conn.execute(
        """
        CREATE TABLE IF NOT EXISTS skill_proposals (
          id          TEXT PRIMARY KEY,
          session_id  TEXT NOT NULL REFERENCES sessions_v2(id) ON DELETE CASCADE,
          message_id  TEXT NOT NULL,
          name        TEXT NOT NULL,
          description TEXT NOT NULL,
          content     TEXT NOT NULL,
          reason      TEXT NOT NULL DEFAULT '',
          status      TEXT NOT NULL DEFAULT 'pending',
          created_at  INTEGER NOT NULL,
          decided_at  INTEGER
        );
        CREATE INDEX IF NOT EXISTS idx_skill_proposals_open ON skill_proposals(session_id, created_at)
          WHERE status = 'pending';
        """
    )


@migration
def m_fts_fold(conn: apsw.Connection) -> None:
    # Full-text search folds width and case (sidecar/store/fts.py ``fold``: NFKC, case
    # folding, digits set apart from letters), on the indexed text as on every query: every
    # index built from ``fts.index_text`` is written again from its rows (messages, knowledge
    # chunks, memories; their rowids and docids stay). Re-runnable: a rebuild from the rows.
    from sidecar.store.knowledge import KnowledgeRepo
    from sidecar.store.memory import MemoryRepo
    from sidecar.store.search import MessageSearch

    messages = MessageSearch.rebuild(conn)
    chunks = KnowledgeRepo.rebuild_index(conn)
    memories = MemoryRepo.rebuild_index(conn)
    log.info("full-text indexes rebuilt: %d messages, %d chunks, %d memories", messages, chunks, memories)


@migration
def m_kb_embedding_retry(conn: apsw.Connection) -> None:
    # A document whose embedding failed is kept chunked and in the full-text index, in status
    # ``embedding_pending``, and its vectors are retried by the knowledge service on a
    # schedule kept here (sidecar/store/knowledge.py): the failed attempts and when the next
    # one is due. Documents an earlier version left in ``error`` / ``embedding_failed`` (no
    # chunks, no index rows) are queued again: the next start indexes them. Re-runnable
    # (columns checked first, IF NOT EXISTS).
    columns = {row[1] for row in conn.execute("PRAGMA table_info(kb_documents)")}
    if "embed_attempts" not in columns:
        conn.execute("ALTER TABLE kb_documents ADD COLUMN embed_attempts INTEGER NOT NULL DEFAULT 0")
    if "embed_retry_at" not in columns:
        conn.execute("ALTER TABLE kb_documents ADD COLUMN embed_retry_at INTEGER")
    conn.execute(
        """
        CREATE INDEX IF NOT EXISTS idx_kb_documents_embed_retry ON kb_documents(embed_retry_at)
          WHERE status = 'embedding_pending';
        UPDATE kb_documents SET status = 'pending', error = NULL, error_code = NULL, revision = revision + 1
          WHERE status = 'error' AND error_code = 'embedding_failed';
        """
    )


@migration
def m_kb_chunk_ids(conn: apsw.Connection) -> None:
    # A chunk's id covers its heading path (sidecar/store/kb_records.py ``chunk_id``), and
    # repeats are numbered per heading path: ids made from the text alone, with repeats
    # numbered over the whole document, moved a citation to another section when a section
    # repeating its text was inserted before it. Every chunk with a heading path gets its
    # id again (a document without headings keeps all of its ids: a chunk without a heading
    # path hashes its text alone, as before); its rowid (vectors, full-text row) stays. A
    # citation follows its chunk when it was made of that very chunk (same id and offsets);
    # any other keeps its old id and reads as documentChanged. Re-runnable: the ids it writes
    # are the ones it computes.
    from sidecar.store.db import fetch_all
    from sidecar.store.kb_records import chunk_id, heading_decoder

    documents = [r[0] for r in fetch_all(conn, "SELECT DISTINCT document_id FROM kb_chunks WHERE heading != '[]'")]
    for document_id in documents:
        seen: dict[str, int] = {}
        renamed: list[tuple[int, str, str, int, int]] = []
        for rowid, old, heading, text, start, end in fetch_all(conn,
            "SELECT rowid, id, heading, text, char_start, char_end FROM kb_chunks WHERE document_id = ?"
            " ORDER BY ordinal, rowid", (document_id,),
        ):
            base = chunk_id(document_id, heading_decoder.decode(heading), text)
            seen[base] = seen.get(base, 0) + 1
            new = base if seen[base] == 1 else f"{base}.{seen[base]}"
            if new != old:
                renamed.append((rowid, old, new, start, end))
        # through ids no chunk can have (a real one has a ':'): the new ids may be old ones of
        # other chunks of the document
        conn.executemany("UPDATE kb_chunks SET id = ? WHERE rowid = ?", [(f"~{r[0]}", r[0]) for r in renamed])
        for rowid, old, new, start, end in renamed:
            conn.execute("UPDATE kb_chunks SET id = ? WHERE rowid = ?", (new, rowid))
            conn.execute(
                "UPDATE message_citations SET chunk_id = ? WHERE chunk_id = ? AND document_id = ?"
                " AND char_start = ? AND char_end = ?", (new, old, document_id, start, end),
            )
@migration
def m_channel_routes_access(conn: apsw.Connection) -> None:
    # IM channels, second part (sidecar/store/channels.py): what the message log shows of a
    # received message (chat type, sender, the start of its text, why it was not answered);
    # a channel's counters since it was created; its sealed secrets (platform credentials, a
    # remote agent's token: channel_secrets, sealed by sidecar/store/secrets.py); the state of
    # a connection the sidecar owns (whether it should run, and where to resume: a Telegram
    # update offset, a Discord gateway session); and the session map of the remote-agent
    # route (a local session -> the remote service's session and the V1 ids it was sent).
    columns = {row[1] for row in conn.execute("PRAGMA table_info(channel_inbox)")}
    for column in ("chat_type", "sender_id", "sender_name", "text_preview", "reason"):
        if column not in columns:
            conn.execute(f"ALTER TABLE channel_inbox ADD COLUMN {column} TEXT")
    conn.execute(
        """
        CREATE INDEX IF NOT EXISTS idx_channel_inbox_log ON channel_inbox(channel_id, id);
        CREATE TABLE IF NOT EXISTS channel_counters (
          channel_id TEXT PRIMARY KEY REFERENCES channel_configs(id) ON DELETE CASCADE,
          received   INTEGER NOT NULL DEFAULT 0,
          replied    INTEGER NOT NULL DEFAULT 0,
          ignored    INTEGER NOT NULL DEFAULT 0,
          refused    INTEGER NOT NULL DEFAULT 0,
          failed     INTEGER NOT NULL DEFAULT 0,
          duplicates INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS channel_secrets (
          channel_id TEXT NOT NULL REFERENCES channel_configs(id) ON DELETE CASCADE,
          name       TEXT NOT NULL,
          value      TEXT NOT NULL,
          PRIMARY KEY (channel_id, name)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS channel_state (
          channel_id TEXT PRIMARY KEY REFERENCES channel_configs(id) ON DELETE CASCADE,
          connect    INTEGER NOT NULL DEFAULT 0,
          resume     TEXT,
          updated_at INTEGER NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS channel_remote_sessions (
          session_id        TEXT PRIMARY KEY REFERENCES sessions_v2(id) ON DELETE CASCADE,
          remote_session_id TEXT NOT NULL,
          user_id           TEXT NOT NULL,
          project_id        TEXT NOT NULL,
          updated_at        INTEGER NOT NULL
        ) WITHOUT ROWID;
        """
    )


@migration
def m_kb_fts_per_base(conn: apsw.Connection) -> None:
    # Each knowledge base gets its own full-text table (sidecar/store/kb_lexical.py), so its
    # BM25 statistics and term pruning are its own: written from kb_chunks (the same text
    # kb_chunks_fts held), then the shared table and its trigger are dropped (chunk rows are
    # deleted from their base's table by KnowledgeRepo, in the transaction that deletes them).
    # Re-runnable: a rebuild from the rows, and DROP ... IF EXISTS.
    from sidecar.store.kb_lexical import rebuild_all

    rows = rebuild_all(conn)
    conn.execute("DROP TRIGGER IF EXISTS kb_chunks_after_delete")
    conn.execute("DROP TABLE IF EXISTS kb_chunks_fts")
    log.info("knowledge full-text index split per base: %d rows", rows)
