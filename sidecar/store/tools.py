"""ToolStore: the tables of the tool loop and approvals (migration 9).

Owns:
- ``tool_runs``: one row per assistant reply that went through the tool loop (provider,
  model, steps taken, state ``running`` | ``paused`` | ``done``), so a paused reply can be
  resumed after a restart with the model it started with;
- ``tool_calls``: one row per tool call of a reply, keyed (message_id, tool_call_id),
  with its approval/execution state:
  ``pending`` (waiting for the user) -> ``approved`` | ``denied`` | ``answered`` (decided)
  -> ``running`` (approved calls only) -> ``done``; any open state -> ``cancelled``;
- ``tool_policies`` (key -> auto | ask | deny), ``tool_audit`` (every decision: who,
  when, which call, which arguments; no foreign key, so it outlives its session) and
  ``mcp_servers`` (name -> JSON config).

Must stay true (the "Pending never runs" invariant rests on these):
- state changes are conditional updates (``transition`` names the states it leaves), so a
  call becomes ``running`` only from ``approved``, never from ``pending``;
- a decision, its audit row and a remembered policy are one transaction;
- pausing a reply writes its content, status ``paused`` and the run state together (the
  engine joins MessageRepo.pause and ``set_run`` in one transaction).

Synchronous and thread-safe (``db.Database``); async code calls it through
``AsyncStore.run`` (``s.tools``). Errors: StoreError / NotFound / InvalidParams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, get_args

import apsw
import msgspec

from protocol import limits
from protocol.events import ApprovalSource, ToolApprovalOption
from protocol.providers import ReasoningLevel
from protocol.tools import AuditActor, AuditDecision, ToolAuditEntry, ToolPolicy
from protocol.types import MessageV2, ToolResultPart
from sidecar.errors import InvalidParams, NotFound
from sidecar.store.db import Database, fetch_all
from sidecar.store.ids import now_ms
from sidecar.store.citations import CitationRows
from sidecar.store import message_table, recovery
from sidecar.store.rows import decode_parts, to_json
from sidecar.store.secrets import Sealer
from sidecar.secrets.box import SecretBox
from sidecar.secrets.mask import MASK, unmask_url

__all__ = ["ToolStore", "ToolRun", "ToolCallRecord", "OPEN_STATES", "DECIDED_STATES"]

OPEN_STATES = frozenset({"pending", "approved", "denied", "answered", "running"})
"""States of a call whose result is not in the message yet."""
DECIDED_STATES = frozenset({"approved", "denied", "answered"})
CALL_STATES = OPEN_STATES | {"done", "cancelled"}
POLICIES = frozenset({"auto", "ask", "deny"})
REASONING_LEVELS = frozenset(get_args(ReasoningLevel))


INTERRUPTED_NOTE = "cancelled: the sidecar stopped while this tool call was running; it may or may not have completed"
"""The result of a tool call that was running when the process died (crash recovery)."""

class ToolRun(msgspec.Struct, kw_only=True):
    message_id: str
    session_id: str
    provider_id: str
    model_id: str
    temperature: float | None = None
    steps: int = 0
    state: str = "running"
    updated_at: int = 0
    reasoning: ReasoningLevel | None = None
    """The reply's reasoning override (a per-send option), kept for its resumption."""


class ToolCallRecord(msgspec.Struct, kw_only=True):
    message_id: str
    tool_call_id: str
    session_id: str
    tool_name: str
    arguments: str
    source: ApprovalSource = "tool"
    policy_key: str | None = None
    options: list[ToolApprovalOption] | None = None
    state: str = "pending"
    answer: str | None = None
    option_id: str | None = None
    step: int = 0
    created_at: int = 0
    updated_at: int = 0


_CALL_COLUMNS = (
    "message_id, tool_call_id, session_id, tool_name, arguments, source, policy_key, options,"
    " state, answer, option_id, step, created_at, updated_at"
)
_RUN_COLUMNS = "message_id, session_id, provider_id, model_id, temperature, steps, state, updated_at, reasoning"
_AUDIT_COLUMNS = (
    "id, at, session_id, message_id, tool_call_id, tool_name, arguments, decision, actor, source,"
    " answer, note"
)
_options = msgspec.json.Decoder(list[ToolApprovalOption])


