"""SQLite: the embedded default, one file on one machine.

- Engine: every write transaction opens with a raw `BEGIN IMMEDIATE` from a
  connection event hook (the pysqlite recipe: the driver's own transaction
  handling is disabled on connect, our BEGIN is emitted on begin). Taking the
  write lock when the transaction opens, not when it first writes, makes
  concurrent claimants queue up instead of racing to upgrade a read lock.
  Read-only engines open plain deferred transactions and never take it.
- Every transaction re-reads the schema revision under its own lock, so a
  worker of an older or newer spoolctl stops with a clear error at its next
  transaction instead of writing into a schema it does not know.
- Files are opened `mode=rw`: no connection ever creates a queue by accident
  (`ensure` creates the spool folder 0700 and the file 0600 when a verb may).
- Change watch (`watch`): `PRAGMA data_version`, and an inotify watch on the
  write-ahead log that wakes an idle worker when a commit is written.
- Clock: this machine's (one machine uses the file). A lease guard
  (`spoolctl/runner/lease_guard.py`) as on PostgreSQL: workers in separate PID
  namespaces of this machine cannot check each other's processes.
- Output: the files the jobs write are the store (`backends.files`).
- Migrations: the backup is `VACUUM INTO` beside the file, taken under the
  migration's write lock; WAL is switched on after the commit.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, case, exists, func
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

from spoolctl.config import busy_timeout_s, local_clock
from spoolctl.db.backends.base import ChangeWatch, Check, HasTag, LeaseGuard, Synchronous
from spoolctl.db.backends.files import FileOutput
from spoolctl.db.backends.sqlite.engine import (
    make_engine,
    peek_uri,
    switch_to_wal,
    translate_errors,
)
from spoolctl.db.backends.sqlite.watch import DataVersionWatch
from spoolctl.db.engine import READ_ONLY_OPTION
from spoolctl.db.url import bad_url
from spoolctl.errors import InvalidInput, StorageFault

__all__ = ["SqliteDriver", "ensure_spool", "make_engine", "peek_uri", "translate_errors"]

SPOOL_DIR_MODE = 0o700
DB_FILE_MODE = 0o600
MIGRATE_BUSY_TIMEOUT_S = 60.0
"""A migrate waiting behind another migrate's rebuild waits at least this long."""
CREATE_FAULTS = {errno.EROFS: "read_only", errno.EACCES: "unreadable", errno.EPERM: "unreadable"}
"""Why a queue could not be created -> its DB_UNUSABLE reason."""


class SqliteDriver:
    """One queue file."""

    name = "sqlite"
    kind_of_database = "an SQLite database"
    backup_note = "none"
    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def located(cls, path: Path, source: str) -> SqliteDriver:
        """The file a `--db` path names: a folder is never a queue file, and a
        file is never a folder to put one in (a wrong path given, INVALID_INPUT,
        not a fault)."""
        with suppress(PermissionError):  # this user cannot look: opening says so (unreadable)
            _refuse_wrong_shape(path, source)
        return cls(path)

    @property
    def display(self) -> str:
        return str(self.path)

    @property
    def spool(self) -> Path:
        return self.path.parent

    @property
    def output_root(self) -> Path:
        return self.spool / "output"

    def redact(self, text: str) -> str:
        return text  # a path holds no secret

    def may_hold_a_queue(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    def ensure(self) -> None:
        ensure_spool(self.path)

    def engine(
        self,
        *,
        write: bool,
        expected_revision: str | None,
        synchronous: Synchronous = "NORMAL",
        lock_wait_s: float | None = None,
    ) -> Engine:
        timeout_s = busy_timeout_s() if lock_wait_s is None else lock_wait_s
        return make_engine(
            self.path,
            write=write,
            busy_timeout_s=timeout_s,
            synchronous=synchronous,
            expected_revision=expected_revision,
        )

    def peek_engine(self) -> Engine:
        return make_engine(self.path, write=False, busy_timeout_s=busy_timeout_s(), peek=True)

    def migration_engine(self) -> Engine:
        timeout_s = max(busy_timeout_s(), MIGRATE_BUSY_TIMEOUT_S)
        return make_engine(
            self.path, write=True, busy_timeout_s=timeout_s, synchronous="FULL", foreign_keys=False
        )

    def translate_errors(self, engine: Engine) -> Any:
        return translate_errors(engine)

    def clock(self, engine: Engine) -> Callable[[], float]:
        return local_clock()

    def change_watch(self, engine: Engine) -> ChangeWatch:
        return DataVersionWatch(engine, self.path)

    def lease_guard(self, fence_after_s: float) -> LeaseGuard | None:
        # One queue file may be shared by workers in separate PID namespaces
        # of one host (containers, `unshare --pid`), which judge each other by
        # the lease, as machines do: a frozen or killed worker's jobs must end
        # before another may rerun them, as on PostgreSQL.
        from spoolctl.runner.lease_guard import LeaseGuard as Guard

        return Guard(fence_after_s)

    def identity(self) -> object | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino)

    def output_writer(self) -> FileOutput:
        return FileOutput()

    def output_reader(self) -> FileOutput:
        return FileOutput()

    def lock_for_migration(self, conn: Connection) -> None:
        return None  # the migration's BEGIN IMMEDIATE holds the write lock

    def take_backup(self, label: str) -> Path:
        return take_backup(self.path, label)

    def after_migration(self, engine: Engine) -> None:
        switch_to_wal(engine, max(busy_timeout_s(), MIGRATE_BUSY_TIMEOUT_S))

    def health_checks(self) -> list[Check]:
        from spoolctl.db.backends.sqlite.health import database_checks

        return database_checks(self.path, self)


