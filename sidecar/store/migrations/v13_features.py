"""Migrations 13-19: the features around a chat (IM channels, knowledge bases, the Qiming
server's sync and forwarding, citations, the data lifecycle, generation completeness).

Must stay true: a shipped migration is never edited or reordered (its version is its
position in ``MIGRATIONS``, sidecar/store/migrations/__init__.py).
"""

from __future__ import annotations

import apsw

__all__ = [
    "m_channels",
    "m_knowledge",
    "m_qiming_sync",
    "m_citations",
    "m_qiming_forward",
    "m_data_lifecycle",
    "m_generation_completeness",
]


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
