"""Changing a queue's schema: upgrade, downgrade, legacy adoption, backup.

SQLite: every change runs in one BEGIN IMMEDIATE transaction on a connection
with foreign keys off (batch rebuilds drop and rename referenced tables), and
is committed only after `PRAGMA foreign_key_check` comes back clean. Holding
the write lock from the first look at the revision to the commit is what makes
two racing `migrate` runs safe: the second waits, then finds nothing to do.
The backup is taken while that lock is held, by a second connection running
`VACUUM INTO`: it is a consistent copy of exactly the state being migrated.

PostgreSQL: every change runs in one transaction (its DDL is transactional)
that first takes a transaction-level advisory lock, so racing runs serialize
the same way and a failure anywhere rolls back every step. There is no file
to copy: no backup is taken (the operator runs pg_dump), and no legacy layout
exists there to adopt.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, Engine

from spoolctl.config import busy_timeout_s
from spoolctl.db import legacy, revision
from spoolctl.db.engine import (
    DB_FILE_MODE,
    LOCK_WAIT_OPTION,
    READ_ONLY_OPTION,
    RevisionMismatch,
    ensure_spool,
    make_engine,
    make_peek_engine,
    read_tx,
    switch_to_wal,
    write_tx,
)
from spoolctl.db.queue import Target, display, schema_status
from spoolctl.db.revision import KNOWN_REVISIONS, SchemaStatus
from spoolctl.errors import InvalidInput, SchemaTooNew

MIGRATE_BUSY_TIMEOUT_S = 60.0
"""A migrate waiting behind another migrate's rebuild waits at least this long."""


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


def migrate_file(
    path: Target,
    target: str | None = None,
    *,
    downgrade: bool = False,
    backup: bool = True,
    delete_stored_output: bool = False,
) -> MigrationResult:
    """Bring the queue to `target` (default: the head; creating the file when
    missing), backing an SQLite file up first. `path` is an SQLite file or a
    PostgreSQL URL. A downgrade below 0004_output_chunks is refused
    (SafetyBlock, nothing changed) while output is stored in the database,
    unless `delete_stored_output`."""
    target = target or revision.HEAD_REVISION
    if isinstance(path, str):
        return _migrate_postgres(
            path, target, downgrade=downgrade, delete_stored_output=delete_stored_output
        )
    ensure_spool(path)
    timeout_s = max(busy_timeout_s(), MIGRATE_BUSY_TIMEOUT_S)
    engine = make_engine(
        path,
        write=True,
        busy_timeout_s=timeout_s,
        synchronous="FULL",
        foreign_keys=False,
    )
    saved: Path | None = None
    committed = False
    try:
        with write_tx(engine) as conn:
            status = revision.inspect_schema(conn)
            steps = plan(status, target, downgrade=downgrade, path=path)
            if not steps:
                return MigrationResult(status.current, status.current, [], None, False)
            saved = take_backup(path, status.label) if backup and status.has_tables else None
            adoption = _apply(conn, path, status, target, downgrade, delete_stored_output)
            revision.check_foreign_keys(conn)
            reached = revision.inspect_schema(conn).current
        committed = True
        switch_to_wal(engine, timeout_s)
    except BaseException:
        if saved is not None and not committed:
            # Refused or failed inside the transaction: it rolled back, the
            # file is as it was, and a copy of it is only clutter.
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


def _migrate_postgres(
    url: str, target: str, *, downgrade: bool, delete_stored_output: bool
) -> MigrationResult:
    """One transaction under the migration lock: look, plan, apply, commit;
    any failure (a refusal included) rolls back every step."""
    from spoolctl.db.backends.postgresql import lock_migrations

    engine = _postgres_engine(url)
    try:
        with write_tx(engine) as conn:
            lock_migrations(conn)
            status = revision.inspect_schema(conn)
            steps = plan(status, target, downgrade=downgrade, path=url)
            if not steps:
                return MigrationResult(status.current, status.current, [], None, False)
            _apply(conn, url, status, target, downgrade, delete_stored_output)
            reached = revision.inspect_schema(conn).current
    finally:
        engine.dispose()
    return MigrationResult(status.current, reached, steps, None, False, downgrade=downgrade)


def _postgres_engine(url: str) -> Engine:
    """A write engine that checks no revision and waits for locks (another
    migrate's advisory lock, workers' row locks) as long as a migrate may."""
    from spoolctl.db.backends import postgresql

    return postgresql.make_engine(
        url,
        write=True,
        busy_timeout_s=max(busy_timeout_s(), MIGRATE_BUSY_TIMEOUT_S),
        expected_revision=None,
        lock_wait_option=LOCK_WAIT_OPTION,
        read_only_option=READ_ONLY_OPTION,
        on_mismatch=RevisionMismatch,
    )


