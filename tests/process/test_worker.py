"""The worker process: its modes, its signals, its row in `workers`, ownership
loss through cancel, and its refusal of bad knobs. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.database import open_write
from spoolctl.config import Timing
from spoolctl.db.engine import write_tx
from spoolctl.errors import Locked
from spoolctl.runner import supervise
from spoolctl.services.cancel import cancel
from spoolctl.services.deadletter import requeue
from spoolctl.worker import Worker, WorkerOptions
from tests.helpers import (
    Db,
    add_job,
    attempts_of,
    cli,
    events_of,
    inproc,
    job,
    patience,
    pid_alive,
    rows,
    signal_taken,
    start_worker,
    wait_for,
)
from tests.helpers import execute as write_behind

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_backends, pytest.mark.subprocess]


def once(db: Db) -> dict[str, Any]:
    result = cli("work", "--once", db=db, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.data  # type: ignore[no-any-return]


def running_pids(db: Db, job_id: int, pidfile: Path) -> list[int]:
    """Wait until the job's attempt has spawned and its script wrote its pids."""
    wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2, what="job start")
    wait_for(lambda: attempts_of(db, job_id)[0]["job_pid"] is not None, what="spawn recorded")
    return [int(p) for p in pidfile.read_text().split()]


def long_job(db: Db, pidfile: Path, **spec: Any) -> int:
    """A job leading a group with a grandchild; both pids go to pidfile."""
    script = f"sleep 60 & echo $! >> {pidfile}; echo $$ >> {pidfile}; wait"
    return add_job(db, "sh", "-c", script, **spec)


def test_once_reports_what_it_did(db: Db) -> None:
    assert once(db) == {"claimed": False}
    ok = add_job(db, "true")
    bad = add_job(db, "false")

    assert once(db) == {
        "claimed": True,
        "job_id": ok,
        "attempt_no": 1,
        "result": "succeeded",
        "job_state": "done",
    }
    assert once(db) == {
        "claimed": True,
        "job_id": bad,
        "attempt_no": 1,
        "result": "process_exit",
        "job_state": "queued",
    }
    # bad waits out its backoff (kept from running out while the next process
    # starts: a loaded machine can take the 2 s)
    assert job(db, bad)["next_run_at"] > attempts_of(db, bad)[0]["finished_at"]
    write_behind(db, "UPDATE jobs SET next_run_at = ? WHERE id = ?", (time.time() + 3600, bad))
    assert once(db) == {"claimed": False}


def test_drain_waits_for_retries_but_not_for_delayed_jobs(db: Db, tmp_path: Path) -> None:
    later = add_job(db, "true", run_at=time.time() + 3600)
    flaky = add_job(db, "sh", "-c", 'test "$SPOOLCTL_ATTEMPT" = 2')

    started = time.monotonic()
    result = cli("work", "--drain", db=db, json=True)

    assert result.exit_code == 0
    assert result.data["drained"] is True and result.data["executed"] == 2
    assert time.monotonic() - started < 10
    assert (job(db, flaky)["state"], job(db, flaky)["attempts"]) == ("done", 1)
    assert job(db, later)["state"] == "queued" and attempts_of(db, later) == []


def test_a_drain_reports_where_its_time_went(db: Db) -> None:
    for _ in range(3):
        add_job(db, "true")

    result = cli("work", "--drain", db=db, json=True)

    assert result.exit_code == 0, result.stdout + result.stderr
    timings = result.data["timings"]
    assert set(timings) == {"db_s", "spawn_s", "wall_s", "jobs"}
    assert timings["jobs"] == result.data["executed"] == 3
    assert timings["db_s"] > 0 and timings["spawn_s"] > 0, timings
    assert timings["db_s"] + timings["spawn_s"] <= timings["wall_s"], timings


def test_first_signal_lets_the_running_job_finish(db: Db, tmp_path: Path) -> None:
    started = tmp_path / "started"
    running = add_job(db, "sh", "-c", f"touch {started}; sleep 1; echo finished")
    waiting = add_job(db, "true")
    worker = start_worker(db)
    wait_for(started.exists, what="job start")

    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=patience(20))

    assert worker.returncode == 0
    data = json.loads(out)["data"]
    assert data["stopped_by_signal"] is True
    assert data["timings"]["jobs"] == 1, "a loop-mode worker reports its timings too"
    assert job(db, running)["state"] == "done"
    assert Path(attempts_of(db, running)[0]["stdout_path"]).read_text() == "finished\n"
    assert job(db, waiting)["state"] == "queued", "claimed a job after the stop signal"
    (row,) = rows(db, "SELECT * FROM workers")
    assert (row["state"], row["pid"]) == ("stopped", worker.pid)
    assert row["stopped_at"] is not None


