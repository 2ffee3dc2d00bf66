"""What each verb reads, named exactly: the statements that status, list,
events, prune, reap and claim really run are captured and explained with
EXPLAIN QUERY PLAN, and each plan is the one written down here, with why.

docs/design.md promises that no verb reads the whole jobs table because the
table grew. Where the plan keeps that promise only in the letter, the entry
says so:
- status counts every job by queue and state: one walk of the claim index
  (state, queue, priority, next_run_at, id), every entry of it but no table
  row and no sort. Its cost grows with the number of jobs (SQLite keeps no
  counts), which the benchmark (bench/) measures; nothing else in status
  depends on the size of the table (the suspended jobs are counted among
  the running rows, as the jobs each live worker runs are found).
- list without a state or queue filter walks the table by id, newest first,
  and stops at --limit; with a tag filter (or --priority-min) alone it stops
  at --limit matches, so a filter that matches fewer jobs than --limit reads
  the whole table. `list --limit 0` with no equality filter reads it all, as
  asked.
- list with several states sorts the rows of those states (a temporary
  b-tree over the matches, not the table).
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event

from spoolctl.cli.inspect import page_with_waits
from spoolctl.db.backends.sqlite import make_engine
from spoolctl.db.engine import read_tx, write_tx
from spoolctl.runner.capacity import Capacity
from spoolctl.services import claim, ledger, prune, query, reaper
from spoolctl.services.query import JobFilter
from tests.helpers import rows
from tests.populated import populate, run_json

pytestmark = pytest.mark.subprocess

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
    """Run work in one transaction; explain every SELECT, UPDATE and DELETE it
    issued (with or without a WITH clause).

    SQL is captured on the sqlite3 connection itself (bound values expanded),
    so statements run through SQLAlchemy and the worker's prepared statements
    on the driver are both seen."""
    seen: list[str] = []

    def capture(statement: str) -> None:
        kind = statement.lstrip().split(maxsplit=1)[0].upper()
        if kind in ("SELECT", "UPDATE", "DELETE", "WITH") and "alembic" not in statement:
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


STATUS_PLANS = {
    # counts per queue and state (and the scheduled count): the claim index, once
    "GROUP BY jobs.state, jobs.queue": ["SCAN jobs USING COVERING INDEX ix_jobs_claim"],
    # recent dead jobs, newest finished first, stops at --limit
    "WHERE jobs.state = 'dead' ORDER BY jobs.finished_at DESC": [
        "SEARCH jobs USING INDEX ix_jobs_state_finished (state=?)"
    ],
    # the output paths of each dead job's latest attempt
    "FROM attempts WHERE attempts.job_id =": [
        "SEARCH attempts USING INDEX sqlite_autoindex_attempts_1 (job_id=?)"
    ],
    # the jobs a live worker runs: running rows only
    "jobs.locked_by =": ["SEARCH jobs USING INDEX ix_jobs_state_* (state=?)"],
    # the suspended jobs per lane: the running rows only, in lane order (no sort)
    "jobs.suspended_at IS NOT NULL": ["SEARCH jobs USING INDEX ix_jobs_claim (state=?)"],
}


def plan_of(plans: list[tuple[str, list[str]]], fragment: str) -> list[str]:
    found = [plan for sql, plan in plans if fragment in " ".join(sql.split())]
    assert found, f"no statement with {fragment!r} was run"
    return found[0]


def matches(plan: list[str], expected: list[str]) -> bool:
    """Line by line; `ix_jobs_state_*` stands for any index that starts with
    state (id, finished_at, heartbeat_at): which one is the planner's pick."""
    return len(plan) == len(expected) and all(
        fnmatch.fnmatchcase(line, want.replace("(", "[(]").replace(")", "[)]").replace("?", "[?]"))
        for line, want in zip(plan, expected, strict=True)
    )


def test_status_reads_the_jobs_table_once_through_the_claim_index(engine: Engine) -> None:
    plans = plans_of(engine, lambda c: query.status_summary(c, time.time()))
    for fragment, expected in STATUS_PLANS.items():
        assert matches(plan_of(plans, fragment), expected), (fragment, plan_of(plans, fragment))
    statements = [" ".join(sql.split()) for sql, _ in plans]
    on_jobs = [
        sql
        for sql in statements
        if "FROM jobs" in sql
        and "JOIN" not in sql
        and "jobs.locked_by =" not in sql
        and "suspended_at IS NOT NULL" not in sql
    ]
    assert len(on_jobs) == 2, ("the counts and the dead jobs only", on_jobs)
    assert_indexed(plans)


