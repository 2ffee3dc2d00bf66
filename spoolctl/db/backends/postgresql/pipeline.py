"""Deferred statements on PostgreSQL (`prepared.Prepared.defer`): sent in one
psycopg pipeline with the connection's next statement, or just before its
commit, instead of each waiting for its own answer. And a transaction's
opening statements (`opening`): sent with the BEGIN psycopg puts before them.

Each connection of an engine gets its own `Pipeline` (`install`). Every
statement SQLAlchemy runs on it, and the commit, send what is deferred
first, so statements run in the order they were issued; a rollback, or a
new transaction, drops what a failed one left behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, event

from spoolctl.db.prepared import DEFERRED


class Pipeline:
    """One connection's deferred statements."""

    def __init__(self) -> None:
        self._queue: list[tuple[str, Any, bool]] = []

    def add(self, sql: str, values: Any, many: bool) -> None:
        self._queue.append((sql, values, many))

    def send(self, driver_conn: Any, last: Callable[[], Any] | None = None) -> Any:
        """Send the deferred statements, then last's, and wait once for all
        their answers (the first error among them is raised)."""
        if not self._queue:
            return None if last is None else last()
        queue, self._queue = self._queue, []
        with driver_conn.pipeline():
            for sql, values, many in queue:
                cursor = driver_conn.cursor()
                if many:
                    cursor.executemany(sql, values)
                else:
                    cursor.execute(sql, values)
            return None if last is None else last()

    def drop(self) -> None:
        self._queue.clear()


def install(engine: Engine) -> None:
    """Give each of the engine's connections a pipeline, sent before any
    other statement and before each commit. Installed before the engine's
    begin hook, so a new transaction starts with nothing deferred."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        record.info[DEFERRED] = Pipeline()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        _pipeline(conn).drop()

    @event.listens_for(engine, "before_cursor_execute")
    def _before_execute(conn: Connection, *_: Any) -> None:
        _pipeline(conn).send(conn.connection.driver_connection)

    @event.listens_for(engine, "commit")
    def _on_commit(conn: Connection) -> None:
        _pipeline(conn).send(conn.connection.driver_connection)

    @event.listens_for(engine, "rollback")
    def _on_rollback(conn: Connection) -> None:
        _pipeline(conn).drop()


def _pipeline(conn: Connection) -> Pipeline:
    found: Pipeline = conn.info[DEFERRED]
    return found


def opening(conn: Connection, statements: list[tuple[str, dict[str, Any] | None]]) -> Any:
    """Run a transaction's first statements in one round trip with the BEGIN
    psycopg sends before them (instead of one for the BEGIN, and one each);
    the last one's first row. Errors come as SQLAlchemy's, as from
    `exec_driver_sql`."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    driver: Any = conn.connection.driver_connection
    cursors = [driver.cursor() for _ in statements]
    try:
        with driver.pipeline():
            for cursor, (sql, params) in zip(cursors, statements, strict=True):
                cursor.execute(sql, params)
        return cursors[-1].fetchone()
    except psycopg.Error as exc:
        raise DBAPIError.instance(
            statements[-1][0], None, exc, psycopg.Error, hide_parameters=True, dialect=conn.dialect
        ) from exc
