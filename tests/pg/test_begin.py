"""How a PostgreSQL transaction of spoolctl's opens (`db/backends/postgresql/begin.py`):
a write engine that checks the revision runs its connections in autocommit
mode and opens each transaction itself, in the round trip of its settings,
sent with the transaction's first statement: inside a pipeline
(`postgresql/pipeline.py`) in the pipeline's one round trip.
SQLite's transactions open with BEGIN IMMEDIATE in its engine's hook
(tests/process/test_drivers.py covers both)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, bindparam, func, insert, select
from sqlalchemy.exc import DBAPIError

from spoolctl.db import revision
from spoolctl.db.backends import statements
from spoolctl.db.engine import RevisionMismatch, read_tx, write_tx
from spoolctl.db.prepared import Prepared
from spoolctl.db.queue import open_for_write
from spoolctl.db.tables import lanes
from tests.helpers import driver_of

PAUSE = Prepared(
    insert(lanes)
    .values(queue=bindparam("b_queue"), paused_at=1.0, paused_by="t")
    .returning(lanes.c.queue)
)
SETTINGS = Prepared(
    select(
        func.current_setting("lock_timeout").label("lock_timeout"),
        func.current_setting("transaction_isolation").label("isolation"),
        func.pg_current_xact_id_if_assigned().cast(type_=lanes.c.queue.type).label("xid"),
    )
)


@contextmanager
def pipelined(engine: Any) -> Iterator[Connection]:
    """A write transaction whose statements go out in one pipeline."""
    with write_tx(engine) as conn, statements(conn).pipeline(conn):
        yield conn


def bare(engine: Any) -> bool:
    """The engine's pooled connection has no transaction open."""
    raw = engine.raw_connection()
    try:
        return bool(raw.driver_connection.info.transaction_status == 0)  # IDLE
    finally:
        raw.close()


def test_transactions_are_whole_and_leave_the_session_bare(pg_url: str) -> None:
    """A write engine that checks the revision opens each transaction itself,
    in the round trip of its settings (its connections are in autocommit
    mode): what a transaction writes is undone with it, its settings and
    isolation hold for the whole of it and end with it (the planner's too:
    `limits.PLAN_SETTINGS`), and a read on the same engine is one REPEATABLE
    READ, READ ONLY snapshot with the server's planner defaults."""
    driver = driver_of(pg_url)
    open_for_write(driver).write(lambda conn: None)  # a queue at head
    engine = driver.engine(write=True, expected_revision=revision.HEAD_REVISION, lock_wait_s=0.7)
    inside = (
        "SELECT current_setting('transaction_isolation'), current_setting('lock_timeout'), "
        "current_setting('transaction_read_only'), pg_current_xact_id_if_assigned()::text"
    )
    planner = "SELECT current_setting('enable_seqscan'), current_setting('plan_cache_mode')"
    defaults = ("on", "auto")
    try:
        with pytest.raises(ZeroDivisionError), write_tx(engine) as conn:
            conn.exec_driver_sql(
                "INSERT INTO lanes (queue, paused_at, paused_by) VALUES ('x', 1, 't')"
            )
            isolation, lock_timeout, read_only, xid = conn.exec_driver_sql(inside).one()
            assert (isolation, lock_timeout, read_only) == ("read committed", "700ms", "off")
            assert xid is not None  # the insert and this read are one transaction
            assert conn.exec_driver_sql(planner).one() == ("off", "force_generic_plan")
            raise ZeroDivisionError  # rolls it back
        with write_tx(engine) as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM lanes").scalar_one() == 0
            raw = conn.connection.driver_connection
        # after the commit the session holds nothing of the transaction's
        assert raw.execute("SELECT current_setting('lock_timeout')").fetchone() == ("0",)
        assert raw.execute(planner).fetchone() == defaults
        with read_tx(engine) as conn:
            isolation, _, read_only, _ = conn.exec_driver_sql(inside).one()
            assert (isolation, read_only) == ("repeatable read", "on")
            assert conn.exec_driver_sql(planner).one() == defaults
    finally:
        engine.dispose()
    # a transaction refused for its revision opened on the server all the
    # same: its connection goes back to the pool with nothing left open
    stale = driver.engine(write=True, expected_revision="0001_initial")
    try:
        with pytest.raises(RevisionMismatch), write_tx(stale):
            pass
        raw = stale.raw_connection()
        try:
            assert raw.driver_connection.info.transaction_status == 0  # IDLE
        finally:
            raw.close()
    finally:
        stale.dispose()


