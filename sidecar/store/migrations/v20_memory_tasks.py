"""Migrations 20-25: long-term memory, per-chat channel dedup, scheduled tasks, provider
limits, memory upkeep, skill proposals.

Must stay true: a shipped migration is never edited or reordered (its version is its
position in ``MIGRATIONS``, sidecar/store/migrations/__init__.py).
"""

from __future__ import annotations

import apsw

__all__ = [
    "m_memory",
    "m_channel_dedup_per_chat",
    "m_tasks",
    "m_provider_limits",
    "m_memory_upkeep",
    "m_skill_proposals",
]


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


def m_provider_limits(conn: apsw.Connection) -> None:
    """Per-provider ``timeoutS`` and ``maxRetries`` (NULL: the transport's defaults).
    Re-runnable (each column checked first), like m_channels."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(providers)")}
    for column, ddl in (("timeout_s", "REAL"), ("max_retries", "INTEGER")):
        if column not in columns:
            conn.execute(f"ALTER TABLE providers ADD COLUMN {column} {ddl}")


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
