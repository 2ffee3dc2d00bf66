"""Transactions on a queue's engine, whatever its backend: a write
transaction takes the backend's write lock when it opens (its driver's begin
hook: BEGIN IMMEDIATE on SQLite, a bounded lock_timeout on PostgreSQL), a
read transaction is one snapshot that takes none; both re-check the schema
revision (RevisionMismatch), and errors come out in the contract's words.
Engines are made by the drivers (`spoolctl.db.backends`).

SQLAlchemy's pool logs what it handles itself with a traceback: a rollback
that fails as a connection comes back to the pool (the server ended it
mid-transaction: "Exception during reset or similar"), just before the pool
discards that connection. With no handler of the program's, Python's
last-resort handler would print that traceback on stderr, beside the error
spoolctl reports in its own words (and between the JSON lines of
`work --log-format json`). Nothing is lost by dropping it: the statement that
met the lost connection raises, and that error is the one reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from sqlalchemy import Connection, Engine

from spoolctl.errors import DiskFull, Locked, SpoolError, Unreachable

logging.getLogger("sqlalchemy.pool").addHandler(logging.NullHandler())

READ_ONLY_OPTION = "spoolctl_read_only"
"""Connection execution option: the begin hook opens a deferred transaction."""
LOCK_WAIT_OPTION = "spoolctl_lock_wait_s"
"""Connection execution option: wait at most this long for the write lock
(a worker waits in short slices so that it keeps running its loop)."""


class OpenWrites:
    """The write transactions this process has open or is opening (from
    before its lock is asked for until its commit or rollback has returned),
    and what runs as the last one ends: a worker told to stop (SIGTSTP)
    inside one stops only then, holding no lock (`worker/suspend.py`).
    Counted by `write_tx` and `HeldConnection.write_tx`, which every write
    goes through; exact in a process that writes from one thread (the
    worker), where signal handlers run too."""

    count = 0
    after_last: Callable[[], None] | None = None

    @classmethod
    def ended(cls) -> None:
        cls.count -= 1
        if not cls.count and cls.after_last is not None:
            cls.after_last()


class RevisionMismatch(SpoolError):
    """Raised as a transaction opens (the begin hook; on PostgreSQL's write
    engines, with its first statement or at its commit); revision.py turns it
    into the public error."""


@contextmanager
def write_tx(engine: Engine, lock_wait_s: float | None = None) -> Iterator[Connection]:
    """One write transaction (its write lock taken as it opens); a lock wait
    beyond the timeout becomes `Locked`.
    lock_wait_s: wait at most that long for the lock (never beyond the
    engine's busy timeout)."""
    OpenWrites.count += 1
    try:
        if lock_wait_s is None:
            with translate_errors(engine), engine.begin() as conn:
                yield conn
            return
        with translate_errors(engine), engine.connect() as conn, _begin_waiting(conn, lock_wait_s):
            yield conn
    finally:
        OpenWrites.ended()


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
        OpenWrites.count += 1
        try:
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
        finally:
            OpenWrites.ended()

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


@contextmanager
def bare_connection(engine: Engine) -> Iterator[Connection]:
    """A connection with no transaction open yet: for reads that open their
    own (the event ledger's, `services/ledger.py`)."""
    with translate_errors(engine), engine.connect() as conn:
        yield conn


@contextmanager
def translate_errors(engine: Engine) -> Iterator[None]:
    """The backend's errors in the contract's words (its driver's
    `translate_errors`): a busy lock becomes `Locked` (exit 4), a database
    that cannot be used `StorageFault` (DB_UNUSABLE, exit 3) with its
    reason; integrity violations (bugs) pass through as they are."""
    from spoolctl.db.backends import statements

    with statements(engine).translate_errors(engine):
        yield
