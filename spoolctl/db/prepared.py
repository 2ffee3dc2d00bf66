"""Statements of the worker's hot path, compiled once and run on the driver.

Each statement is still written with SQLAlchemy Core against the tables in
`tables.py`; only the per-execution machinery is skipped. Measured on a
1,000-job drain, SQLAlchemy spent about 60 us per statement against 8 us for
the same SQL on the sqlite3 cursor, and a job runs a dozen statements. The
statement runs inside the caller's SQLAlchemy transaction (the same driver
connection, after the engine's BEGIN IMMEDIATE), so atomicity is unchanged.
Only plain column types are selected (no result processors are needed).

A statement whose results nobody reads (an event, an attempt's end) may be
deferred: where the driver pipelines (PostgreSQL), it is sent with the
connection's next statement, or just before its commit, in one round trip;
elsewhere it runs at once. Statements still run in the order they were
issued, inside the same transaction, so nothing a later statement reads and
nothing a commit makes durable differs; a deferred statement's error comes
with the statement it was sent with.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Connection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

DEFERRED = "spoolctl_deferred"
"""Key of a connection's `info`: its `Deferring`, where its driver pipelines."""


class Deferring(Protocol):
    """A connection's deferred statements (its driver's: `postgresql.pipeline`)."""

    def add(self, sql: str, values: Any, many: bool) -> None:
        """Send this statement with the next one."""

    def send(self, driver_conn: Any, last: Callable[[], Any] | None = None) -> Any:
        """Send what was deferred (and last's statement with it, in one round
        trip); returns what last returns."""


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: tuple[str, ...] | None
    """Bind names in order for a positional driver (sqlite3: `?`); None for a
    driver taking named parameters (psycopg: `%(name)s`)."""
    defaults: dict[str, Any]


class Prepared:
    """One Core statement, compiled for each dialect on first use."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[type, _Compiled] = {}
        """Compiled once per dialect (a queue's backend), keyed by its class."""
        self._row: Any = None

    def _compile(self, conn: Connection) -> _Compiled:
        compiled = cast(SQLCompiler, self.statement.compile(dialect=conn.dialect))
        order = tuple(compiled.positiontup or ()) if compiled.positional else None
        found = _Compiled(str(compiled), order, dict(compiled.params))
        self._compiled[type(conn.dialect)] = found
        return found

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """Run on the driver cursor; returns that cursor (rowcount, rows)."""
        sql, values = self._bound(conn, params)
        driver = conn.connection.driver_connection
        cursor = driver.cursor()  # type: ignore[union-attr]
        deferred: Deferring | None = conn.info.get(DEFERRED)
        if deferred is None:
            cursor.execute(sql, values)
        else:
            deferred.send(driver, lambda: cursor.execute(sql, values))
        return cursor

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run once per parameter set, in one driver call: psycopg sends them
        all in one pipeline (one round trip), sqlite3 loops in C."""
        sql, values = self._bound_many(conn, rows)
        driver = conn.connection.driver_connection
        cursor = driver.cursor()  # type: ignore[union-attr]
        deferred: Deferring | None = conn.info.get(DEFERRED)
        if deferred is None:
            cursor.executemany(sql, values)
        else:
            deferred.send(driver, lambda: cursor.executemany(sql, values))

    def defer(self, conn: Connection, params: Mapping[str, Any] | None = None) -> None:
        """`execute`, sent with the connection's next statement where its
        driver pipelines (module docstring); for a statement whose results
        nobody reads."""
        deferred: Deferring | None = conn.info.get(DEFERRED)
        if deferred is None:
            self.execute(conn, params)
        else:
            deferred.add(*self._bound(conn, params), many=False)

    def defer_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """`execute_many`, deferred as `defer` is."""
        deferred: Deferring | None = conn.info.get(DEFERRED)
        if deferred is None:
            self.execute_many(conn, rows)
        else:
            deferred.add(*self._bound_many(conn, rows), many=True)

    def _bound(self, conn: Connection, params: Mapping[str, Any] | None) -> tuple[str, Any]:
        """The SQL for conn's dialect and params as its driver takes them."""
        compiled = self._compiled.get(type(conn.dialect)) or self._compile(conn)
        values = compiled.defaults if not params else {**compiled.defaults, **params}
        if compiled.order is None:
            return compiled.sql, values
        return compiled.sql, [values[name] for name in compiled.order]

    def _bound_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> tuple[str, Any]:
        compiled = self._compiled.get(type(conn.dialect)) or self._compile(conn)
        values = [{**compiled.defaults, **row} for row in rows]
        if compiled.order is None:
            return compiled.sql, values
        return compiled.sql, [[v[name] for name in compiled.order] for v in values]

    def first(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first row as a named tuple (attribute access by column), or None.
        Every row is fetched, so a RETURNING statement has completed."""
        cursor = self.execute(conn, params)
        rows = cursor.fetchall()
        row = rows[0] if rows else None
        if row is None:
            return None
        if self._row is None:
            self._row = namedtuple("Row", [d[0] for d in cursor.description])  # type: ignore[misc]
        return self._row(*row)

    def all(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        cursor = self.execute(conn, params)
        rows = cursor.fetchall()
        if rows and self._row is None:
            self._row = namedtuple("Row", [d[0] for d in cursor.description])  # type: ignore[misc]
        return [self._row(*row) for row in rows]


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
