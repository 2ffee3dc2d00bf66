"""alembic environment for spoolctl.

The CLI hands its own connection (already inside its transaction: BEGIN
IMMEDIATE on SQLite, one transaction under an advisory lock on PostgreSQL)
through `config.attributes["connection"]`, and alembic then opens no
transaction of its own; pytest-alembic hands an engine made by spoolctl's
engine factory the same way; run by hand, alembic opens `sqlalchemy.url` from
alembic.ini. The offline branch serves `spoolctl migrate --sql`, rendering for
the dialect of `sqlalchemy.url` (`sqlite://` or `postgresql://`).

`render_as_batch` only rebuilds tables on SQLite; on PostgreSQL a batch block
is plain ALTER statements. Revisions that must differ ask
`op.get_context().dialect.name`, which answers offline too.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine, create_engine

from spoolctl.db.tables import ONLY_ON, metadata

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata


def _include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Autogenerate compares an index the model creates on one backend only
    (`tables.only_on`) with a database of that backend only."""
    only = getattr(obj, "info", {}).get(ONLY_ON)
    return only is None or only == context.get_context().dialect.name


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        include_object=_include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or "sqlite://",
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if isinstance(given, Connection):
        _configure_and_run(given)
        return
    engine = given if isinstance(given, Engine) else _engine_from_url()
    with engine.connect() as conn:
        _configure_and_run(conn)
        conn.commit()


def _engine_from_url() -> Engine:
    return create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
