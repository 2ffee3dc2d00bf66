"""Statements of the worker's hot path, compiled once and run on the driver.

Each statement is still written with SQLAlchemy Core against the tables in
`tables.py`; only the per-execution machinery is skipped. Measured on a
1,000-job drain, SQLAlchemy spent about 60 us per statement against 8 us for
the same SQL on the sqlite3 cursor, and a job runs a dozen statements. The
statement runs inside the caller's SQLAlchemy transaction (the same driver
connection, after the engine's BEGIN IMMEDIATE), so atomicity is unchanged.
Only plain column types are selected (no result processors are needed).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class Compiled:
    sql: str
    order: tuple[str, ...] | None
    """Bind names in order for a positional driver (sqlite3: `?`); None for a
    driver taking named parameters (psycopg: `%(name)s`)."""
    defaults: dict[str, Any]


OPENING_INFO = "spoolctl_opening"
"""A connection's info key: its transaction's opening, where the backend
sends it with the transaction's first statement instead of at BEGIN
(PostgreSQL's write engines: `postgresql.begin.Opening`)."""


def opened(conn: Connection) -> None:
    """Send conn's transaction opening if it is still due (before a
    statement that bypasses SQLAlchemy's events, as ours do)."""
    opening = conn.connection.info.pop(OPENING_INFO, None)
    if opening is not None:
        opening.now(conn)


def _cursor(conn: Connection) -> Any:
    """A cursor of conn's driver connection, for a statement that bypasses
    SQLAlchemy's events: the one way `Prepared` runs one, so the
    transaction's opening goes out first wherever it is still due."""
    record = conn.connection
    opening = record.info.pop(OPENING_INFO, None)
    if opening is not None:
        opening.now(conn)
    return record.driver_connection.cursor()  # type: ignore[union-attr]


class Prepared:
    """One Core statement, compiled for each dialect on first use."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[type, Compiled] = {}
        """Compiled once per dialect (a queue's backend), keyed by its class."""
        self._row: Any = None

    def _compile(self, conn: Connection) -> Compiled:
        found = self._compiled[type(conn.dialect)] = self.compiled_for(conn.dialect)
        return found

    def compiled_for(self, dialect: Dialect) -> Compiled:
        """The statement as `dialect` runs it (what the lean path's SQL is
        generated from: `services/statements.py`)."""
        compiled = cast(SQLCompiler, self.statement.compile(dialect=dialect))
        order = tuple(compiled.positiontup or ()) if compiled.positional else None
        return Compiled(str(compiled), order, dict(compiled.params))

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """Run on the driver cursor; returns that cursor (rowcount, rows)."""
        compiled = self._compiled.get(type(conn.dialect)) or self._compile(conn)
        values = compiled.defaults if not params else {**compiled.defaults, **params}
        cursor = _cursor(conn)
        if compiled.order is None:
            cursor.execute(compiled.sql, values)
        else:
            cursor.execute(compiled.sql, [values[name] for name in compiled.order])
        return cursor

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run once per parameter set, in one driver call: psycopg sends them
        all in one pipeline (one round trip), sqlite3 loops in C."""
        compiled = self._compiled.get(type(conn.dialect)) or self._compile(conn)
        cursor = _cursor(conn)
        values = [{**compiled.defaults, **row} for row in rows]
        if compiled.order is None:
            cursor.executemany(compiled.sql, values)
        else:
            cursor.executemany(compiled.sql, [[v[name] for name in compiled.order] for v in values])

    def send(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Sent:
        """Run it; its rows are read when asked for (`Sent`). Inside a
        pipeline (`Statements.pipeline`) the statement is sent without
        waiting for its answer, and the first read waits for every answer
        sent so far, in one round trip."""
        return Sent(self, self.execute(conn, params))

    def first(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first row as a named tuple (attribute access by column), or None.
        Every row is fetched, so a RETURNING statement has completed."""
        return self.send(conn, params).first()

    def all(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        return self.send(conn, params).all()

    def _rows(self, cursor: Any) -> list[Any]:
        rows = cursor.fetchall()
        if rows and self._row is None:
            self._row = namedtuple("Row", [d[0] for d in cursor.description])  # type: ignore[misc]
        return [self._row(*row) for row in rows]


class Sent:
    """A statement run by `Prepared.send`, its rows not read yet."""

    def __init__(self, prepared: Prepared, cursor: Any) -> None:
        self._prepared = prepared
        self._cursor = cursor

    def all(self) -> list[Any]:
        """Every row, as named tuples."""
        return self._prepared._rows(self._cursor)

    def first(self) -> Any:
        """The first row, or None (every row is fetched: the statement completed)."""
        rows = self.all()
        return rows[0] if rows else None


class PreparedFor:
    """A statement over n items (an IN list, rows of one multi-row VALUES),
    built by `build(n)` and compiled once per dialect and n, so that a pass
    over n jobs is one statement. Item i's values bind as NAME_i
    (`item_binds`)."""

    def __init__(self, build: Callable[[int], ClauseElement]) -> None:
        self._build = build
        self._by_count: dict[int, Prepared] = {}

    def of(self, n: int) -> Prepared:
        found = self._by_count.get(n)
        if found is None:
            found = self._by_count[n] = Prepared(self._build(n))
        return found


def item_bind(name: str, i: int) -> str:
    """The bind name of item i's `name` in a `PreparedFor` statement."""
    return f"{name}_{i}"


def item_binds(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every item's values under its own bind names (`item_bind`)."""
    return {
        item_bind(name, i): value for i, item in enumerate(items) for name, value in item.items()
    }
