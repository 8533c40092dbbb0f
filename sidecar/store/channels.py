"""ChannelRepo: IM channels' rows (configs, chat links, the inbox, deliveries) and the delivery
summary of replies on ``messages_v2.delivery``.

Owns: the tables of migration ``m_channels``. Each public method is one transaction.
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
from typing import Any

import apsw
import msgspec

from protocol.channels import ChannelConfig, ChannelReplyParams
from protocol.types import DeliveryStatus, MessageDelivery
from sidecar.errors import NotFound
from sidecar.store.db import Database
from sidecar.store.ids import now_ms

__all__ = ["ChannelRepo", "InboxRow", "DeliveryRow", "OPEN_INBOX_STATES", "OPEN_DELIVERY_STATES"]

OPEN_INBOX_STATES = ("queued", "running")
OPEN_DELIVERY_STATES = ("pending", "sent")

_enc = msgspec.json.Encoder()
_dec_config = msgspec.json.Decoder(ChannelConfig)
_dec_payload = msgspec.json.Decoder(ChannelReplyParams)


class InboxRow(msgspec.Struct, kw_only=True):
    id: str
    channel_id: str
    dedup_key: str
    chat_id: str
    thread_id: str | None = None
    platform_message_id: str | None = None
    session_id: str | None = None
    action: str
    state: str
    input: str | None = None
    """JSON of the turn to run or store (the service's QueuedTurn), until the row is done."""
    user_message_id: str | None = None
    reply_message_id: str | None = None
    error: str | None = None
    received_at: int
    updated_at: int


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
    " input, user_message_id, reply_message_id, error, received_at, updated_at"
)
_DELIVERY_COLUMNS = (
    "id, channel_id, chat_id, message_id, inbox_id, seq, kind, target, payload, state, attempts,"
    " error, platform_message_id, created_at, updated_at"
)


def _inbox(row: tuple[Any, ...]) -> InboxRow:
    return InboxRow(
        id=row[0], channel_id=row[1], dedup_key=row[2], chat_id=row[3], thread_id=row[4],
        platform_message_id=row[5], session_id=row[6], action=row[7], state=row[8], input=row[9],
        user_message_id=row[10], reply_message_id=row[11], error=row[12], received_at=row[13],
        updated_at=row[14],
    )


def _delivery(row: tuple[Any, ...]) -> DeliveryRow:
    return DeliveryRow(
        id=row[0], channel_id=row[1], chat_id=row[2], message_id=row[3], inbox_id=row[4], seq=row[5],
        kind=row[6], target=row[7], payload=_dec_payload.decode(row[8]), state=row[9], attempts=row[10],
        error=row[11], platform_message_id=row[12], created_at=row[13], updated_at=row[14],
    )


class ChannelRepo:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms) -> None:
        self._db = db
        self._clock = clock

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
                    return old, False
                conn.execute("DELETE FROM channel_inbox WHERE id = ?", (old.id,))
            conn.execute(
                f"INSERT INTO channel_inbox({_INBOX_COLUMNS}) VALUES ({', '.join('?' * 15)})",
                (
                    row.id, row.channel_id, row.dedup_key, row.chat_id, row.thread_id,
                    row.platform_message_id, row.session_id, row.action, row.state, row.input,
                    row.user_message_id, row.reply_message_id, row.error, row.received_at, row.updated_at,
                ),
            )
        return row, True

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
        error; a finished state clears ``input``)."""
        allowed = {"state", "action", "session_id", "user_message_id", "reply_message_id", "error", "input"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"not inbox columns: {sorted(unknown)}")
        if fields.get("state") in ("done", "failed"):
            fields["input"] = None
        sets = ", ".join(f"{name} = ?" for name in fields)
        with self._db.write() as conn:
            conn.execute(
                f"UPDATE channel_inbox SET {sets}, updated_at = ? WHERE id = ?",
                (*fields.values(), self._clock(), inbox_id),
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
    ) -> list[DeliveryRow]:
        """Store deliveries (payload, target index) as ``pending``; with ``finish_inbox`` that
        inbox row becomes ``done`` in the same transaction (the reply cannot be lost between)."""
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
                conn.execute(
                    "UPDATE channel_inbox SET state = 'done', input = NULL, updated_at = ? WHERE id = ?",
                    (now, finish_inbox),
                )
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