def _call(r: tuple[Any, ...]) -> ToolCallRecord:
    return ToolCallRecord(
        message_id=r[0],
        tool_call_id=r[1],
        session_id=r[2],
        tool_name=r[3],
        arguments=r[4],
        source=r[5],
        policy_key=r[6],
        options=_options.decode(r[7]) if r[7] else None,
        state=r[8],
        answer=r[9],
        option_id=r[10],
        step=r[11],
        created_at=r[12],
        updated_at=r[13],
    )


def _run(r: tuple[Any, ...]) -> ToolRun:
    return ToolRun(
        message_id=r[0],
        session_id=r[1],
        provider_id=r[2],
        model_id=r[3],
        temperature=r[4],
        steps=r[5],
        state=r[6],
        updated_at=r[7],
        reasoning=r[8] if r[8] in REASONING_LEVELS else None,  # a level this build does not know: the default
    )


def _audit(r: tuple[Any, ...]) -> ToolAuditEntry:
    return ToolAuditEntry(
        id=r[0],
        at=r[1],
        session_id=r[2],
        message_id=r[3],
        tool_call_id=r[4],
        tool_name=r[5],
        arguments=r[6],
        decision=r[7],
        actor=r[8],
        source=r[9],
        answer=r[10],
        note=r[11],
    )


