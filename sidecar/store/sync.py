"""SyncRepo: the storage side of Qiming server sync (tables of migration ``m_qiming_sync``;
its records: sync_records.py; importing a conversation: sync_import.py).

Owns:
- ``sync_account``: the one configured server account: URL, the account key (URL + user
  id) that scopes every link, the token sealed at rest by the Store's Sealer (purpose
  ``sync_account.token``, re-sealed by SecretsRepo.settle with the other secrets; only
  ``token()`` opens it), user, configuration, state, last sync;
- ``sync_links``: local session <-> server conversation, with what was last seen on each
  side (server ``modified`` and topic, local title, the session's ``updated_at``), the
  newest server message index imported and the oldest unfinished one, the server's
  ``sandboxSessionId``. A link row is also the tombstone: ``state`` is ``linked``,
  ``creating`` (``/create`` answered, the topic not set yet), ``server_deleted`` (gone on
  the server; the local copy was kept because it had changed, or was deleted with it) or
  ``deleted`` (gone on both sides); a ``linked`` row whose session no longer exists is a
  local deletion the next push sends to the server;
- ``sync_messages``: which local message is which server message (server index, id and a
  digest of the mapped content); cascades with its message. Forwarded turns (server
  sessions) map their messages here too (``map_forwarded``), so a pull skips them;
- ``sync_forward``: the server-side session of a server session's last forwarded turn
  (the computer API continues it); cascades with its session.

Must stay true:
- Importing a conversation is all or nothing: the session, its messages, their search
  index, the message map and the link are written in one transaction (``import_new`` /
  ``import_update``) or one savepoint of a batch transaction (``import_batch``), so a crash
  never leaves a half-imported conversation visible and a retry starts from a clean state.
- A server message index is imported at most once per account (unique index), so
  repeated or overlapping pulls never duplicate a message.
- The message tree is add-only: a pull appends new server messages under the local copy
  of the newest server message before them; local messages added meanwhile stay where
  they are, so both become branches. Only a message the server changed (an unfinished
  reply that finished) is rewritten, and only if it came from the server and was not
  edited here: an edited one keeps the edit, and the server's text becomes its sibling.
Synchronous: a Store attribute (``store.sync``), reached from async code through the
store gateway (``await store.run(lambda s: s.sync.<method>(...))``). Each public method is
one transaction.
"""

from __future__ import annotations

import apsw

from protocol.types import MessageV2, SessionV2
from sidecar.errors import SidecarError, StoreError
from sidecar.store import message_table, session_table
from sidecar.store.db import Database, fetch_all
from sidecar.store.rows import SESSION_COLUMNS, session_from_row
from sidecar.store.secrets import SYNC_TOKEN, Sealer
from sidecar.store.sync_import import import_new, import_update
from sidecar.store.sync_records import (
    LINK_COLUMNS,
    OPEN_STATUSES,
    AccountRow,
    ConversationUpdate,
    NewConversation,
    PushCandidate,
    SyncLink,
    UpdateOutcome,
    link_from_row,
)

__all__ = ["SyncRepo"]

_OPEN_MARKS = ", ".join("?" * len(OPEN_STATUSES))
_S_COLUMNS = ", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))


