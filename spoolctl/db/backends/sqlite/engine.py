"""SQLite's engines: every write transaction opens with a raw `BEGIN
IMMEDIATE` from a connection event hook (the pysqlite recipe: the driver's
own transaction handling is disabled on connect, our BEGIN is emitted on
begin), waited for in short sleeps; every transaction re-reads the schema
revision; files are opened `mode=rw` (never created by a connection) or, to
look without a trace, immutable. SQLite's errors in the contract's words.

A writer that has waited a while for the lock looks for the process holding
it, without the lock, and fences it where it is a stopped worker of this
queue silent beyond the hang threshold (`holder.py`; `LockWait`)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError

from spoolctl.db.backends.base import Synchronous
from spoolctl.db.engine import LOCK_WAIT_OPTION, READ_ONLY_OPTION, RevisionMismatch
from spoolctl.db.lean import (
    BUSY_MAX_SLEEP_S,
    MIN_PAGE_SIZE,
    begin_immediate,
    is_busy,
    revision_of,
)
from spoolctl.db.lean import peek_uri as peek_uri  # where the drivers' modules find it
from spoolctl.errors import DiskFull, Locked, StorageFault

if TYPE_CHECKING:
    from spoolctl.db.backends.sqlite.holder import Holder


def make_engine(
    db_path: Path,
    *,
    write: bool,
    busy_timeout_s: float,
    synchronous: Synchronous = "NORMAL",
    expected_revision: str | None = None,
    foreign_keys: bool = True,
    peek: bool = False,
) -> Engine:
    """An engine on one queue file.

    write: transactions open with BEGIN IMMEDIATE (else plain deferred BEGIN).
    expected_revision: when set, every transaction checks alembic_version.
    foreign_keys: False only for schema migrations, which rebuild referenced
    tables (SQLite ignores this pragma inside a transaction, so it is set on
    connect) and must run `PRAGMA foreign_key_check` before committing.
    peek: a read that leaves no trace (see peek_uri).
    """
    # mode=rw: SQLite never creates the file behind our back (a pool connection
    # opened after the queue was deleted would otherwise start an empty one).
    uri = peek_uri(db_path) if peek else f"file:{quote(str(db_path))}?mode=rw"
    engine = create_engine(
        f"sqlite:///{uri}&uri=true",
        connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        check_header(db_path)
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if write and expected_revision is not None and revision_of(cur) == expected_revision:
            # Only a queue already at the code's revision is switched to WAL:
            # a file that will be refused (foreign, legacy, newer) is not
            # changed by opening it. after_migration() switches a file that
            # migrate created or adopted once the change is committed.
            cur.execute("PRAGMA journal_mode=WAL")
        if write:
            # BEGIN IMMEDIATE waits in begin_immediate(), not in SQLite's busy
            # handler, whose sleeps start at 1 ms and grow to 100 ms.
            cur.execute("PRAGMA busy_timeout=0")
        cur.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.close()

    waits = LockWait(db_path) if write else None

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if write and not options.get(READ_ONLY_OPTION, False):
            wait_s = min(busy_timeout_s, options.get(LOCK_WAIT_OPTION, busy_timeout_s))
            begin_immediate(conn.connection.driver_connection, wait_s, waits)
        else:
            conn.exec_driver_sql("BEGIN")
        if expected_revision is not None:
            _check_revision(conn, expected_revision)

    return engine


def check_header(db_path: Path) -> None:
    """A file of 1 to 511 bytes cannot be an SQLite database, but SQLite
    takes one shorter than its header for an empty database and writes a new
    one over it: a few bytes of someone else's file would be lost. Refused
    as SQLite refuses a longer file that is not a database, with the same
    words (DB_UNUSABLE, damaged). Only the size is looked
    at: opening and closing the file here would drop the POSIX locks that
    this process's SQLite connections hold on it."""
    try:
        size = os.stat(db_path).st_size
    except OSError:
        return  # missing or unreadable: the connection reports it
    if 0 < size < MIN_PAGE_SIZE:
        raise unusable_file("file is not a database", str(db_path))


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