class ToolStore:
    def __init__(self, db: Database, clock: Callable[[], int] = now_ms, sealer: Sealer | None = None) -> None:
        self._db = db
        self._clock = clock
        self._sealer = sealer if sealer is not None else Sealer(SecretBox(Path(db.path).parent, use_keychain=False))
        self.policy_version = 0
        """Bumped after every committed write of a policy (this process is the only writer;
        each such write is a transaction of its own): a reader that caches the policies reads
        the counter before it reads them and reads again once the counter moved."""

    # ---- runs -------------------------------------------------------------------------

    def begin_run(self, run: ToolRun) -> None:
        with self._db.write() as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO tool_runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.message_id, run.session_id, run.provider_id, run.model_id, run.temperature,
                 run.steps, run.state, self._clock(), run.reasoning),
            )

    def get_run(self, message_id: str) -> ToolRun | None:
        with self._db.read() as conn:
            rows = fetch_all(
                conn,
                f"SELECT {_RUN_COLUMNS} FROM tool_runs WHERE message_id = ?", (message_id,)
            )
        return _run(rows[0]) if rows else None

    def set_run(self, message_id: str, *, state: str | None = None, steps: int | None = None) -> None:
        with self._db.write() as conn:
            conn.execute(
                "UPDATE tool_runs SET state = coalesce(?, state), steps = coalesce(?, steps),"
                " updated_at = ? WHERE message_id = ?",
                (state, steps, self._clock(), message_id),
            )

    def runs(self, *, session_id: str | None = None, state: str) -> list[ToolRun]:
        sql = f"SELECT {_RUN_COLUMNS} FROM tool_runs WHERE state = ?"
        args: list[Any] = [state]
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        with self._db.read() as conn:
            return [_run(r) for r in fetch_all(conn, sql + " ORDER BY updated_at", args)]

    # ---- calls ------------------------------------------------------------------------

    def add_calls(self, calls: Iterable[ToolCallRecord], audit: Iterable[ToolAuditEntry] = ()) -> None:
        """Insert calls (an existing (message, call id) keeps its row) and audit rows."""
        with self._db.write() as conn:
            now = self._clock()
            conn.executemany(
                f"INSERT OR IGNORE INTO tool_calls ({_CALL_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (c.message_id, c.tool_call_id, c.session_id, c.tool_name, c.arguments, c.source,
                     c.policy_key, to_json(c.options), c.state, c.answer, c.option_id, c.step,
                     c.created_at or now, now)
                    for c in calls
                ],
            )
            self._insert_audit(conn, audit, now)

    def calls(self, message_id: str) -> list[ToolCallRecord]:
        with self._db.read() as conn:
            return [
                _call(r)
                for r in fetch_all(
                    conn,
                    f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE message_id = ? ORDER BY rowid",
                    (message_id,),
                )
            ]

    def get_call(self, message_id: str, tool_call_id: str) -> ToolCallRecord | None:
        with self._db.read() as conn:
            rows = fetch_all(
                conn,
                f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE message_id = ? AND tool_call_id = ?",
                (message_id, tool_call_id),
            )
        return _call(rows[0]) if rows else None

    def transition(
        self,
        message_id: str,
        tool_call_id: str,
        *,
        from_states: frozenset[str] | set[str],
        to_state: str,
        audit: ToolAuditEntry | None = None,
    ) -> bool:
        """Move a call to ``to_state`` if it is in one of ``from_states``; False otherwise."""
        if to_state not in CALL_STATES:
            raise InvalidParams(f"unknown tool call state {to_state!r}")
        marks = ", ".join("?" * len(from_states))
        with self._db.write() as conn:
            now = self._clock()
            conn.execute(
                f"UPDATE tool_calls SET state = ?, updated_at = ?"
                f" WHERE message_id = ? AND tool_call_id = ? AND state IN ({marks})",
                (to_state, now, message_id, tool_call_id, *sorted(from_states)),
            )
            if conn.changes() == 0:
                return False
            if audit is not None:
                self._insert_audit(conn, [audit], now)
            return True

    def find_pending(
        self, session_id: str, tool_call_id: str, message_id: str | None = None
    ) -> list[ToolCallRecord]:
        """Calls with this id in the session (pending ones first, newest first)."""
        sql = f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE session_id = ? AND tool_call_id = ?"
        args: list[Any] = [session_id, tool_call_id]
        if message_id is not None:
            sql += " AND message_id = ?"
            args.append(message_id)
        sql += " ORDER BY state = 'pending' DESC, created_at DESC"
        with self._db.read() as conn:
            return [_call(r) for r in fetch_all(conn, sql, args)]

    def decide(
        self,
        call: ToolCallRecord,
        *,
        state: str,
        answer: str | None,
        option_id: str | None,
        audit: list[ToolAuditEntry],
        remember: tuple[str, str] | None = None,
    ) -> int | None:
        """pending -> ``state`` with its audit rows and a remembered policy, in one transaction.

        Returns how many calls of the same message are still pending, or None when the call
        was no longer pending (somebody else decided or cancelled it first)."""
        with self._db.write() as conn:
            now = self._clock()
            conn.execute(
                "UPDATE tool_calls SET state = ?, answer = ?, option_id = ?, updated_at = ?"
                " WHERE message_id = ? AND tool_call_id = ? AND state = 'pending'",
                (state, answer, option_id, now, call.message_id, call.tool_call_id),
            )
            if conn.changes() == 0:
                return None
            self._insert_audit(conn, audit, now)
            if remember is not None:
                self._put_policy(conn, remember[0], remember[1], now)
            pending = int(
                fetch_all(
                    conn,
                    "SELECT count(*) FROM tool_calls WHERE message_id = ? AND state = 'pending'",
                    (call.message_id,),
                )[0][0]
            )
        if remember is not None:
            self.policy_version += 1  # once committed (see set_policy)
        return pending

    def list_open(
        self, *, session_id: str | None = None, states: Iterable[str] = ("pending",)
    ) -> list[ToolCallRecord]:
        wanted = sorted(set(states))
        sql = f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE state IN ({', '.join('?' * len(wanted))})"
        args: list[Any] = list(wanted)
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        with self._db.read() as conn:
            return [_call(r) for r in fetch_all(conn, sql + " ORDER BY created_at", args)]

    # ---- the reply row while paused -----------------------------------------------------
    # (pausing: MessageRepo.pause and set_run(state="paused") in one Store.transaction)

    def reopen_message(self, message_id: str) -> MessageV2 | None:
        """paused -> streaming (a resumed reply); None when it is no longer paused."""
        with self._db.write() as conn:
            now = self._clock()
            conn.execute(
                "UPDATE messages_v2 SET status = 'streaming', updated_at = ?"
                " WHERE id = ? AND status = 'paused'",
                (now, message_id),
            )
            if conn.changes() == 0:
                return None
            conn.execute(
                "UPDATE tool_runs SET state = 'running', updated_at = ? WHERE message_id = ?",
                (now, message_id),
            )
            return CitationRows.attach(conn, [message_table.get(conn, message_id)])[0]

    def complete_interrupted(self, note: str = INTERRUPTED_NOTE) -> list[str]:
        """Runs left ``running`` by a dead process: every open call of them gets an error
        result ``note`` in its message (if it has none yet) and becomes ``cancelled``; ACP
        requests left pending are cancelled too. Returns the message ids touched."""
        touched: list[str] = []
        with self._db.write() as conn:
            now = self._clock()
            runs = fetch_all(
                conn,
                "SELECT r.message_id, m.status FROM tool_runs r JOIN messages_v2 m ON m.id = r.message_id"
                f" WHERE r.{recovery.RUNNING_TOOL_RUN}"
            )
            for message_id, status in runs:
                if status in ("pending", "streaming"):
                    continue  # live in this process (never at start-up)
                open_calls = [
                    _call(r)
                    for r in fetch_all(
                        conn,
                        f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE message_id = ?"
                        " AND state IN ('pending', 'approved', 'denied', 'answered', 'running')",
                        (message_id,),
                    )
                ]
                if open_calls:
                    self._append_results(conn, message_id, open_calls, note, now)
                    self._insert_audit(
                        conn,
                        [_system_audit(c, "cancelled", note) for c in open_calls],
                        now,
                    )
                conn.execute(
                    "UPDATE tool_calls SET state = 'cancelled', updated_at = ? WHERE message_id = ?"
                    " AND state IN ('pending', 'approved', 'denied', 'answered', 'running')",
                    (now, message_id),
                )
                conn.execute(
                    "UPDATE tool_runs SET state = 'done', updated_at = ? WHERE message_id = ?",
                    (now, message_id),
                )
                touched.append(message_id)
            stale = [
                _call(r)
                for r in fetch_all(
                    conn,
                    f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE source != 'tool'"
                    " AND state IN ('pending', 'approved', 'denied', 'answered', 'running')"
                )
            ]
            if stale:
                self._insert_audit(conn, [_system_audit(c, "cancelled", note) for c in stale], now)
                conn.execute(
                    "UPDATE tool_calls SET state = 'cancelled', updated_at = ? WHERE source != 'tool'"
                    " AND state IN ('pending', 'approved', 'denied', 'answered', 'running')",
                    (now,),
                )
        return touched

    def _append_results(
        self, conn: apsw.Connection, message_id: str, calls: list[ToolCallRecord], note: str, now: int
    ) -> None:
        rows = fetch_all(conn, "SELECT parts FROM messages_v2 WHERE id = ?", (message_id,))
        if not rows:
            return
        parts = list(decode_parts(rows[0][0], message_id) or [])
        answered = {p.tool_use_id for p in parts if isinstance(p, ToolResultPart)}
        added = [
            ToolResultPart(tool_use_id=c.tool_call_id, content=note, is_error=True)
            for c in calls
            if c.tool_call_id not in answered
        ]
        if not added:
            return
        conn.execute(
            "UPDATE messages_v2 SET parts = ?, content_type = 'multipart', updated_at = ? WHERE id = ?",
            (to_json(parts + added), now, message_id),
        )

    # ---- policies ---------------------------------------------------------------------

    def policies(self, keys: Iterable[str] | None = None) -> dict[str, ToolPolicy]:
        with self._db.read() as conn:
            if keys is None:
                rows = fetch_all(conn, "SELECT key, policy, updated_at FROM tool_policies ORDER BY key")
            else:
                wanted = list(dict.fromkeys(keys))
                if not wanted:
                    return {}
                rows = fetch_all(
                    conn,
                    f"SELECT key, policy, updated_at FROM tool_policies WHERE key IN ({', '.join('?' * len(wanted))})",
                    wanted,
                )
        return {r[0]: ToolPolicy(key=r[0], policy=r[1], updated_at=r[2]) for r in rows}

    def set_policy(self, key: str, policy: str | None) -> None:
        if not isinstance(key, str) or not key.strip() or len(key) > 512:
            raise InvalidParams("key must be a tool name or mcp:<server> (1..512 characters)")
        with self._db.write() as conn:
            if policy is None:
                conn.execute("DELETE FROM tool_policies WHERE key = ?", (key,))
            else:
                self._put_policy(conn, key, policy, self._clock())
        self.policy_version += 1  # once committed: a reader that sees it reads the new rows

    def _put_policy(self, conn: apsw.Connection, key: str, policy: str, now: int) -> None:
        if policy not in POLICIES:
            raise InvalidParams(f"policy must be one of auto, ask, deny, got {policy!r}")
        conn.execute(
            "INSERT INTO tool_policies(key, policy, updated_at) VALUES (?, ?, ?)"
            " ON CONFLICT(key) DO UPDATE SET policy = excluded.policy, updated_at = excluded.updated_at",
            (key, policy, now),
        )

    # ---- audit ------------------------------------------------------------------------

    def add_audit(self, entries: Iterable[ToolAuditEntry]) -> None:
        with self._db.write() as conn:
            self._insert_audit(conn, entries, self._clock())

    def list_audit(
        self,
        *,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[ToolAuditEntry]:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= limits.MAX_AUDIT_PAGE:
            raise InvalidParams(f"limit must be between 1 and {limits.MAX_AUDIT_PAGE}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= limits.MAX_OFFSET:
            raise InvalidParams(f"offset must be between 0 and {limits.MAX_OFFSET}")
        sql = f"SELECT {_AUDIT_COLUMNS} FROM tool_audit"
        where: list[str] = []
        args: list[Any] = []
        if session_id is not None:
            where.append("session_id = ?")
            args.append(session_id)
        if tool_call_id is not None:
            where.append("tool_call_id = ?")
            args.append(tool_call_id)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ? OFFSET ?"
        with self._db.read() as conn:
            return [_audit(r) for r in fetch_all(conn, sql, [*args, limit, offset])]

    def _insert_audit(self, conn: apsw.Connection, entries: Iterable[ToolAuditEntry], now: int) -> None:
        conn.executemany(
            "INSERT INTO tool_audit(at, session_id, message_id, tool_call_id, tool_name, arguments,"
            " decision, actor, source, answer, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (e.at or now, e.session_id, e.message_id, e.tool_call_id, e.tool_name, e.arguments,
                 e.decision, e.actor, e.source, e.answer, e.note)
                for e in entries
            ],
        )

    # ---- MCP server configs -------------------------------------------------------------

    def mcp_servers(self) -> list[tuple[str, str]]:
        """(name, config JSON) with the secrets opened; a value that cannot be opened (sealed
        with a key this process was not given) is left out of the config."""
        with self._db.read() as conn:
            rows = fetch_all(conn, "SELECT name, config FROM mcp_servers ORDER BY name")
        return [(name, self._sealer.open_mcp_config(config, name)[0]) for name, config in rows]

    def put_mcp_server(self, name: str, config: str) -> str:
        """Store ``config`` (JSON) with its secrets sealed (every env and header value, the
        URL's userinfo and query values); returns it as ``mcp_servers()`` will (opened). A
        masked URL part sent back (``***``, as ``mcp:server:list`` shows it) keeps the
        stored part."""
        with self._db.write() as conn:
            row = conn.execute("SELECT config FROM mcp_servers WHERE name = ?", (name,)).fetchone()
            if row is not None:
                config = _keep_masked_url(config, str(row[0]))
            sealed = self._sealer.seal_mcp_config(config)
            now = self._clock()
            conn.execute(
                "INSERT INTO mcp_servers(name, config, created_at, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET config = excluded.config, updated_at = excluded.updated_at",
                (name, sealed, now, now),
            )
        return self._sealer.open_mcp_config(sealed, name)[0]

    def delete_mcp_server(self, name: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM mcp_servers WHERE name = ?", (name,))
            if conn.changes() == 0:
                raise NotFound(f"no MCP server named {name!r}")


def _keep_masked_url(config: str, stored: str) -> str:
    """``config`` with the masked parts of its ``url`` replaced by the stored ones."""
    new, old = msgspec.json.decode(config), msgspec.json.decode(stored)
    if not (isinstance(new, dict) and isinstance(old, dict)):
        return config
    url, stored_url = new.get("url"), old.get("url")
    if not isinstance(url, str) or not isinstance(stored_url, str) or MASK not in url:
        return config
    new["url"] = unmask_url(url, stored_url)
    return msgspec.json.encode(new).decode()


def audit_entry(call: ToolCallRecord, decision: AuditDecision, actor: AuditActor, **extra: Any) -> ToolAuditEntry:
    """An audit row about ``call`` (``at`` 0 = the time of the write)."""
    return ToolAuditEntry(
        id=0,
        at=0,
        session_id=call.session_id,
        message_id=call.message_id,
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        arguments=call.arguments,
        decision=decision,
        actor=actor,
        source=call.source,
        **extra,
    )


def _system_audit(call: ToolCallRecord, decision: AuditDecision, note: str) -> ToolAuditEntry:
    return audit_entry(call, decision, "system", note=note)
