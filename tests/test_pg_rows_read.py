"""What a job costs PostgreSQL in rows read, counted by the server itself
(pg_stat_user_tables, pg_stat_user_indexes): a drain's claims, output and
outcomes find each job and attempt by its key, so the rows read per job stay
a handful however many jobs the tables hold.

The plans the worker runs are generic plans that PostgreSQL builds once per
connection, early, while the tables are still small or their statistics
stale; and custom plans believe the statistics. A statement that offers the
planner a walk of every running job's index entries (`state = 'running'`),
every queued job's, or a scan of every attempt took it there, and a job's
cost then grew with the drain: a worker that had run 3,000 jobs read about
1,500 index entries of jobs and 3,000 attempts for each more."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest

from devtools.pg_server import libpq_url
from tests.helpers import cli

JOBS = 300
"""Enough that a walk of a table per job reads several times the bound below."""
ROWS_PER_JOB_MAX = 25
"""Rows read per job per table, index entries and table rows together.
Measured: 6 of attempts and 13 to 16 of jobs. A job's claim, attempt,
output and outcome are each found by key; the drain's end reads the lane's
jobs a few times over (`due.lane_settled`, `due.next_due_at`: once per
drain, not per job), 3 to 6 a job here. A walk of a table per job read
JOBS / 2 or more: about 300 of attempts fresh and 160 to 170 of jobs
after a drain, before the statements named their rows by key."""
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


def _drain(url: str, jobs: int) -> None:
    """One slot: each pass ends one job and claims one, the statements of the
    one-slot drain the benchmark measures."""
    work = cli("work", "--drain", "--concurrency", "1", db=url, json=True, env=QUIET)
    assert work.exit_code == 0, work.stderr
    assert work.data["executed"] == jobs


@pytest.mark.subprocess
@pytest.mark.parametrize("history", [False, True], ids=["fresh", "after-a-drain"])
def test_a_drain_reads_a_handful_of_rows_a_job(pg_url: str, tmp_path: Path, history: bool) -> None:
    """Fresh tables (the worker's plans are made while attempts is empty), and
    tables that hold a drained history besides the backlog; never analyzed
    (autovacuum off for them), as in a new installation's first minute: a
    statistics run in the middle would make the counts depend on when it
    came. Once analyzed, a plan made for a small table lasts until the next
    analysis, 10 % more rows later (autovacuum's default)."""
    migrated = cli("migrate", db=pg_url, json=True)
    assert migrated.exit_code == 0, migrated.stderr
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
        for table in ("jobs", "attempts"):
            admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    if history:
        _add(pg_url, tmp_path, JOBS)
        _drain(pg_url, JOBS)
    _add(pg_url, tmp_path, JOBS)
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
        before = _counts(admin)
        _drain(pg_url, JOBS)
        after = _landed(admin, before["jobs"][1], 2 * JOBS)
    per_job = {name: (after[name] - before[name][0]) / JOBS for name in after}
    assert all(reads <= ROWS_PER_JOB_MAX for reads in per_job.values()), per_job
    assert per_job["jobs"] >= 1 and per_job["attempts"] >= 1, per_job
