"""Schema revisions: what the code expects, what a file has, and upgrading it.

The check on open is cheap and never imports alembic: the head revision is a
constant (`db/revisions.py`; a test keeps it equal to the revision scripts' head), and the
file's revision is one SELECT. alembic is imported lazily, only to create a
new database or to migrate one.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sqlalchemy import Connection

from spoolctl.config import auto_migrate
from spoolctl.db.engine import read_tx
from spoolctl.db.revisions import HEAD_REVISION as HEAD_REVISION
from spoolctl.db.revisions import KNOWN_REVISIONS as KNOWN_REVISIONS
from spoolctl.errors import NotAQueue, SchemaOutdated, SchemaTooNew

if TYPE_CHECKING:
    from alembic.config import Config

    from spoolctl.db.backends.base import Driver

DELETE_STORED_OUTPUT_FLAG = "--delete-stored-output"
"""The `migrate` flag that lets a downgrade below 0004_output_chunks (which
drops the output stored in the database) delete it; without it such a
downgrade is refused while any output is stored."""
DELETE_STORED_OUTPUT = "delete_stored_output"
"""The alembic Config attribute that carries that flag to the revision script."""
DROP_SCHEDULES_FLAG = "--drop-schedules"
"""The `migrate` flag that lets a downgrade below 0006_schedules delete the
schedules; without it such a downgrade is refused while any exists."""
DROP_SCHEDULES = "drop_schedules"
"""The alembic Config attribute that carries that flag to the revision script."""
DROP_RESOURCES_FLAG = "--drop-resources"
"""The `migrate` flag that lets a downgrade below 0010_resources release the
device holds and forget the requests of unfinished jobs; without it such a
downgrade is refused while a device is held or an unfinished job asks for a
weight or GPUs."""
DROP_RESOURCES = "drop_resources"
"""The alembic Config attribute that carries that flag to the revision script."""


@dataclass(frozen=True)
class SchemaStatus:
    """What a database file holds, told without changing it."""

    current: str | None
    legacy_version: int | None
    has_tables: bool

    @property
    def is_head(self) -> bool:
        return self.current == HEAD_REVISION

    @property
    def is_legacy(self) -> bool:
        return self.current is None and self.legacy_version is not None

    @property
    def is_blank(self) -> bool:
        return not self.has_tables

    @property
    def is_foreign(self) -> bool:
        """Tables, but neither an alembic revision nor a legacy layout."""
        return self.current is None and self.legacy_version is None and self.has_tables

    @property
    def is_known(self) -> bool:
        return self.current in KNOWN_REVISIONS

    @property
    def pending(self) -> list[str]:
        return revisions_between(self.current, HEAD_REVISION)

    @property
    def label(self) -> str:
        """How backups and messages name what the file holds."""
        if self.is_legacy:
            return f"legacy-v{self.legacy_version}"
        return self.current or "none"


def revisions_between(start: str | None, target: str) -> list[str]:
    """Revisions an upgrade from `start` (None: nothing yet) to `target` applies."""
    if start is not None and start not in KNOWN_REVISIONS:
        return []
    low = 0 if start is None else KNOWN_REVISIONS.index(start) + 1
    return list(KNOWN_REVISIONS[low : KNOWN_REVISIONS.index(target) + 1])


def inspect_schema(conn: Connection) -> SchemaStatus:
    """Read the revision (alembic) or schema_version (legacy) of a database."""
    from spoolctl.db.backends import statements

    backend = statements(conn)
    tables = backend.table_names(conn)
    current = None
    if "alembic_version" in tables:
        current = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    legacy = None if current is not None else backend.legacy_version(conn, tables)
    return SchemaStatus(current=current, legacy_version=legacy, has_tables=bool(tables))


def schema_status(driver: Driver) -> SchemaStatus | None:
    """What the database holds, read without the write lock and without
    creating or changing anything; None when there is nothing there (no
    file, an empty one, or a database without tables)."""
    if not driver.may_hold_a_queue():
        return None
    engine = driver.peek_engine()
    try:
        with read_tx(engine) as conn:
            status = inspect_schema(conn)
    finally:
        engine.dispose()
    return status if status.has_tables else None


def refuse_unless_current(status: SchemaStatus, where: Driver) -> None:
    """Raise the public error for a database this code must not use as it is."""
    if status.is_head:
        return
    db_path = where.display
    if status.is_foreign:
        raise NotAQueue(
            f"{db_path} is {where.kind_of_database} but not a spoolctl queue (no "
            "alembic_version, no legacy meta table); spoolctl, `migrate` included, never "
            "changes it. Check --db / SPOOLCTL_DB / config db_path",
            path=str(db_path),
        )
    migrate_cmd = f"spoolctl migrate --db {db_path}"
    if status.is_legacy:
        raise SchemaOutdated(
            f"{db_path} was written by the original spoolctl (schema_version "
            f"{status.legacy_version}); code head is {HEAD_REVISION}. "
            f"Adopt it (a backup is written first) with: {migrate_cmd}",
            current=None,
            legacy_version=status.legacy_version,
            head=HEAD_REVISION,
            command=migrate_cmd,
        )
    if status.current is not None and not status.is_known:
        raise SchemaTooNew(
            f"{db_path} is at schema revision {status.current}, newer than this spoolctl "
            f"knows (head {HEAD_REVISION}); upgrade spoolctl. Nothing was written.",
            current=status.current,
            head=HEAD_REVISION,
        )
    raise SchemaOutdated(
        f"{db_path} is at schema revision {status.current or 'none'}, older than this "
        f"spoolctl's head {HEAD_REVISION}; run: {migrate_cmd} "
        "(or set SPOOLCTL_AUTO_MIGRATE=1)",
        current=status.current,
        head=HEAD_REVISION,
        command=migrate_cmd,
    )


def auto_migrate_enabled() -> bool:
    return auto_migrate()  # the one reading of SPOOLCTL_AUTO_MIGRATE (config.py)


def migrations_dir() -> Path:
    """The revision scripts of the code that runs: inside the installed wheel,
    else the folder beside the package in its repository. Never looked up by
    module name: an editable install maps `spoolctl._migrations` to its own
    checkout, whose scripts need not be those of a spoolctl imported from
    another (a worktree's)."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_migrations"
    return shipped if shipped.is_dir() else package.parent / "migrations"


def alembic_config(
    connection: Connection | None = None,
    output_buffer: TextIO | None = None,
    *,
    dialect: str = "sqlite",
    **attributes: Any,
) -> Config:
    """alembic's Config built in code: no ini file is needed at run time.
    dialect: what offline (`--sql`) mode renders for, "sqlite" or "postgresql"."""
    from alembic.config import Config

    config = Config(output_buffer=output_buffer)
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", f"{dialect}://")
    if connection is not None:
        config.attributes["connection"] = connection
    config.attributes.update(attributes)
    return config


def upgrade_in(conn: Connection, target: str = "head") -> None:
    """Run revision scripts on a connection already inside a write transaction."""
    from alembic import command

    command.upgrade(alembic_config(conn), target)


def downgrade_in(
    conn: Connection,
    target: str,
    *,
    delete_stored_output: bool = False,
    drop_schedules: bool = False,
    drop_resources: bool = False,
) -> None:
    """Run downgrade scripts on a connection already inside a write transaction.
    Below 0004_output_chunks its script refuses while output is stored,
    unless `delete_stored_output`; below 0006_schedules while a schedule
    exists, unless `drop_schedules`; below 0010_resources while a device is
    held or an unfinished job asks for a weight or GPUs, unless
    `drop_resources`."""
    from alembic import command

    config = alembic_config(conn)
    config.attributes[DELETE_STORED_OUTPUT] = delete_stored_output
    config.attributes[DROP_SCHEDULES] = drop_schedules
    config.attributes[DROP_RESOURCES] = drop_resources
    command.downgrade(config, target)


def offline_sql(
    start: str | None,
    target: str,
    *,
    downgrade: bool = False,
    dialect: str = "sqlite",
    delete_stored_output: bool = False,
) -> str:
    """The SQL alembic would run from `start` to `target` on `dialect`, rendered
    without a database. Rendered for PostgreSQL, a downgrade below
    0004_output_chunks first runs a statement that aborts the script while
    output is stored, unless `delete_stored_output`."""
    from alembic import command

    buffer = io.StringIO()
    config = alembic_config(output_buffer=buffer, dialect=dialect)
    config.attributes[DELETE_STORED_OUTPUT] = delete_stored_output
    span = target if start is None else f"{start}:{target}"
    if downgrade:
        command.downgrade(config, span, sql=True)
    else:
        command.upgrade(config, span, sql=True)
    return buffer.getvalue()


@dataclass(frozen=True)
class RevisionInfo:
    revision: str
    down_revision: str | None
    doc: str


def history() -> list[RevisionInfo]:
    """The shipped revision scripts, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    found = [
        RevisionInfo(s.revision, _single(s.down_revision), s.doc or "")
        for s in scripts.walk_revisions()
    ]
    return list(reversed(found))


def _single(down: str | Sequence[str] | None) -> str | None:
    if down is None or isinstance(down, str):
        return down
    return ",".join(down)


def check_foreign_keys(conn: Connection) -> None:
    """Refuse to commit a migration that left a dangling reference."""
    from spoolctl.db.backends import statements

    statements(conn).check_references(conn)
