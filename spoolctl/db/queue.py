"""Opening a queue for a verb, with the revision policy of SPEC section 3.

A queue is an SQLite file (a `Path`) or a PostgreSQL database (a URL string);
what differs between the two is chosen here and implemented in
`spoolctl.db.engine` (SQLite) and `spoolctl.db.backends.postgresql`.

The fast path costs nothing extra: the engine's begin hook compares the
file's revision with the code's head inside each transaction. Only when that
check fails do we look closer: a blank file is created at head, an older one
is refused with SCHEMA_OUTDATED (or upgraded with SPOOLCTL_AUTO_MIGRATE=1), a
newer one with SCHEMA_TOO_NEW, a foreign SQLite file with NotAQueue. Creating
and upgrading both go through `spoolctl.db.migration.migrate_file`, the one
path that changes a schema. A refusal writes nothing: the engine is disposed
(so SQLite removes any -wal/-shm its connection made) before the file is
looked at again, by a read that creates no file (`make_peek_engine`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypeVar

from sqlalchemy import Connection, Engine

from spoolctl.config import busy_timeout_s
from spoolctl.db import revision
from spoolctl.db.engine import (
    RevisionMismatch,
    Synchronous,
    ensure_spool,
    make_engine,
    make_peek_engine,
    read_tx,
    write_tx,
)

T = TypeVar("T")
Target: TypeAlias = Path | str
"""An SQLite file's path, or a PostgreSQL URL."""


def is_postgres(target: Target) -> bool:
    return isinstance(target, str)


def display(target: Target) -> str:
    """How messages name the queue (a URL's password masked)."""
    if isinstance(target, str):
        from spoolctl.db.url import masked

        return masked(target)
    return str(target)


def local_spool(url: str) -> Path:
    """Where a worker of a PostgreSQL queue keeps its output files on this
    machine: `SPOOLCTL_SPOOL_DIR`, else a folder per database under
    `$XDG_STATE_HOME/spoolctl` (default `~/.local/state/spoolctl`). Output
    is also stored in the database, readable from any machine."""
    given = os.environ.get("SPOOLCTL_SPOOL_DIR")
    if given:
        return Path(given).expanduser().absolute()
    from spoolctl.db.url import masked

    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(masked(url).encode()).hexdigest()[:16]
    return state / "spoolctl" / f"pg-{digest}"


@dataclass
class QueueFile:
    target: Target
    engine: Engine

    @property
    def path(self) -> Path:
        """The SQLite file (PostgreSQL queues have none: see `target`)."""
        if isinstance(self.target, str):
            raise TypeError("a PostgreSQL queue has no file")
        return self.target

    @property
    def is_postgres(self) -> bool:
        return is_postgres(self.target)

    @property
    def display(self) -> str:
        return display(self.target)

    @property
    def spool(self) -> Path:
        if isinstance(self.target, str):
            return local_spool(self.target)
        return self.target.parent

    @property
    def output_root(self) -> Path:
        return self.spool / "output"

    def clock(self) -> Callable[[], float]:
        """The clock liveness times are written and judged by: this machine's
        on SQLite (one machine), the database server's on PostgreSQL."""
        from spoolctl.config import local_clock

        if isinstance(self.target, str):
            from spoolctl.db.backends.postgresql import ServerClock

            return ServerClock(self.engine, local_clock())
        return local_clock()

    def now(self) -> float:
        """One reading of `clock()`, for a verb that stamps a change."""
        return self.clock()()

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run fn in one BEGIN IMMEDIATE transaction on a current schema."""
        try:
            with write_tx(self.engine) as conn:
                return fn(conn)
        except RevisionMismatch:
            self.engine.dispose()
            prepare(self.target)
        return self._after_prepare(write_tx, fn)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run fn in one read snapshot; refuses a file that is not current
        (unless SPOOLCTL_AUTO_MIGRATE=1 lets it be upgraded first)."""
        try:
            with read_tx(self.engine) as conn:
                return fn(conn)
        except RevisionMismatch:
            self.engine.dispose()
            if not revision.auto_migrate_enabled():
                diagnose(self.target)
                raise
            prepare(self.target)
        return self._after_prepare(read_tx, fn)

    def _after_prepare(
        self,
        transaction: Callable[[Engine], AbstractContextManager[Connection]],
        fn: Callable[[Connection], T],
    ) -> T:
        """The second try; if the revision moved again meanwhile, say how."""
        try:
            with transaction(self.engine) as conn:
                return fn(conn)
        except RevisionMismatch:
            self.engine.dispose()
            diagnose(self.target)
            raise

    def dispose(self) -> None:
        self.engine.dispose()


