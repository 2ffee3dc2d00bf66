"""Opening a queue for a verb, with the revision policy of docs/migrations.md.

A `Queue` is a driver (`spoolctl.db.backends`: where the queue is and how its
backend works) and an engine made by it; every verb, the worker and the web
hold one and never ask which backend it is.

The fast path costs nothing extra: the engine's begin hook compares the
database's revision with the code's head inside each transaction. Only when
that check fails do we look closer: a blank database is created at head, an
older one is refused with SCHEMA_OUTDATED (or upgraded with
SPOOLCTL_AUTO_MIGRATE=1), a newer one with SCHEMA_TOO_NEW, a foreign one
with NotAQueue. Creating and upgrading both go through
`spoolctl.db.migration.migrate_file`, the one path that changes a schema. A
refusal writes nothing: the engine is disposed (so SQLite removes any
-wal/-shm its connection made) before the database is looked at again,
through the driver's peek engine, which creates nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine

from spoolctl.db import revision
from spoolctl.db.backends.base import Driver, OutputReader, Synchronous
from spoolctl.db.engine import RevisionMismatch, bare_connection, read_tx, write_tx

T = TypeVar("T")


@dataclass
class Queue:
    """One queue, opened: its driver and an engine of it."""

    driver: Driver
    engine: Engine

    @property
    def display(self) -> str:
        """How messages name it (a URL's password masked)."""
        return self.driver.display

    @property
    def spool(self) -> Path:
        return self.driver.spool

    @property
    def output_root(self) -> Path:
        return self.driver.output_root

    def clock(self) -> Callable[[], float]:
        """The clock liveness times are written and judged by."""
        return self.driver.clock(self.engine)

    def now(self) -> float:
        """One reading of `clock()`, for a verb that stamps a change."""
        return self.clock()()

    def output(self) -> OutputReader:
        """Where attempts' output is read from (files, or the database's copy)."""
        return self.driver.output_reader()

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run fn in one write transaction on a current schema."""
        try:
            with write_tx(self.engine) as conn:
                return fn(conn)
        except RevisionMismatch:
            self.engine.dispose()
            prepare(self.driver)
        return self._after_prepare(write_tx, fn)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run fn in one read snapshot; refuses a database that is not current
        (unless SPOOLCTL_AUTO_MIGRATE=1 lets it be upgraded first)."""
        return self._reading(read_tx, fn)

    def read_ledger(self, fn: Callable[[Connection], T]) -> T:
        """Run fn, which reads the event ledger (`services/ledger.py`), on a
        connection outside any transaction: each ledger read opens its own
        (on PostgreSQL after the readers' numbering, on this same connection
        instead of a second one). Refuses a database that is not current as
        `read` does."""
        return self._reading(bare_connection, fn)

    def _reading(
        self,
        transaction: Callable[[Engine], AbstractContextManager[Connection]],
        fn: Callable[[Connection], T],
    ) -> T:
        try:
            with transaction(self.engine) as conn:
                return fn(conn)
        except RevisionMismatch:
            self.engine.dispose()
            if not revision.auto_migrate_enabled():
                diagnose(self.driver)
                raise
            prepare(self.driver)
        return self._after_prepare(transaction, fn)

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
            diagnose(self.driver)
            raise

    def dispose(self) -> None:
        self.engine.dispose()


def open_for_write(driver: Driver, *, synchronous: Synchronous = "NORMAL") -> Queue:
    """Open (creating what the backend needs, an SQLite file and its folder)
    for a mutating verb."""
    driver.ensure()
    engine = driver.engine(
        write=True, expected_revision=revision.HEAD_REVISION, synchronous=synchronous
    )
    return Queue(driver, engine)


def open_for_read(driver: Driver) -> Queue | None:
    """Open for a read-only verb; None when there is no queue there yet."""
    if revision.schema_status(driver) is None:
        return None
    return Queue(driver, driver.engine(write=False, expected_revision=revision.HEAD_REVISION))


def diagnose(driver: Driver) -> None:
    """Raise the public error for a database whose revision is not the head."""
    status = revision.schema_status(driver)
    if status is not None:
        revision.refuse_unless_current(status, driver)


def prepare(driver: Driver) -> None:
    """Make the database usable at head: create a blank one, auto-migrate if
    the operator opted in, else raise SCHEMA_OUTDATED / SCHEMA_TOO_NEW.

    Auto-migration covers spoolctl's own revisions only; adopting a legacy
    file is always an explicit `spoolctl migrate`."""
    status = revision.schema_status(driver)
    if status is not None and status.is_head:
        return
    auto = revision.auto_migrate_enabled() and status is not None and status.is_known
    if status is None or status.is_blank or auto:
        from spoolctl.db.migration import migrate_file

        migrate_file(driver)
        return
    revision.refuse_unless_current(status, driver)
