"""A stopped worker must not lock the whole SQLite queue.

- Ctrl-Z (SIGTSTP) stops a worker only outside a write transaction: one that
  lands inside waits for its end (`spoolctl/worker/suspend.py`).
- A worker frozen where it could not choose (SIGSTOP inside a write
  transaction) is found by the writers waiting behind it, without the lock,
  and fenced once it is silent beyond the hang threshold
  (`spoolctl/db/backends/sqlite/holder.py`); anything else holding the lock
  is left alone, and the writer fails LOCKED naming it.

Real worker processes, real signals; the moments a worker is caught inside a
transaction are waited for, never assumed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from spoolctl.cli.database import open_write
from spoolctl.db.backends.sqlite import holder
from spoolctl.db.engine import OpenWrites
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from spoolctl.worker import suspend
from tests.helpers import cli, rows, start_worker, wait_for, write_lock_free

with_processes = pytest.mark.subprocess
slow = pytest.mark.slow
HANG = {"SPOOLCTL_HANG_THRESHOLD": "2"}


def submit_jobs(db: Path, specs: list[JobSpec]) -> list[int]:
    queue = open_write(str(db))
    try:
        now = queue.now()
        return queue.write(lambda conn: [submit(conn, s, now).job_id for s in specs])
    finally:
        queue.engine.dispose()


def state_of(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def done(db: Path) -> int:
    return int(rows(db, "SELECT count(*) FROM jobs WHERE state = 'done'")[0][0])


def busy_worker(db: Path, jobs: int) -> subprocess.Popen[str]:
    """A worker draining `jobs` jobs of `true`, four at a time: it is inside
    a write transaction a good share of the time."""
    submit_jobs(db, [JobSpec(argv=["true"]) for _ in range(jobs)])
    worker = start_worker(db, "--concurrency", "4")
    wait_for(lambda: done(db) >= 10, what="the worker to get busy")
    return worker


def freeze_holding_the_lock(db: Path, worker: subprocess.Popen[str]) -> int:
    """SIGSTOP the worker at a moment when it holds the write lock (a
    transaction open); returns the tries it took."""
    rng = random.Random(5)
    for tries in range(1, 2000):
        worker.send_signal(signal.SIGSTOP)
        wait_for(lambda: state_of(worker.pid) == psutil.STATUS_STOPPED, what="the worker to stop")
        if not write_lock_free(db):
            return tries
        worker.send_signal(signal.SIGCONT)
        time.sleep(rng.uniform(0.0, 0.01))
    raise AssertionError("never caught the worker inside a write transaction")


def ran_jobs(db: Path, pid: int) -> bool:
    """The worker of that pid has run a job to its end."""
    found = rows(
        db,
        "SELECT 1 FROM attempts JOIN workers ON workers.id = attempts.worker_id"
        " WHERE workers.pid = ? AND attempts.state = 'succeeded'",
        (pid,),
    )
    return bool(found)


def ctrl_z_inside_a_transaction(db: Path, worker: subprocess.Popen[str]) -> None:
    """SIGTSTP the worker inside a write transaction: caught there by SIGSTOP
    (`freeze_holding_the_lock`), continued and sent SIGTSTP at once, it gets
    the signal before it runs on. Returns once it has stopped."""
    freeze_holding_the_lock(db, worker)
    os.kill(worker.pid, signal.SIGCONT)
    os.kill(worker.pid, signal.SIGTSTP)
    wait_for(lambda: state_of(worker.pid) == psutil.STATUS_STOPPED, what="the worker to stop")


def worker_id_of(db: Path, pid: int) -> str:
    return str(rows(db, "SELECT id FROM workers WHERE pid = ?", (pid,))[0]["id"])


def check_all_done_once_crashed(db: Path, held: list[int], frozen_id: str) -> None:
    """Every job is done; those the frozen worker had claimed ran again after
    their attempt was abandoned as a worker crash; no other job ran twice."""
    states = {r["id"]: r["state"] for r in rows(db, "SELECT id, state FROM jobs")}
    assert set(states.values()) == {"done"}, states
    tries = rows(
        db,
        "SELECT job_id, worker_id, state, failure_reason FROM attempts ORDER BY job_id, attempt_no",
    )
    by_job: dict[int, list[tuple[str, str, str | None]]] = {}
    for t in tries:
        by_job.setdefault(t["job_id"], []).append((t["worker_id"], t["state"], t["failure_reason"]))
    for job_id in held:
        *first, last = by_job[job_id]
        assert first == [(frozen_id, "abandoned", "worker_crash")], (job_id, by_job[job_id])
        assert last[1:] == ("succeeded", None), (job_id, by_job[job_id])
    others = [job for job, attempts in by_job.items() if job not in held and len(attempts) != 1]
    assert others == [], "a job the frozen worker did not hold ran twice"


# -- (a) frozen inside a write transaction: fenced by whoever waits --------------


@with_processes
@slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("first", ["add", "worker"])
def test_a_worker_frozen_inside_a_transaction_is_fenced_by_the_writer_behind_it(
    db: Path, first: str
) -> None:
    frozen = busy_worker(db, 300)
    frozen_id = worker_id_of(db, frozen.pid)
    tries = freeze_holding_the_lock(db, frozen)
    held = [
        r["id"]
        for r in rows(
            db, "SELECT id FROM jobs WHERE state = 'running' AND locked_by = ?", (frozen_id,)
        )
    ]
    if first == "add":
        added = cli("add", "--", "true", db=db, json=True, env=HANG)
        assert added.exit_code == 0, f"frozen after {tries} tries: {added.stdout}{added.stderr}"
    fresh = start_worker(db, "--drain", "--concurrency", "4", env=HANG)
    out, err = fresh.communicate(timeout=200)
    assert fresh.returncode == 0, f"frozen after {tries} tries: {out}{err}"
    assert json.loads(out)["data"]["drained"] is True
    assert frozen.wait(timeout=30) == -signal.SIGKILL, "the frozen worker was not fenced"
    check_all_done_once_crashed(db, held, frozen_id)


# -- (b) Ctrl-Z: the worker stops holding nothing, and goes on after SIGCONT -----

PROBE = (
    'mkdir "$1/$SPOOLCTL_JOB_ID" 2>/dev/null || echo "$SPOOLCTL_JOB_ID" >> "$1/twice";'
    ' sleep 0.05; rmdir "$1/$SPOOLCTL_JOB_ID"'
)
"""A job that notes when a second copy of it starts while one runs."""


@with_processes
@slow
@pytest.mark.timeout(240)
def test_ctrl_z_stops_a_worker_outside_its_transactions_and_it_goes_on_after(
    db: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    submit_jobs(db, [JobSpec(argv=["sh", "-c", PROBE, "probe", str(runs)]) for _ in range(8)])
    worker = busy_worker(db, 400)
    for _ in range(5):
        ctrl_z_inside_a_transaction(db, worker)
        assert write_lock_free(db), "the worker stopped holding the write lock"
        worker.send_signal(signal.SIGCONT)
        wait_for(lambda: state_of(worker.pid) != psutil.STATUS_STOPPED, what="it to go on")

    ctrl_z_inside_a_transaction(db, worker)
    never_fence = {"SPOOLCTL_HANG_THRESHOLD": "0"}
    added = cli(
        "add", "--", "sh", "-c", PROBE, "probe", str(runs), db=db, json=True, env=never_fence
    )
    assert added.exit_code == 0, added.stdout + added.stderr
    other = start_worker(db, "--concurrency", "2", env=never_fence)
    wait_for(lambda: ran_jobs(db, other.pid), what="the other worker to run jobs meanwhile")
    assert state_of(worker.pid) == psutil.STATUS_STOPPED

    worker.send_signal(signal.SIGCONT)
    wait_for(
        lambda: not rows(db, "SELECT 1 FROM jobs WHERE state <> 'done'"),
        timeout=120,
        what="the queue to drain",
    )
    for proc in (worker, other):
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, out + err
    assert not (runs / "twice").exists(), (runs / "twice").read_text()
    counts = rows(db, "SELECT job_id, count(*) AS n FROM attempts GROUP BY job_id HAVING n > 1")
    assert [tuple(r) for r in counts] == [], "a job ran twice"


# -- (c) anything that is not a stopped worker of this queue is left alone --------

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@with_processes
@slow
def test_a_stopped_process_that_is_no_worker_keeps_the_lock_and_add_says_who(db: Path) -> None:
    submit_jobs(db, [JobSpec(argv=["true"])])
    # its command line carries spoolctl's marker, and it is stopped: only
    # the workers table tells it is no worker of the queue
    lock = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), "spoolctl", "work"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert lock.stdout is not None and lock.stdout.readline() == "held\n"
        lock.send_signal(signal.SIGSTOP)
        wait_for(lambda: state_of(lock.pid) == psutil.STATUS_STOPPED, what="the holder to stop")
        env = {"SPOOLCTL_HANG_THRESHOLD": "0.5", "SPOOLCTL_BUSY_TIMEOUT": "2"}
        added = cli("add", "--", "true", db=db, json=True, env=env)
        assert added.exit_code == 4, added.stdout + added.stderr
        error = added.envelope["errors"][0]
        assert error["code"] == "LOCKED"
        assert error["detail"]["lock_holder"] == {
            "pid": lock.pid,
            "fenced": False,
            "why": "not a worker of this queue on this machine",
        }
        assert state_of(lock.pid) == psutil.STATUS_STOPPED, "the holder was touched"
        lock.send_signal(signal.SIGCONT)
        lock.communicate("\n", timeout=30)
        assert lock.returncode == 0
    finally:
        lock.kill()
        lock.wait()
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == 1, "the refused add wrote"


# -- the parts, without processes ---------------------------------------------------


def test_the_lock_holders_are_read_from_the_kernels_list(tmp_path: Path) -> None:
    """Held write locks on the -shm's lock bytes or on the file's lock bytes
    name holders; a waiter (`->`), a read lock, an invisible holder (pid 0),
    flock, a byte outside the lock bytes and another file do not."""
    db = tmp_path / "queue.db"
    shm, other = Path(f"{db}-shm"), tmp_path / "other"
    for path in (db, shm, other):
        path.write_bytes(b"")

    def where(path: Path) -> str:
        info = path.stat()
        return f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"

    listing = f"""\
