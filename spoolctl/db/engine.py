"""Engine factory: WAL, busy timeout, foreign keys, and BEGIN IMMEDIATE.

Every write transaction is opened with a raw `BEGIN IMMEDIATE` from a
connection event hook (the pysqlite recipe: the driver's own transaction
handling is disabled on connect, our BEGIN is emitted on begin). Taking the
write lock when the transaction opens, not when it first writes, is what makes
concurrent claimants queue up instead of racing to upgrade a read lock.
Read-only engines open plain deferred transactions and never take the lock.

Every transaction also re-reads the schema revision under its own lock, so a
worker of an older or newer spoolctl stops with a clear error at its next
transaction instead of writing into a schema it does not know.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, unquote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError

from spoolctl.errors import DiskFull, Locked, SpoolError, StorageFault, Unreachable

Synchronous = Literal["OFF", "NORMAL", "FULL"]
READ_ONLY_OPTION = "spoolctl_read_only"
"""Connection execution option: the begin hook opens a deferred transaction."""
LOCK_WAIT_OPTION = "spoolctl_lock_wait_s"
"""Connection execution option: wait at most this long for the write lock
(a worker waits in short slices so that it keeps running its loop)."""
SPOOL_DIR_MODE = 0o700
DB_FILE_MODE = 0o600


class RevisionMismatch(SpoolError):
    """Raised from the begin hook; revision.py turns it into the public error."""


def ensure_spool(db_path: Path) -> None:
    """Create the spool folder (0700) and an empty database file (0600) if missing."""
    folder = db_path.parent
    try:
        if not folder.exists():
            folder.mkdir(mode=SPOOL_DIR_MODE, parents=True, exist_ok=True)
        if not db_path.exists():
            fd = os.open(db_path, os.O_CREAT | os.O_WRONLY, DB_FILE_MODE)
            os.close(fd)
    except OSError as exc:
        raise StorageFault(
            f"cannot create the queue at {db_path}: {exc.strerror or exc}",
            reason=CREATE_FAULTS.get(exc.errno or 0, "not_creatable"),
            path=str(db_path),
        ) from None


CREATE_FAULTS = {errno.EROFS: "read_only", errno.EACCES: "unreadable", errno.EPERM: "unreadable"}
"""Why a queue could not be created -> its DB_UNUSABLE reason."""


def make_engine(
    db_path: Path,
    *,
    write: bool,
    busy_timeout_s: float,
    synchronous: Synchronous = "NORMAL",
    expected_revision: str | None = None,
    foreign_keys: bool = True,
) -> Engine:
    """An engine on one queue file.

    write: transactions open with BEGIN IMMEDIATE (else plain deferred BEGIN).
    expected_revision: when set, every transaction checks alembic_version.
    foreign_keys: False only for schema migrations, which rebuild referenced
    tables (SQLite ignores this pragma inside a transaction, so it is set on
    connect) and must run `PRAGMA foreign_key_check` before committing.
    """
    # mode=rw: SQLite never creates the file behind our back (a pool connection
    # opened after the queue was deleted would otherwise start an empty one);
    # ensure_spool() creates it, with its permissions, when a verb may.
    engine = create_engine(
        f"sqlite:///file:{quote(str(db_path))}?mode=rw&uri=true",
        connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if write and expected_revision is not None and revision_of(cur) == expected_revision:
            # Only a queue already at the code's revision is switched to WAL:
            # a file that will be refused (foreign, legacy, newer) is not
            # changed by opening it. migrate_file() switches a file it created
            # or adopted once the change is committed.
            cur.execute("PRAGMA journal_mode=WAL")
        if write:
            # BEGIN IMMEDIATE waits in begin_immediate(), not in SQLite's busy
            # handler, whose sleeps start at 1 ms and grow to 100 ms.
            cur.execute("PRAGMA busy_timeout=0")
        cur.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if write and not options.get(READ_ONLY_OPTION, False):
            wait_s = min(busy_timeout_s, options.get(LOCK_WAIT_OPTION, busy_timeout_s))
            begin_immediate(conn.connection.driver_connection, wait_s)
        else:
            conn.exec_driver_sql("BEGIN")
        if expected_revision is not None:
            _check_revision(conn, expected_revision)

    return engine


def revision_of(cursor: sqlite3.Cursor) -> str | None:
    """The file's alembic revision, None when it has none (or is no database)."""
    try:
        row = cursor.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.DatabaseError:
        return None
    return None if row is None else str(row[0])


