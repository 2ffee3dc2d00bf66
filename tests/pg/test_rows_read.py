"""What a job costs PostgreSQL in rows read, counted by the server itself
(pg_stat_user_tables, pg_stat_user_indexes): a drain's claims, output and
outcomes find each job and attempt by its key, so the rows read per job stay
a handful however many jobs the tables hold; and in plans made
(pg_prepared_statements): a statement a worker runs again is not planned
again.

The plans the worker runs are generic plans that PostgreSQL builds once per
connection, early, while the tables are still small or their statistics
stale; and custom plans believe the statistics. A statement that offers the
planner a walk of every running job's index entries (`state = 'running'`),
every queued job's, or a scan of every attempt took it there, and a job's
cost then grew with the drain: a worker that had run 3,000 jobs read about
1,500 index entries of jobs and 3,000 attempts for each more. Statistics
taken while `attempts` was empty (an ANALYZE of a new queue) made a scan of
`attempts` the cheapest plan for the outcome, the output's lock and the
server's own foreign-key check, kept as the table grew: about 3,000 rows a
job by the end of a 3,000-job drain, until `enable_seqscan = off`
(`limits.PLAN_SETTINGS`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection

from devtools.pg_server import libpq_url
from spoolctl.db.queue import Queue, open_for_write
from spoolctl.services.claim import Claimant
from spoolctl.services.outcome import Ending, Outcome
from spoolctl.services.settle import settle
from tests.helpers import cli, driver_of

JOBS = 300
"""Enough that a walk of a table per job reads several times the bound below."""
ROWS_PER_JOB_MAX = 25
"""Rows read per job per table, index entries and table rows together.
Measured: 6 of attempts (7 with four slots) and 13 to 16 of jobs. A job's
claim, attempt, output and outcome are each found by key; the drain's end
reads the lane's jobs a few times over (`due.lane_settled`,
`due.next_due_at`: once per drain, not per job), 3 to 6 a job here. A walk
of a table per job read JOBS / 2 or more: about 300 of attempts fresh and
160 to 170 of jobs after a drain, before the statements named their rows by
key; analyzed empty, 1,200 of attempts with one slot and 620 with four,
before `enable_seqscan = off`."""
QUIET = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "30", "SPOOLCTL_TEST_REAP_THRESHOLD": "120"}
"""No heartbeat, and so no reap scan, falls inside the drain: only its passes are counted."""

_READS = """
SELECT t.relname,
       coalesce(t.seq_tup_read, 0) + coalesce(sum(i.idx_tup_read), 0),
       t.n_tup_upd
FROM pg_stat_user_tables t LEFT JOIN pg_stat_user_indexes i USING (relid)
WHERE t.relname IN ('jobs', 'attempts')
GROUP BY t.relname, t.seq_tup_read, t.n_tup_upd
"""


def _counts(admin: psycopg.Connection) -> dict[str, tuple[int, int]]:
    """Per table: rows read so far (sequentially and through its indexes), and updates."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    return {name: (int(read), int(updated)) for name, read, updated in admin.execute(_READS)}


def _landed(admin: psycopg.Connection, updated_before: int, updates: int) -> dict[str, int]:
    """Rows read per table once the drain's statistics reached the server: a
    server session reports its counts when its client has gone, shortly
    after, so the wait is for the drain's own updates (claim and outcome of
    each job) to show."""
    deadline = time.monotonic() + 30
    while True:
        counts = _counts(admin)
        if counts["jobs"][1] >= updated_before + updates or time.monotonic() > deadline:
            return {name: read for name, (read, _) in counts.items()}
        time.sleep(0.1)


def _add(url: str, folder: Path, jobs: int) -> None:
    batch = folder / "jobs.ndjson"
    batch.write_text((json.dumps({"argv": ["true"]}) + "\n") * jobs)
    added = cli("add", "--batch", str(batch), db=url, json=True)
    assert added.exit_code == 0, added.stderr


def _drain(url: str, jobs: int, slots: int = 1) -> None:
    """One slot: each pass ends one job and claims one, the statements of the
    one-slot drain the benchmark measures. More: a pass may end several."""
    work = cli("work", "--drain", "--concurrency", str(slots), db=url, json=True, env=QUIET)
    assert work.exit_code == 0, work.stderr
    assert work.data["executed"] == jobs