class SyncRepo:
    def __init__(self, db: Database, sealer: Sealer) -> None:
        self._db = db
        self._sealer = sealer

    # ---- the account ------------------------------------------------------------------

    def account(self) -> AccountRow | None:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT service_url, account_key, token_expires_at, user, config, state, last_sync_at,"
                " last_result, token IS NOT NULL FROM sync_account WHERE id = 1"
            ).fetchone()
        if row is None:
            return None
        return AccountRow(
            service_url=row[0], account_key=row[1], token_expires_at=row[2], user=row[3], config=row[4],
            state=row[5], last_sync_at=row[6], last_result=row[7], has_token=bool(row[8]),
        )

    def token(self) -> tuple[str | None, bool]:
        """(the token opened, locked): None when there is none; locked when it was sealed
        with a key this process was not given (it stays stored as it is)."""
        with self._db.read() as conn:
            row = conn.execute("SELECT token FROM sync_account WHERE id = 1").fetchone()
        return self._sealer.open(None if row is None else row[0], SYNC_TOKEN)

    def save_account(
        self, *, service_url: str, account_key: str, token: str, token_expires_at: int | None,
        user: str, config: str, now: int,
    ) -> None:
        """Configure the account (replacing any), its token sealed; last sync is kept for
        the same account."""
        sealed_token = self._sealer.seal(token, SYNC_TOKEN)
        with self._db.write() as conn:
            row = conn.execute("SELECT account_key FROM sync_account WHERE id = 1").fetchone()
            same = row is not None and row[0] == account_key
            conn.execute(
                "INSERT INTO sync_account (id, service_url, account_key, token, token_expires_at, user, config,"
                " state, updated_at) VALUES (1, ?, ?, ?, ?, ?, ?, 'ok', ?)"
                " ON CONFLICT(id) DO UPDATE SET service_url = excluded.service_url,"
                " account_key = excluded.account_key, token = excluded.token,"
                " token_expires_at = excluded.token_expires_at, user = excluded.user, config = excluded.config,"
                " state = 'ok', updated_at = excluded.updated_at",
                (service_url, account_key, sealed_token, token_expires_at, user, config, now),
            )
            if not same:
                conn.execute(
                    "UPDATE sync_account SET last_sync_at = NULL, last_result = NULL, watermarks = '{}' WHERE id = 1"
                )

    def set_state(self, state: str, now: int) -> None:
        with self._db.write() as conn:
            conn.execute("UPDATE sync_account SET state = ?, updated_at = ? WHERE id = 1", (state, now))

    def clear_token(self, now: int) -> None:
        """Logout: the token goes; URL, links and history stay."""
        with self._db.write() as conn:
            conn.execute(
                "UPDATE sync_account SET token = NULL, token_expires_at = NULL, state = 'logged_out',"
                " updated_at = ? WHERE id = 1",
                (now,),
            )

    def watermark(self, scope: str) -> int | None:
        """The server ``modified`` up to which every conversation of ``scope`` was listed and
        imported by a complete pull (None: never)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT json_extract(watermarks, '$.' || json_quote(?)) FROM sync_account WHERE id = 1", (scope,)
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def set_watermark(self, scope: str, value: int) -> None:
        with self._db.write() as conn:
            conn.execute(
                "UPDATE sync_account SET watermarks = json_set(watermarks, '$.' || json_quote(?), ?) WHERE id = 1",
                (scope, value),
            )

    def record_sync(self, at: int, result: str) -> None:
        with self._db.write() as conn:
            conn.execute(
                "UPDATE sync_account SET last_sync_at = ?, last_result = ? WHERE id = 1", (at, result)
            )

    # ---- links ------------------------------------------------------------------------

    def links(self, account_key: str, conversation_ids: list[int] | None = None) -> dict[int, SyncLink]:
        """Links of the account (all, or those of the given conversations)."""
        with self._db.read() as conn:
            if conversation_ids is None:
                rows = conn.execute(
                    f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ?", (account_key,)
                ).fetchall()
            else:
                rows = []
                for start in range(0, len(conversation_ids), 500):
                    chunk = conversation_ids[start : start + 500]
                    rows += conn.execute(
                        f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ?"
                        f" AND l.conversation_id IN ({','.join('?' * len(chunk))})",
                        [account_key, *chunk],
                    ).fetchall()
        return {link.conversation_id: link for link in map(link_from_row, rows)}

    def link_of_session(self, account_key: str, session_id: str) -> SyncLink | None:
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.session_id = ?",
                (account_key, session_id),
            ).fetchone()
        return None if row is None else link_from_row(row)

    def held_index_at_most(self, account_key: str, conversation_id: int, index: int) -> int | None:
        """The largest server index this conversation holds that is at most ``index``."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT max(server_index) FROM sync_messages WHERE account_key = ? AND conversation_id = ?"
                " AND server_index <= ?",
                (account_key, conversation_id, index),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def session_state(self, session_id: str) -> tuple[SessionV2, bool] | None:
        """The session and whether it has a reply that is not final; None if it is gone."""
        with self._db.read() as conn:
            rows = conn.execute(f"SELECT {SESSION_COLUMNS} FROM sessions_v2 WHERE id = ?", (session_id,)).fetchall()
            if not rows:
                return None
            return session_from_row(rows[0]), _has_open(conn, session_id)

    # ---- pull -------------------------------------------------------------------------

    def import_new(self, item: NewConversation) -> SessionV2:
        """A conversation this device does not hold: a new session (id ``item.session.id``)
        with its messages chained in server order, and the link. The session takes the
        default provider/model when it names none."""
        with self._db.write() as conn:
            return import_new(conn, item)

    def import_update(self, item: ConversationUpdate) -> UpdateOutcome:
        """Server messages of a linked conversation (new ones are added, known ones whose
        content changed on the server are rewritten) and what was seen of it.

        ``apply_title`` (the server's topic won) is applied only if the session's title is
        still ``expected_title``; otherwise neither the title nor the topic snapshot moves,
        so the next run sees both sides changed and decides again (nothing is lost)."""
        with self._db.write() as conn:
            return import_update(conn, item)

    def import_batch(
        self, items: list[NewConversation | ConversationUpdate]
    ) -> list[SessionV2 | UpdateOutcome | SidecarError]:
        """Several conversations in one transaction, each in a savepoint of its own: each is
        stored whole or (failing) not at all, and one that fails (a constraint, a value
        SQLite cannot hold) does not take the others with it. Results (or the error of
        each) in the order of ``items``."""
        out: list[SessionV2 | UpdateOutcome | SidecarError] = []
        with self._db.write() as conn:
            for item in items:
                try:
                    with conn:  # a savepoint inside the write transaction
                        if isinstance(item, NewConversation):
                            out.append(import_new(conn, item))
                        else:
                            out.append(import_update(conn, item))
                except SidecarError as exc:
                    out.append(exc)
                except apsw.Error as exc:
                    out.append(StoreError(f"database error: {exc}"))
                except OverflowError as exc:  # a server value past int64 that slipped past the wire's bounds
                    out.append(StoreError(f"a value is out of the 64-bit range the database holds: {exc}"))
        return out

    def deletable(self, account_key: str, conversation_id: int) -> bool:
        """Whether the linked session would go with its conversation (unchanged here since the
        last sync, no open reply, no message only here)."""
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.conversation_id = ?",
                (account_key, conversation_id),
            ).fetchone()
            return row is not None and _unchanged(conn, link_from_row(row))

    def mark_server_deleted(self, account_key: str, conversation_id: int, now: int) -> str:
        """The conversation is gone on the server. Its session is deleted with it when it
        has not changed here since the last sync; otherwise it is kept (and stays local).
        Returns ``deleted_local``, ``kept`` or ``gone`` (the session had gone already)."""
        with self._db.write() as conn:
            row = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.conversation_id = ?",
                (account_key, conversation_id),
            ).fetchone()
            if row is None:
                return "gone"
            link = link_from_row(row)
            outcome = "gone"
            state = "deleted"
            if link.session_exists:
                if _unchanged(conn, link):
                    session_table.delete(conn, link.session_id)
                    outcome = "deleted_local"
                else:
                    outcome, state = "kept", "server_deleted"
            conn.execute(
                "UPDATE sync_links SET state = ?, updated_at = ? WHERE account_key = ? AND conversation_id = ?",
                (state, now, account_key, conversation_id),
            )
            return outcome

    def server_messages(self, message_ids: list[str]) -> int:
        """How many of ``message_ids`` are copies of server messages (a pull maps them)."""
        count = 0
        with self._db.read() as conn:
            for start in range(0, len(message_ids), 500):
                part = message_ids[start : start + 500]
                marks = ",".join("?" * len(part))
                sql = f"SELECT count(*) FROM sync_messages WHERE message_id IN ({marks})"
                count += int(fetch_all(conn, sql, part)[0][0])
        return count

    def delete_session(self, session_id: str) -> bool:
        """Delete a local session (its link stays as the tombstone); False if it was gone."""
        with self._db.write() as conn:
            if not session_table.exists(conn, session_id):
                return False
            session_table.delete(conn, session_id)
            return True

    def set_link_state(self, account_key: str, conversation_id: int, state: str, now: int) -> None:
        with self._db.write() as conn:
            conn.execute(
                "UPDATE sync_links SET state = ?, updated_at = ? WHERE account_key = ? AND conversation_id = ?",
                (state, now, account_key, conversation_id),
            )

    def unlink_session(self, account_key: str, session_id: str, state: str, now: int) -> SyncLink | None:
        """Set the state of a session's link (e.g. ``server_deleted`` after the user deleted
        the conversation on the server); returns the link as it was."""
        with self._db.write() as conn:
            row = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.session_id = ?",
                (account_key, session_id),
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE sync_links SET state = ?, updated_at = ? WHERE account_key = ? AND session_id = ?",
                (state, now, account_key, session_id),
            )
            return link_from_row(row)

    def note_server_topic(
        self, account_key: str, conversation_id: int, *, topic: str | None, modified: int | None,
        local_title: str | None, now: int,
    ) -> None:
        """After a topic update this device made: both snapshots agree (no false conflict),
        and the local title follows when given."""
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT session_id FROM sync_links WHERE account_key = ? AND conversation_id = ?",
                (account_key, conversation_id),
            ).fetchone()
            if row is None:
                return
            if local_title is not None and session_table.exists(conn, row[0]):
                conn.execute("UPDATE sessions_v2 SET title = ? WHERE id = ?", (local_title, row[0]))
            conn.execute(
                "UPDATE sync_links SET server_topic = coalesce(?, server_topic),"
                " server_modified = coalesce(?, server_modified), local_title = coalesce(?, local_title),"
                " updated_at = ? WHERE account_key = ? AND conversation_id = ?",
                (topic, modified, local_title, now, account_key, conversation_id),
            )

    # ---- forwarded chat -------------------------------------------------------------------

    def link_forwarded(
        self, *, account_key: str, session_id: str, conversation_id: int, agent_id: int | None,
        server_modified: int | None, now: int,
    ) -> None:
        """A conversation created for a server session (``/create`` answered): linked at once,
        without a topic (the server makes one from the first message)."""
        with self._db.write() as conn:
            session = session_table.get(conn, session_id)
            conn.execute(
                "INSERT INTO sync_links (account_key, conversation_id, session_id, agent_id, state, server_modified,"
                " local_title, local_synced_at, created_at, updated_at) VALUES (?, ?, ?, ?, 'linked', ?, ?, ?, ?, ?)",
                (account_key, conversation_id, session_id, agent_id, server_modified, session.title,
                 session.updated_at, now, now),
            )

    def map_forwarded(
        self, account_key: str, conversation_id: int, session_id: str, pairs: list[tuple[str, int, str | None, str]]
    ) -> int:
        """The server's copies of messages a forwarded turn stored here: (local message id,
        server index, server id, digest). A pull then knows them and adds nothing twice; a
        local message or a server index already mapped is left as it is. Returns how many
        were mapped."""
        with self._db.write() as conn:
            mapped = 0
            for message_id, index, server_id, digest in pairs:
                conn.execute(
                    "INSERT OR IGNORE INTO sync_messages (message_id, session_id, account_key, conversation_id,"
                    " server_index, server_id, digest, finished)"
                    " SELECT ?, ?, ?, ?, ?, ?, ?, 1 WHERE EXISTS (SELECT 1 FROM messages_v2 WHERE id = ? AND session_id = ?)",
                    (message_id, session_id, account_key, conversation_id, index, server_id, digest,
                     message_id, session_id),
                )
                mapped += conn.changes()
            return mapped

    def set_server_mode(self, session_id: str) -> SessionV2:
        """Make a session a server session (its turns go to its linked conversation)."""
        with self._db.write() as conn:
            session_table.require(conn, session_id)
            conn.execute("UPDATE sessions_v2 SET mode = 'server' WHERE id = ?", (session_id,))
            return session_table.get(conn, session_id)

    def remote_session(self, session_id: str, chat_api: str) -> str | None:
        """The server-side session of a server session's last forwarded turn (computer API)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT remote_session_id FROM sync_forward WHERE session_id = ? AND chat_api = ?",
                (session_id, chat_api),
            ).fetchone()
        return None if row is None else row[0]

    def set_remote_session(self, session_id: str, chat_api: str, remote_session_id: str, now: int) -> None:
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO sync_forward (session_id, chat_api, remote_session_id, updated_at)"
                " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions_v2 WHERE id = ?)"
                " ON CONFLICT(session_id) DO UPDATE SET chat_api = excluded.chat_api,"
                " remote_session_id = excluded.remote_session_id, updated_at = excluded.updated_at",
                (session_id, chat_api, remote_session_id, now, session_id),
            )

    # ---- push -------------------------------------------------------------------------

    def push_candidates(self, account_key: str) -> list[PushCandidate]:
        """Sessions created or changed here since their last sync (none with an open reply),
        local deletions of linked sessions, and conversations created but not titled yet."""
        with self._db.read() as conn:
            open_ids = {
                r[0] for r in conn.execute(
                    f"SELECT DISTINCT session_id FROM messages_v2 WHERE status IN ({_OPEN_MARKS})", OPEN_STATUSES
                )
            }
            out: list[PushCandidate] = []
            # never synced with any account: created here
            for r in conn.execute(
                f"SELECT {_S_COLUMNS} FROM sessions_v2 s WHERE s.message_count > 0"
                " AND NOT EXISTS (SELECT 1 FROM sync_links l WHERE l.session_id = s.id)"
                " ORDER BY s.created_at, s.id"
            ).fetchall():
                session = session_from_row(r)
                if session.id in open_ids:
                    continue
                out.append(PushCandidate(
                    session=session, link=None, local_only=_local_only(conn, session.id),
                    first_user_text=_first_user_text(conn, session),
                ))
            for r in conn.execute(
                f"SELECT {LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.state IN ('linked', 'creating')",
                (account_key,),
            ).fetchall():
                link = link_from_row(r)
                if not link.session_exists:
                    out.append(PushCandidate(session=None, link=link, local_only=0, first_user_text=None))
                    continue
                if link.session_id in open_ids:
                    continue
                session = session_table.get(conn, link.session_id)
                if link.state == "linked" and session.updated_at <= (link.local_synced_at or -1):
                    continue
                out.append(PushCandidate(
                    session=session, link=link, local_only=_local_only(conn, session.id),
                    first_user_text=_first_user_text(conn, session),
                ))
            return out

    def active_path(self, session_id: str) -> list[MessageV2]:
        """Root -> active leaf of a session (what a server conversation can hold)."""
        with self._db.read() as conn:
            row = conn.execute("SELECT active_leaf_id FROM sessions_v2 WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                return []
            leaf = row[0] or message_table.newest_leaf(conn, session_id)
            return [] if leaf is None else message_table.path(conn, session_id, leaf)

    def record_creating(
        self, *, account_key: str, session_id: str, conversation_id: int, agent_id: int | None,
        server_modified: int | None, server_topic: str | None, now: int,
    ) -> None:
        """``/create`` answered: remember the conversation before setting its topic, so a
        crash in between resumes with the same conversation instead of creating another."""
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO sync_links (account_key, conversation_id, session_id, agent_id, state, server_modified,"
                " server_topic, created_at, updated_at) VALUES (?, ?, ?, ?, 'creating', ?, ?, ?, ?)",
                (account_key, conversation_id, session_id, agent_id, server_modified, server_topic, now, now),
            )

    def mark_pushed(
        self,
        *,
        account_key: str,
        conversation_id: int,
        session_updated_at: int,
        local_title: str,
        server_topic: str | None,
        server_modified: int | None,
        reported_local: int,
        mapped: list[tuple[str, int, str | None, str]] | None = None,
        now: int,
    ) -> None:
        """The server confirmed: the session as it was at ``session_updated_at`` is in sync.
        ``mapped``: (local message id, server index, server id, digest) of messages the server
        stored from this push."""
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT session_id FROM sync_links WHERE account_key = ? AND conversation_id = ?",
                (account_key, conversation_id),
            ).fetchone()
            if row is None:
                return
            session_id = row[0]
            for message_id, index, server_id, digest in mapped or []:
                conn.execute(
                    "INSERT OR IGNORE INTO sync_messages (message_id, session_id, account_key, conversation_id,"
                    " server_index, server_id, digest, finished) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                    (message_id, session_id, account_key, conversation_id, index, server_id, digest),
                )
            top = conn.execute(
                "SELECT max(server_index) FROM sync_messages WHERE account_key = ? AND conversation_id = ?",
                (account_key, conversation_id),
            ).fetchall()[0][0]
            conn.execute(
                "UPDATE sync_links SET state = 'linked', local_synced_at = ?, local_title = ?,"
                " server_topic = coalesce(?, server_topic), server_modified = coalesce(?, server_modified),"
                " reported_local = ?, pulled_index = coalesce(?, pulled_index), pushed_at = ?, updated_at = ?"
                " WHERE account_key = ? AND conversation_id = ?",
                (
                    session_updated_at, local_title, server_topic, server_modified, reported_local, top, now, now,
                    account_key, conversation_id,
                ),
            )


def _unchanged(conn: apsw.Connection, link: SyncLink) -> bool:
    if not link.session_exists:
        return False
    session = session_table.get(conn, link.session_id)
    return (
        session.updated_at <= (link.local_synced_at or -1)
        and not _has_open(conn, link.session_id)
        and not _local_only(conn, link.session_id)
    )


def _has_open(conn: apsw.Connection, session_id: str) -> bool:
    return bool(conn.execute(
        f"SELECT 1 FROM messages_v2 WHERE session_id = ? AND status IN ({_OPEN_MARKS}) LIMIT 1",
        (session_id, *OPEN_STATUSES),
    ).fetchall())


def _local_only(conn: apsw.Connection, session_id: str) -> int:
    (count,) = conn.execute(
        "SELECT count(*) FROM messages_v2 m WHERE m.session_id = ?"
        " AND NOT EXISTS (SELECT 1 FROM sync_messages x WHERE x.message_id = m.id)",
        (session_id,),
    ).fetchall()[0]
    return int(count) if isinstance(count, int) else 0


def _first_user_text(conn: apsw.Connection, session: SessionV2) -> str | None:
    row = conn.execute(
        "SELECT text_content FROM messages_v2 WHERE session_id = ? AND role = 'user'"
        " ORDER BY created_at, id LIMIT 1",
        (session.id,),
    ).fetchone()
    return None if row is None else row[0]
