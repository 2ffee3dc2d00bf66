"""Opening a queue file for a verb, with the revision policy of SPEC section 3.

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

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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


@dataclass
class QueueFile:
    path: Path
    engine: Engine

    @property
    def spool(self) -> Path:
        return self.path.parent

    @property
    def output_root(self) -> Path:
        return self.spool / "output"

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run fn in one BEGIN IMMEDIATE transaction on a current schema."""
        try:
            with write_tx(self.engine) as conn:
                return fn(conn)
        except RevisionMismatch:
            self.engine.dispose()
            prepare(self.path)
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
                diagnose(self.path)
                raise
            prepare(self.path)
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
            diagnose(self.path)
            raise

    def dispose(self) -> None:
        self.engine.dispose()


def open_for_write(path: Path, *, synchronous: Synchronous = "NORMAL") -> QueueFile:
    """Open (creating the spool folder and file if missing) for a mutating verb."""
    ensure_spool(path)
    engine = make_engine(
        path,
        write=True,
        busy_timeout_s=busy_timeout_s(),
        synchronous=synchronous,
        expected_revision=revision.HEAD_REVISION,
    )
    return QueueFile(path, engine)


def open_for_read(path: Path) -> QueueFile | None:
    """Open for a read-only verb; None when there is no queue there yet."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    engine = make_engine(
        path, write=False, busy_timeout_s=busy_timeout_s(), expected_revision=revision.HEAD_REVISION
    )
    return QueueFile(path, engine)


def schema_status(path: Path) -> revision.SchemaStatus | None:
    """What the file holds, read without the write lock and without creating
    or changing any file; None when there is no file."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    engine = make_peek_engine(path, busy_timeout_s())
    try:
        with read_tx(engine) as conn:
            return revision.inspect_schema(conn)
    finally:
        engine.dispose()


def diagnose(path: Path) -> None:
    """Raise the public error for a file whose revision is not the head."""
    status = schema_status(path)
    if status is not None:
        revision.refuse_unless_current(status, path)


def prepare(path: Path) -> None:
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
