"""What the message log and the counters of a channel call its inbox rows.

Owns ``log_status`` (an inbox row's action and state -> received, replied, ignored, refused or
failed; the same mapping in SQL: STATUS_SQL) and the counter writes (``bump``,
``count_change``), which ChannelRepo runs inside the transaction that changes the row. Must
stay true: a row adds one to ``received`` when it is inserted and one to its final status
the first time it gets one, never more (a duplicate adds to ``duplicates`` only).
"""

from __future__ import annotations

import apsw

from protocol.channels import LogStatus

__all__ = [
    "log_status", "STATUS_SQL", "COUNTERS", "LOG_TEXT_CHARS", "bump", "count_change", "IGNORED_ACTIONS",
    "OPEN_INBOX_STATES",
]

OPEN_INBOX_STATES = ("queued", "running")
"""An inbox row waiting for its turn or being answered."""

IGNORED_ACTIONS = ("store", "throttled", "ignored")


def log_status(action: str, state: str) -> LogStatus:
    """What the message log (and the counters) call a row in this state."""
    if state == "failed":
        return "failed"
    if action == "refused":
        return "refused"
    if state in OPEN_INBOX_STATES:
        return "received"
    return "ignored" if action in IGNORED_ACTIONS else "replied"


STATUS_SQL: dict[str, str] = {
    "received": "state IN ('queued', 'running')",
    "replied": "state = 'done' AND action IN ('reply', 'new_session')",
    "ignored": "state = 'done' AND action IN ('store', 'throttled', 'ignored')",
    "refused": "state != 'failed' AND action = 'refused'",
    "failed": "state = 'failed'",
}
COUNTERS = ("received", "replied", "ignored", "refused", "failed", "duplicates")
LOG_TEXT_CHARS = 500


def bump(conn: apsw.Connection, channel_id: str, counter: str, by: int = 1) -> None:
    if counter not in COUNTERS:
        raise ValueError(counter)
    conn.execute(
        f"INSERT INTO channel_counters(channel_id, {counter}) VALUES (?, ?)"
        f" ON CONFLICT(channel_id) DO UPDATE SET {counter} = {counter} + excluded.{counter}",
        (channel_id, by),
    )


def count_change(conn: apsw.Connection, channel_id: str, old: str | None, new: str) -> None:
    """A row reached a final status: its counter goes up once (never again for that row)."""
    if new != "received" and old in (None, "received") and new != old:
        bump(conn, channel_id, new)
