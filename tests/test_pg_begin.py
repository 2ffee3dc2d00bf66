"""How a PostgreSQL transaction of spoolctl's opens (`db/backends/postgresql/begin.py`):
a write engine that checks the revision runs its connections in autocommit
mode and opens each transaction itself, in the round trip of its settings.
SQLite's transactions open with BEGIN IMMEDIATE in its engine's hook
(tests/test_drivers.py covers both)."""

from __future__ import annotations

import pytest

from spoolctl.db import revision
from spoolctl.db.engine import RevisionMismatch, read_tx, write_tx
from spoolctl.db.queue import open_for_write
from tests.helpers import driver_of


def test_transactions_are_whole_and_leave_the_session_bare(pg_url: str) -> None:
    """A write engine that checks the revision opens each transaction itself,
    in the round trip of its settings (its connections are in autocommit
    mode): what a transaction writes is undone with it, its settings and
    isolation hold for the whole of it and end with it, and a read on the
    same engine is one REPEATABLE READ, READ ONLY snapshot."""
    driver = driver_of(pg_url)
    open_for_write(driver).write(lambda conn: None)  # a queue at head
    engine = driver.engine(write=True, expected_revision=revision.HEAD_REVISION, lock_wait_s=0.7)
    inside = (
        "SELECT current_setting('transaction_isolation'), current_setting('lock_timeout'), "
        "current_setting('transaction_read_only'), pg_current_xact_id_if_assigned()::text"
    )
    try:
        with pytest.raises(ZeroDivisionError), write_tx(engine) as conn:
            conn.exec_driver_sql(
                "INSERT INTO lanes (queue, paused_at, paused_by) VALUES ('x', 1, 't')"
            )
            isolation, lock_timeout, read_only, xid = conn.exec_driver_sql(inside).one()
            assert (isolation, lock_timeout, read_only) == ("read committed", "700ms", "off")
            assert xid is not None  # the insert and this read are one transaction
            raise ZeroDivisionError  # rolls it back
        with write_tx(engine) as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM lanes").scalar_one() == 0
            raw = conn.connection.driver_connection
        # after the commit the session holds nothing of the transaction's
        assert raw.execute("SELECT current_setting('lock_timeout')").fetchone() == ("0",)
        with read_tx(engine) as conn:
            isolation, _, read_only, _ = conn.exec_driver_sql(inside).one()
            assert (isolation, read_only) == ("repeatable read", "on")
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