LIST_PLANS = [
    (JobFilter(state="queued", limit=100), ["SEARCH jobs USING INDEX ix_jobs_state_* (state=?)"]),
    (JobFilter(lane="q3", limit=100), ["SEARCH jobs USING INDEX ix_jobs_queue_id (queue=?)"]),
    (
        JobFilter(state="dead", lane="q3", limit=0),
        ["SEARCH jobs USING INDEX ix_jobs_state_* (state=?)"],
    ),
    (
        JobFilter(lane="q3", priority_min=3, limit=100),
        ["SEARCH jobs USING INDEX ix_jobs_queue_id (queue=?)"],
    ),
    (
        JobFilter(state="queued", tags=(("n", "1"),), limit=100),
        [
            "SEARCH jobs USING INDEX ix_jobs_state_* (state=?)",
            "CORRELATED SCALAR SUBQUERY 1",
            "SCAN anon_1 VIRTUAL TABLE INDEX 1:",
        ],
    ),
    # several states: the rows of those states, sorted newest first
    (
        JobFilter(state=("done", "dead"), limit=100),
        ["SEARCH jobs USING INDEX ix_jobs_state_* (state=?)", "USE TEMP B-TREE FOR ORDER BY"],
    ),
    # no equality filter: the primary key newest first, stopping at --limit
    (JobFilter(limit=100), ["SCAN jobs"]),
    (JobFilter(priority_min=3, limit=100), ["SCAN jobs"]),
    (
        JobFilter(tags=(("n", "2"),), limit=5),
        ["SCAN jobs", "CORRELATED SCALAR SUBQUERY 1", "SCAN anon_1 VIRTUAL TABLE INDEX 1:"],
    ),
]


@pytest.mark.parametrize(
    ("where", "expected"),
    LIST_PLANS,
    ids=[
        "state",
        "queue",
        "state+queue",
        "queue+priority",
        "state+tag",
        "states",
        "none",
        "priority",
        "tag",
    ],
)
def test_list_reads_exactly_what_its_filters_name(
    engine: Engine, where: JobFilter, expected: list[str]
) -> None:
    plans = plans_of(engine, lambda c: query.list_page(c, where))
    plan = plan_of(plans, "SELECT jobs.id, jobs.argv")
    assert matches(plan, expected), plan
    # meta.pagination.first_id: the smallest id, read off the primary key's end
    assert plan_of(plans, "SELECT min(jobs.id)") == ["SEARCH jobs"]


def test_list_counts_each_shown_jobs_attempts_through_the_attempts_index(engine: Engine) -> None:
    """`list` shows how many attempts each job had: one grouped count over the
    page's ids, read off the (job_id, attempt_no) index alone, never the table."""
    plans = plans_of(engine, lambda c: page_with_waits(c, JobFilter(limit=100)))
    assert plan_of(plans, "FROM attempts WHERE attempts.job_id IN") == [
        "SEARCH attempts USING COVERING INDEX sqlite_autoindex_attempts_1 (job_id=?)"
    ]


def test_list_without_an_equality_filter_stops_at_its_limit(engine: Engine, db: Path) -> None:
    """The `SCAN jobs` above is a walk newest first that ends at --limit: the
    rows it visits are counted (SQLite's VM step counter) against a limit of 5."""
    total = rows(db, "SELECT count(*) AS n FROM jobs")[0]["n"]
    with read_tx(engine) as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        steps = {"n": 0}

        def count() -> int:
            steps["n"] += 1
            return 0

        raw.set_progress_handler(count, 1)
        try:
            query.list_page(conn, JobFilter(limit=5))
        finally:
            raw.set_progress_handler(None, 1)
    per_row = 100  # VM instructions per row read, generously
    assert steps["n"] < 6 * per_row < total * 10, (steps["n"], total)


def test_events_prune_reap_and_claim_name_their_indexes(engine: Engine, db: Path) -> None:
    output = db.parent / "output"

    def work(conn: Connection) -> None:
        ledger.read_events(conn, since_id=5, limit=10)
        ledger.read_events(conn, since_id=0, job_id=2, limit=10)
        prune.survey(conn, ("done", "dead", "canceled"), time.time(), output, prune.PruneReport())
        reaper.reap_candidates(conn, time.time(), 30.0)
        claimant = claim.Claimant("w1", 1, "q1", output, cap=Capacity(1, lane_cap=3))
        claim.claim_up_to(conn, claimant, 1, time.time())

    plans = plans_of(engine, work)
    assert_indexed(plans)
    # events: the ledger by its cursor; one job's events by (job_id, id)
    assert plan_of(plans, "WHERE job_events.id > 5") == [
        "SEARCH job_events USING INTEGER PRIMARY KEY (rowid>?)"
    ]
    assert plan_of(plans, "job_events.job_id = 2") == [
        "SEARCH job_events USING INDEX ix_job_events_job_id (job_id=? AND id>?)"
    ]
    # prune: old finished jobs by (state, finished_at), then their own rows
    # (less the jobs an attempt of which holds a device: the few holds, read
    # once as a list)
    assert plan_of(plans, "jobs.finished_at <") == [
        "SEARCH jobs USING COVERING INDEX ix_jobs_state_finished (state=? AND finished_at<?)",
        "LIST SUBQUERY 1",
        "SCAN device_holds USING COVERING INDEX ix_device_holds_attempt_id",
        "SEARCH attempts USING INTEGER PRIMARY KEY (rowid=?)",
    ]
    # reap: the running rows only (as many as busy slots); adopted rows without
    # a heartbeat are judged by their lock or start time, so no range on it
    reap = plan_of(plans, "coalesce(jobs.heartbeat_at")
    assert matches(reap, ["SEARCH jobs USING INDEX ix_jobs_state_* (state=?)"]), reap
    # claim: one statement (CLAIM_PLAN)
    assert plan_of(plans, "next_run_at <=") == CLAIM_PLAN
    assert rows(db, "SELECT count(*) AS n FROM jobs WHERE state = 'running'")[0]["n"] == 1


