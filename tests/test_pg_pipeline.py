"""Deferred statements on PostgreSQL (`Prepared.defer`, `postgresql/pipeline.py`):
an event insert or an attempt's end waits to be sent with the connection's
next statement or its commit. Nothing may change but the round trips: every
deferred statement runs before any later one, in order, inside its own
transaction; it is durable at commit; a rolled-back transaction leaves
nothing of it behind for the next; its error fails its own transaction."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.exc import DBAPIError

from spoolctl.db.engine import write_tx
from spoolctl.db.queue import Queue, open_for_write
from spoolctl.db.tables import job_events
from spoolctl.services.events import event_row, record_event, record_events
from spoolctl.states import EventKind
from tests.helpers import cli, driver_of, rows

pytestmark = pytest.mark.subprocess


@pytest.fixture
def queue(pg_url: str) -> Iterator[Queue]:
    """A PostgreSQL queue with job 1 in it (the events below name it)."""
    assert cli("add", "--", "true", db=pg_url).exit_code == 0
    opened = open_for_write(driver_of(pg_url))
    try:
        yield opened
    finally:
        opened.dispose()


def paused(conn: Any, n: int, job_id: int | None = 1) -> None:
    record_event(conn, job_id, EventKind.PAUSED, time.time(), detail={"n": n})  # type: ignore[arg-type]


def stored(pg_url: str) -> list[int]:
    found = rows(pg_url, "SELECT detail::json->>'n' AS n FROM job_events"
                         " WHERE event = 'paused' ORDER BY id")  # fmt: skip
    return [int(r["n"]) for r in found]


def statements_sent(engine: Engine) -> list[str]:
    """Every statement SQLAlchemy runs on the engine from now on (the deferred
    ones go on the driver, past this list)."""
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_deferred_statements_run_in_order_before_the_next_and_commit(
    queue: Queue, pg_url: str
) -> None:
    with write_tx(queue.engine) as conn:
        paused(conn, 1)
        record_events(conn, [event_row(1, EventKind.PAUSED, time.time(), detail={"n": n})
                             for n in (2, 3)])  # fmt: skip
        assert stored(pg_url) == [], "nothing is visible before the commit"
        mine = conn.execute(
            select(job_events.c.detail)
            .where(job_events.c.event == "paused")
            .order_by(job_events.c.id)
        ).scalars()
        assert [json.loads(d)["n"] for d in mine] == [1, 2, 3], (
            "a later statement of the same transaction sees them all, in order"
        )
        paused(conn, 4)  # sent only by the commit
    assert stored(pg_url) == [1, 2, 3, 4]


def test_a_rolled_back_transaction_leaves_nothing_deferred_for_the_next(
    queue: Queue, pg_url: str
) -> None:
    with pytest.raises(RuntimeError), write_tx(queue.engine) as conn:
        paused(conn, 1)
        raise RuntimeError("rolled back before anything was sent")
    with write_tx(queue.engine) as conn:
        paused(conn, 2)
    assert stored(pg_url) == [2]


def test_a_deferred_statement_that_fails_fails_its_own_transaction(
    queue: Queue, pg_url: str
) -> None:
    """An event of a job that does not exist breaks its foreign key: the
    error comes with the commit that sends it (an integrity violation is a
    bug, and passes through as it is), and nothing of the transaction is
    kept; the next transaction on the engine works."""
    with pytest.raises(DBAPIError, match="foreign key"), write_tx(queue.engine) as conn:
        paused(conn, 1)
        paused(conn, 2, job_id=999_999)
    assert stored(pg_url) == []
    with write_tx(queue.engine) as conn:
        paused(conn, 3)
    assert stored(pg_url) == [3]


def test_deferred_statements_go_with_the_next_in_one_pipeline(queue: Queue) -> None:
    """Three deferred inserts and a read cost the server one sync, not four
    (psycopg counts the pipeline's syncs only when one is open)."""
    syncs: list[int] = []
    with write_tx(queue.engine) as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        real = driver.pipeline

        def counted(*args: Any, **kwargs: Any) -> Any:
            syncs.append(1)
            return real(*args, **kwargs)

        driver.pipeline = counted  # type: ignore[method-assign]
        try:
            for n in (1, 2, 3):
                paused(conn, n)
            assert syncs == [], "deferred: nothing sent yet"
            seen = statements_sent(queue.engine)
            count = conn.execute(select(job_events.c.id).where(job_events.c.event == "paused"))
            assert len(count.all()) == 3
            assert syncs == [1] and len(seen) == 1
        finally:
            del driver.pipeline
