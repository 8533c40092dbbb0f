"""SyncRepo: the storage side of Qiming server sync (tables of migration ``m_qiming_sync``).

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

import logging
from typing import Any

import apsw
import msgspec

from protocol.types import MessageV2, SessionV2
from sidecar.errors import SidecarError, StoreError
from sidecar.store.db import Database, fetch_all
from sidecar.store.ids import new_id
from sidecar.store import message_table
from sidecar.store.rows import SESSION_COLUMNS, searchable_text, session_from_row, to_json
from sidecar.store import search as message_search
from sidecar.store.secrets import SYNC_TOKEN, Sealer
from sidecar.store import session_table
from sidecar.store.settings import DEFAULT_MODEL_KEY, DEFAULT_PROVIDER_KEY, setting
from sidecar.store.transfer import import_session

__all__ = [
    "SyncRepo",
    "AccountRow",
    "SyncLink",
    "PulledMessage",
    "NewConversation",
    "ConversationUpdate",
    "UpdateOutcome",
    "PushCandidate",
    "OPEN_STATUSES",
]

log = logging.getLogger(__name__)

OPEN_STATUSES = ("pending", "streaming", "paused")
"""A session with a message in one of these is never pushed (its reply is not final)."""

_LINK_COLUMNS = (
    "l.account_key, l.conversation_id, l.session_id, l.agent_id, l.state, l.server_modified,"
    " l.server_topic, l.local_title, l.pulled_index, l.open_index, l.local_synced_at,"
    " l.reported_local, l.sandbox_session_id,"
    " EXISTS (SELECT 1 FROM sessions_v2 s WHERE s.id = l.session_id)"
)
_S_COLUMNS = ", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))


class AccountRow(msgspec.Struct, frozen=True, kw_only=True):
    service_url: str
    account_key: str
    token_expires_at: int | None
    user: str | None
    """JSON of the user as the sync layer stored it."""
    config: str
    """JSON of the account configuration (agent, capabilities, timeouts)."""
    state: str
    last_sync_at: int | None
    last_result: str | None
    has_token: bool


class SyncLink(msgspec.Struct, frozen=True, kw_only=True):
    account_key: str
    conversation_id: int
    session_id: str
    agent_id: int | None
    state: str
    server_modified: int | None
    server_topic: str | None
    local_title: str | None
    pulled_index: int | None
    open_index: int | None
    local_synced_at: int | None
    reported_local: int
    sandbox_session_id: str | None
    session_exists: bool


class PulledMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A server message to store: the local message (its id, session and parent are set
    by the repo) and what identifies it on the server."""

    message: MessageV2
    server_index: int
    server_id: str | None
    digest: str
    finished: bool


class NewConversation(msgspec.Struct, frozen=True, kw_only=True):
    """A server conversation to import as a new session."""

    account_key: str
    conversation_id: int
    agent_id: int | None
    session: SessionV2
    messages: list[PulledMessage]
    server_modified: int | None
    server_topic: str | None
    sandbox_session_id: str | None
    now: int


class ConversationUpdate(msgspec.Struct, frozen=True, kw_only=True):
    """What a pull saw of a linked conversation: its messages (new and known) and metadata."""

    account_key: str
    conversation_id: int
    messages: list[PulledMessage]
    server_modified: int | None
    server_topic: str | None
    apply_title: str | None
    expected_title: str | None
    sandbox_session_id: str | None
    now: int