def test_second_signal_kills_the_group_and_requeues_as_a_crash(db: Db, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    job_id = long_job(db, pidfile)
    worker = start_worker(db)
    pids = running_pids(db, job_id, pidfile)

    signal_taken(worker, signal.SIGTERM)  # two distinct signals, not one coalesced delivery
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=patience(20))

    assert worker.returncode == 0 and json.loads(out)["data"]["stopped_by_signal"] is True
    (attempt,) = attempts_of(db, job_id)
    assert attempt["state"] == "abandoned"
    assert attempt["failure_reason"] == "worker_crash"
    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("queued", 1, 1), "retries kept"
    assert events_of(db, job_id) == ["added", "claimed", "failed"]
    for pid in pids:
        wait_for(lambda pid=pid: not pid_alive(pid), 3, what=f"pid {pid} to die")


def test_cancelling_a_running_job_makes_its_worker_kill_the_group(db: Db, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    job_id = long_job(db, pidfile)
    worker = start_worker(db)
    try:
        pids = running_pids(db, job_id, pidfile)
        queue = open_write(str(db))
        with write_tx(queue.engine) as conn:
            cancel(conn, job_id, running_ok=True, now=time.time())
        queue.engine.dispose()

        for pid in pids:
            wait_for(lambda pid=pid: not pid_alive(pid), 5, what=f"pid {pid} to die")
        after = add_job(db, "true")
        wait_for(lambda: job(db, after)["state"] == "done", what="the worker to carry on")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=patience(20))
    assert worker.returncode == 0
    assert job(db, job_id)["state"] == "canceled"
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["failure_reason"]) == ("canceled", "canceled")
    assert events_of(db, job_id) == ["added", "claimed", "canceled"]


RERUN_PROBE = """
import os, sys, time
from pathlib import Path
folder, attempt = Path(sys.argv[1]), os.environ["SPOOLCTL_ATTEMPT"]
if attempt == "1":
    (folder / "pid.1").write_text(str(os.getpid()))
    time.sleep(60)
else:
    pid = int((folder / "pid.1").read_text())
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(") ", 1)[1].split()[0]
    except OSError:
        state = "gone"
    (folder / "seen.2").write_text(state)
"""


def test_a_force_retried_job_does_not_rerun_while_its_first_attempt_lives(
    db: Db, tmp_path: Path
) -> None:
    """retry --force hands the job back at once, but its owner only kills the
    old attempt at its next heartbeat: no worker may start attempt 2 before then."""
    script = tmp_path / "probe.py"
    script.write_text(RERUN_PROBE)
    job_id = add_job(db, sys.executable, str(script), str(tmp_path))
    slow = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "2", "SPOOLCTL_TEST_REAP_THRESHOLD": "30"}
    owner = start_worker(db, env=slow)
    wait_for((tmp_path / "pid.1").exists, what="attempt 1")
    other = start_worker(db, "--poll-interval", "0.1", env=slow)
    wait_for(lambda: len(rows(db, "SELECT id FROM workers")) == 2, what="the other worker")
    try:
        queue = open_write(str(db))
        with write_tx(queue.engine) as conn:
            requeue(conn, job_id, force=True, now=time.time())
        queue.engine.dispose()
        wait_for(lambda: job(db, job_id)["state"] == "done", timeout=15, what="attempt 2")
    finally:
        for worker in (owner, other):
            worker.send_signal(signal.SIGTERM)
            worker.communicate(timeout=patience(20))
    assert (tmp_path / "seen.2").read_text() in ("gone", "Z"), "two attempts ran at once"
    first, _ = attempts_of(db, job_id)
    assert (first["state"], first["failure_reason"]) == ("canceled", "canceled")


