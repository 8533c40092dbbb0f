"""Migrations 1-12: the chat core (seed 004's tables, the active branch and stream
sequence, settings, session tags, query indexes, message search, providers, workspace
dirs, tool calls, context windows, ACP engines, search dates).

Must stay true: a shipped migration is never edited or reordered (its version is its
position in ``MIGRATIONS``, sidecar/store/migrations/__init__.py).
"""

from __future__ import annotations

import apsw

__all__ = [
    "m001_seed_tables",
    "m002_active_leaf_and_seq",
    "m003_settings",
    "m004_session_tags",
    "m005_query_indexes",
    "m006_search_index",
    "m007_providers",
    "m008_session_workspace_dir",
    "m009_tool_calls",
    "m_context_window",
    "m_acp_engines",
    "m012_search_docs_created_at",
]


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


def m002_active_leaf_and_seq(conn: apsw.Connection) -> None:
    conn.execute(
        """
        ALTER TABLE sessions_v2 ADD COLUMN active_leaf_id TEXT;
        ALTER TABLE messages_v2 ADD COLUMN seq INTEGER;
        """
    )


def m003_settings(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE settings (
          key   TEXT PRIMARY KEY,
          value TEXT NOT NULL
        ) WITHOUT ROWID;
        """
    )


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
    from sidecar.store import search as message_search

    message_search.reindex_all(conn)


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


def m008_session_workspace_dir(conn: apsw.Connection) -> None:
    # The session's working directory (the workspace tools, the ACP cwd).
    conn.execute("ALTER TABLE sessions_v2 ADD COLUMN workspace_dir TEXT;")


def m009_tool_calls(conn: apsw.Connection) -> None:
    # The tool loop's tables (sidecar/store/tools.py): its per-reply state (tool_runs), every
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


def m_context_window(conn: apsw.Connection) -> None:
    # The context window's tables (sidecar/store/context.py, sidecar/store/assistants.py):
    # rolling summaries, a session's assistant profile and truncation strategy, the
    # per-message token-count cache, and assistant profiles with the built-in default one.
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


def m_acp_engines(conn: apsw.Connection) -> None:
    # The agent engines' tables (sidecar/store/acp.py, sidecar/store/providers.py): the
    # engine configuration of acp-engine providers (JSON of protocol.AcpEngineConfig; env
    # values may be secrets), and for every ACP reply the agent session that holds the
    # conversation up to and including that reply (regenerate / edit-and-resend fork it; a
    # send continues from it).
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