def plan(status: SchemaStatus, target: str, *, downgrade: bool, path: Target) -> list[str]:
    """The revisions a change from `status` to `target` applies (or undoes), in order."""
    _refuse_foreign(status, path)
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


def _refuse_foreign(status: SchemaStatus, path: Target) -> None:
    """Never touch a file this code does not understand."""
    if status.current is not None and not status.is_known:
        revision.refuse_unless_current(status, path)
    if status.is_legacy and status.legacy_version not in legacy.LEGACY_VERSIONS:
        if (status.legacy_version or 0) > max(legacy.LEGACY_VERSIONS):
            raise SchemaTooNew(
                f"{path} has legacy schema_version {status.legacy_version}, newer than "
                f"this spoolctl can adopt (up to {max(legacy.LEGACY_VERSIONS)})",
                legacy_version=status.legacy_version,
            )
        raise InvalidInput(f"{path} has an unreadable legacy schema_version; not adopting it")
    if status.is_foreign:
        revision.refuse_unless_current(status, path)


def _apply(
    conn: Connection,
    path: Target,
    status: SchemaStatus,
    target: str,
    downgrade: bool,
    delete_stored_output: bool = False,
) -> Adoption:
    """Run the change inside the caller's transaction."""
    if downgrade:
        revision.downgrade_in(conn, target, delete_stored_output=delete_stored_output)
        return Adoption()
    adoption = Adoption()
    if status.is_legacy and isinstance(path, Path):
        adoption = adopt(conn, path, status.legacy_version or 0)
    if revision.inspect_schema(conn).current != target:
        revision.upgrade_in(conn, target)
    return adoption


def adopt(conn: Connection, path: Path, schema_version: int) -> Adoption:
    """Convert a legacy file into the adoption revision's layout, in place;
    rows no spoolctl state can hold are quarantined, never a reason to abort."""
    layout = legacy.read_layout(conn, schema_version)
    moves = legacy.relocations(conn, path.parent)
    job_ids, n_attempts = legacy.quarantine_counts(conn, layout)
    for statement in legacy.detach_statements():
        conn.exec_driver_sql(statement)
    revision.upgrade_in(conn, legacy.ADOPTION_REVISION)
    for statement in legacy.fill_statements(layout, moves):
        conn.exec_driver_sql(statement)
    return Adoption(len(moves), job_ids, n_attempts)


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


def migration_sql(
    path: Target, target: str, *, downgrade: bool = False, delete_stored_output: bool = False
) -> str:
    """The SQL `migrate_file` would run on this queue, rendered without changing
    it (for PostgreSQL: PostgreSQL's DDL, in one BEGIN ... COMMIT; a downgrade
    below 0004_output_chunks aborts there while output is stored, unless
    `delete_stored_output`)."""
    status = _read_status(path)
    steps = plan(status, target, downgrade=downgrade, path=path)
    if not steps:
        return f"-- {display(path)} is already at {status.label}: nothing to run\n"
    if isinstance(path, str):
        return revision.offline_sql(
            status.current,
            target,
            downgrade=downgrade,
            dialect="postgresql",
            delete_stored_output=delete_stored_output,
        )
    if not status.is_legacy:
        return revision.offline_sql(status.current, target, downgrade=downgrade)
    layout, moves = _legacy_facts(path, status.legacy_version or 0)
    parts = [
        f"-- adopt {path} (original spoolctl, schema_version {layout.schema_version})\n",
        *(f"{s};\n" for s in legacy.detach_statements()),
        revision.offline_sql(None, legacy.ADOPTION_REVISION),
        *(f"{s};\n" for s in legacy.fill_statements(layout, moves)),
    ]
    if target != legacy.ADOPTION_REVISION:
        parts.append(revision.offline_sql(legacy.ADOPTION_REVISION, target))
    return "".join(parts)


def _read_status(path: Target) -> SchemaStatus:
    status = schema_status(path)
    return status if status is not None else SchemaStatus(None, None, has_tables=False)


def _legacy_facts(path: Path, version: int) -> tuple[legacy.Layout, list[legacy.Relocation]]:
    engine = make_peek_engine(path, busy_timeout_s())
    try:
        with read_tx(engine) as conn:
            return legacy.read_layout(conn, version), legacy.relocations(conn, path.parent)
    finally:
        engine.dispose()