def test_a_spawn_record_lost_to_a_busy_lock_is_retried_until_it_lands(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the job's pid on its attempt a reaper could not kill the job if
    this worker died; one busy lock must not lose it for good."""
    job_id = add_job(db, "sleep", "1")
    real = supervise.record_spawn
    calls: list[int] = []

    def busy_the_first_time(
        conn: Any, execution: supervise.Execution, started_at: float | None
    ) -> None:
        calls.append(execution.claim.job_id)
        if len(calls) == 1:
            raise Locked("database is locked")
        real(conn, execution, started_at)

    monkeypatch.setattr(supervise, "record_spawn", busy_the_first_time)
    queue = open_write(str(db))
    worker = Worker(queue, WorkerOptions(mode="once"), Timing(0.2, 1.0, 600.0))
    try:
        worker.run()
    finally:
        queue.engine.dispose()

    (attempt,) = attempts_of(db, job_id)
    assert len(calls) == 2
    assert attempt["job_pid"] is not None and attempt["job_started_at"] is not None


def test_a_due_spawn_record_rides_with_the_next_pass(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy worker's spawn records go with the pass that records another
    job's end, not in a transaction of their own: with the record's own
    transaction held off for good, the long job's start time still lands
    while it runs (a pid stored with the outcome would come without one)."""
    long_id = add_job(db, "sleep", "1")
    short_id = add_job(db, "sleep", "0.05")
    monkeypatch.setattr(supervise, "SPAWN_RECORD_ALONE_S", 3600.0)
    queue = open_write(str(db))
    options = WorkerOptions(mode="drain", concurrency=2)
    worker = Worker(queue, options, Timing(0.2, 1.0, 600.0))
    try:
        worker.run()
    finally:
        queue.engine.dispose()

    (long_attempt,) = attempts_of(db, long_id)
    (short_attempt,) = attempts_of(db, short_id)
    assert (long_attempt["state"], short_attempt["state"]) == ("succeeded", "succeeded")
    assert long_attempt["job_pid"] is not None and long_attempt["job_started_at"] is not None
    assert short_attempt["job_started_at"] is None  # it ended before any pass to ride with


def test_the_worker_row_is_registered_heartbeats_and_stops(db: Db) -> None:
    add_job(db, "true")  # creates the queue file, in a lane the worker does not serve
    worker = start_worker(db, "--worker-id", "w-beat", "--queue", "lane")
    try:
        wait_for(lambda: rows(db, "SELECT * FROM workers"), what="register")
        first = rows(db, "SELECT * FROM workers WHERE id = 'w-beat'")[0]
        assert (first["state"], first["pid"], first["queue"]) == ("running", worker.pid, "lane")
        wait_for(
            lambda: rows(db, "SELECT heartbeat_at FROM workers")[0][0] > first["heartbeat_at"],
            what="a heartbeat",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=patience(20))
    (row,) = rows(db, "SELECT * FROM workers")
    assert row["state"] == "stopped" and row["stopped_at"] >= row["heartbeat_at"] - 1


def test_a_stopped_workers_id_can_be_reused_but_a_live_ones_cannot(db: Db) -> None:
    first = add_job(db, "true")
    assert cli("work", "--once", "--worker-id", "w1", db=db).exit_code == 0
    second = add_job(db, "true")
    assert cli("work", "--once", "--worker-id", "w1", db=db).exit_code == 0
    assert [attempts_of(db, j)[0]["worker_id"] for j in (first, second)] == ["w1", "w1"]
    assert [r["state"] for r in rows(db, "SELECT state FROM workers")] == ["stopped"]

    live = start_worker(db, "--worker-id", "w2")
    try:
        wait_for(lambda: rows(db, "SELECT 1 FROM workers WHERE id = 'w2'"), what="w2 registered")
        clash = cli("work", "--once", "--worker-id", "w2", db=db, json=True)
        assert clash.exit_code == 5
        assert clash.envelope["errors"][0]["code"] == "CONFLICT"
    finally:
        live.send_signal(signal.SIGTERM)
        live.communicate(timeout=patience(20))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "0"),
        ("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "nan"),
        ("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "-1"),
        ("SPOOLCTL_TEST_REAP_THRESHOLD", "inf"),
        ("SPOOLCTL_TEST_REAP_THRESHOLD", "soon"),
        ("SPOOLCTL_HANG_THRESHOLD", "-5"),
    ],
)
def test_invalid_knobs_are_refused(
    db: Db,
    name: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    add_job(db, "true")
    monkeypatch.setenv(name, value)

    result = inproc("work", "--once", "--db", str(db), "--json", capsys=capsys)

    assert result.exit_code == 1
    envelope = result.envelope
    assert envelope["ok"] is False and envelope["data"] is None
    assert envelope["errors"][0]["code"] == "INVALID_INPUT"
    assert name in envelope["errors"][0]["message"]
    assert "Traceback" not in result.stderr
    assert rows(db, "SELECT count(*) FROM attempts")[0][0] == 0