def _postgres_engine(url: str, *, write: bool, expected: str | None) -> Engine:
    from spoolctl.db.backends import postgresql
    from spoolctl.db.engine import LOCK_WAIT_OPTION, READ_ONLY_OPTION

    return postgresql.make_engine(
        url,
        write=write,
        busy_timeout_s=busy_timeout_s(),
        expected_revision=expected,
        lock_wait_option=LOCK_WAIT_OPTION,
        read_only_option=READ_ONLY_OPTION,
        on_mismatch=RevisionMismatch,
    )


def open_for_write(path: Target, *, synchronous: Synchronous = "NORMAL") -> QueueFile:
    """Open (creating the spool folder and file if missing) for a mutating verb."""
    if isinstance(path, str):
        return QueueFile(path, _postgres_engine(path, write=True, expected=revision.HEAD_REVISION))
    ensure_spool(path)
    engine = make_engine(
        path,
        write=True,
        busy_timeout_s=busy_timeout_s(),
        synchronous=synchronous,
        expected_revision=revision.HEAD_REVISION,
    )
    return QueueFile(path, engine)


def open_for_read(path: Target) -> QueueFile | None:
    """Open for a read-only verb; None when there is no queue there yet."""
    if isinstance(path, str):
        status = schema_status(path)
        if status is None:
            return None
        return QueueFile(path, _postgres_engine(path, write=False, expected=revision.HEAD_REVISION))
    if not path.exists() or path.stat().st_size == 0:
        return None
    engine = make_engine(
        path, write=False, busy_timeout_s=busy_timeout_s(), expected_revision=revision.HEAD_REVISION
    )
    return QueueFile(path, engine)


def schema_status(path: Target) -> revision.SchemaStatus | None:
    """What the file holds, read without the write lock and without creating
    or changing any file; None when there is no file (or, on PostgreSQL, an
    empty database)."""
    if isinstance(path, str):
        engine = _postgres_engine(path, write=False, expected=None)
        try:
            with read_tx(engine) as conn:
                status = revision.inspect_schema(conn)
        finally:
            engine.dispose()
        return status if status.has_tables else None
    if not path.exists() or path.stat().st_size == 0:
        return None
    engine = make_peek_engine(path, busy_timeout_s())
    try:
        with read_tx(engine) as conn:
            return revision.inspect_schema(conn)
    finally:
        engine.dispose()


def diagnose(path: Target) -> None:
    """Raise the public error for a file whose revision is not the head."""
    status = schema_status(path)
    if status is not None:
        revision.refuse_unless_current(status, path)


def prepare(path: Target) -> None:
    """Make the file usable at head: create a blank one, auto-migrate if the
    operator opted in, else raise SCHEMA_OUTDATED / SCHEMA_TOO_NEW.

    Auto-migration covers spoolctl's own revisions only; adopting a legacy
    file is always an explicit `spoolctl migrate`."""
    status = schema_status(path)
    if status is not None and status.is_head:
        return
    auto = revision.auto_migrate_enabled() and status is not None and status.is_known
    if status is None or status.is_blank or auto:
        from spoolctl.db.migration import migrate_file

        migrate_file(path)
        return
    revision.refuse_unless_current(status, path)
