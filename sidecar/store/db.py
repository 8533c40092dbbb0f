"""The SQLite database file: connections, pragmas and transactions (apsw).

Owns: opening ``chat.db`` in the data dir (created 0600 first, so SQLite's own -wal and
-shm files are 0600 too: sidecar/datadir.py), the per-connection pragmas, and the two ways to
touch it: ``write()`` (the one writer connection, under a lock, in ``BEGIN IMMEDIATE``) and
``read()`` (a small pool of reader connections, each read in its own snapshot).

Thread-safety: every method may be called from any thread. Writes are serialized by a
lock around the single writer connection, so two writers never wait on SQLite's busy
handler inside the process; readers each take a connection of their own from a pool, so
in WAL mode a search or a list never waits for a streaming write and vice versa. A
connection is only ever used by one thread at a time.

The read lane (``read_lane()``, entered by the store gateway's ``read``): while a thread is
in it, its reads take connections from a pool of their own (one per thread the lane runs
at once, opened on first use and kept), never the shared pool other callers may hold, and
any attempt to write (``write``, ``pragma``, ``checkpoint``) raises ``ReadLaneWrite``
before it touches the write lock. So a read-lane call waits for nothing but SQLite itself.

Must stay true: a write either commits whole or leaves the database unchanged (any
exception inside ``write()`` rolls back); apsw errors leave this module as ``StoreError``
whose code says whose problem it is (``_store_error``, the one mapping):

    FOREIGN KEY constraint failed        NOT_FOUND       a row the request refers to is gone
                                                         (deleted meanwhile, e.g. the session)
    UNIQUE / PRIMARY KEY constraint      BAD_STATE       the row already exists
    other constraints (NOT NULL, CHECK)  INVALID_PARAMS  SQLite refused a value
    a value too big, a pattern or an     INVALID_PARAMS  the input, not the database
    expression too complex, an integer
    outside int64 (OverflowError)
    anything else (I/O, disk full,       STORE_ERROR     the database failed
    corrupt, locked, read-only...)
    the store is already closed          BUSY            the process is shutting down
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import apsw

from protocol.errors import ErrorCode
from sidecar import datadir
from sidecar.errors import InvalidParams, SidecarError, StoreError
from sidecar.logging_setup import EarlyLogger
from sidecar.store import bm25

__all__ = [
    "Database", "DB_FILENAME", "BUSY_TIMEOUT_MS", "ReadLaneWrite", "Row", "TransactionLost", "fetch_all", "fetch_iter",
    "read_lane",
]

log = EarlyLogger(__name__)

DB_FILENAME = "chat.db"
BUSY_TIMEOUT_MS = 5000


def _configure(conn: apsw.Connection) -> None:
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA temp_store = MEMORY")
    # deleted and rewritten content is zeroed, not left in free space: a deleted session
    # or a re-sealed secret must not stay readable in the file
    conn.execute("PRAGMA secure_delete = ON")
    # SQLite passes the integers the query gives (the cast states that bm25's own
    # signature is narrower than the generic callback's)
    conn.register_fts5_function(bm25.BM25_FUNCTION, cast("apsw.FTS5Function", bm25.bm25))


Row = tuple[Any, ...]
"""One result row. A value's type is decided by the column the query selects, which only
the repository knows: rows are Any-typed so each repository states what it maps them to."""

Bindings = Sequence[Any] | Mapping[str, Any]

_lane = threading.local()


class TransactionLost(StoreError):
    """A failure inside a savepoint took the whole transaction with it: nothing of it stands."""


class ReadLaneWrite(RuntimeError):
    """A call in the read lane tried to write: a bug of the caller (it belongs in ``run``)."""


@contextmanager
def read_lane() -> Iterator[None]:
    """This thread's database calls are read-lane reads until the block ends."""
    outer = getattr(_lane, "active", False)
    _lane.active = True
    try:
        yield
    finally:
        _lane.active = outer


def _in_read_lane() -> bool:
    return bool(getattr(_lane, "active", False))


