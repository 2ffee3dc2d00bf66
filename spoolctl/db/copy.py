"""Copying an SQLite queue into an empty PostgreSQL database: the table plumbing.

Everything on the target happens in one PostgreSQL transaction, under the
migration lock: check that the database holds no queue yet, create the schema
at head, copy every row with its id, move each id sequence past every id the
source ever gave out. PostgreSQL's DDL is transactional, so a failure anywhere
(or a dry run) rolls all of it back: the database is left exactly as it was
found, empty. The source is only read, in the caller's snapshot.

SQLite integers are 64-bit and its text may hold any value; a row the target's
columns cannot hold is refused by name before anything is written (integers
out of range) or fails the whole copy (anything else), never stored altered.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy
from sqlalchemy import BigInteger, Connection, SmallInteger, Table, func, or_, select, text
from sqlalchemy.exc import DataError, IntegrityError

from spoolctl.db import revision
from spoolctl.db.backends.base import Driver
from spoolctl.db.tables import (
    LEDGER_SEQUENCE,
    attempts,
    control_requests,
    device_holds,
    devices,
    job_dependencies,
    job_events,
    jobs,
    lanes,
    output_chunks,
    schedule_occurrences,
    schedules,
    workers,
)
from spoolctl.errors import Conflict, InvalidInput

COPY_ORDER: tuple[Table, ...] = (
    jobs,
    workers,
    lanes,
    attempts,
    devices,
    device_holds,
    control_requests,
    job_events,
    job_dependencies,
    output_chunks,
    schedules,
    schedule_occurrences,
)
"""Every queue table, parents before children: each reference is checked as
it is written (a device's holds after the device and the attempt holding
it, `devices.held` copied as it is: the sum of its holds)."""
SEQUENCED: tuple[Table, ...] = (
    jobs,
    attempts,
    device_holds,
    control_requests,
    job_events,
    output_chunks,
    schedules,
    schedule_occurrences,
)
"""Tables whose integer id comes from a sequence on PostgreSQL."""
BATCH_ROWS = 1000
SHOWN_OUT_OF_RANGE = 5
"""Rows named per column when integers do not fit the target."""


@contextmanager
def target_transaction(target: Driver, *, commit: bool) -> Iterator[Connection]:
    """One write transaction on the PostgreSQL database under the migration
    lock (waiting as long as a migrate would for another copy or migrate);
    committed only if `commit` and the body returned normally."""
    engine = target.migration_engine()
    try:
        with target.translate_errors(engine), engine.connect() as conn:
            transaction = conn.begin()
            try:
                target.lock_for_migration(conn)
                yield conn
            except BaseException:
                transaction.rollback()
                raise
            if commit:
                transaction.commit()
            else:
                transaction.rollback()
    finally:
        engine.dispose()


def prepare_target(conn: Connection, target: Driver) -> None:
    """Refuse a database that holds anything (CONFLICT, nothing written); else
    create the schema at head inside the caller's transaction.

    Accepted: no tables at all, or a spoolctl schema of a known revision whose
    tables are all empty (upgraded to head here). A database with tables of
    another program is refused like a filled queue: spoolctl shares no schema."""
    shown = target.display
    status = revision.inspect_schema(conn)
    if status.has_tables and status.current is None:
        raise Conflict(
            f"{shown} holds tables that are not a spoolctl queue; copy into an empty database "
            "(CREATE DATABASE ...). Nothing was written",
            target=shown,
            reason="foreign_tables",
        )
    if status.current is not None and not status.is_known:
        revision.refuse_unless_current(status, target)
    filled = filled_tables(conn)
    if filled:
        listed = ", ".join(f"{name} {n}" for name, n in filled.items())
        raise Conflict(
            f"{shown} already holds a spoolctl queue with rows ({listed}); copy-to only fills "
            "an empty database. Nothing was written",
            target=shown,
            reason="not_empty",
            rows=filled,
        )
    revision.upgrade_in(conn, revision.HEAD_REVISION)


def filled_tables(conn: Connection) -> dict[str, int]:
    """Rows in each queue table the database has (tables it lacks count as empty)."""
    present = set(sqlalchemy.inspect(conn).get_table_names())
    counts = {
        t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
        for t in COPY_ORDER
        if t.name in present
    }
    return {name: n for name, n in counts.items() if n}


def dangling_references(source: Connection) -> dict[str, int]:
    """Rows of the SQLite source that name a row it does not have (PostgreSQL
    would refuse them), per table."""
    found: dict[str, int] = {}
    for row in source.exec_driver_sql("PRAGMA foreign_key_check"):
        found[str(row[0])] = found.get(str(row[0]), 0) + 1
    return found


def integer_bounds(column_type: Any) -> tuple[int, int] | None:
    """The range a target integer column holds; None when it holds all of SQLite's."""
    if isinstance(column_type, BigInteger) or not isinstance(column_type, sqlalchemy.Integer):
        return None
    bits = 16 if isinstance(column_type, SmallInteger) else 32
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def out_of_range(source: Connection, target: Connection) -> list[dict[str, Any]]:
    """Integers of the source that the target's columns cannot hold: per
    column, the primary keys of the first few such rows."""
    inspector = sqlalchemy.inspect(target)
    found = []
    for table in COPY_ORDER:
        for column in inspector.get_columns(table.name):
            bounds = integer_bounds(column["type"])
            if bounds is None or column["name"] not in table.c:
                continue
            value = table.c[column["name"]]
            keys = list(table.primary_key.columns)
            rows = source.execute(
                select(*keys)
                .where(or_(value < bounds[0], value > bounds[1]))
                .order_by(*keys)
                .limit(SHOWN_OUT_OF_RANGE)
            ).all()
            if rows:
                shown = [row[0] if len(keys) == 1 else list(row) for row in rows]
                found.append({"table": table.name, "column": column["name"], "rows": shown})
    return found


