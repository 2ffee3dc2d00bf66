"""The holes in crash recovery, closed, each shown with real processes:

- an attempt ends with its whole process group, so background children of
  attempt N never overlap attempt N+1;
- an orphan whose end cannot be confirmed keeps its job running (flagged in
  status, workers and doctor) instead of a second copy starting;
- running rows without a heartbeat (adopted from old databases) are reaped;
- a worker that cannot be probed is judged by the lease rule, and a worker
  whose heartbeats cannot land fences itself;
- a worker keeps enforcing timeouts and handling signals while the write lock
  is held elsewhere, and a worker whose slots are all busy still reaps.

The lease, lock and reap tests run on SQLite and on PostgreSQL; the process
handling (the same on both), the unconfirmed orphan and the adopted legacy
file stay on SQLite.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    Db,
    Strays,
    WriteLock,
    add_job,
    attempts_of,
    child_env,
    cli,
    cli_json,
    events_of,
    execute_all,
    job,
    kill_worker_and_guard,
    patience,
    pid_alive,
    rows,
    signal_taken,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.subprocess]


def pid_in(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), what=f"{path.name}")
    return int(path.read_text().split()[0])


@contextmanager
def write_lock_held(db: Db) -> Iterator[None]:
    """Hold the write lock from outside, as a long migration or a stray
    `sqlite3` (or `psql`) shell would."""
    holder = WriteLock(db)
    try:
        yield
    finally:
        holder.release()


def finish(worker: subprocess.Popen[str], timeout: float = 30) -> dict[str, object]:
    out, err = worker.communicate(timeout=timeout)
    assert worker.returncode == 0, out + err
    return json.loads(out)["data"]  # type: ignore[no-any-return]


# -- an attempt ends with its whole process group ------------------------------


def test_a_background_child_does_not_outlive_its_attempt(db: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    job_id = add_job(db, "sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 0")

    data = cli_json("work", "--drain", db=db).data

    assert data["executed"] == 1 and job(db, job_id)["state"] == "done"
    assert not pid_alive(pid_in(pidfile)), "the sleeper outlived the attempt"


@pytest.mark.slow
def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(
    db: Path, tmp_path: Path
) -> None:
    pidfile = tmp_path / "child"
    ready = tmp_path / "ready"
    script = (
        f"(trap '' TERM; touch {ready}; exec sleep 60) & echo $! > {pidfile};"
        f" while [ ! -e {ready} ]; do sleep 0.01; done; exit 0"
    )
    job_id = add_job(db, "sh", "-c", script)

    started = time.monotonic()
    assert cli_json("work", "--drain", db=db).data["executed"] == 1
    took = time.monotonic() - started

    assert not pid_alive(pid_in(pidfile))
    assert took >= 5.0, "the outcome was recorded before the grace period ended"
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["exit_code"]) == ("succeeded", 0)


def test_a_failed_attempts_children_never_overlap_the_retry(db: Path, tmp_path: Path) -> None:
    """Attempt 1 leaves a child holding a lock for 60 s and fails; the retry
    (2 s later) must find the lock free."""
    lock = tmp_path / "lock"
    script = (
        'if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then flock -n "$0" sleep 60 & sleep 0.3; exit 1; '
        'else exec flock -n -E 99 "$0" true; fi'
    )
    job_id = add_job(db, "sh", "-c", script, str(lock), max_retries=1)

    cli_json("work", "--drain", "--poll-interval", "0.1", db=db)

    first, second = attempts_of(db, job_id)
    assert (first["state"], first["exit_code"]) == ("failed", 1)
    assert (second["state"], second["exit_code"]) == ("succeeded", 0), "lock still held"


# -- unconfirmed means not requeued --------------------------------------------


def _nobody_can_run_spoolctl(env: dict[str, str]) -> bool:
    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import spoolctl.cli, psutil, sqlalchemy"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.slow
def test_an_orphan_that_cannot_be_killed_keeps_its_job_running_and_is_shown() -> None:
    """A reaper running as another user cannot signal the dead worker's job:
    the job stays running, flagged with its pid in status, workers and doctor,
    and is requeued only once the orphan is gone."""
    assert os.getuid() == 0 and shutil.which("setpriv"), (
        "this test runs a reaper as another user: it needs root and setpriv (CI has both)"
    )
    base = Path(tempfile.mkdtemp(prefix="spoolctl-orphan-", dir="/tmp"))
    try:
        _unconfirmed_orphan_scenario(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_an_orphan_gone_with_its_first_cgroup_swept_is_requeued_by_another_user() -> None:
    """Once the operator ended the orphan, a root worker's sweep of empty
    leftovers may remove the attempt's first cgroup (cgroup v2) before the
    other user's reaper looks, leaving the v1 memory one, which that user can
    neither kill nor remove: the job was kept running for ever."""
    assert os.getuid() == 0 and shutil.which("setpriv"), "needs root and setpriv (CI has both)"
    base = Path(tempfile.mkdtemp(prefix="spoolctl-orphan-", dir="/tmp"))
    try:
        _unconfirmed_orphan_scenario(base, sweep_first=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _unconfirmed_orphan_scenario(base: Path, *, sweep_first: bool = False) -> None:
    os.chmod(base, 0o755)
    db = base / "spool" / "queue.db"
    pidfile = base / "job.pid"
    job_id = add_job(db, "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60")
    os.chmod(db.parent, 0o777)  # the other user's reaper must open the queue
    os.chmod(db, 0o666)  # SQLite gives -wal and -shm the database file's mode

    owner = start_worker(db)
    strays = Strays()
    orphan = strays.keep(pid_in(pidfile))
    wait_for(lambda: attempts_of(db, job_id)[0]["job_pid"] == orphan, what="pid recorded")
    kill_worker_and_guard(owner)  # with its lease guard: the job lives on

    other_env = child_env()
    assert _nobody_can_run_spoolctl(other_env), (
        f"user nobody must be able to run spoolctl from this checkout ({REPO})"
    )
    reaper_cmd = [*AS_NOBODY, sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--json"]
    other = subprocess.Popen(reaper_cmd, env=other_env, stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "orphan_unconfirmed" in events_of(db, job_id), what="the flag")
        time.sleep(1.5)  # several more reap passes: still not requeued
        assert job(db, job_id)["state"] == "running" and pid_alive(orphan)
        assert events_of(db, job_id).count("orphan_unconfirmed") == 1, "flagged once"

        (flag,) = cli_json("status", db=db).data["orphans_unconfirmed"]
        assert (flag["job_id"], flag["pid"]) == (job_id, orphan)
        assert "cannot tell" in flag["reason"]
        assert cli_json("workers", db=db).data["orphans_unconfirmed"] == [flag]
        text = cli("status", db=db).stdout
        assert "unconfirmed orphans: 1" in text and str(orphan) in text
        checks = {c["id"]: c for c in cli_json("doctor", db=db).data["checks"]}
        assert checks["orphans_unconfirmed"]["status"] == "warn"
        assert f"job {job_id} pid {orphan}" in checks["orphans_unconfirmed"]["message"]

        if sweep_first:
            _end_and_sweep_first_cgroup(db, job_id, orphan, other)
        else:
            os.kill(orphan, signal.SIGKILL)  # the operator ends it
        wait_for(lambda: job(db, job_id)["state"] != "running", what="the requeue")
        # the cgroup this user cannot remove is no reason to flag the job again
        assert events_of(db, job_id).count("orphan_unconfirmed") == 1, events_of(db, job_id)
        assert job(db, job_id)["crashes"] == 1
        assert events_of(db, job_id)[-2:] == ["orphan_unconfirmed", "reaped"]
        assert cli_json("status", db=db).data["orphans_unconfirmed"] == []
    finally:
        other.kill()
        other.communicate()
        strays.kill()


def _end_and_sweep_first_cgroup(
    db: Path, job_id: int, orphan: int, reaper: subprocess.Popen[str]
) -> None:
    """The operator ends the orphan and a root sweep removes the attempt's
    first (now empty) cgroup, both while the other user's reaper is held."""
    directories = (attempts_of(db, job_id)[0]["cgroup"] or "").splitlines()
    # as root the worker contains its jobs; with one hierarchy (pure cgroup v2)
    # nothing is left after the sweep, and the check below holds all the same
    assert directories, "a root worker records its attempt's cgroup"
    reaper.send_signal(signal.SIGSTOP)
    try:
        os.kill(orphan, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{orphan}"), what="the orphan gone")
        wait_for(lambda: _rmdir(directories[0]), what="its first cgroup removed")
    finally:
        reaper.send_signal(signal.SIGCONT)


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True  # a cleaner of the machine's was first
    except OSError:
        return False  # still populated for a moment after the kill
    return True


# -- nothing stays running forever ----------------------------------------------


def test_a_running_row_without_heartbeat_from_an_old_database_is_reaped(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    db = spool / "queue.db"
    shutil.copy(REPO / "tests/fixtures/legacy/v1-populated.db", db)
    assert cli_json("migrate", db=db).exit_code == 0
    (stuck,) = rows(db, "SELECT id, heartbeat_at, locked_at FROM jobs WHERE state = 'running'")
    assert (stuck["heartbeat_at"], stuck["locked_at"]) == (None, None)

    assert cli_json("work", "--once", db=db).exit_code == 0

    row = job(db, stuck["id"])
    assert (row["state"], row["crashes"], row["last_failure_reason"]) == (
        "queued",
        1,
        "worker_crash",
    )
    assert "no heartbeat, lock or start time" in row["last_error"]


def _job_of_a_worker_on(db: Db, hostname: str, silent_s: float) -> int:
    """A running job of a worker on another machine, silent for silent_s."""
    job_id = add_job(db, "true")
    old = time.time() - silent_s
    execute_all(
        db,
        (
            "INSERT INTO workers (id, hostname, pid, process_started_at, boot_id, queue,"
            " concurrency, started_at, heartbeat_at, state, jobs_run)"
            " VALUES (?, ?, 1, 1.0, 'other-boot', 'default', 1, ?, ?, 'running', 0)",
            (f"{hostname}-1", hostname, old, old),
        ),
        (
            "UPDATE jobs SET state = 'running', locked_by = ?, locked_pid = 1, locked_at = ?,"
            " heartbeat_at = ?, started_at = ? WHERE id = ?",
            (f"{hostname}-1", old, old, old, job_id),
        ),
        (
            "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state,"
            " started_at, stdout_path, stderr_path) VALUES (?, 1, ?, 1, 'running', ?, 'o', 'e')",
            (job_id, f"{hostname}-1", old),
        ),
    )
    return job_id


@pytest.mark.both_backends
def test_a_worker_that_cannot_be_probed_is_trusted_for_its_lease_only(db: Db) -> None:
    assert socket.gethostname() != "renamed-host"
    within = _job_of_a_worker_on(db, "renamed-host", silent_s=5)
    beyond = _job_of_a_worker_on(db, "container-host", silent_s=20)

    env = {"SPOOLCTL_HANG_THRESHOLD": "10"}
    assert cli_json("work", "--once", "--queue", "none", db=db, env=env).exit_code == 0

    assert job(db, within)["state"] == "running", "requeued within its lease"
    row = job(db, beyond)
    assert (row["state"], row["crashes"]) == ("queued", 1)
    assert events_of(db, beyond)[-1] == "reaped"


@pytest.mark.slow
@pytest.mark.both_backends
def test_a_worker_whose_heartbeats_cannot_land_fences_itself(db: Db, tmp_path: Path) -> None:
    """Lock held from outside beyond half the hang threshold: the worker kills
    its job and claims nothing; once the lock is free it records the attempt
    as a crash, and the job runs again."""
    pidfile = tmp_path / "job.pid"
    script = f'echo $$ > {pidfile}; if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then exec sleep 60; fi'
    job_id = add_job(db, "sh", "-c", script)
    worker = start_worker(db, "--drain", env={"SPOOLCTL_HANG_THRESHOLD": "2"})
    first = pid_in(pidfile)
    pidfile.unlink()
    with write_lock_held(db):  # killed while no heartbeat can land: the fence, not the lock's end
        wait_for(lambda: not pid_alive(first), timeout=10, what="the job to be fenced")
        assert worker.poll() is None, "the worker waits; it does not exit"
        time.sleep(0.5)
    data = finish(worker)
    assert data["executed"] == 2
    one, two = attempts_of(db, job_id)
    assert (one["state"], one["failure_reason"]) == ("abandoned", "worker_crash")
    assert "fenced" in one["error"]
    assert two["state"] == "succeeded"
    assert (job(db, job_id)["state"], job(db, job_id)["crashes"]) == ("done", 1)


# -- a worker never stalls --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.both_backends
def test_timeouts_and_signals_are_handled_while_the_lock_is_held_elsewhere(
    db: Db, tmp_path: Path
) -> None:
    pidfile = tmp_path / "job.pid"
    job_id = add_job(
        db, "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60", timeout_seconds=1, max_retries=0
    )
    worker = start_worker(db)
    pid = pid_in(pidfile)
    with write_lock_held(db):
        wait_for(lambda: not pid_alive(pid), timeout=4, what="the timeout kill")
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        time.sleep(7)  # beyond the 5 s busy timeout: the worker must not give up
        assert worker.poll() is None, "the worker stopped before recording its job"
    data = finish(worker)
    assert data["stopped_by_signal"] is True
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["failure_reason"]) == ("timed_out", "timeout")
    assert job(db, job_id)["state"] == "dead"


@pytest.mark.both_backends
def test_a_worker_with_every_slot_busy_still_reaps(db: Db, tmp_path: Path) -> None:
    busy_pid, crashed_pid = tmp_path / "busy.pid", tmp_path / "crashed.pid"
    busy = add_job(db, "sh", "-c", f"echo $$ > {busy_pid}; exec sleep 60")
    saturated = start_worker(db)
    wait_for(lambda: job(db, busy)["state"] == "running", what="the busy job")
    orphaned = add_job(db, "sh", "-c", f"echo $$ > {crashed_pid}; exec sleep 60")
    doomed = start_worker(db)
    orphan = pid_in(crashed_pid)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=patience(10))

    wait_for(lambda: job(db, orphaned)["state"] == "queued", timeout=15, what="the reap")
    assert not pid_alive(orphan), "requeued while its orphan still ran"
    assert job(db, busy)["state"] == "running" and pid_alive(pid_in(busy_pid))
    (reaped,) = attempts_of(db, orphaned)
    assert reaped["state"] == "abandoned"
    assert saturated.poll() is None
    signal_taken(saturated, signal.SIGINT)  # two signals at once may reach it as one
    saturated.send_signal(signal.SIGINT)
    saturated.communicate(timeout=patience(20))