def _migrated_without_autovacuum(url: str) -> None:
    migrated = cli("migrate", db=url, json=True)
    assert migrated.exit_code == 0, migrated.stderr
    with psycopg.connect(libpq_url(url), autocommit=True) as admin:
        for table in ("jobs", "attempts"):
            admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


def _analyze(url: str) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as admin:
        admin.execute("ANALYZE jobs, attempts")


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("history", "analyzed", "slots"),
    [(False, False, 1), (True, False, 1), (False, True, 1), (False, True, 4)],
    ids=["fresh", "after-a-drain", "analyzed-empty", "analyzed-empty-4-slots"],
)
def test_a_drain_reads_a_handful_of_rows_a_job(
    pg_url: str, tmp_path: Path, history: bool, analyzed: bool, slots: int
) -> None:
    """Fresh tables (the worker's plans are made while attempts is empty);
    tables that hold a drained history besides the backlog; and statistics
    taken of the backlog while attempts was empty, with one slot and with
    passes that end several jobs at once. Autovacuum is off for the tables:
    a statistics run in the middle of the drain would make the counts depend
    on when it came."""
    _migrated_without_autovacuum(pg_url)
    if history:
        _add(pg_url, tmp_path, JOBS)
        _drain(pg_url, JOBS)
    _add(pg_url, tmp_path, JOBS)
    if analyzed:
        _analyze(pg_url)
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
        before = _counts(admin)
        _drain(pg_url, JOBS, slots)
        after = _landed(admin, before["jobs"][1], 2 * JOBS)
    per_job = {name: (after[name] - before[name][0]) / JOBS for name in after}
    assert all(reads <= ROWS_PER_JOB_MAX for reads in per_job.values()), per_job
    assert per_job["jobs"] >= 1 and per_job["attempts"] >= 1, per_job


PASSES = 40
"""Passes of one connection, each recording the previous claim and claiming
the next: eight times the five custom plans PostgreSQL tries before it
settles on a generic plan, so a statement planned on every run shows."""
BACKLOG = 2_000
"""Queued jobs analyzed before the passes. With 45 the server's default kept
the generic plan of the claim; with 2,000 it planned the claim again on
each of its 35 prepared runs."""


def _pass(conn: Connection, queue: Queue, previous: list[Any]) -> list[Any]:
    """A worker's pass with one slot: the previous claims recorded as
    successes and one job claimed, sent together in one pipeline."""
    now, pid = time.time(), os.getpid()
    endings = [
        Ending(c.job_id, c.attempt_id, c.attempt_no, Outcome(0, None), pid) for c in previous
    ]
    settled = settle(conn, Claimant("test", pid, "default", queue.output_root), endings, 1, now)
    assert all(settled.states)
    return settled.claims


@pytest.mark.subprocess
def test_a_statement_run_again_is_not_planned_again(pg_url: str, tmp_path: Path) -> None:
    """The claim and the outcome on one connection, as a worker's passes run
    them, over an analyzed backlog: psycopg prepares each, and the server
    plans each at most its five trial times (none, with the generic plans
    spoolctl asks for). With the server's default plan mode those statistics
    made a fresh plan of the claim look cheaper than its generic one, and the
    server planned the claim again on every run: 0.4 to 0.6 ms of its CPU a
    job in the benchmark's database-only run."""
    _migrated_without_autovacuum(pg_url)
    _add(pg_url, tmp_path, BACKLOG)
    _analyze(pg_url)
    queue = open_for_write(driver_of(pg_url))
    claims: list[Any] = []
    try:
        with queue.engine.connect() as conn:
            for _ in range(PASSES):
                with conn.begin():
                    claims = _pass(conn, queue, claims)
                assert len(claims) == 1
            with conn.begin():
                plans = conn.exec_driver_sql(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
                ).all()
    finally:
        queue.dispose()
    runs_again = [p for p in plans if p.generic_plans + p.custom_plans >= PASSES - 10]
    assert len(runs_again) >= 2, plans  # the claim and the outcome, at least
    replanned = [(p.statement[:80], p.custom_plans) for p in plans if p.custom_plans > 5]
    assert not replanned, replanned