def test_a_pipelined_transaction_opens_in_its_pipeline(pg_url: str) -> None:
    """The opening goes first in the pipeline: the pass's statements run in
    the transaction with its settings, and the revision is checked before
    anything commits. A stale revision is the error told, also where a
    statement of the pipeline failed; nothing of it is left."""
    driver = driver_of(pg_url)
    open_for_write(driver).write(lambda conn: None)  # a queue at head
    good = driver.engine(write=True, expected_revision=revision.HEAD_REVISION, lock_wait_s=0.7)
    stale = driver.engine(write=True, expected_revision="0001_initial")
    try:
        with write_tx(good) as conn, statements(conn).pipeline(conn):
            paused = PAUSE.send(conn, {"b_queue": "a"})
            seen = SETTINGS.send(conn)
        assert [row.queue for row in paused.all()] == ["a"]
        row = seen.first()
        assert (row.lock_timeout, row.isolation) == ("700ms", "read committed")
        assert row.xid is not None  # the insert before it was in this transaction
        with pytest.raises(RevisionMismatch), pipelined(stale) as conn:
            PAUSE.send(conn, {"b_queue": "b"})
        with pytest.raises(RevisionMismatch) as told, pipelined(stale) as conn:
            PAUSE.send(conn, {"b_queue": "a"})  # a duplicate: this statement fails
        assert told.value.detail["found"] == revision.HEAD_REVISION
        with pytest.raises(DBAPIError) as failed, pipelined(good) as conn:
            PAUSE.send(conn, {"b_queue": "a"})  # the revision is ours: the failure is told
        assert getattr(failed.value.orig, "sqlstate", None) == "23505"  # unique_violation
        with write_tx(good) as conn:
            assert conn.execute(select(lanes.c.queue)).scalars().all() == ["a"]
        assert bare(good) and bare(stale)
    finally:
        good.dispose()
        stale.dispose()


def test_a_pipeline_on_a_database_without_a_queue_says_so(pg_url: str) -> None:
    """No alembic_version: the opening fails, and with it the pipeline; the
    error told is the revision's (none found), not the failed statement's."""
    driver = driver_of(pg_url)
    engine = driver.engine(write=True, expected_revision=revision.HEAD_REVISION)
    try:
        with pytest.raises(RevisionMismatch) as told, pipelined(engine) as conn:
            PAUSE.send(conn, {"b_queue": "a"})
        assert told.value.detail["found"] is None
        with pytest.raises(RevisionMismatch), write_tx(engine) as conn:
            conn.exec_driver_sql("SELECT 1")  # outside a pipeline: at the first statement
        assert bare(engine)
    finally:
        engine.dispose()


def test_a_transaction_that_runs_nothing_checks_its_revision_at_commit(pg_url: str) -> None:
    """An empty write transaction sends its opening at commit, so it is
    refused for a stale revision as any other; one rolled back sends nothing
    and leaves nothing open."""
    driver = driver_of(pg_url)
    open_for_write(driver).write(lambda conn: None)
    stale = driver.engine(write=True, expected_revision="0001_initial")
    try:
        with pytest.raises(ZeroDivisionError), write_tx(stale):
            raise ZeroDivisionError
        assert bare(stale)
        with pytest.raises(RevisionMismatch), write_tx(stale):
            pass
        assert bare(stale)
    finally:
        stale.dispose()