def _refuse_in_read_lane(what: str) -> None:
    if _in_read_lane():
        raise ReadLaneWrite(f"{what} in the read lane: a call that writes goes through the gateway's run")


def fetch_all(conn: apsw.Connection, sql: str, args: Bindings = ()) -> list[Row]:
    """Every row of ``sql``."""
    return conn.execute(sql, args).fetchall()


def fetch_iter(conn: apsw.Connection, sql: str, args: Bindings = ()) -> Iterator[Row]:
    """The rows of ``sql`` one at a time (the statement stays open while iterated)."""
    return conn.execute(sql, args)


class Database:
    """One database file; a writer connection plus up to ``readers`` reader connections."""

    def __init__(self, path: datadir.StrPath, *, readers: int = 2) -> None:
        self.path = os.fspath(path)
        try:
            # made 0600 before SQLite sees it: its -wal/-shm/-journal files copy this mode
            datadir.create_db_file(self.path)
            self._writer = apsw.Connection(self.path)
            _configure(self._writer)
            mode = self._writer.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
        except (apsw.Error, OSError) as exc:
            raise StoreError(f"cannot open the database {self.path}: {exc}") from exc
        if mode != "wal":
            log.warning("database %s is in journal mode %s, not WAL", self.path, mode)
        self._write_lock = threading.RLock()
        # idle reader connections; a deque's appends and pops are thread-safe
        self._readers: deque[apsw.Connection] = deque()
        self._reader_slots = threading.BoundedSemaphore(readers)
        self._lane_readers: deque[apsw.Connection] = deque()
        self._all_readers: list[apsw.Connection] = []
        self._pool_lock = threading.Lock()
        self._closed = False

    @property
    def writer(self) -> apsw.Connection:
        """The writer connection, for code that already holds ``write()`` (migrations)."""
        return self._writer

    @contextmanager
    def write(self) -> Iterator[apsw.Connection]:
        """One write transaction on the writer connection (re-entrant: nested = same txn)."""
        _refuse_in_read_lane("a write")
        with self._write_lock:
            self._check_open()
            conn = self._writer
            if not conn.in_transaction:
                with _wrap_errors():
                    conn.execute("BEGIN IMMEDIATE")
                try:
                    with _wrap_errors():
                        yield conn
                except BaseException:
                    self._rollback(conn)
                    raise
                else:
                    try:
                        with _wrap_errors():
                            conn.execute("COMMIT")
                    except BaseException:
                        self._rollback(conn)
                        raise
            else:
                with _wrap_errors():
                    yield conn

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the open write transaction that fails alone: an exception inside rolls
        back what the block wrote (and propagates), the rest of the transaction stands;
        ``TransactionLost`` when the failure ended the whole transaction instead."""
        with self.write() as conn:
            with _wrap_errors():
                conn.execute("SAVEPOINT part")
            try:
                yield
            except BaseException as exc:
                if not conn.in_transaction:  # SQLite rolled all of it back (disk full, I/O error)
                    raise TransactionLost(f"database error: the transaction was rolled back ({exc})") from exc
                conn.execute("ROLLBACK TO part; RELEASE part")
                raise
            with _wrap_errors():
                conn.execute("RELEASE part")

    def pragma(self, name: str) -> Any:
        """One pragma's value read on the writer connection outside any transaction (a
        shared lock for the one statement, no write lock: cheap when nothing is to change)."""
        _refuse_in_read_lane("a pragma on the writer")
        with self._write_lock:
            self._check_open()
            with _wrap_errors():
                return self._writer.execute(f"PRAGMA {name}").fetchall()[0][0]

    def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate it, so no page image older
        than the database's current content stays on disk."""
        _refuse_in_read_lane("a checkpoint")
        with self._write_lock:
            self._check_open()
            with _wrap_errors():
                busy = self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0]
        if busy:
            log.warning("the WAL checkpoint of %s was partial (a reader was busy)", self.path)

    @contextmanager
    def read(self) -> Iterator[apsw.Connection]:
        """A reader connection inside one read transaction (a consistent snapshot)."""
        self._check_open()
        conn = self._acquire_reader()
        try:
            with _wrap_errors():
                conn.execute("BEGIN")
            try:
                with _wrap_errors():
                    yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        finally:
            self._release_reader(conn)

    def close(self) -> None:
        """Close every connection (idempotent). Callers must have finished their work."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._writer.execute("PRAGMA optimize")
            except apsw.Error as exc:  # closing must not fail because of an advisory pragma
                log.warning("PRAGMA optimize failed: %s", exc)
            with self._pool_lock:
                for conn in self._all_readers:
                    conn.close()
                self._all_readers.clear()
            self._writer.close()

    # ---- internals ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:  # only while the process shuts down: the database did not fail
            raise StoreError("the store is closed (shutting down)", code=ErrorCode.BUSY)

    def _rollback(self, conn: apsw.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except apsw.Error as exc:
                log.error("ROLLBACK failed: %s", exc)

    def _acquire_reader(self) -> apsw.Connection:
        if _in_read_lane():
            # the lane's own pool: bounded by the threads the gateway lets into the lane
            try:
                return self._lane_readers.popleft()
            except IndexError:
                return self._open_reader()
        self._reader_slots.acquire()
        try:
            return self._readers.popleft()
        except IndexError:
            pass
        try:
            return self._open_reader()
        except BaseException:
            self._reader_slots.release()
            raise

    def _open_reader(self) -> apsw.Connection:
        with _wrap_errors():
            conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READONLY)
            _configure(conn)
        with self._pool_lock:
            if self._closed:  # closed while this one opened: it must not outlive close()
                conn.close()
                raise StoreError("the store is closed (shutting down)", code=ErrorCode.BUSY)
            self._all_readers.append(conn)
        return conn

    def _release_reader(self, conn: apsw.Connection) -> None:
        if _in_read_lane():
            self._lane_readers.append(conn)
            return
        self._readers.append(conn)
        self._reader_slots.release()


@contextmanager
def _wrap_errors() -> Iterator[None]:
    try:
        yield
    except SidecarError:
        raise
    except apsw.Error as exc:
        raise _store_error(exc) from exc
    except OverflowError as exc:  # apsw binding a Python int outside SQLite's 64 bits
        raise InvalidParams(f"invalid params: an integer is out of range (64-bit signed): {exc}") from exc


_FOREIGN_KEY = 787  # SQLITE_CONSTRAINT_FOREIGNKEY
_UNIQUE = (1555, 2067)  # SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE
_INPUT_TOO_COMPLEX = (
    "LIKE or GLOB pattern too complex",
    "too many SQL variables",
    "Expression tree is too large",
    "parser stack overflow",
    "too many terms",
    "string or blob too big",
)


def _store_error(exc: apsw.Error) -> StoreError:
    """The StoreError (and its code) for one SQLite error; see the module docstring."""
    text = str(exc)
    if isinstance(exc, apsw.ConstraintError):
        extended = getattr(exc, "extendedresult", None)
        if extended == _FOREIGN_KEY or "FOREIGN KEY" in text:
            return StoreError(
                "not found: a row this request refers to no longer exists (it was deleted meanwhile)",
                code=ErrorCode.NOT_FOUND,
            )
        if extended in _UNIQUE or "UNIQUE" in text:
            return StoreError(f"already exists: {text}", code=ErrorCode.BAD_STATE)
        log.warning("constraint failed: %s", text)
        return StoreError(f"invalid params: the database refused a value ({text})", code=ErrorCode.INVALID_PARAMS)
    if isinstance(exc, apsw.TooBigError) or (
        isinstance(exc, apsw.SQLError) and any(marker in text for marker in _INPUT_TOO_COMPLEX)
    ):
        return StoreError(f"invalid params: the database refused the input ({text})", code=ErrorCode.INVALID_PARAMS)
    return StoreError(f"database error: {text}")