def _refuse_wrong_shape(path: Path, source: str) -> None:
    if path.is_dir():
        raise InvalidInput(f"{source} names a folder, not a queue file: {path}", db=str(path))
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise InvalidInput(
                    f"{source} names {path}, but {parent} is a file, not a folder", db=str(path)
                )
            break


# -- the statements that differ (backends.statements(conn)) ---------------------


def event_position() -> ColumnElement[int]:
    """SQLite's single writer commits event ids in order: the id is the cursor."""
    from spoolctl.db.tables import job_events

    return job_events.c.id


@contextmanager
def ledger_reader(conn: Connection) -> Iterator[Connection]:
    """conn itself, nothing to number: in the caller's transaction, or in a
    read snapshot of its own when conn has none open (`Queue.read_ledger`)."""
    if conn.in_transaction():
        yield conn
        return
    conn.execution_options(**{READ_ONLY_OPTION: True})
    with conn.begin():
        yield conn


def writes_in_with() -> bool:
    """SQLite's WITH precedes one statement and holds only SELECTs; its
    statements cost no round trip anyway (the database is in process)."""
    return False


@contextmanager
def pipeline(conn: Connection) -> Iterator[bool]:
    """Nothing to gather: each statement runs as it is sent."""
    yield False


def before_cap_count(conn: Connection, lane: str) -> None:
    """The write lock already serializes every claimant."""


def ledger_lag(conn: Connection) -> None:
    """An event's id is its position as it commits: the ledger never lags."""


def upsert(conn: Connection, table: Table, values: dict[str, Any], key: str) -> None:
    from sqlalchemy.dialects.sqlite import insert

    stmt = insert(table).values(**values)
    conn.execute(stmt.on_conflict_do_update(index_elements=[table.c[key]], set_=values))


def table_names(conn: Connection) -> set[str]:
    found = conn.exec_driver_sql(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    )
    return {row[0] for row in found}


def legacy_version(conn: Connection, tables: set[str]) -> int | None:
    """The original spoolctl's `meta.schema_version` (0 when unreadable)."""
    if not {"meta", "jobs"} <= tables:
        return None
    raw = conn.exec_driver_sql("SELECT value FROM meta WHERE key = 'schema_version'").scalar()
    return int(raw) if raw is not None and str(raw).isdigit() else 0


def check_references(conn: Connection) -> None:
    """Refuse to commit a migration that left a dangling reference (batch
    rebuilds run with foreign keys off)."""
    violations = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if violations:
        raise StorageFault(
            f"the database holds {len(violations)} reference(s) to rows that do not exist, "
            "so the migration was not committed; nothing was changed",
            reason="damaged",
            violations=[list(v) for v in violations[:20]],
        )


def located(location: str, base: Path, source: str) -> SqliteDriver:
    """The driver of a path (a `--db` value, or `parse_url`'s), relative to `base`."""
    path = Path(location).expanduser()
    return SqliteDriver.located(path if path.is_absolute() else base / path, source)


def at(path: Path) -> SqliteDriver:
    """The driver of the file at path, as it is (the default queue, tests)."""
    return SqliteDriver(path)


def parse_url(text: str, source: str, shown: str) -> str:
    """`sqlite:///relative/path` or `sqlite:////absolute/path`, nothing else."""
    rest = text[len("sqlite://") :]
    if not rest.startswith("/") or "?" in rest or "#" in rest:
        raise bad_url(
            f"{source}: {shown!r}: an SQLite URL is sqlite:///PATH (three slashes, then the "
            "file; four for an absolute path), with no host and no options",
            shown,
        )
    path = rest[1:]
    if not path or path == ":memory:":
        raise bad_url(f"{source}: {shown!r} names no file: a queue lives in a file", shown)
    return path


@compiles(HasTag, "sqlite")
def _has_tag_sqlite(element: HasTag, compiler: SQLCompiler, **kw: Any) -> str:
    tags = case((func.json_valid(element.tags), element.tags), else_="{}")
    pairs = func.json_each(tags).table_valued("key", "value")
    if element.value is None:
        clause = exists().where(pairs.c.key == element.key)
    else:
        clause = exists().where(pairs.c.key == element.key, pairs.c.value == element.value)
    return compiler.process(clause, **kw)


# -- the spool --------------------------------------------------------------------


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


# -- the backup -------------------------------------------------------------------


def take_backup(path: Path, label: str) -> Path:
    """A consistent copy beside the file, readable only by its owner."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = path.with_name(f"{path.name}.bak-{label}-{stamp}")
    target, n = base, 1
    while True:
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, DB_FILE_MODE))
            break
        except FileExistsError:
            n += 1
            target = base.with_name(f"{base.name}.{n}")
    reader = sqlite3.connect(path, timeout=busy_timeout_s())
    try:
        reader.execute("VACUUM INTO ?", (str(target),))
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        reader.close()
    return target