def switch_to_wal(engine: Engine, timeout_s: float) -> None:
    """Put the file in WAL mode (persistent in its header), waiting up to
    timeout_s while another connection keeps it busy."""
    deadline = time.monotonic() + timeout_s
    with translate_errors(engine), engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        while True:
            try:
                raw.execute("PRAGMA journal_mode=WAL").fetchall()
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(BUSY_MAX_SLEEP_S)


def peek_uri(db_path: Path) -> str:
    """The `file:` URI of a read that leaves no trace (see make_peek_engine)."""
    side = [db_path.with_name(db_path.name + suffix).exists() for suffix in ("-wal", "-shm")]
    options = "mode=ro" if all(side) else "mode=ro&immutable=1"
    return f"file:{quote(str(db_path))}?{options}"


def make_peek_engine(db_path: Path, busy_timeout_s: float) -> Engine:
    """A read-only engine that creates, changes and removes no file.

    Without a `-wal` and `-shm` beside it the file is opened immutable: SQLite
    takes no lock and makes no `-shm`/`-wal` even for a WAL-mode file, so a
    file that is then refused is left exactly as it was found. With both
    present (a queue in use) it is opened read-only, which sees committed WAL
    content and, unlike a read-write connection, never checkpoints on close.
    (An immutable read takes no lock: it could see a torn page of a file being
    written in rollback-journal mode, which only `migrate` does, on a file it
    creates or adopts, before switching it to WAL.)
    """
    engine = create_engine(
        f"sqlite:///{peek_uri(db_path)}&uri=true",
        connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        # It commits nothing; NORMAL like every other read engine's connections.
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


BUSY_FIRST_SLEEP_S = 0.0001
BUSY_MAX_SLEEP_S = 0.002


def begin_immediate(raw: Any, timeout_s: float) -> None:
    """Take SQLite's write lock, waiting up to timeout_s for it.

    Retries with sleeps from 0.1 ms doubling to 2 ms: transactions here last
    well under a millisecond, so a waiting claimant gets the lock about as soon
    as it is free instead of after SQLite's coarse busy-handler sleeps (which
    made two workers slower than one). Raises sqlite3's busy error on timeout.
    """
    deadline = time.monotonic() + timeout_s
    sleep_s = BUSY_FIRST_SLEEP_S
    while True:
        try:
            raw.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            left = deadline - time.monotonic()
            if not is_busy(exc) or left <= 0:
                raise
            time.sleep(min(sleep_s, left))
            sleep_s = min(sleep_s * 2, BUSY_MAX_SLEEP_S)


def _check_revision(conn: Connection, expected: str) -> None:
    raw: Any = conn.connection.driver_connection
    cursor = raw.cursor()
    try:
        found = revision_of(cursor)
    finally:
        cursor.close()
    if found != expected:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise RevisionMismatch(
            f"schema revision changed underneath: expected {expected}, found {found}",
            expected=expected,
            found=found,
        )


def is_postgres_engine(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def db_path_of(engine: Engine) -> str:
    """The queue file an engine opens (its URL is a `file:` URI with options);
    for PostgreSQL, the URL with its password masked."""
    if is_postgres_engine(engine):
        from spoolctl.db.backends.postgresql import display_of

        return display_of(engine)
    database = engine.url.database or ""
    return unquote(database.removeprefix("file:"))


def is_busy(exc: BaseException) -> bool:
    """True when SQLite gave up waiting for a lock."""
    text = str(getattr(exc, "orig", exc)).lower()
    return "database is locked" in text or "database is busy" in text or "locked" in text


@contextmanager
def write_tx(engine: Engine, lock_wait_s: float | None = None) -> Iterator[Connection]:
    """One BEGIN IMMEDIATE transaction; a busy timeout becomes `Locked`.
    lock_wait_s: wait at most that long for the lock (never beyond the
    engine's busy timeout)."""
    if lock_wait_s is None:
        with translate_errors(engine), engine.begin() as conn:
            yield conn
        return
    with translate_errors(engine), engine.connect() as conn, _begin_waiting(conn, lock_wait_s):
        yield conn


@contextmanager
def _begin_waiting(conn: Connection, lock_wait_s: float) -> Iterator[Connection]:
    """A write transaction on conn whose lock wait is at most lock_wait_s."""
    conn.execution_options(**{LOCK_WAIT_OPTION: lock_wait_s})
    with conn.begin():
        yield conn


class HeldConnection:
    """One connection a long-lived process keeps for its hot path's write
    transactions, instead of a pool checkout and return around each (about a
    tenth of a worker's cost per job). A transaction that raises drops the
    connection, so one in doubt (a PostgreSQL session cut mid-way) is never
    used again; the next transaction opens a fresh one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._conn: Connection | None = None

    @contextmanager
    def write_tx(self, lock_wait_s: float) -> Iterator[Connection]:
        """Like `write_tx(engine, lock_wait_s)`, on the held connection."""
        with translate_errors(self.engine):
            conn = self._conn
            if conn is None:
                conn = self._conn = self.engine.connect()
            try:
                with _begin_waiting(conn, lock_wait_s):
                    yield conn
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):  # already broken: nothing to keep
                conn.close()


def write_quietly(
    engine: Engine, fn: Callable[[Connection], object], lock_wait_s: float | None = None
) -> bool:
    """Run fn in a write transaction; False (nothing written) if the lock
    stayed busy beyond the timeout, the disk is full or the server did not
    answer: for work that is retried later anyway."""
    try:
        with write_tx(engine, lock_wait_s) as conn:
            fn(conn)
    except (Locked, Unreachable, DiskFull):
        return False
    return True


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """One consistent read snapshot: a deferred BEGIN, so no write lock is
    taken even on a write engine (a worker's reads never block claims)."""
    with translate_errors(engine), engine.connect() as conn:
        conn.execution_options(**{READ_ONLY_OPTION: True})
        with conn.begin():
            yield conn


STORAGE_FAULTS = (
    ("unable to open database file", "unreadable",
     "check that the file and its folder exist and that this user may read and write them"),
    ("file is not a database", "damaged", "the file is damaged or not an SQLite database"),
    ("malformed", "damaged", "the file is damaged: restore the queue from a backup"),
    ("readonly database", "read_only",
     "the database file or its folder is read-only for this user"),
    ("disk i/o error", "unusable", "the disk failed or the file was removed underneath"),
    ("database or disk is full", "disk_full", "free space on the disk holding the spool folder"),
    ("no such table", "not_a_queue",
     "the file is not a spoolctl queue (or was replaced underneath)"),
)  # fmt: skip
"""SQLite's words for a file it cannot use -> (DB_UNUSABLE reason, what to check)."""


def storage_fault(text: str) -> tuple[str, str | None]:
    """The DB_UNUSABLE reason and hint for one of SQLite's error texts."""
    lowered = text.lower()
    for words, reason, hint in STORAGE_FAULTS:
        if words in lowered:
            return reason, hint
    return "unusable", None


@contextmanager
def translate_errors(engine: Engine) -> Iterator[None]:
    """Busy beyond the timeout becomes `Locked` (exit 4); a file SQLite cannot
    use becomes `StorageFault` (DB_UNUSABLE, exit 3) with its reason and what
    to check; integrity
    violations (bugs) pass through as they are. Errors of statements run on the
    driver directly (`prepared.py`) are treated the same way."""
    if is_postgres_engine(engine):
        from spoolctl.db.backends.postgresql import translate_errors as translate_postgres

        with translate_postgres(engine):
            yield
        return
    try:
        yield
    except (DBAPIError, sqlite3.Error) as exc:
        raw = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(raw, sqlite3.IntegrityError) or not isinstance(raw, sqlite3.DatabaseError):
            raise
        text = str(raw)
        if isinstance(raw, sqlite3.OperationalError) and is_busy(raw):
            raise Locked(
                "the queue database stayed locked beyond the busy timeout; try again",
                sqlite_error=text,
            ) from None
        reason, hint = storage_fault(text)
        message = f"cannot use the queue database {db_path_of(engine)}: {text}" + (
            f" ({hint})" if hint else ""
        )
        if reason == "disk_full":
            raise DiskFull(message, path=db_path_of(engine), sqlite_error=text) from None
        raise StorageFault(
            message, reason=reason, path=db_path_of(engine), sqlite_error=text
        ) from None