CLAIM_PLAN = [
    # the jobs taken: the rows the CTE picked, by id (no state test of
    # their own, which would offer PostgreSQL a walk of every queued job)
    "SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)",
    # the lane's first due jobs in claim order: the claim index's first
    # entries, then those few rows of the CTE (not a table) read back
    "LIST SUBQUERY 4",
    "CO-ROUTINE picked",
    "SEARCH pick USING COVERING INDEX ix_jobs_claim (state=? AND queue=?)",
    # jobs that require limits this worker cannot enforce: the partial index
    # of jobs that require limits (empty in the common case), read once
    "LIST SUBQUERY 1",
    "SEARCH needing USING INDEX ix_jobs_needs_limits (require_limits=? AND state=?)",
    # whether a due job of the lane asks for resources (the walk places it):
    # the partial index of requests (empty in the common case), read once
    "SCALAR SUBQUERY 2",
    "SEARCH asking USING INDEX ix_jobs_requests (state=? AND queue=? AND next_run_at<?)",
    "SCAN picked",
    # the lane's pause row: one primary-key lookup
    "SCALAR SUBQUERY 5",
    "SEARCH lanes USING INDEX sqlite_autoindex_lanes_1 (queue=?)",
    # each job's newest attempt (was it ended elsewhere?), then its number
    "CORRELATED SCALAR SUBQUERY 6",
    "SEARCH attempts USING INDEX sqlite_autoindex_attempts_1 (job_id=?)",
    "CORRELATED SCALAR SUBQUERY 7",
    "SEARCH attempts USING COVERING INDEX sqlite_autoindex_attempts_1 (job_id=?)",
]
"""The claim as one UPDATE ... RETURNING: every part a search by an index;
the attempt and its event are two inserts beside it."""


def test_read_engine_opens_a_deferred_transaction(db: Path) -> None:
    """A plain BEGIN takes no lock until it reads, and never the write lock."""
    engine = make_engine(db, write=False, busy_timeout_s=5)
    issued: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: issued.append(a[2]))
    with read_tx(engine) as conn:
        query.lane_summary(conn, time.time())
    engine.dispose()
    begins = [s for s in issued if s.startswith("BEGIN")]
    assert begins == ["BEGIN"]


def claim_in(conn: Connection, queue: str, output: Path, now: float) -> Any:
    found = claim.claim_up_to(conn, claim.Claimant("w1", 1, queue, output), 1, now)
    return found[0] if found else None


def test_waiting_jobs_cost_the_claim_nothing(engine: Engine, db: Path) -> None:
    """Hundreds of waiting jobs in the lane: the claim is still its one
    statement (waiting rows sit outside its state='queued' range)."""
    output = db.parent / "output"
    now = time.time()
    with write_tx(engine) as conn:
        conn.exec_driver_sql(
            "INSERT INTO jobs (argv, state, queue, priority, next_run_at, created_at) "
            "SELECT '[\"true\"]', 'waiting', 'q2', 9, 0, 0 FROM job_events LIMIT 500"
        )
    try:
        plans = plans_of(engine, lambda conn: claim_in(conn, "q2", output, now))
        assert_indexed(plans)
        assert plan_of(plans, "next_run_at <=") == CLAIM_PLAN
        assert [sql.split()[0] for sql, _ in plans] == ["WITH"]  # nothing else is read
        claimed = rows(db, "SELECT state FROM jobs WHERE locked_by = 'w1' AND queue = 'q2'")
        assert [r["state"] for r in claimed] == ["running"]
    finally:
        with write_tx(engine) as conn:
            conn.exec_driver_sql("DELETE FROM jobs WHERE state = 'waiting'")


def test_a_worker_finds_due_schedules_with_one_range_of_their_index(
    engine: Engine, db: Path
) -> None:
    """The check every worker runs once per poll: a range of
    ix_schedules_next_fire_at, never the table, whatever the number of schedules."""
    from spoolctl.services.firing import due_schedules

    assert (
        run_json("schedule add", "--db", str(db), "plan", "--every", "1h", "--", "true").exit_code
        == 0
    )
    plans = plans_of(engine, lambda conn: due_schedules(conn, time.time() + 7200))
    assert len(plans) == 1
    assert plans[0][1] == [
        "SEARCH schedules USING INDEX ix_schedules_next_fire_at (next_fire_at<?)"
    ], plans
