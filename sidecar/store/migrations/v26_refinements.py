"""Migrations 26 on: full-text folding, KB embedding retries and chunk ids, channel routes
and access. New migrations are appended here (see the package docstring).

Must stay true: a shipped migration is never edited or reordered (its version is its
position in ``MIGRATIONS``, sidecar/store/migrations/__init__.py).
"""

from __future__ import annotations

import apsw

from sidecar.logging_setup import EarlyLogger

log = EarlyLogger("sidecar.store.migrations")

__all__ = [
    "m_fts_fold",
    "m_kb_embedding_retry",
    "m_kb_chunk_ids",
    "m_channel_routes_access",
    "m_kb_fts_per_base",
    "m_kb_common_lines",
]


def m_fts_fold(conn: apsw.Connection) -> None:
    # Full-text search folds width and case (sidecar/store/fts.py ``fold``: NFKC, case
    # folding, digits set apart from letters), on the indexed text as on every query: every
    # index built from ``fts.index_text`` is written again from its rows (messages, knowledge
    # chunks, memories; their rowids and docids stay). Re-runnable: a rebuild from the rows.
    from sidecar.store.knowledge import KnowledgeRepo
    from sidecar.store.memory import MemoryRepo
    from sidecar.store import search as message_search

    messages = message_search.rebuild(conn)
    chunks = KnowledgeRepo.rebuild_index(conn)
    memories = MemoryRepo.rebuild_index(conn)
    log.info("full-text indexes rebuilt: %d messages, %d chunks, %d memories", messages, chunks, memories)


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


def m_kb_common_lines(conn: apsw.Connection) -> None:
    # Per base, how many indexed documents hold each line (a digest of it) and whether it is
    # common (sidecar/store/kb_common.py): counted from the bodies of the documents indexed so
    # far, settled, and every base's full-text table rewritten without its common lines.
    # Vectors stay as they are (re-indexing a document re-embeds what its text changed).
    # Re-runnable: the counts are rebuilt from nothing.
    from sidecar.store import kb_common
    from sidecar.store.db import fetch_all
    from sidecar.store.kb_lexical import rebuild_all

    conn.execute(
        "CREATE TABLE IF NOT EXISTS kb_lines ("
        " kb_id TEXT NOT NULL, line INTEGER NOT NULL, docs INTEGER NOT NULL, common INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (kb_id, line)) WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS idx_kb_lines_common ON kb_lines(kb_id, common, docs)")
    conn.execute("DELETE FROM kb_lines")
    documents: dict[str, int] = {}
    for kb_id, body in fetch_all(conn,
        "SELECT kb_id, body FROM kb_documents WHERE indexed_at IS NOT NULL AND body IS NOT NULL"
    ):
        kb_common.count(conn, str(kb_id), None, str(body))
        documents[str(kb_id)] = documents.get(str(kb_id), 0) + 1
    for kb_id, n in documents.items():
        kb_common.settle(conn, kb_id, n)
    rows = rebuild_all(conn, kb_common.rows_of)
    log.info("knowledge common lines counted for %d bases, %d full-text rows rewritten", len(documents), rows)
