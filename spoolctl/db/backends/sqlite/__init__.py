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
- Change watch: `PRAGMA data_version`, cheap enough to read every few ms.
- Clock: this machine's (one machine uses the file). No lease guard: every
  reaper of the file runs on this machine and can check a worker's process.
- Output: the files the jobs write are the store (`backends.files`).
- Migrations: the backup is `VACUUM INTO` beside the file, taken under the
  migration's write lock; WAL is switched on after the commit.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from sqlalchemy import Connection, Engine, Table, case, create_engine, event, exists, func
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from spoolctl.config import busy_timeout_s, local_clock
from spoolctl.db.backends.base import ChangeWatch, HasTag, LeaseGuard, Synchronous
from spoolctl.db.backends.files import FileOutput
from spoolctl.db.engine import LOCK_WAIT_OPTION, READ_ONLY_OPTION, RevisionMismatch
from spoolctl.db.url import bad_url
from spoolctl.errors import DiskFull, InvalidInput, Locked, StorageFault

if TYPE_CHECKING:
    from spoolctl.db.health import Check

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
        return make_engine(self.path, write=True, busy_timeout_s=timeout_s, synchronous="FULL",
                           foreign_keys=False)  # fmt: skip

    def translate_errors(self, engine: Engine) -> Any:
        return translate_errors(engine)

    def clock(self, engine: Engine) -> Callable[[], float]:
        return local_clock()

    def change_watch(self, engine: Engine) -> ChangeWatch:
        return DataVersionWatch(engine)

    def lease_guard(self, fence_after_s: float) -> LeaseGuard | None:
        return None

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

        return database_checks(self.path)


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


def before_event(conn: Connection) -> None:
    """SQLite's single writer already commits event ids in order."""


def before_slot_count(conn: Connection, queue: str) -> None:
    """The write lock already serializes every claimant."""


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


# -- engines -----------------------------------------------------------------------


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


def db_path_of(engine: Engine) -> str:
    """The queue file an engine opens (its URL is a `file:` URI with options)."""
    database = engine.url.database or ""
    return unquote(database.removeprefix("file:").split("?", 1)[0])


def is_busy(exc: BaseException) -> bool:
    """True when SQLite gave up waiting for a lock."""
    text = str(getattr(exc, "orig", exc)).lower()
    return "database is locked" in text or "database is busy" in text or "locked" in text


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
            raise Locked(
                "the queue database stayed locked beyond the busy timeout; try again",
                sqlite_error=text,
            ) from None
        reason, hint = storage_fault(text)
        where = db_path_of(engine)
        message = f"cannot use the queue database {where}: {text}" + (f" ({hint})" if hint else "")
        if reason == "disk_full":
            raise DiskFull(message, path=where, sqlite_error=text) from None
        raise StorageFault(message, reason=reason, path=where, sqlite_error=text) from None


# -- the change watch, the backup ---------------------------------------------------


class DataVersionWatch:
    """Tells whether any connection committed to the queue since the last look."""

    def __init__(self, engine: Engine) -> None:
        self._raw: Any = engine.raw_connection()
        self._version: int | None = None

    def changed(self) -> bool:
        try:
            cursor = self._raw.cursor()
            cursor.execute("PRAGMA data_version")
            version = cursor.fetchone()[0]
            cursor.close()
        except Exception:  # a failed peek only means "look properly"
            return True
        changed = bool(version != self._version)
        self._version = version
        return changed

    def fileno(self) -> int | None:
        return None

    def close(self) -> None:
        self._raw.close()


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
