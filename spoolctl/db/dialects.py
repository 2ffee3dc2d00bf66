"""The few statements whose SQL differs between SQLite and PostgreSQL.

Services stay plain Core: where a mechanism differs they call a function or
use a construct from here, which picks the SQL by the connection's dialect
(PostgreSQL's parts live in `spoolctl.db.backends.postgresql`, imported only
when a PostgreSQL connection is in hand). On SQLite each hook costs one
attribute comparison.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, Text, bindparam, case, exists, func
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import Boolean


def is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def before_event(conn: Connection) -> None:
    """Called before an event row is inserted. On PostgreSQL it takes the
    ledger's transaction lock, so event ids commit in the order they are
    drawn and a reader's `id > cursor` never skips one; SQLite's single
    writer already guarantees that."""
    if is_postgres(conn):
        from spoolctl.db.backends.postgresql import lock_ledger

        lock_ledger(conn)


def before_slot_count(conn: Connection, queue: str) -> None:
    """Called before `--slots` counts a lane's running jobs: on PostgreSQL,
    claimants of one lane count one at a time (their row locks alone would let
    two of them see the same count)."""
    if is_postgres(conn):
        from spoolctl.db.backends.postgresql import lock_lane_slots

        lock_lane_slots(conn, queue)


def upsert(conn: Connection, table: Table, values: dict[str, Any], key: str) -> None:
    """Insert a row, or update the one with the same primary key."""
    stmt: Any
    if is_postgres(conn):
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt = pg_insert(table).values(**values)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table).values(**values)
    conn.execute(stmt.on_conflict_do_update(index_elements=[table.c[key]], set_=values))


class HasTag(ColumnElement[bool]):
    """`tags` (a JSON object stored as text) holds key, or key=value; a damaged
    tags value matches nothing."""

    inherit_cache = True
    type = Boolean()

    def __init__(self, tags: ColumnElement[Any], key: str, value: str | None) -> None:
        self.tags = tags
        self.key = key
        self.value = value


@compiles(HasTag, "sqlite")
def _has_tag_sqlite(element: HasTag, compiler: SQLCompiler, **kw: Any) -> str:
    tags = case((func.json_valid(element.tags), element.tags), else_="{}")
    pairs = func.json_each(tags).table_valued("key", "value")
    if element.value is None:
        clause = exists().where(pairs.c.key == element.key)
    else:
        clause = exists().where(pairs.c.key == element.key, pairs.c.value == element.value)
    return compiler.process(clause, **kw)


@compiles(HasTag, "postgresql")
def _has_tag_postgresql(element: HasTag, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.tags, **kw)
    safe = (
        f"(CASE WHEN {column} IS JSON OBJECT THEN CAST({column} AS JSONB) ELSE '{{}}'::jsonb END)"
    )
    key = compiler.process(bindparam(None, element.key, type_=Text()), **kw)
    if element.value is None:
        return f"jsonb_exists({safe}, {key})"
    value = compiler.process(bindparam(None, element.value, type_=Text()), **kw)
    return f"(({safe} ->> {key}) = {value})"