def copy_rows(source: Connection, target: Connection, table: Table, into: Driver) -> int:
    """Every row of `table`, ids included, in primary key order, BATCH_ROWS
    per executemany; returns how many."""
    rows = source.execute(select(table).order_by(*table.primary_key.columns)).mappings()
    copied = 0
    while batch := rows.fetchmany(BATCH_ROWS):
        insert_rows(target, table, [positioned(table, dict(row)) for row in batch], into)
        copied += len(batch)
    return copied


def positioned(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """An SQLite event's id is its ledger position: PostgreSQL keeps it as the
    event's `seq`, so a cursor read from the source stays valid on the target."""
    return {**row, "seq": row["id"]} if table is job_events else row


def insert_rows(
    target: Connection, table: Table, rows: Sequence[dict[str, Any]], into: Driver
) -> None:
    """One executemany; a row PostgreSQL refuses fails the copy with its reason."""
    if not rows:
        return
    try:
        target.execute(table.insert(), list(rows))
    except (DataError, IntegrityError) as exc:
        reason = into.redact(str(exc.orig).strip().splitlines()[0])
        raise InvalidInput(
            f"a row of {table.name} cannot be stored in {into.display}: {reason}; "
            "nothing was written",
            table=table.name,
            database_error=reason,
        ) from None


def issued_ids(source: Connection, table: Table) -> int:
    """The highest id the source ever gave out in `table`: its highest row, or
    more when the newest rows were pruned (SQLite's AUTOINCREMENT remembers)."""
    top = source.execute(select(func.max(table.c.id))).scalar_one() or 0
    remembered = source.exec_driver_sql(
        "SELECT seq FROM sqlite_sequence WHERE name = ?", (table.name,)
    ).scalar()
    return max(int(top), int(remembered or 0))


def advance_sequences(source: Connection, target: Connection) -> None:
    """Move each id sequence of the target past every id the source gave out,
    so a new row never takes an id the queue already used, and the ledger's
    positions past every event id (the source's cursors)."""
    for table in SEQUENCED:
        floor = issued_ids(source, table)
        if floor:
            target.execute(
                text(
                    "SELECT setval(s, GREATEST(:floor, COALESCE(pg_sequence_last_value(s), 0)))"
                    " FROM CAST(pg_get_serial_sequence(:t, 'id') AS regclass) AS s"
                ),
                {"floor": floor, "t": table.name},
            )
            if table is job_events:
                target.execute(
                    text(f"SELECT setval('{LEDGER_SEQUENCE.name}', :floor)"), {"floor": floor}
                )


def next_ids(target: Connection) -> dict[str, int]:
    """The id each sequenced table gives its next row."""
    found = {}
    for table in SEQUENCED:
        last = target.execute(
            text(
                "SELECT pg_sequence_last_value(CAST(pg_get_serial_sequence(:t, 'id') AS regclass))"
            ),
            {"t": table.name},
        ).scalar()
        found[table.name] = int(last or 0) + 1
    return found


def streams_with_chunks(source: Connection) -> set[tuple[int, str]]:
    """(attempt id, stream) pairs the source already stores chunks of."""
    query = select(output_chunks.c.attempt_id, output_chunks.c.stream).distinct()
    return {(int(row[0]), str(row[1])) for row in source.execute(query)}


def output_totals(target: Connection) -> tuple[int, int, int]:
    """(chunks, bytes, streams cut at the cap) the target stores."""
    found = target.execute(
        select(
            func.count(),
            func.coalesce(func.sum(func.length(output_chunks.c.data)), 0),
            func.coalesce(func.sum(output_chunks.c.truncated), 0),
        )
    ).one()
    return int(found[0]), int(found[1]), int(found[2])
