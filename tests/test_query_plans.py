"""Every query of the hot verbs is served by an index: the statements that
status, list, events, prune and claim really run are captured and explained
with EXPLAIN QUERY PLAN, and no plan walks a whole table."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event

from spoolctl.db.engine import make_engine, read_tx, write_tx
from spoolctl.services import claim, ledger, prune, query, reaper
from spoolctl.services.query import JobFilter
from tests.helpers import rows
from tests.populated import populate, run_json

BARE_SCAN = re.compile(r"^SCAN (jobs|attempts|job_events)$")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The populated queue plus 2,000 jobs over 7 queues and a live worker."""
    folder = tmp_path_factory.mktemp("plans")
    q = populate(folder / "queue.db")
    batch = folder / "jobs.ndjson"
    batch.write_text(
        "\n".join(
            json.dumps(
                {
                    "argv": ["true"],
                    "queue": f"q{i % 7}",
                    "priority": i % 5,
                    "tags": {"n": str(i % 3)},
                }
            )
            for i in range(2000)
        )
    )
    assert run_json("add", "--db", str(q.db), "--batch", str(batch)).exit_code == 0
    engine = make_engine(q.db, write=True, busy_timeout_s=5)
    with write_tx(engine) as conn:
        conn.exec_driver_sql(
            "INSERT INTO workers (id, hostname, pid, queue, started_at, heartbeat_at, state) "
            "VALUES ('w1', 'h', 1, 'q1', 0, 0, 'running')"
        )
    engine.dispose()
    return q.db


@pytest.fixture
def engine(db: Path) -> Iterator[Engine]:
    engine = make_engine(db, write=True, busy_timeout_s=5)
    yield engine
    engine.dispose()


def plans_of(engine: Engine, work: Callable[[Connection], Any]) -> list[tuple[str, list[str]]]:
    """Run work in one transaction; explain every SELECT it issued.

    SQL is captured on the sqlite3 connection itself (bound values expanded),
    so statements run through SQLAlchemy and the worker's prepared statements
    on the driver are both seen."""
    seen: list[str] = []

    def capture(statement: str) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "alembic" not in statement:
            seen.append(statement)

    with write_tx(engine) as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.set_trace_callback(capture)
        try:
            work(conn)
        finally:
            raw.set_trace_callback(None)
        return [(sql, [r[3] for r in raw.execute("EXPLAIN QUERY PLAN " + sql)]) for sql in seen]


def assert_indexed(plans: list[tuple[str, list[str]]]) -> None:
    assert plans, "nothing was captured"
    for sql, plan in plans:
        assert not any(BARE_SCAN.match(line) for line in plan), (sql, plan)


def test_status_is_served_by_indexes(engine: Engine) -> None:
    plans = plans_of(engine, lambda c: query.status_summary(c, time.time()))
    assert any("locked_by" in sql for sql, _ in plans), "running jobs per worker not exercised"
    assert_indexed(plans)


@pytest.mark.parametrize(
    "where",
    [
        JobFilter(state="queued", limit=100),
        JobFilter(queue="q3", limit=100),
        JobFilter(state="dead", queue="q3", limit=0),
        JobFilter(state="queued", tags=(("n", "1"),), limit=100),
        JobFilter(queue="q3", priority_min=3, limit=100),
    ],
    ids=["state", "queue", "state+queue", "state+tag", "queue+priority"],
)
def test_list_filters_are_served_by_indexes(engine: Engine, where: JobFilter) -> None:
    plans = plans_of(engine, lambda c: query.list_jobs(c, where))
    assert_indexed(plans)
    assert not any("TEMP B-TREE" in line for _, plan in plans for line in plan)


@pytest.mark.parametrize(
    "where",
    [
        JobFilter(limit=100),
        JobFilter(priority_min=3, limit=100),
        JobFilter(tags=(("n", "2"),), limit=5),
    ],
    ids=["none", "priority", "tag"],
)
def test_list_without_an_equality_filter_walks_newest_first_and_stops(
    engine: Engine, where: JobFilter
) -> None:
    """No index can order these by id; the primary key walk, newest first,
    stops at --limit and never sorts the table."""
    plans = plans_of(engine, lambda c: query.list_jobs(c, where))
    assert not any("TEMP B-TREE" in line for _, plan in plans for line in plan)
    assert plans[0][1][0] == "SCAN jobs"


def test_events_prune_and_claim_are_served_by_indexes(engine: Engine, db: Path) -> None:
    output = db.parent / "output"

    def work(conn: Connection) -> None:
        ledger.read_events(conn, since_id=5, limit=10)
        ledger.read_events(conn, since_id=0, job_id=2, limit=10)
        prune.survey(conn, ("done", "dead", "canceled"), time.time(), output, prune.PruneReport())
        reaper.reap_candidates(conn, time.time(), 30.0)
        claim.claim_next(conn, worker_id="w1", worker_pid=1, queue="q1", slots=3,
                         output_root=output, now=time.time())  # fmt: skip

    plans = plans_of(engine, work)
    assert_indexed(plans)
    claim_plan = next(plan for sql, plan in plans if "next_run_at <=" in sql)
    reap_plan = next(plan for sql, plan in plans if "coalesce(jobs.heartbeat_at" in sql)
    # the running rows only (as many as busy slots); adopted rows without a
    # heartbeat are judged by their lock or start time, so no range on it
    assert reap_plan in (
        [f"SEARCH jobs USING INDEX ix_jobs_state_{index} (state=?)"]
        for index in ("heartbeat", "id")  # either state-prefixed index: the planner's pick
    )
    assert claim_plan == ["SEARCH jobs USING INDEX ix_jobs_claim (state=? AND queue=?)"]
    assert rows(db, "SELECT count(*) AS n FROM jobs WHERE state = 'running'")[0]["n"] == 1


def test_read_engine_opens_a_deferred_transaction(db: Path) -> None:
    """A plain BEGIN takes no lock until it reads, and never the write lock."""
    engine = make_engine(db, write=False, busy_timeout_s=5)
    issued: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: issued.append(a[2]))
    with read_tx(engine) as conn:
        query.state_counts(conn)
    engine.dispose()
    begins = [s for s in issued if s.startswith("BEGIN")]
    assert begins == ["BEGIN"]