class UpdateOutcome(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    """``updated`` | ``local_deleted`` (the session went away meanwhile) | ``unlinked``."""
    added: int = 0
    changed: int = 0
    branched: bool = False
    """New server messages were added beside local ones (the local branch stays active)."""
    kept_edits: int = 0
    """Replies edited here that the server changed since: the server's text was added as a
    sibling of each (the edit stays, and so does the active branch)."""
    title_applied: bool = False
    session: SessionV2 | None = None


class PushCandidate(msgspec.Struct, frozen=True, kw_only=True):
    session: SessionV2 | None
    """None for a local deletion (the session is gone)."""
    link: SyncLink | None
    """None for a session never synced."""
    local_only: int
    """Messages of the session that are not on the server."""
    first_user_text: str | None


def _link(row: tuple[Any, ...]) -> SyncLink:
    return SyncLink(
        account_key=row[0], conversation_id=row[1], session_id=row[2], agent_id=row[3], state=row[4],
        server_modified=row[5], server_topic=row[6], local_title=row[7], pulled_index=row[8],
        open_index=row[9], local_synced_at=row[10], reported_local=row[11], sandbox_session_id=row[12],
        session_exists=bool(row[13]),
    )


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
                    f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ?", (account_key,)
                ).fetchall()
            else:
                rows = []
                for start in range(0, len(conversation_ids), 500):
                    chunk = conversation_ids[start : start + 500]
                    rows += conn.execute(
                        f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ?"
                        f" AND l.conversation_id IN ({','.join('?' * len(chunk))})",
                        [account_key, *chunk],
                    ).fetchall()
        return {link.conversation_id: link for link in map(_link, rows)}

    def link_of_session(self, account_key: str, session_id: str) -> SyncLink | None:
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.session_id = ?",
                (account_key, session_id),
            ).fetchone()
        return None if row is None else _link(row)

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
            return _import_new(conn, item)

    def import_update(self, item: ConversationUpdate) -> UpdateOutcome:
        """Server messages of a linked conversation (new ones are added, known ones whose
        content changed on the server are rewritten) and what was seen of it.

        ``apply_title`` (the server's topic won) is applied only if the session's title is
        still ``expected_title``; otherwise neither the title nor the topic snapshot moves,
        so the next run sees both sides changed and decides again (nothing is lost)."""
        with self._db.write() as conn:
            return _import_update(conn, item)

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
                            out.append(_import_new(conn, item))
                        else:
                            out.append(_import_update(conn, item))
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
                f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.conversation_id = ?",
                (account_key, conversation_id),
            ).fetchone()
            return row is not None and _unchanged(conn, _link(row))

    def mark_server_deleted(self, account_key: str, conversation_id: int, now: int) -> str:
        """The conversation is gone on the server. Its session is deleted with it when it
        has not changed here since the last sync; otherwise it is kept (and stays local).
        Returns ``deleted_local``, ``kept`` or ``gone`` (the session had gone already)."""
        with self._db.write() as conn:
            row = conn.execute(
                f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.conversation_id = ?",
                (account_key, conversation_id),
            ).fetchone()
            if row is None:
                return "gone"
            link = _link(row)
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
                f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.session_id = ?",
                (account_key, session_id),
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE sync_links SET state = ?, updated_at = ? WHERE account_key = ? AND session_id = ?",
                (state, now, account_key, session_id),
            )
            return _link(row)

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
                    "SELECT DISTINCT session_id FROM messages_v2 WHERE status IN (?, ?, ?)", OPEN_STATUSES
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
                f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.state IN ('linked', 'creating')",
                (account_key,),
            ).fetchall():
                link = _link(r)
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


# ---- helpers (inside the caller's transaction) ----------------------------------------


def _import_new(conn: apsw.Connection, item: NewConversation) -> SessionV2:
    """See ``SyncRepo.import_new`` (inside the caller's transaction)."""
    _, foreign = _known_indexes(
        conn, item.account_key, item.conversation_id, [p.server_index for p in item.messages]
    )
    messages = [p for p in item.messages if p.server_index not in foreign]
    provider = item.session.provider_id or setting(conn, DEFAULT_PROVIDER_KEY) or ""
    model = item.session.model_id or setting(conn, DEFAULT_MODEL_KEY) or ""
    stored_messages: list[MessageV2] = []
    parent: str | None = None
    for pulled in messages:
        mid = new_id()
        stored_messages.append(
            msgspec.structs.replace(pulled.message, id=mid, session_id=item.session.id, parent_id=parent)
        )
        parent = mid
    stored = import_session(
        conn,
        msgspec.structs.replace(
            item.session, provider_id=provider, model_id=model,
            active_leaf_id=stored_messages[-1].id if stored_messages else None,
        ),
        stored_messages,
        replace=False,
    )
    _map_messages(conn, item.account_key, item.conversation_id, item.session.id, messages, stored_messages)
    indexes = [p.server_index for p in messages]
    conn.execute(
        "INSERT INTO sync_links (account_key, conversation_id, session_id, agent_id, state, server_modified,"
        " server_topic, local_title, pulled_index, open_index, local_synced_at, reported_local,"
        " sandbox_session_id, pulled_at, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, 'linked', ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)"
        " ON CONFLICT(account_key, conversation_id) DO UPDATE SET session_id = excluded.session_id,"
        " agent_id = excluded.agent_id, state = 'linked', server_modified = excluded.server_modified,"
        " server_topic = excluded.server_topic, local_title = excluded.local_title,"
        " pulled_index = excluded.pulled_index, open_index = excluded.open_index,"
        " local_synced_at = excluded.local_synced_at, reported_local = 0,"
        " sandbox_session_id = excluded.sandbox_session_id, pulled_at = excluded.pulled_at,"
        " updated_at = excluded.updated_at",
        (
            item.account_key, item.conversation_id, item.session.id, item.agent_id, item.server_modified, item.server_topic,
            stored.title, max(indexes, default=None),
            min((p.server_index for p in messages if not p.finished), default=None),
            stored.updated_at, item.sandbox_session_id, item.now, item.now, item.now,
        ),
    )
    return stored


