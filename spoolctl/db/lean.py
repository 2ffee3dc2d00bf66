"""The lean path's SQLite: the queue file opened with the standard library
alone (no SQLAlchemy), the same connection settings and write lock as an
engine's (`db/backends/sqlite/engine.py`, which takes its raw pieces from
here), and the statements SQLAlchemy compiled for it (`db/lean_sql.py`).

Whatever it meets that it cannot answer exactly as the full path would (no
file yet, another revision, a lock held a while, any error of SQLite's) it
raises `Unanswered` before anything is committed: the caller then goes the
full way, which creates, refuses, waits or reports in the contract's words.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from spoolctl.db import lean_sql
from spoolctl.db.revisions import HEAD_REVISION

T = TypeVar("T")


class Waits(Protocol):
    """A write engine's waits for the lock (`LockWait`)."""

    busy_since: float | None

    def busy(self, raw: Any, now: float, deadline: float) -> float: ...

    def tell(self, exc: BaseException, began: float) -> None: ...


LEAN_LOCK_WAIT_S = 1.0
"""How long the lean path waits for the write lock before it leaves the wait
to the full path (which looks for the lock's holder after as long)."""


class Unanswered(Exception):
    """The lean path cannot answer exactly as the full path would; it has
    written nothing."""


MIN_PAGE_SIZE = 512
"""SQLite's smallest page: a database file that holds anything holds page 1."""


def revision_of(cursor: sqlite3.Cursor) -> str | None:
    """The file's alembic revision, None when it has none (or is no database)."""
    try:
        row = cursor.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.DatabaseError:
        return None
    return None if row is None else str(row[0])


def is_busy(exc: BaseException) -> bool:
    """True when SQLite gave up waiting for a lock."""
    text = str(getattr(exc, "orig", exc)).lower()
    return "database is locked" in text or "database is busy" in text or "locked" in text


BUSY_SPIN_S = 0.001
"""How long a busy lock is first retried without sleeping."""
BUSY_FIRST_SLEEP_S = 0.0001
BUSY_MAX_SLEEP_S = 0.002
_yield = getattr(os, "sched_yield", None)


def begin_immediate(raw: Any, timeout_s: float, waits: Waits | None = None) -> None:
    """Take SQLite's write lock, waiting up to timeout_s for it.

    For the first BUSY_SPIN_S a busy lock is retried at once, giving the CPU
    to any other runnable process between tries: the holder's transaction
    usually ends within it, and a waiter that slept would find its CPU gone
    idle and run its own transaction slower (`worker/spin.py`; two
    uncontained workers drained 1.03× faster this way, docs/performance.md,
    "Waiting for short jobs"). Then it retries with sleeps from 0.1 ms
    doubling to 2 ms: transactions here last well under a millisecond, so a
    waiting claimant gets the lock about as soon as it is free instead of
    after SQLite's coarse busy-handler sleeps (which made two workers slower
    than one). Raises sqlite3's busy error on timeout.

    waits: the engine's `LockWait`, which looks for the lock's holder once
    the lock has been busy a while and fences a stopped worker whose
    heartbeat is older than the hang threshold. The wait never goes past the
    busy timeout for a holder that is not fenceable yet (a verb in a shell
    loop would seem to hang for up to the hang threshold): the error names
    it, and when it will be (`LOCKED`'s detail.lock_holder).
    """
    began = time.monotonic()
    deadline = began + timeout_s
    spin_until = began + BUSY_SPIN_S if _yield is not None else began
    sleep_s = BUSY_FIRST_SLEEP_S
    while True:
        try:
            raw.execute("BEGIN IMMEDIATE")
            if waits is not None and waits.busy_since is not None:
                waits.busy_since = None
            return
        except sqlite3.OperationalError as exc:
            now = time.monotonic()
            if not is_busy(exc):
                raise
            if waits is not None:
                deadline = waits.busy(raw, now, deadline)
                now = time.monotonic()
            left = deadline - now
            if left <= 0:
                if waits is not None:
                    waits.tell(exc, began)
                raise
            if now < spin_until and _yield is not None:
                _yield()
                continue
            time.sleep(min(sleep_s, left))
            sleep_s = min(sleep_s * 2, BUSY_MAX_SLEEP_S)


def peek_uri(db_path: Path) -> str:
    """The `file:` URI of a read-only engine that creates, changes and removes
    no file.

    Without a `-wal` and `-shm` beside it the file is opened immutable: SQLite
    takes no lock and makes no `-shm`/`-wal` even for a WAL-mode file, so a
    file that is then refused is left exactly as it was found. With both
    present (a queue in use) it is opened read-only, which sees committed WAL
    content and, unlike a read-write connection, never checkpoints on close.
    (An immutable read takes no lock: it could see a torn page of a file being
    written in rollback-journal mode, which only `migrate` does, on a file it
    creates or adopts, before switching it to WAL.)
    """
    side = [db_path.with_name(db_path.name + suffix).exists() for suffix in ("-wal", "-shm")]
    options = "mode=ro" if all(side) else "mode=ro&immutable=1"
    return f"file:{quote(str(db_path))}?{options}"


