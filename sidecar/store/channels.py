"""ChannelRepo: IM channels' rows (configs, chat links, the inbox, deliveries) and the delivery
summary of replies on ``messages_v2.delivery``.

Owns: the tables of migrations ``m_channels`` and ``m_channel_routes_access`` (the log's
statuses and the counters: channel_log.py). Each public method is one transaction.
Must stay true:
- dedup is decided by the database: ``receive`` inserts under UNIQUE(channel_id, chat_id,
  dedup_key) (a platform message id is unique within its chat, not across chats) and
  answers with the existing row when the key is taken in that chat, so two deliveries of one
  platform message never both become turns, whatever the timing and across restarts; a row
  older than the dedup window no longer counts (it is replaced);
- an inbox row is the durable queue entry of its turn (``queued`` -> ``running`` -> ``done``
  or ``failed``) until it is pruned after the window (only finished rows are pruned);
- every change of a delivery's state rewrites the summary of its message in the same
  transaction, so ``chat:messages:get`` never shows a stale status;
- a delivery's payload is stored before it is sent, so an unacknowledged one is sent again
  after a restart with the same delivery id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import apsw
import msgspec

from protocol.channels import (
    ChannelConfig,
    ChannelCounters,
    ChannelLogEntry,
    ChannelReplyParams,
    ChatType,
    LogStatus,
    MessageAction,
)
from protocol.types import DeliveryStatus, MessageDelivery
from sidecar.errors import NotFound, SecretsLocked
from sidecar.store.db import Database
from sidecar.store.ids import now_ms

from sidecar.store.channel_log import (
    COUNTERS,
    LOG_TEXT_CHARS,
    OPEN_INBOX_STATES,
    STATUS_SQL,
    bump,
    count_change,
    log_status,
)
from sidecar.store.secrets import CHANNEL_SECRET as SECRET_PURPOSE

if TYPE_CHECKING:
    from sidecar.store.secrets import Sealer

__all__ = [
    "ChannelRepo", "InboxRow", "DeliveryRow", "OPEN_INBOX_STATES", "OPEN_DELIVERY_STATES", "log_status",
    "SECRET_PURPOSE", "KEEP", "LOG_TEXT_CHARS",
]

OPEN_DELIVERY_STATES = ("pending", "sent")

_enc = msgspec.json.Encoder()
_dec_config = msgspec.json.Decoder(ChannelConfig)
_dec_payload = msgspec.json.Decoder(ChannelReplyParams)


class InboxRow(msgspec.Struct, kw_only=True):
    id: str
    channel_id: str
    dedup_key: str
    chat_id: str
    chat_type: ChatType | None = None
    thread_id: str | None = None
    platform_message_id: str | None = None
    session_id: str | None = None
    action: MessageAction
    state: str
    input: str | None = None
    """JSON of the turn to run or store (the service's QueuedTurn), until the row is done."""
    user_message_id: str | None = None
    reply_message_id: str | None = None
    error: str | None = None
    received_at: int
    updated_at: int
    sender_id: str | None = None
    sender_name: str | None = None
    text_preview: str | None = None
    reason: str | None = None
    """Why the message is not answered (ignored, refused), for the log."""


class DeliveryRow(msgspec.Struct, kw_only=True):
    id: str
    channel_id: str
    chat_id: str
    message_id: str | None
    inbox_id: str | None
    seq: int
    kind: str
    target: int
    """Index of the platform message within its reply (stream mode edits address it)."""
    payload: ChannelReplyParams
    state: str
    attempts: int = 0
    error: str | None = None
    platform_message_id: str | None = None
    created_at: int
    updated_at: int


_INBOX_COLUMNS = (
    "id, channel_id, dedup_key, chat_id, thread_id, platform_message_id, session_id, action, state,"
    " input, user_message_id, reply_message_id, error, received_at, updated_at, chat_type, sender_id,"
    " sender_name, text_preview, reason"
)
_INBOX_COUNT = 20
_DELIVERY_COLUMNS = (
    "id, channel_id, chat_id, message_id, inbox_id, seq, kind, target, payload, state, attempts,"
    " error, platform_message_id, created_at, updated_at"
)


def _inbox(row: tuple[Any, ...]) -> InboxRow:
    return InboxRow(
        id=row[0], channel_id=row[1], dedup_key=row[2], chat_id=row[3], thread_id=row[4],
        platform_message_id=row[5], session_id=row[6], action=row[7], state=row[8], input=row[9],
        user_message_id=row[10], reply_message_id=row[11], error=row[12], received_at=row[13],
        updated_at=row[14], chat_type=row[15], sender_id=row[16], sender_name=row[17], text_preview=row[18],
        reason=row[19],
    )


def _delivery(row: tuple[Any, ...]) -> DeliveryRow:
    return DeliveryRow(
        id=row[0], channel_id=row[1], chat_id=row[2], message_id=row[3], inbox_id=row[4], seq=row[5],
        kind=row[6], target=row[7], payload=_dec_payload.decode(row[8]), state=row[9], attempts=row[10],
        error=row[11], platform_message_id=row[12], created_at=row[13], updated_at=row[14],
    )


class _Keep:
    """``set_connection(resume=KEEP)``: leave the resume point as it is."""


KEEP = _Keep()


class ChannelRepo:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms, sealer: Sealer | None = None) -> None:
        self._db = db
        self._clock = clock
        self._sealer = sealer

    def now(self) -> int:
        return self._clock()

    # ---- configs ------------------------------------------------------------------

    def list_configs(self) -> list[ChannelConfig]:
        with self._db.read() as conn:
            rows = conn.execute("SELECT config FROM channel_configs ORDER BY created_at, id").fetchall()
        return [_dec_config.decode(str(r[0])) for r in rows]

    def get_config(self, channel_id: str) -> ChannelConfig:
        with self._db.read() as conn:
            rows = conn.execute("SELECT config FROM channel_configs WHERE id = ?", (channel_id,)).fetchall()
        if not rows:
            raise NotFound(f"no channel {channel_id!r}")
        return _dec_config.decode(str(rows[0][0]))

    def upsert_config(self, config: ChannelConfig) -> ChannelConfig:
        """Store ``config``; an existing channel keeps its created_at."""
        with self._db.write() as conn:
            now = self._clock()
            rows = conn.execute("SELECT created_at FROM channel_configs WHERE id = ?", (config.id,)).fetchall()
            created = rows[0][0] if rows else now
            stored = msgspec.structs.replace(config, created_at=created, updated_at=now)
            conn.execute(
                "INSERT INTO channel_configs(id, platform, config, created_at, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET platform = excluded.platform, config = excluded.config,"
                " updated_at = excluded.updated_at",
                (stored.id, stored.platform, _enc.encode(stored).decode(), created, now),
            )
        return stored

    def delete_config(self, channel_id: str) -> bool:
        """Delete a channel: its open deliveries end ``failed`` (their replies say so), then the
        channel's links, inbox and deliveries go with it. Sessions stay."""
        with self._db.write() as conn:
            if not conn.execute("SELECT 1 FROM channel_configs WHERE id = ?", (channel_id,)).fetchall():
                return False
            now = self._clock()
            messages = [
                str(r[0]) for r in conn.execute(
                    "UPDATE channel_deliveries SET state = 'failed', error = 'the channel was deleted',"
                    " updated_at = ? WHERE channel_id = ? AND state IN ('pending', 'sent')"
                    " RETURNING message_id",
                    (now, channel_id),
                ) if r[0] is not None
            ]
            for message_id in dict.fromkeys(messages):
                self._summarize(conn, message_id, now)
            conn.execute("DELETE FROM channel_configs WHERE id = ?", (channel_id,))
        return True

    # ---- links (scope key -> session) -----------------------------------------------

    def linked_session(self, channel_id: str, scope_key: str) -> str | None:
        """The session linked to this scope, if it still exists."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT l.session_id FROM channel_links l JOIN sessions_v2 s ON s.id = l.session_id"
                " WHERE l.channel_id = ? AND l.scope_key = ?",
                (channel_id, scope_key),
            ).fetchall()
        return str(rows[0][0]) if rows else None

    def link(self, channel_id: str, scope_key: str, session_id: str, chat_id: str) -> None:
        with self._db.write() as conn:
            now = self._clock()
            conn.execute(
                "INSERT INTO channel_links(channel_id, scope_key, session_id, chat_id, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(channel_id, scope_key) DO UPDATE SET"
                " session_id = excluded.session_id, updated_at = excluded.updated_at",
                (channel_id, scope_key, session_id, chat_id, now, now),
            )

    # ---- inbox ----------------------------------------------------------------------

    def find_received(self, channel_id: str, chat_id: str, dedup_key: str, window_ms: int) -> InboxRow | None:
        """The message of this chat received under this key within the window (or still
        open), if any."""
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_INBOX_COLUMNS} FROM channel_inbox WHERE channel_id = ? AND chat_id = ? AND dedup_key = ?",
                (channel_id, chat_id, dedup_key),
            ).fetchall()
        if not rows:
            return None
        row = _inbox(rows[0])
        if row.received_at >= self._clock() - window_ms or row.state in OPEN_INBOX_STATES:
            return row
        return None

    def receive(self, row: InboxRow, window_ms: int) -> tuple[InboxRow, bool]:
        """Insert ``row`` unless its dedup key was received in its chat within ``window_ms``:
        returns the row now stored and whether it is the new one."""
        with self._db.write() as conn:
            existing = conn.execute(
                f"SELECT {_INBOX_COLUMNS} FROM channel_inbox WHERE channel_id = ? AND chat_id = ? AND dedup_key = ?",
                (row.channel_id, row.chat_id, row.dedup_key),
            ).fetchall()
            if existing:
                old = _inbox(existing[0])
                if old.received_at >= row.received_at - window_ms or old.state in OPEN_INBOX_STATES:
                    bump(conn, row.channel_id, "duplicates")
                    return old, False
                conn.execute("DELETE FROM channel_inbox WHERE id = ?", (old.id,))
            conn.execute(
                f"INSERT INTO channel_inbox({_INBOX_COLUMNS}) VALUES ({', '.join('?' * _INBOX_COUNT)})",
                (
                    row.id, row.channel_id, row.dedup_key, row.chat_id, row.thread_id,
                    row.platform_message_id, row.session_id, row.action, row.state, row.input,
                    row.user_message_id, row.reply_message_id, row.error, row.received_at, row.updated_at,
                    row.chat_type, row.sender_id, row.sender_name, row.text_preview, row.reason,
                ),
            )
            bump(conn, row.channel_id, "received")
            count_change(conn, row.channel_id, None, log_status(row.action, row.state))
        return row, True

    def note_duplicate(self, channel_id: str) -> None:
        """A redelivery answered ``duplicate`` before it reached ``receive``."""
        with self._db.write() as conn:
            bump(conn, channel_id, "duplicates")

    def next_open(self, session_id: str) -> InboxRow | None:
        """The session's oldest turn not done yet (turns of a session run in arrival order)."""
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_INBOX_COLUMNS} FROM channel_inbox WHERE session_id = ?"
                " AND state IN ('queued', 'running') ORDER BY id LIMIT 1",
                (session_id,),
            ).fetchall()
        return _inbox(rows[0]) if rows else None

    def open_sessions(self) -> list[str]:
        """Sessions with turns not done (to resume at start-up). Open rows whose session was
        deleted meanwhile are failed here."""
        with self._db.write() as conn:
            conn.execute(
                "UPDATE channel_inbox SET state = 'failed', error = 'the session was deleted', input = NULL,"
                " updated_at = ? WHERE session_id IS NULL AND state IN ('queued', 'running')",
                (self._clock(),),
            )
            rows = conn.execute(
                "SELECT DISTINCT session_id FROM channel_inbox WHERE state IN ('queued', 'running')"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def update_inbox(self, inbox_id: str, **fields: Any) -> None:
        """Set columns of an inbox row (state, action, session_id, user/reply message ids,
        error, reason; a finished state clears ``input``); the channel's counters follow."""
        allowed = {"state", "action", "session_id", "user_message_id", "reply_message_id", "error", "input", "reason"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"not inbox columns: {sorted(unknown)}")
        if fields.get("state") in ("done", "failed"):
            fields["input"] = None
        sets = ", ".join(f"{name} = ?" for name in fields)
        with self._db.write() as conn:
            old = conn.execute(
                "SELECT channel_id, action, state FROM channel_inbox WHERE id = ?", (inbox_id,)
            ).fetchall()
            conn.execute(
                f"UPDATE channel_inbox SET {sets}, updated_at = ? WHERE id = ?",
                (*fields.values(), self._clock(), inbox_id),
            )
            if old:
                channel_id, action, state = (str(v) for v in old[0])
                count_change(
                    conn, channel_id, log_status(action, state),
                    log_status(str(fields.get("action", action)), str(fields.get("state", state))),
                )

    def known_text(self, channel_id: str, chat_id: str, platform_message_id: str) -> str | None:
        """The text of a platform message of this chat the sidecar received (its user turn)
        or sent (the reply a delivery carried), for a quoted reply that came without text."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT m.text_content FROM channel_inbox i JOIN messages_v2 m ON m.id = i.user_message_id"
                " WHERE i.channel_id = ? AND i.chat_id = ? AND i.platform_message_id = ?"
                " UNION ALL"
                " SELECT m.text_content FROM channel_deliveries d JOIN messages_v2 m ON m.id = d.message_id"
                " WHERE d.channel_id = ? AND d.chat_id = ? AND d.platform_message_id = ?"
                " LIMIT 1",
                (channel_id, chat_id, platform_message_id) * 2,
            ).fetchall()
        return str(rows[0][0]) if rows and rows[0][0] else None

    def prune_inbox(self, channel_id: str, window_ms: int) -> int:
        """Forget finished messages received before the window."""
        with self._db.write() as conn:
            rows = conn.execute(
                "DELETE FROM channel_inbox WHERE channel_id = ? AND received_at < ?"
                " AND state NOT IN ('queued', 'running') RETURNING id",
                (channel_id, self._clock() - window_ms),
            ).fetchall()
        return len(rows)

    # ---- deliveries -----------------------------------------------------------------

    def mark_pending(self, message_id: str, channel_id: str, chat_id: str) -> None:
        """A reply to an IM message exists but has nothing to deliver yet."""
        with self._db.write() as conn:
            now = self._clock()
            summary = MessageDelivery(channel=channel_id, chat_id=chat_id, status="pending", updated_at=now)
            conn.execute(
                "UPDATE messages_v2 SET delivery = ? WHERE id = ?", (_enc.encode(summary).decode(), message_id)
            )

    def add_deliveries(
        self,
        payloads: list[tuple[ChannelReplyParams, int]],
        *,
        finish_inbox: str | None = None,
        finish_state: str = "done",
    ) -> list[DeliveryRow]:
        """Store deliveries (payload, target index) as ``pending``; with ``finish_inbox`` that
        inbox row becomes ``finish_state`` (done, or failed: a notice of what could not be
        answered) in the same transaction (the reply cannot be lost between)."""
        out: list[DeliveryRow] = []
        with self._db.write() as conn:
            now = self._clock()
            for payload, target in payloads:
                row = DeliveryRow(
                    id=payload.delivery_id, channel_id=payload.channel, chat_id=payload.chat_id,
                    message_id=payload.message_id, inbox_id=finish_inbox, seq=payload.seq,
                    kind=payload.kind, target=target, payload=payload, state="pending",
                    created_at=now, updated_at=now,
                )
                conn.execute(
                    f"INSERT INTO channel_deliveries({_DELIVERY_COLUMNS}) VALUES ({', '.join('?' * 15)})",
                    (
                        row.id, row.channel_id, row.chat_id, row.message_id, row.inbox_id, row.seq,
                        row.kind, row.target, _enc.encode(payload).decode(), row.state, 0, None, None,
                        now, now,
                    ),
                )
                out.append(row)
            for message_id in dict.fromkeys(p.message_id for p, _ in payloads if p.message_id):
                self._summarize(conn, message_id, now)
            if finish_inbox is not None:
                old = conn.execute(
                    "SELECT channel_id, action, state FROM channel_inbox WHERE id = ?", (finish_inbox,)
                ).fetchall()
                conn.execute(
                    "UPDATE channel_inbox SET state = ?, input = NULL, updated_at = ? WHERE id = ?",
                    (finish_state, now, finish_inbox),
                )
                if old:
                    channel_id, action, state = (str(v) for v in old[0])
                    count_change(conn, channel_id, log_status(action, state), log_status(action, finish_state))
        return out

    def next_delivery(self, channel_id: str, chat_id: str) -> DeliveryRow | None:
        """The chat's oldest delivery not acknowledged or failed (deliveries of a chat go in order)."""
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM channel_deliveries WHERE channel_id = ? AND chat_id = ?"
                " AND state IN ('pending', 'sent') ORDER BY id LIMIT 1",
                (channel_id, chat_id),
            ).fetchall()
        return _delivery(rows[0]) if rows else None

    def open_chats(self) -> list[tuple[str, str]]:
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT DISTINCT channel_id, chat_id FROM channel_deliveries WHERE state IN ('pending', 'sent')"
            ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def get_delivery(self, delivery_id: str) -> DeliveryRow | None:
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM channel_deliveries WHERE id = ?", (delivery_id,)
            ).fetchall()
        return _delivery(rows[0]) if rows else None

    def deliveries_of(self, message_id: str) -> list[DeliveryRow]:
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM channel_deliveries WHERE message_id = ? ORDER BY seq",
                (message_id,),
            ).fetchall()
        return [_delivery(r) for r in rows]

    def mark_sent(self, delivery_id: str, attempts: int) -> None:
        self._set_delivery(delivery_id, "state = 'sent', attempts = ?", (attempts,))

    def mark_acked(self, delivery_id: str, platform_message_id: str | None) -> bool:
        """Acknowledged (also after it was marked failed: it arrived after all). False if unknown."""
        return self._set_delivery(
            delivery_id, "state = 'acked', error = NULL, platform_message_id = ?", (platform_message_id,)
        )

    def mark_failed(self, delivery_id: str, error: str) -> None:
        self._set_delivery(delivery_id, "state = 'failed', error = ?", (error[:2000],))

    def note_error(self, delivery_id: str, error: str) -> None:
        """The last attempt's error (the delivery is retried)."""
        self._set_delivery(delivery_id, "error = ?", (error[:2000],))

    def _set_delivery(self, delivery_id: str, sets: str, values: tuple[Any, ...]) -> bool:
        with self._db.write() as conn:
            now = self._clock()
            rows = conn.execute(
                f"UPDATE channel_deliveries SET {sets}, updated_at = ? WHERE id = ? RETURNING message_id",
                (*values, now, delivery_id),
            ).fetchall()
            if not rows:
                return False
            if rows[0][0] is not None:
                self._summarize(conn, str(rows[0][0]), now)
        return True

    def _summarize(self, conn: apsw.Connection, message_id: str, now: int) -> None:
        rows = conn.execute(
            "SELECT channel_id, chat_id, state, error FROM channel_deliveries WHERE message_id = ? ORDER BY seq",
            (message_id,),
        ).fetchall()
        if not rows:
            return
        states = [r[2] for r in rows]
        errors = [r[3] for r in rows if r[3]]
        status: DeliveryStatus
        if any(s in ("pending", "sent") for s in states):
            status = "sending" if any(s != "pending" for s in states) else "pending"
        elif "failed" in states:
            status = "failed"
        else:
            status = "delivered"
        summary = MessageDelivery(
            channel=str(rows[0][0]), chat_id=str(rows[0][1]), status=status, deliveries=len(rows),
            delivered=states.count("acked"), failed=states.count("failed"),
            error=str(errors[-1]) if errors and status != "delivered" else None, updated_at=now,
        )
        conn.execute("UPDATE messages_v2 SET delivery = ? WHERE id = ?", (_enc.encode(summary).decode(), message_id))

    # ---- the message log and the counters ------------------------------------------

    def log(
        self, channel_id: str, *, status: str | None, chat_id: str | None, before: str | None, limit: int
    ) -> tuple[list[ChannelLogEntry], str | None]:
        """A page of the channel's received messages, newest first, and the cursor of the next."""
        where = ["channel_id = ?"]
        args: list[Any] = [channel_id]
        if status is not None:
            where.append(STATUS_SQL[status])
        if chat_id is not None:
            where.append("chat_id = ?")
            args.append(chat_id)
        if before is not None:
            where.append("id < ?")
            args.append(before)
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {_INBOX_COLUMNS} FROM channel_inbox WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        entries = [_entry(_inbox(r)) for r in rows[:limit]]
        return entries, entries[-1].inbox_id if len(rows) > limit else None

    def counters(self) -> dict[str, ChannelCounters]:
        with self._db.read() as conn:
            rows = conn.execute(f"SELECT channel_id, {', '.join(COUNTERS)} FROM channel_counters").fetchall()
        return {str(r[0]): ChannelCounters(**dict(zip(COUNTERS, (int(str(v)) for v in r[1:])))) for r in rows}

    # ---- secrets (sealed) -----------------------------------------------------------

    def set_secret(self, channel_id: str, name: str, value: str | None) -> None:
        """Store (None: remove) a channel's secret, sealed."""
        with self._db.write() as conn:
            if value is None:
                conn.execute("DELETE FROM channel_secrets WHERE channel_id = ? AND name = ?", (channel_id, name))
                return
            sealed = self._sealer.seal(value, SECRET_PURPOSE) if self._sealer is not None else value
            conn.execute(
                "INSERT INTO channel_secrets(channel_id, name, value) VALUES (?, ?, ?)"
                " ON CONFLICT(channel_id, name) DO UPDATE SET value = excluded.value",
                (channel_id, name, sealed),
            )

    def secret_names(self, channel_id: str) -> set[str]:
        with self._db.read() as conn:
            rows = conn.execute("SELECT name FROM channel_secrets WHERE channel_id = ?", (channel_id,)).fetchall()
        return {str(r[0]) for r in rows}

    def secret(self, channel_id: str, name: str) -> str | None:
        """The plaintext of a stored secret (None: none); SecretsLocked when it is sealed with
        a key this process was not given."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT value FROM channel_secrets WHERE channel_id = ? AND name = ?", (channel_id, name)
            ).fetchall()
        if not rows:
            return None
        stored = str(rows[0][0])
        if self._sealer is None:
            return stored
        plain, locked = self._sealer.open(stored, SECRET_PURPOSE)
        if locked:
            raise SecretsLocked(f"the {name} of channel {channel_id!r} is sealed with a key this process was not given")
        return plain

    # ---- connections the sidecar owns ---------------------------------------------------

    def connection_state(self, channel_id: str) -> tuple[bool, str | None]:
        """(should it be connected, where to resume)."""
        with self._db.read() as conn:
            rows = conn.execute("SELECT connect, resume FROM channel_state WHERE channel_id = ?", (channel_id,)).fetchall()
        if not rows:
            return False, None
        resume = rows[0][1]
        return bool(rows[0][0]), str(resume) if resume is not None else None

    def wanted_connections(self) -> list[str]:
        with self._db.read() as conn:
            rows = conn.execute("SELECT channel_id FROM channel_state WHERE connect = 1").fetchall()
        return [str(r[0]) for r in rows]

    def set_connection(self, channel_id: str, *, connect: bool | None = None, resume: str | None | _Keep = KEEP) -> None:
        """Record whether the channel should be connected and/or its resume point."""
        with self._db.write() as conn:
            now = self._clock()
            conn.execute(
                "INSERT INTO channel_state(channel_id, connect, resume, updated_at) VALUES (?, 0, NULL, ?)"
                " ON CONFLICT(channel_id) DO NOTHING",
                (channel_id, now),
            )
            if connect is not None:
                conn.execute(
                    "UPDATE channel_state SET connect = ?, updated_at = ? WHERE channel_id = ?",
                    (int(connect), now, channel_id),
                )
            if not isinstance(resume, _Keep):
                conn.execute(
                    "UPDATE channel_state SET resume = ?, updated_at = ? WHERE channel_id = ?", (resume, now, channel_id)
                )

    # ---- the remote-agent route's session map -------------------------------------------

    def remote_session(self, session_id: str) -> tuple[str, str, str] | None:
        """(remote session id, user_id, project_id) of a local session's previous turn."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT remote_session_id, user_id, project_id FROM channel_remote_sessions WHERE session_id = ?",
                (session_id,),
            ).fetchall()
        return (str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None

    def set_remote_session(self, session_id: str, remote_session_id: str, user_id: str, project_id: str) -> None:
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO channel_remote_sessions(session_id, remote_session_id, user_id, project_id, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET"
                " remote_session_id = excluded.remote_session_id, user_id = excluded.user_id,"
                " project_id = excluded.project_id, updated_at = excluded.updated_at",
                (session_id, remote_session_id, user_id, project_id, self._clock()),
            )


def _entry(row: InboxRow) -> ChannelLogEntry:
    reason = row.reason
    if row.state == "failed":
        reason = row.error or reason
    return ChannelLogEntry(
        inbox_id=row.id, chat_id=row.chat_id, chat_type=row.chat_type,
        thread_id=row.thread_id, message_id=row.platform_message_id, sender_id=row.sender_id,
        sender_name=row.sender_name, text=row.text_preview, action=row.action,
        status=log_status(row.action, row.state), reason=reason, session_id=row.session_id,
        user_message_id=row.user_message_id, reply_message_id=row.reply_message_id,
        received_at=row.received_at, updated_at=row.updated_at,
    )