LOOK_AFTER_S = 1.0
"""How long the lock stays busy (over one wait, or a worker's waits one after
another) before a writer looks for its holder: far beyond any transaction
of spoolctl's, short beside the busy timeout."""
LOOK_EVERY_S = 0.5
"""How often a writer looks again while the lock stays busy."""
AFTER_FENCE_S = 1.0
"""How long, at least, a writer waits for the lock once it fenced its holder."""


class LockWait:
    """One write engine's waits for the lock: since when the lock has been
    busy, and what the last look for its holder found (`holder.py`, loaded
    only here, on the slow path)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.busy_since: float | None = None
        """When the lock was first found busy since a writer last took it."""
        self.next_look_at = 0.0
        self.holder: Holder | None = None
        self.looked_at = 0.0

    def busy(self, raw: Any, now: float, deadline: float) -> float:
        """The lock was busy at `now`: look for its holder if due; the
        wait's deadline, moved on where the holder was fenced (time to take
        the lock)."""
        if self.busy_since is None:
            self.busy_since = now
        waited_long = now - self.busy_since >= LOOK_AFTER_S
        if now < self.next_look_at or not (waited_long or now >= deadline):
            return deadline
        from spoolctl.db.backends.sqlite.holder import look

        self.holder = holder = look(raw, self.db_path)
        self.looked_at = after = time.monotonic()
        self.next_look_at = after + LOOK_EVERY_S
        if holder is None:
            return deadline
        if holder.fenced:
            self.busy_since, self.next_look_at = None, 0.0
            return max(deadline, after + AFTER_FENCE_S)
        return deadline

    def tell(self, exc: BaseException, began: float) -> None:
        """The wait gives up: the error names the holder this wait found."""
        if self.holder is not None and self.looked_at >= began:
            exc.spoolctl_lock_holder = self.holder  # type: ignore[attr-defined]


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


def db_path_of(engine: Engine) -> str:
    """The queue file an engine opens (its URL is a `file:` URI with options)."""
    database = engine.url.database or ""
    return unquote(database.removeprefix("file:").split("?", 1)[0])


STORAGE_FAULTS = (
    (
        "unable to open database file",
        "unreadable",
        "check that the file and its folder exist and that this user may read and write them",
    ),
    ("file is not a database", "damaged", "the file is damaged or not an SQLite database"),
    ("malformed", "damaged", "the file is damaged: restore the queue from a backup"),
    (
        "readonly database",
        "read_only",
        "the database file or its folder is read-only for this user",
    ),
    ("disk i/o error", "unusable", "the disk failed or the file was removed underneath"),
    ("database or disk is full", "disk_full", "free space on the disk holding the spool folder"),
    (
        "no such table",
        "not_a_queue",
        "the file is not a spoolctl queue (or was replaced underneath)",
    ),
)
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
    to check; integrity violations (bugs) pass through as they are. Errors of
    statements run on the driver directly (`prepared.py`) are treated the same."""
    try:
        yield
    except (DBAPIError, sqlite3.Error) as exc:
        raw = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(raw, sqlite3.IntegrityError) or not isinstance(raw, sqlite3.DatabaseError):
            raise
        text = str(raw)
        if isinstance(raw, sqlite3.OperationalError) and is_busy(raw):
            raise locked(text, getattr(raw, "spoolctl_lock_holder", None)) from None
        raise unusable_file(text, db_path_of(engine)) from None


def locked(text: str, holder: Holder | None) -> Locked:
    """LOCKED, naming the process that held the lock where the wait found it."""
    message = "the queue database stayed locked beyond the busy timeout; try again"
    if holder is None:
        return Locked(message, sqlite_error=text)
    return Locked(
        f"{message} (pid {holder.pid} holds the write lock: {holder.why})",
        sqlite_error=text,
        lock_holder=holder.as_detail(),
    )


def unusable_file(text: str, where: str) -> StorageFault:
    """The error for a queue file SQLite cannot use (its words in `text`):
    DB_UNUSABLE with the reason and what to check, or DiskFull (a kind of it)."""
    reason, hint = storage_fault(text)
    message = f"cannot use the queue database {where}: {text}" + (f" ({hint})" if hint else "")
    if reason == "disk_full":
        return DiskFull(message, path=where, sqlite_error=text)
    return StorageFault(message, reason=reason, path=where, sqlite_error=text)