def _import_update(conn: apsw.Connection, item: ConversationUpdate) -> UpdateOutcome:
    """See ``SyncRepo.import_update`` (inside the caller's transaction)."""
    row = conn.execute(
        f"SELECT {_LINK_COLUMNS} FROM sync_links l WHERE l.account_key = ? AND l.conversation_id = ?",
        (item.account_key, item.conversation_id),
    ).fetchone()
    if row is None:
        return UpdateOutcome(state="unlinked")
    link = _link(row)
    if link.state != "linked":
        return UpdateOutcome(state="unlinked")
    if not link.session_exists:
        return UpdateOutcome(state="local_deleted")
    session_id = link.session_id
    before = session_table.get(conn, session_id)
    locally_changed = before.updated_at > (link.local_synced_at or -1)
    known, foreign = _known_indexes(conn, item.account_key, item.conversation_id, [p.server_index for p in item.messages])
    fresh = [p for p in item.messages if p.server_index not in known and p.server_index not in foreign]
    added = _append_branch(conn, item.account_key, item.conversation_id, session_id, fresh, before)
    changed_count, kept_edits = _rewrite(
        conn, item.account_key, item.conversation_id, [p for p in item.messages if p.server_index in known], item.now
    )
    title_applied = False
    topic_snapshot = item.server_topic
    title_snapshot = link.local_title
    if item.apply_title is not None:
        if before.title == item.expected_title:
            if item.apply_title != before.title:
                conn.execute("UPDATE sessions_v2 SET title = ? WHERE id = ?", (item.apply_title, session_id))
            title_applied = True
            title_snapshot = item.apply_title
        else:
            topic_snapshot = link.server_topic
    if added or changed_count or kept_edits:
        session_table.recount(conn, session_id)
    # Local clock only: a server time ahead of ours would hide later local edits.
    updated_at = before.updated_at
    if added or changed_count or kept_edits or title_applied:
        updated_at = max(before.updated_at, min(item.server_modified or item.now, item.now))
        if title_applied:
            updated_at = max(updated_at, item.now)
        session_table.touch(conn, session_id, updated_at)
    stats = conn.execute(
        "SELECT max(server_index), min(CASE WHEN finished = 0 THEN server_index END)"
        " FROM sync_messages WHERE account_key = ? AND conversation_id = ?",
        (item.account_key, item.conversation_id),
    ).fetchall()[0]
    conn.execute(
        "UPDATE sync_links SET server_modified = ?, server_topic = ?, local_title = ?,"
        " pulled_index = ?, open_index = ?, local_synced_at = ?, sandbox_session_id = coalesce(?,"
        " sandbox_session_id), pulled_at = ?, updated_at = ? WHERE account_key = ? AND conversation_id = ?",
        (
            item.server_modified, topic_snapshot, title_snapshot, stats[0], stats[1],
            link.local_synced_at if locally_changed else updated_at,
            item.sandbox_session_id, item.now, item.now, item.account_key, item.conversation_id,
        ),
    )
    session = session_table.get(conn, session_id)
    branched = added > 0 and session.active_leaf_id is not None and not _is_server_message(
        conn, session.active_leaf_id
    )
    return UpdateOutcome(
        state="updated", added=added, changed=changed_count, kept_edits=kept_edits, branched=branched,
        title_applied=title_applied, session=session,
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
        "SELECT 1 FROM messages_v2 WHERE session_id = ? AND status IN (?, ?, ?) LIMIT 1",
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


def _is_server_message(conn: apsw.Connection, message_id: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM sync_messages WHERE message_id = ?", (message_id,)).fetchall())


def _known_indexes(
    conn: apsw.Connection, account_key: str, conversation_id: int, indexes: list[int]
) -> tuple[set[int], set[int]]:
    """Of ``indexes``: those this conversation holds already, and those another one holds
    (a server that reuses an index must not touch another session's message)."""
    mine: set[int] = set()
    foreign: set[int] = set()
    for start in range(0, len(indexes), 500):
        chunk = indexes[start : start + 500]
        for index, owner in conn.execute(
            f"SELECT server_index, conversation_id FROM sync_messages WHERE account_key = ?"
            f" AND server_index IN ({','.join('?' * len(chunk))})",
            [account_key, *chunk],
        ):
            (mine if owner == conversation_id else foreign).add(index)
    if foreign:
        log.warning(
            "conversation %s: %d server message indexes belong to another conversation; not imported",
            conversation_id, len(foreign),
        )
    return mine, foreign


def _map_messages(
    conn: apsw.Connection, account_key: str, conversation_id: int, session_id: str,
    pulled: list[PulledMessage], stored: list[MessageV2],
) -> None:
    conn.executemany(
        "INSERT INTO sync_messages (message_id, session_id, account_key, conversation_id, server_index, server_id,"
        " digest, finished) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (m.id, session_id, account_key, conversation_id, p.server_index, p.server_id, p.digest, int(p.finished))
            for p, m in zip(pulled, stored, strict=True)
        ],
    )


def _append_branch(
    conn: apsw.Connection, account_key: str, conversation_id: int, session_id: str,
    fresh: list[PulledMessage], before: SessionV2,
) -> int:
    """Chain ``fresh`` (server order) under the local copy of the newest server message
    before them; the active branch follows only if it was the server's branch."""
    if not fresh:
        return 0
    anchor = conn.execute(
        "SELECT message_id FROM sync_messages WHERE account_key = ? AND conversation_id = ? AND server_index < ?"
        " ORDER BY server_index DESC LIMIT 1",
        (account_key, conversation_id, fresh[0].server_index),
    ).fetchone()
    parent: str | None = None if anchor is None else anchor[0]
    old_server_leaf = conn.execute(
        "SELECT message_id FROM sync_messages WHERE account_key = ? AND conversation_id = ?"
        " ORDER BY server_index DESC LIMIT 1",
        (account_key, conversation_id),
    ).fetchone()
    stored: list[MessageV2] = []
    for pulled in fresh:
        mid = new_id()
        stored.append(msgspec.structs.replace(pulled.message, id=mid, session_id=session_id, parent_id=parent))
        parent = mid
    message_table.insert_many(conn, stored)
    _map_messages(conn, account_key, conversation_id, session_id, fresh, stored)
    message_search.index(
        conn,
        [(m.id, session_id, m.role, searchable_text(m.text_content, m.parts)) for m in stored],
        fresh=True,
    )
    active = before.active_leaf_id
    follows_server = active is None or (old_server_leaf is not None and active == old_server_leaf[0])
    if follows_server:
        session_table.set_active_leaf(conn, session_id, stored[-1].id)
    return len(stored)


def _rewrite(
    conn: apsw.Connection, account_key: str, conversation_id: int, changed: list[PulledMessage], now: int
) -> tuple[int, int]:
    """Known server messages whose mapped content changed (a reply that finished later):
    (rewritten, kept edits). A message edited here (``edited_at``) is never overwritten:
    the server's version becomes a sibling of it, which the server index maps from now on
    (later changes on the server go there), and the edit stays where it is, local only."""
    count = kept = 0
    for p in changed:
        row = conn.execute(
            "SELECT x.message_id, x.digest, m.session_id, m.role, m.edited_at, m.parent_id FROM sync_messages x"
            " JOIN messages_v2 m ON m.id = x.message_id"
            " WHERE x.account_key = ? AND x.server_index = ? AND x.conversation_id = ?",
            (account_key, p.server_index, conversation_id),
        ).fetchone()
        if row is None or row[1] == p.digest:
            continue
        message_id, _, session_id, role, edited_at, parent_id = row
        m = p.message
        if edited_at is not None:
            sibling = msgspec.structs.replace(m, id=new_id(), session_id=session_id, parent_id=parent_id)
            message_table.insert_many(conn, [sibling])
            conn.execute(
                "UPDATE sync_messages SET message_id = ?, digest = ?, finished = ? WHERE message_id = ?",
                (sibling.id, p.digest, int(p.finished), message_id),
            )
            message_search.index(
                conn, [(sibling.id, session_id, sibling.role, searchable_text(m.text_content, m.parts))], fresh=True,
            )
            kept += 1
            continue
        conn.execute(
            "UPDATE messages_v2 SET text_content = ?, parts = ?,"
            " content_type = CASE WHEN ? IS NOT NULL THEN 'multipart' ELSE 'text' END,"
            " status = ?, error = ?, updated_at = max(updated_at, ?) WHERE id = ?",
            (m.text_content, to_json(m.parts) if m.parts else None, to_json(m.parts) if m.parts else None,
             m.status, m.error, now, message_id),
        )
        conn.execute(
            "UPDATE sync_messages SET digest = ?, finished = ? WHERE message_id = ?",
            (p.digest, int(p.finished), message_id),
        )
        conn.execute("DELETE FROM search_docs WHERE message_id = ?", (message_id,))
        message_search.index(conn, [(message_id, session_id, role, searchable_text(m.text_content, m.parts))],
                            fresh=True)
        count += 1
    return count, kept