class LeanQueue:
    """One queue file at the code's revision, opened for one write
    (`open`, `write`) or one read (`open_read`, `read`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @classmethod
    def open(cls, path: Path, busy_timeout_s: float) -> LeanQueue:
        """Opened as a write engine opens it; Unanswered where the file is
        missing, too short to be a database, or not at this code's revision."""
        conn = _connected(path, busy_timeout_s, peek_first=False)
        try:
            if revision_of(conn.cursor()) != HEAD_REVISION:
                raise Unanswered("not at this code's revision")
            for pragma in (
                "journal_mode=WAL",
                "busy_timeout=0",
                "foreign_keys=ON",
                "synchronous=FULL",
            ):
                conn.execute(f"PRAGMA {pragma}")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise Unanswered(str(exc)) from None
            raise
        return cls(conn)

    @classmethod
    def open_read(cls, path: Path, busy_timeout_s: float) -> LeanQueue:
        """Opened as a read-only verb opens it (`db/queue.py`'s
        open_for_read): the revision looked at without a trace (`peek_uri`),
        then the file opened as a read engine opens it. Unanswered where the
        file is missing, too short to be a database, or not at this code's
        revision (no queue yet: the full path answers NO_QUEUE)."""
        conn = _connected(path, busy_timeout_s, peek_first=True)
        try:
            for pragma in ("foreign_keys=ON", "synchronous=NORMAL"):
                conn.execute(f"PRAGMA {pragma}")
        except sqlite3.Error as exc:
            conn.close()
            raise Unanswered(str(exc)) from None
        return cls(conn)

    def read(self, fn: Callable[[LeanQueue], T]) -> T:
        """Run fn in one read snapshot (a deferred BEGIN, the revision checked
        inside it); Unanswered where anything goes otherwise."""
        try:
            self.conn.execute("BEGIN")
            if revision_of(self.conn.cursor()) != HEAD_REVISION:
                raise Unanswered("the revision changed underneath")
            result = fn(self)
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise Unanswered(str(exc)) from None
        finally:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        return result

    def write(self, fn: Callable[[LeanQueue], T]) -> T:
        """Run fn in one write transaction (BEGIN IMMEDIATE, the revision
        checked inside it) and commit; Unanswered, rolled back, where
        anything goes otherwise."""
        try:
            begin_immediate(self.conn, LEAN_LOCK_WAIT_S)
        except sqlite3.Error as exc:
            raise Unanswered(str(exc)) from None
        try:
            if revision_of(self.conn.cursor()) != HEAD_REVISION:
                raise Unanswered("the revision changed underneath")
            result = fn(self)
            self.conn.execute("COMMIT")
        except BaseException as exc:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise Unanswered(str(exc)) from None
            raise
        return result

    def first(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """A statement of `db/lean_sql.py` by name: its first row by column."""
        sql, order, defaults = lean_sql.STATEMENTS[name]
        values = {**defaults, **params}
        cursor = self.conn.execute(sql, [values.get(bind) for bind in order.split()])
        row = cursor.fetchone()
        if row is None:
            return None
        found = dict(zip([d[0] for d in cursor.description], row, strict=True))
        cursor.fetchall()  # a RETURNING statement has completed
        return found

    def all(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A statement of `db/lean_sql.py` by name: every row by column."""
        sql, order, defaults = lean_sql.STATEMENTS[name]
        values = {**defaults, **params}
        cursor = self.conn.execute(sql, [values.get(bind) for bind in order.split()])
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]

    def close(self) -> None:
        self.conn.close()


def _connected(path: Path, busy_timeout_s: float, *, peek_first: bool) -> sqlite3.Connection:
    """A connection to the queue file (`mode=rw`: never created by it), in
    autocommit so that our BEGIN is the one sent; with peek_first, only once
    a look that leaves no trace found the code's revision. Unanswered where
    the lean statements, the file or its revision are not this code's."""
    if lean_sql.HEAD_REVISION != HEAD_REVISION:
        raise Unanswered("the lean statements were compiled for another revision")
    try:
        if os.stat(path).st_size < MIN_PAGE_SIZE:
            raise Unanswered("no queue in the file yet")
        if not peek_first and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
            # a read-only file, folder or disk: the engine says which, in its words (and a
            # failed open here would leave SQLite's per-process state of the file to it)
            raise Unanswered("not writable here")
        if peek_first:
            peek = sqlite3.connect(peek_uri(path), uri=True, timeout=busy_timeout_s)
            try:
                found = revision_of(peek.cursor())
            finally:
                peek.close()
            if found != HEAD_REVISION:
                raise Unanswered("not at this code's revision")
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=rw", uri=True, timeout=busy_timeout_s)
    except (OSError, sqlite3.Error) as exc:
        raise Unanswered(str(exc)) from None
    conn.isolation_level = None
    return conn
