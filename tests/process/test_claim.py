"""Several real worker processes on one queue file: every job runs exactly once
(no crash happens here), the fleet-wide slot cap holds, claims follow priority
order, and a worker never leaves its lane. On SQLite and on PostgreSQL."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import (
    Db,
    add_job,
    attempts_of,
    cli,
    execute,
    job,
    patience,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_backends, pytest.mark.subprocess]


JOBS = 200


def start_fleet(db: Db, worker_args: list[list[str]]) -> list[subprocess.Popen[str]]:
    """Start loop-mode workers and wait until every one is registered and idle."""
    add_job(db, "true", lane="setup")  # creates the file, in a lane nobody serves
    fleet = [start_worker(db, *args) for args in worker_args]
    wait_for(
        lambda: len(rows(db, "SELECT id FROM workers WHERE state = 'running'")) == len(fleet),
        what="every worker to register",
    )
    return fleet


def stop_fleet(fleet: list[subprocess.Popen[str]]) -> None:
    for worker in fleet:
        worker.send_signal(signal.SIGTERM)
    for worker in fleet:
        worker.communicate(timeout=patience(20))
        assert worker.returncode == 0


def test_many_jobs_many_workers_each_job_runs_exactly_once(db: Db, tmp_path: Path) -> None:
    log = tmp_path / "log"
    line = f'echo "$SPOOLCTL_JOB_ID $SPOOLCTL_ATTEMPT $SPOOLCTL_WORKER_ID $SPOOLCTL_SLOT" >> {log}'
    batch = tmp_path / "jobs.ndjson"
    batch.write_text("".join(json.dumps({"cmd": line}) + "\n" for _ in range(JOBS)))
    fleet = start_fleet(db, [[], ["--concurrency", "2"], [], ["--concurrency", "2"]])
    try:
        added = cli("add", "--batch", str(batch), db=db, json=True)
        assert added.exit_code == 0, added.stdout + added.stderr
        ids = added.data["job_ids"]
        done = "SELECT count(*) FROM jobs WHERE state = 'done'"
        wait_for(lambda: rows(db, done)[0][0] == JOBS, timeout=60, what="every job done")
    finally:
        stop_fleet(fleet)

    runs = [ln.split() for ln in log.read_text().splitlines()]
    assert Counter(int(r[0]) for r in runs) == Counter(ids), "a job ran twice or never"
    assert {r[1] for r in runs} == {"1"}
    attempts = rows(db, "SELECT job_id, attempt_no, worker_id, state FROM attempts")
    assert sorted(a["job_id"] for a in attempts) == sorted(ids), "duplicate attempt rows"
    assert {a["state"] for a in attempts} == {"succeeded"}
    claimed = rows(db, "SELECT count(*) FROM job_events WHERE event = 'claimed'")[0][0]
    assert claimed == len(attempts) == JOBS
    by_attempt = {a["job_id"]: a["worker_id"] for a in attempts}
    assert all(by_attempt[int(job_id)] == worker for job_id, _, worker, _ in runs)
    concurrency = {row["id"]: row["concurrency"] for row in rows(db, "SELECT * FROM workers")}
    for _, _, worker, slot in runs:
        assert 0 <= int(slot) < concurrency[worker], "SPOOLCTL_SLOT out of the worker's range"
    assert len({a["worker_id"] for a in attempts}) >= 2, "the workers did not compete"


def test_slots_cap_running_jobs_across_workers(db: Db, tmp_path: Path) -> None:
    log = tmp_path / "spans"
    span = f's=$(date +%s%N); sleep 0.15; echo "$s $(date +%s%N)" >> {log}'
    fleet = start_fleet(db, [["--queue", "serial", "--slots", "1", "--concurrency", "2"]] * 2)
    try:
        ids = [add_job(db, "sh", "-c", span, lane="serial") for _ in range(6)]
        wait_for(lambda: all(job(db, j)["state"] == "done" for j in ids), what="all done")
    finally:
        stop_fleet(fleet)

    spans = sorted(tuple(map(int, ln.split())) for ln in log.read_text().splitlines())
    assert len(spans) == 6
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two jobs of a one-slot queue ran at the same time"


def test_claims_follow_priority_then_due_time_then_id(db: Db) -> None:
    low = add_job(db, "true", priority=-1)
    plain_a = add_job(db, "true")
    high_a = add_job(db, "true", priority=5)
    plain_b = add_job(db, "true")
    high_b = add_job(db, "true", priority=5)
    # plain_b became due before plain_a: it goes first among equals
    execute(db, "UPDATE jobs SET next_run_at = next_run_at - 100 WHERE id = ?", (plain_b,))

    result = cli("work", "--drain", db=db, json=True)

    assert result.exit_code == 0
    order = [r["job_id"] for r in rows(db, "SELECT job_id FROM attempts ORDER BY id")]
    assert order == [high_a, high_b, plain_b, plain_a, low]


def test_a_worker_never_leaves_its_lane(db: Db, tmp_path: Path) -> None:
    lane = add_job(db, "sh", "-c", "echo $SPOOLCTL_QUEUE", lane="gpu")
    other = add_job(db, "true")

    result = cli("work", "--drain", "--queue", "gpu", db=db, json=True)

    assert result.exit_code == 0 and result.data["executed"] == 1
    assert job(db, lane)["state"] == "done"
    assert Path(attempts_of(db, lane)[0]["stdout_path"]).read_text() == "gpu\n"
    assert job(db, other)["state"] == "queued" and attempts_of(db, other) == []
