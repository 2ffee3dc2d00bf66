"""A pid is only recorded with its start time. A worker whose outcome write
failed (a dropped connection) still held the ended attempt in `running` and
wrote its pid as a spawn record, with no start time to read: the writer
meant "ended", every reaper read "unknown", no reap could confirm that pid
gone, and the job stayed `running` for ever once the worker crashed, logged
again at every look. Now the writer records no pid for a job it has waited
for, a reaper takes a pid without a start time for no identity (the
attempt's token tells whether anything of it still runs), and an orphan left
unconfirmed is logged once."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Connection

from spoolctl.cli.database import open_write
from spoolctl.config import Timing
from spoolctl.db.engine import read_tx
from spoolctl.db.queue import Queue
from spoolctl.runner import liveness, procs, supervise
from spoolctl.runner.capacity import Place
from spoolctl.services import claim, reaper
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from spoolctl.worker.reaping import Reaping
from tests.helpers import Db, attempts_of, cli, events_of, execute_all, job, wait_for

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess, pytest.mark.timeout(90)]


@pytest.fixture
def queue(db: Db) -> Iterator[Queue]:
    opened = open_write(str(db))
    yield opened
    opened.engine.dispose()


def claimed(queue: Queue, argv: list[str]) -> claim.Claim:
    spec = JobSpec(argv=argv)
    queue.write(lambda conn: submit(conn, spec, time.time() - 1))

    def take(conn: Connection) -> claim.Claim:
        claimant = claim.Claimant("w", os.getpid(), "default", queue.output_root)
        (found,) = claim.claim_up_to(conn, claimant, 1, time.time())
        return found

    return queue.write(take)


def test_no_pid_is_recorded_for_a_job_already_waited_for(queue: Queue, db: Db) -> None:
    ended = supervise.Execution(claimed(queue, ["true"]), Place((0,)))
    running = supervise.Execution(claimed(queue, ["sleep", "30"]), Place((1,)))
    base = supervise.encoded_environment()
    try:
        for execution in (ended, running):
            execution.start(base, "w", time.time())
        wait_for(lambda: ended.poll(time.time()) is not None, what="the short job's end")
        assert ended.returncode == 0 and ended.pid is not None
        queue.write(lambda conn: supervise.record_spawns(conn, [ended, running]))
        queue.write(lambda conn: supervise.record_spawn(conn, ended, None))
    finally:
        running.kill_now()
        running.wait_blocking()

    def recorded(execution: supervise.Execution) -> tuple[Any, Any]:
        (attempt,) = attempts_of(db, execution.claim.job_id)
        return attempt["job_pid"], attempt["job_started_at"]

    assert recorded(ended) == (None, None), "a pid without its start time was recorded"
    pid, started_at = recorded(running)
    assert pid == running.pid and started_at is not None


def dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def ghost_job_with_a_bare_job_pid(db: Db, folder: Path) -> int:
    """A job left `running` by a dead worker on this machine (its row names a
    gone pid, silent for 100 s), whose attempt has a job pid and no start
    time: what an older spoolctl wrote for a job it had already waited for."""
    marker = folder / "ran"
    job_id = add(db, ["sh", "-c", f"echo $SPOOLCTL_ATTEMPT >> {marker}"])
    old, pid = time.time() - 100, dead_pid()
    execute_all(
        db,
        (
            "INSERT INTO workers (id, hostname, pid, process_started_at, boot_id, pid_space, queue,"
            " concurrency, started_at, heartbeat_at, state, jobs_run)"
            " VALUES ('ghost', ?, ?, ?, ?, ?, 'default', 1, ?, ?, 'running', 0)",
            (socket.gethostname(), pid, old, procs.boot_id(), procs.pid_space(), old, old),
        ),
        (
            "UPDATE jobs SET state = 'running', locked_by = 'ghost', locked_pid = ?,"
            " locked_at = ?, heartbeat_at = ?, started_at = ? WHERE id = ?",
            (pid, old, old, old, job_id),
        ),
        (
            "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, started_at,"
            " stdout_path, stderr_path, job_pid, job_pgid, job_started_at) VALUES"
            " (?, 1, 'ghost', ?, 'running', ?, '/nonexistent/out', '/nonexistent/err', ?, ?, NULL)",
            (job_id, pid, old, dead_pid(), dead_pid()),
        ),
    )
    return job_id


def add(db: Db, argv: list[str]) -> int:
    queue = open_write(str(db))
    try:
        spec = JobSpec(argv=argv)
        return queue.write(lambda conn: submit(conn, spec, time.time())).job_id
    finally:
        queue.engine.dispose()


def test_a_job_pid_recorded_without_its_start_time_is_reaped_by_the_attempts_token(
    db: Db, tmp_path: Path
) -> None:
    job_id = ghost_job_with_a_bare_job_pid(db, tmp_path)

    drained = cli("work", "--drain", "--poll-interval", "0.1", db=db, json=True)

    assert drained.exit_code == 0, drained.stdout + drained.stderr
    row = job(db, job_id)
    assert (row["state"], row["crashes"]) == ("done", 1), events_of(db, job_id)
    assert attempts_of(db, job_id)[0]["failure_reason"] == "worker_crash"
    assert (tmp_path / "ran").read_text() == "2\n"
    assert "orphan_unconfirmed" not in events_of(db, job_id)


@pytest.mark.sqlite_only("the log of a reap pass is the same on both backends")
def test_an_orphan_left_unconfirmed_is_logged_once(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judged again at every heartbeat interval, it is told to the log once
    (and the ledger says it once), not at every look."""
    job_id = ghost_job_with_a_bare_job_pid(db, tmp_path)
    stuck = reaper.OrphanCheck(False, 4242, 1.0, "pid 4242 still runs 5s after SIGKILL")
    monkeypatch.setattr(liveness, "end_orphan", lambda cand, **_: stuck)
    told: list[dict[str, Any]] = []
    queue = open_write(str(db))
    timing = Timing(0.2, 1.0, 600.0)
    reaping = Reaping(
        queue.engine,
        timing,
        "judge",
        procs.boot_id(),
        socket.gethostname(),
        time.time,
        1.0,
        log=told.append,
    )
    me = SimpleNamespace(
        running={},
        predecessor=None,
        pid_space=procs.pid_space(),
        spared=lambda: frozenset({os.getpid()}),
    )
    try:
        for _ in range(4):
            now = time.time()
            with read_tx(queue.engine) as conn:
                due = reaping.stale(conn, now + 1.0, me)  # type: ignore[arg-type]
            assert [c.job_id for c in due] == [job_id]
            reaping.reap(due, now + 1.0, me)  # type: ignore[arg-type]
            reaping.deferred.clear()  # the next heartbeat interval's look, at once
    finally:
        queue.engine.dispose()
    assert [t["event"] for t in told] == ["orphan_unconfirmed"], told
    assert events_of(db, job_id).count("orphan_unconfirmed") == 1
    assert job(db, job_id)["state"] == "running"


def test_start_times_read_from_proc_are_psutils() -> None:
    """The spawn record's start time is read from /proc without psutil; a
    reaper confirms it with psutil's create_time: both must say the same for
    a living job, a zombie, this process and PID 1, and nothing for a pid
    that is gone."""
    import psutil

    child = subprocess.Popen(["sleep", "30"])
    exited = subprocess.Popen(["true"])
    try:
        wait_for(lambda: psutil.Process(exited.pid).status() == psutil.STATUS_ZOMBIE)
        for pid in (child.pid, exited.pid, os.getpid(), 1):
            assert procs.process_start_time(pid) == psutil.Process(pid).create_time(), pid
        assert procs.boot_time() == psutil.boot_time()
    finally:
        child.kill()
        child.wait()
        exited.wait()
    assert procs.process_start_time(exited.pid) is None