1: POSIX  ADVISORY  WRITE 4242 {where(shm)} 120 120
1: -> POSIX  ADVISORY  WRITE 5151 {where(shm)} 120 120
2: POSIX  ADVISORY  READ 4243 {where(shm)} 128 128
3: POSIX  ADVISORY  WRITE 0 {where(shm)} 120 120
4: POSIX  ADVISORY  WRITE 4244 {where(db)} 1073741825 1073741825
5: FLOCK  ADVISORY  WRITE 4245 {where(shm)} 0 EOF
6: POSIX  ADVISORY  WRITE 4246 {where(other)} 120 120
7: POSIX  ADVISORY  WRITE 4247 {where(shm)} 0 EOF
8: POSIX  ADVISORY  WRITE 4248 {where(db)} 0 1000
"""
    assert holder.write_lock_holders(db, listing) == [4242, 4244, 4247]


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The open write transactions at each stop the worker would make."""
    made: list[int] = []
    monkeypatch.setattr(suspend, "stop_self", lambda: made.append(OpenWrites.count))
    yield made


def test_a_stop_asked_inside_a_write_transaction_comes_as_the_last_one_ends(
    stops: list[int],
) -> None:
    suspension = suspend.Suspension()
    OpenWrites.after_last = suspension.stop
    try:
        OpenWrites.count += 2
        suspension.on_signal(signal.SIGTSTP, None)
        suspension.on_signal(signal.SIGTSTP, None)
        OpenWrites.ended()
        assert stops == []
        OpenWrites.ended()
        assert stops == [0], "one stop, for both requests, once no transaction is open"
        suspension.on_signal(signal.SIGTSTP, None)
        assert stops == [0, 0], "outside a transaction: at once"
    finally:
        OpenWrites.after_last = None
        OpenWrites.count = 0
