"""Changing a queue's schema: upgrade, downgrade, legacy adoption, backup.

Every change runs in one transaction on the driver's migration engine,
holding its write lock (and its migration lock) from the first look at the
revision to the commit: two racing `migrate` runs serialize, and the second
finds nothing to do. The references are checked before the commit. What
differs is the driver's: SQLite rebuilds tables with foreign keys off, takes
its backup (`VACUUM INTO`, by a second connection, while the lock is held: a
consistent copy of exactly the state being migrated) and switches to WAL
after the commit; PostgreSQL takes an advisory lock and no backup (the
operator runs pg_dump), and holds no legacy layout to adopt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from sqlalchemy import Connection

from spoolctl.db import legacy, revision
from spoolctl.db.backends.base import Driver
from spoolctl.db.engine import read_tx, write_tx
from spoolctl.db.revision import KNOWN_REVISIONS, SchemaStatus
from spoolctl.errors import InvalidInput, SchemaTooNew


@dataclass(frozen=True)
class MigrationResult:
    from_revision: str | None
    to_revision: str | None
    applied: list[str]
    backup_path: Path | None
    legacy_adopted: bool
    legacy_schema_version: int | None = None
    relocated_paths: int = 0
    downgrade: bool = False
    quarantined_job_ids: list[int] = field(default_factory=list)
    quarantined_attempts: int = 0


@dataclass(frozen=True)
class Adoption:
    """What adopting a legacy file did beyond copying rows."""

    relocated_paths: int = 0
    quarantined_job_ids: list[int] = field(default_factory=list)
    quarantined_attempts: int = 0


@dataclass(frozen=True)
class Drops:
    """What a downgrade was told it may delete (each refused without it)."""

    delete_stored_output: bool = False
    drop_schedules: bool = False
    drop_resources: bool = False


def migrate_file(
    driver: Driver,
    target: str | None = None,
    *,
    downgrade: bool = False,
    backup: bool = True,
    delete_stored_output: bool = False,
    drop_schedules: bool = False,
    drop_resources: bool = False,
) -> MigrationResult:
    """Bring the queue to `target` (default: the head; creating an SQLite file
    when missing), backing it up first where the driver takes backups. A
    downgrade below 0004_output_chunks is refused (SafetyBlock, nothing
    changed) while output is stored in the database, unless
    `delete_stored_output`; below 0006_schedules while a schedule exists,
    unless `drop_schedules`; below 0010_resources while a device is held or
    an unfinished job asks for a weight or GPUs, unless `drop_resources`.

    One transaction: its write lock (and the driver's migration lock) held
    from the first look at the revision to the commit, so two racing runs
    serialize and the second finds nothing to do; a failure anywhere (a
    refusal included) rolls back every step and removes the backup."""
    target = target or revision.HEAD_REVISION
    driver.ensure()
    engine = driver.migration_engine()
    saved: Path | None = None
    committed = False
    try:
        with write_tx(engine) as conn:
            driver.lock_for_migration(conn)
            status = revision.inspect_schema(conn)
            steps = plan(status, target, downgrade=downgrade, driver=driver)
            if not steps:
                return MigrationResult(status.current, status.current, [], None, False)
            saved = driver.take_backup(status.label) if backup and status.has_tables else None
            drops = Drops(delete_stored_output, drop_schedules, drop_resources)
            adoption = _apply(conn, driver, status, target, downgrade, drops)
            revision.check_foreign_keys(conn)
            reached = revision.inspect_schema(conn).current
        committed = True
        driver.after_migration(engine)
    except BaseException:
        if saved is not None and not committed:
            # Refused or failed inside the transaction: it rolled back, the
            # database is as it was, and a copy of it is only clutter.
            saved.unlink(missing_ok=True)
        raise
    finally:
        engine.dispose()
    return MigrationResult(
        from_revision=status.current,
        to_revision=reached,
        applied=steps,
        backup_path=saved,
        legacy_adopted=status.is_legacy,
        legacy_schema_version=status.legacy_version,
        relocated_paths=adoption.relocated_paths,
        downgrade=downgrade,
        quarantined_job_ids=adoption.quarantined_job_ids,
        quarantined_attempts=adoption.quarantined_attempts,
    )


def plan(status: SchemaStatus, target: str, *, downgrade: bool, driver: Driver) -> list[str]:
    """The revisions a change from `status` to `target` applies (or undoes), in order."""
    _refuse_foreign(status, driver)
    if target not in KNOWN_REVISIONS:
        raise InvalidInput(
            f"unknown revision {target!r}; known: {', '.join(KNOWN_REVISIONS)}",
            known=list(KNOWN_REVISIONS),
        )
    if downgrade:
        return _downgrade_steps(status, target)
    if status.current is not None and _index(target) < _index(status.current):
        raise InvalidInput(
            f"{target} is older than the file's revision {status.current}; "
            f"use: spoolctl migrate --downgrade {target} --yes"
        )
    return revision.revisions_between(status.current, target)


def _downgrade_steps(status: SchemaStatus, target: str) -> list[str]:
    if status.current is None:
        held = "an unadopted legacy database" if status.is_legacy else "no schema yet"
        raise InvalidInput(f"nothing to downgrade: the file holds {held}")
    if _index(target) > _index(status.current):
        raise InvalidInput(
            f"{target} is newer than the file's revision {status.current}; use: --to {target}"
        )
    undone = KNOWN_REVISIONS[_index(target) + 1 : _index(status.current) + 1]
    return list(reversed(undone))


def _index(rev: str) -> int:
    return KNOWN_REVISIONS.index(rev)


def _refuse_foreign(status: SchemaStatus, driver: Driver) -> None:
    """Never touch a database this code does not understand."""
    path = driver.display
    if status.current is not None and not status.is_known:
        revision.refuse_unless_current(status, driver)
    if status.is_legacy and status.legacy_version not in legacy.LEGACY_VERSIONS:
        if (status.legacy_version or 0) > max(legacy.LEGACY_VERSIONS):
            raise SchemaTooNew(
                f"{path} has legacy schema_version {status.legacy_version}, newer than "
                f"this spoolctl can adopt (up to {max(legacy.LEGACY_VERSIONS)})",
                legacy_version=status.legacy_version,
            )
        raise InvalidInput(f"{path} has an unreadable legacy schema_version; not adopting it")
    if status.is_foreign:
        revision.refuse_unless_current(status, driver)


def _apply(
    conn: Connection,
    driver: Driver,
    status: SchemaStatus,
    target: str,
    downgrade: bool,
    drops: Drops | None = None,
) -> Adoption:
    """Run the change inside the caller's transaction."""
    if downgrade:
        revision.downgrade_in(conn, target, **asdict(drops or Drops()))
        return Adoption()
    adoption = Adoption()
    if status.is_legacy:  # only a driver whose files the original wrote finds one
        adoption = adopt(conn, driver.spool, status.legacy_version or 0)
    if revision.inspect_schema(conn).current != target:
        revision.upgrade_in(conn, target)
    return adoption


def adopt(conn: Connection, spool: Path, schema_version: int) -> Adoption:
    """Convert a legacy file into the adoption revision's layout, in place;
    rows no spoolctl state can hold are quarantined, never a reason to abort."""
    layout = legacy.read_layout(conn, schema_version)
    moves = legacy.relocations(conn, spool)
    job_ids, n_attempts = legacy.quarantine_counts(conn, layout)
    for statement in legacy.detach_statements():
        conn.exec_driver_sql(statement)
    revision.upgrade_in(conn, legacy.ADOPTION_REVISION)
    for statement in legacy.fill_statements(layout, moves):
        conn.exec_driver_sql(statement)
    return Adoption(len(moves), job_ids, n_attempts)


def migration_sql(
    driver: Driver, target: str, *, downgrade: bool = False, delete_stored_output: bool = False
) -> str:
    """The SQL `migrate_file` would run on this queue, rendered without changing
    it, in the backend's own dialect (on PostgreSQL in one BEGIN ... COMMIT; a
    downgrade below 0004_output_chunks aborts there while output is stored,
    unless `delete_stored_output`)."""
    status = _read_status(driver)
    steps = plan(status, target, downgrade=downgrade, driver=driver)
    if not steps:
        return f"-- {driver.display} is already at {status.label}: nothing to run\n"
    if not status.is_legacy:
        return revision.offline_sql(
            status.current,
            target,
            downgrade=downgrade,
            dialect=driver.name,
            delete_stored_output=delete_stored_output,
        )
    layout, moves = _legacy_facts(driver, status.legacy_version or 0)
    parts = [
        f"-- adopt {driver.display} (original spoolctl, schema_version {layout.schema_version})\n",
        *(f"{s};\n" for s in legacy.detach_statements()),
        revision.offline_sql(None, legacy.ADOPTION_REVISION),
        *(f"{s};\n" for s in legacy.fill_statements(layout, moves)),
    ]
    if target != legacy.ADOPTION_REVISION:
        parts.append(revision.offline_sql(legacy.ADOPTION_REVISION, target))
    return "".join(parts)


def _read_status(driver: Driver) -> SchemaStatus:
    status = revision.schema_status(driver)
    return status if status is not None else SchemaStatus(None, None, has_tables=False)


def _legacy_facts(driver: Driver, version: int) -> tuple[legacy.Layout, list[legacy.Relocation]]:
    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            return legacy.read_layout(conn, version), legacy.relocations(conn, driver.spool)
    finally:
        engine.dispose()
