"""What a dead process left behind in the database, told by one read at open.

A process that dies mid-reply leaves rows that only its own life made true: messages
still 'pending' or 'streaming', tool runs still 'running', ACP chunks not yet joined into
their message. Opening the store repairs them (MessageRepo.recover_interrupted,
AcpRepo.join_left_chunks, ToolStore.complete_interrupted), and those repairs are the only
reason opening would build those repositories. ``left_behind`` says which repairs have
work, with one cheap query, so an ordinary start builds none of them.

What must stay true: each condition here is the one its repair selects its rows with (the
repairs use these constants in their WHERE clauses), so "nothing left behind" is never
wrong: a repair skipped here would have found no row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.store.db import Database

__all__ = ["MESSAGES", "ACP_CHUNKS", "TOOL_RUNS", "LIVE_MESSAGE", "RUNNING_TOOL_RUN", "left_behind"]

MESSAGES = "messages"
ACP_CHUNKS = "acp_chunks"
TOOL_RUNS = "tool_runs"

LIVE_MESSAGE = "status IN ('pending', 'streaming')"
"""A messages_v2 row a live reply owns (a dead process's: to be aborted)."""
RUNNING_TOOL_RUN = "state = 'running'"
"""A tool_runs row whose loop is running (a dead process's: its open calls are cancelled)."""

_TABLE_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
"""Tests open databases of older schemas (a shortened migration list), without every table."""


def left_behind(db: Database) -> frozenset[str]:
    """The repairs that have rows to repair: a subset of MESSAGES, ACP_CHUNKS, TOOL_RUNS."""
    checks = (
        (MESSAGES, "messages_v2", f"SELECT 1 FROM messages_v2 WHERE {LIVE_MESSAGE} LIMIT 1"),
        (ACP_CHUNKS, "acp_raw_chunks", "SELECT 1 FROM acp_raw_chunks LIMIT 1"),
        (TOOL_RUNS, "tool_runs", f"SELECT 1 FROM tool_runs WHERE {RUNNING_TOOL_RUN} LIMIT 1"),
    )
    found: set[str] = set()
    # on the writer, as the open's other steps: a reader connection (~1 ms to open) is
    # left to the first read
    with db.write() as conn:
        for repair, table, probe in checks:
            if conn.execute(_TABLE_EXISTS, (table,)).fetchall() and conn.execute(probe).fetchall():
                found.add(repair)
    return frozenset(found)
