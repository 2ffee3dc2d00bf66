"""Crash recovery with real processes: a worker is SIGKILLed (or stopped) mid-job
and another worker must detect it, confirm it is gone, kill the orphaned job
process group, and requeue the job, which then runs again to done.

The job used here is a small Python script: attempt 1 starts a grandchild,
writes both pids to a file and sleeps; attempt 2 checks those pids and records
which are still alive, so "the orphan died before the job ran again" is read
from a file the second attempt wrote, not inferred. The tests with a queue run
on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from spoolctl.cli.database import open_write
from spoolctl.db.engine import read_tx, write_tx
from spoolctl.runner import liveness, procs
from spoolctl.services import reaper
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests.helpers import (
    Db,
    attempts_of,
    cli,
    events_of,
    execute,
    job,
    kill_worker_and_guard,
    patience,
    pid_alive,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_backends, pytest.mark.subprocess]


REAP_THRESHOLD_S = 1.0  # tests.helpers.FAST_KNOBS
PROBE = r"""
import json, os, subprocess, sys, time
from pathlib import Path

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False

folder, attempt = Path(sys.argv[1]), int(os.environ["SPOOLCTL_ATTEMPT"])
if attempt > 1:
    pids = [int(p) for p in (folder / f"pids.{attempt - 1}").read_text().split()]
    (folder / f"check.{attempt}").write_text(json.dumps([p for p in pids if alive(p)]))
if attempt <= int(os.environ.get("HANG_ATTEMPTS", "1")):
    child = subprocess.Popen(["sleep", "60"])
    (folder / "pids.tmp").write_text(f"{os.getpid()} {child.pid}")
    os.rename(folder / "pids.tmp", folder / f"pids.{attempt}")
    if os.environ.get("LEADER_EXITS_AFTER_CRASH"):  # leave the grandchild behind
        while not (folder / "crashed").exists():
            time.sleep(0.01)
        sys.exit(0)
    time.sleep(60)
"""


def _sql(db: Db, sql: str, params: tuple[object, ...]) -> int:
    """Write to the queue behind spoolctl's back, as a crash or a test would."""
    return execute(db, sql, params)


def submit_probe(db: Db, folder: Path, **spec: object) -> int:
    """Submit the probe job in-process (fast); returns its id."""
    script = folder / "probe.py"
    script.write_text(PROBE)
    queue = open_write(str(db))
    try:
        spec_obj = JobSpec(argv=[sys.executable, str(script), str(folder)], **spec)  # type: ignore[arg-type]
        return queue.write(lambda conn: submit(conn, spec_obj, time.time())).job_id
    finally:
        queue.engine.dispose()


def orphan_pids(folder: Path, attempt: int = 1) -> list[int]:
    """The pids attempt N of the probe wrote once it was running."""
    path = folder / f"pids.{attempt}"
    wait_for(path.exists, what=f"attempt {attempt} to start")
    return [int(p) for p in path.read_text().split()]


def crash_worker(worker: subprocess.Popen[str], *, guard_too: bool = True) -> float:
    """SIGKILL the worker, by default with its lease guard (the OOM killer,
    `kill -9` of its group), so that its job lives on for the reaper."""
    if guard_too:
        kill_worker_and_guard(worker)
    else:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=patience(10))
    return time.time()


def drain(db: Db, env: dict[str, str] | None = None) -> dict[str, object]:
    result = cli("work", "--drain", "--poll-interval", "0.1", db=db, env=env, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.data  # type: ignore[no-any-return]


def test_sigkilled_worker_is_reaped_and_its_orphan_dies_before_the_rerun(
    db: Db, tmp_path: Path
) -> None:
    job_id = submit_probe(db, tmp_path)
    first = start_worker(db)
    leader, grandchild = orphan_pids(tmp_path)
    killed_at = crash_worker(first, guard_too=False)
    # its lease guard ends the group the moment the worker dies
    wait_for(
        lambda: not (pid_alive(leader) or pid_alive(grandchild)),
        5,
        what="the lease guard to kill the dead worker's job group",
    )

    data = drain(db)

    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("done", 1, 1)
    one, two = attempts_of(db, job_id)
    assert (one["state"], one["failure_reason"]) == ("abandoned", "worker_crash")
    assert (two["state"], two["exit_code"]) == ("succeeded", 0)
    assert json.loads((tmp_path / "check.2").read_text()) == [], "orphan alive at rerun"
    assert events_of(db, job_id) == ["added", "claimed", "reaped", "claimed", "succeeded"]
    reaped_at = rows(db, "SELECT at FROM job_events WHERE event = 'reaped'")[0]["at"]
    # the last heartbeat came at most one interval (0.2 s) before the kill
    assert reaped_at - killed_at >= REAP_THRESHOLD_S - 0.3, "reaped before it was stale"
    assert two["started_at"] >= reaped_at + 2.0, "crash redelivery skipped its backoff"
    dead = rows(db, "SELECT state FROM workers WHERE pid = ?", (first.pid,))
    assert [r["state"] for r in dead] == ["dead"]
    assert data["executed"] == 1


@pytest.mark.slow
@pytest.mark.sqlite_only("killing an orphan group is process handling, the same on both backends")
def test_an_orphan_group_whose_leader_already_exited_is_killed_too(
    db: Path, tmp_path: Path
) -> None:
    job_id = submit_probe(db, tmp_path, env={"LEADER_EXITS_AFTER_CRASH": "1"})
    first = start_worker(db)
    leader, grandchild = orphan_pids(tmp_path)
    crash_worker(first)
    (tmp_path / "crashed").touch()
    wait_for(lambda: not pid_alive(leader), 5, what="the leader to exit on its own")
    assert pid_alive(grandchild), "the worker and its guard are gone: the reaper ends it"

    drain(db)

    assert job(db, job_id)["state"] == "done"
    assert json.loads((tmp_path / "check.2").read_text()) == [], "job ran twice at once"


@pytest.mark.sqlite_only("the crash budget on PostgreSQL: test_max_crashes_one_requeues_...")
def test_max_crashes_zero_dead_letters_on_the_first_crash(db: Path, tmp_path: Path) -> None:
    job_id = submit_probe(db, tmp_path, max_crashes=0)
    first = start_worker(db)
    leader, grandchild = orphan_pids(tmp_path)
    crash_worker(first)

    assert drain(db)["executed"] == 0

    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("dead", 1, 1)
    assert row["last_failure_reason"] == "worker_crash"
    assert events_of(db, job_id) == ["added", "claimed", "reaped", "dead"]
    wait_for(lambda: not pid_alive(leader) and not pid_alive(grandchild), 5, what="orphan kill")


def test_max_crashes_one_requeues_the_first_crash_and_dead_letters_the_second(
    db: Db, tmp_path: Path
) -> None:
    job_id = submit_probe(db, tmp_path, max_crashes=1, env={"HANG_ATTEMPTS": "2"})
    first = start_worker(db)
    orphan_pids(tmp_path)
    crash_worker(first)

    second = start_worker(db, "--poll-interval", "0.1")
    wait_for(lambda: job(db, job_id)["crashes"] == 1, what="first reap")
    assert job(db, job_id)["state"] in ("queued", "running")
    # Skip the 2 s crash backoff: the waiting worker notices the change at once.
    _sql(db, "UPDATE jobs SET next_run_at = 0 WHERE id = ? AND state = 'queued'", (job_id,))
    leader, grandchild = orphan_pids(tmp_path, 2)
    crash_worker(second)

    drain(db)

    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("dead", 2, 2)
    assert [a["failure_reason"] for a in attempts_of(db, job_id)] == ["worker_crash"] * 2
    assert events_of(db, job_id) == ["added", "claimed", "reaped", "claimed", "reaped", "dead"]
    assert json.loads((tmp_path / "check.2").read_text()) == [], "attempt 1 outlived its reap"
    wait_for(lambda: not pid_alive(leader) and not pid_alive(grandchild), 5, what="orphan kill")


@pytest.mark.sqlite_only("on PostgreSQL: tests/pg/test_clock.py, workers never reaped")
def test_a_heartbeating_worker_is_never_reaped(db: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    queue = open_write(str(db))
    spec = JobSpec(argv=["sh", "-c", f"echo x >> {marker}; sleep 3"])
    job_id = queue.write(lambda conn: submit(conn, spec, time.time())).job_id
    queue.engine.dispose()
    owner = start_worker(db)
    wait_for(marker.exists, what="job started")
    claimed_beat = job(db, job_id)["heartbeat_at"]
    wait_for(lambda: job(db, job_id)["heartbeat_at"] > claimed_beat, what="a job heartbeat")

    # A second worker watches the whole 3 s job: 3x the reap threshold, and
    # with a hang threshold of 1 s it would fence an owner that went silent.
    drain(db, env={"SPOOLCTL_HANG_THRESHOLD": "1"})

    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=patience(10)) == 0
    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("done", 0, 0)
    assert events_of(db, job_id) == ["added", "claimed", "succeeded"]
    assert marker.read_text() == "x\n"


# -- liveness: recycled pids, inconclusive probes --------------------------


@pytest.fixture
def impostor() -> subprocess.Popen[bytes]:
    """A live process that is not a worker but carries the `spoolctl` marker in
    its command line, as a recycled pid might."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "spoolctl", "work"],
        stdin=subprocess.DEVNULL,
    )

    def exec_done() -> bool:
        try:
            return "spoolctl" in psutil.Process(proc.pid).cmdline()
        except psutil.Error:
            return False

    # Before its exec the child still has the test runner's command line.
    wait_for(exec_done, what="impostor exec")
    yield proc
    proc.kill()
    proc.wait()


def candidate(pid: int, started_at: float | None, **changes: object) -> reaper.Candidate:
    now = time.time()
    fields: dict[str, object] = dict(
        job_id=1,
        worker_id="w",
        locked_pid=pid,
        heartbeat_at=now - 100,
        attempt_id=None,
        job_identity=None,
        job_pgid=None,
        worker_identity=procs.ProcessIdentity(pid, started_at),
        worker_boot_id=procs.boot_id(),
        worker_hostname=socket.gethostname(),
        worker_heartbeat_at=now - 100,
        worker_pid_space=procs.pid_space(),
    )
    fields.update(changes)
    return reaper.Candidate(**fields)  # type: ignore[arg-type]


def verdict(cand: reaper.Candidate, hang_threshold_s: float = 600.0) -> liveness.Verdict:
    return liveness.owner_verdict(
        cand,
        now=time.time(),
        hang_threshold_s=hang_threshold_s,
        boot_id=procs.boot_id(),
        hostname=socket.gethostname(),
        pid_space=procs.pid_space(),
    )


def test_a_recycled_pid_is_judged_dead(impostor: subprocess.Popen[bytes]) -> None:
    started = procs.process_start_time(impostor.pid)
    assert started is not None
    same = procs.ProcessIdentity(impostor.pid, started)
    recycled = procs.ProcessIdentity(impostor.pid, started - 50)
    assert procs.is_same_process(same, procs.WORKER_MARKER) is procs.Liveness.ALIVE
    assert procs.is_same_process(recycled, procs.WORKER_MARKER) is procs.Liveness.DEAD
    assert procs.is_same_process(same, "not-in-its-cmdline") is procs.Liveness.DEAD
    assert verdict(candidate(impostor.pid, started)) is liveness.Verdict.ALIVE
    assert verdict(candidate(impostor.pid, started - 50)) is liveness.Verdict.DEAD
    assert verdict(candidate(impostor.pid, started), hang_threshold_s=50) is liveness.Verdict.HUNG
    assert verdict(candidate(impostor.pid, started, worker_boot_id="0")) is liveness.Verdict.DEAD
    # a bare pid (no start time recorded) is never fenced: it may be another worker now
    assert verdict(candidate(impostor.pid, None), hang_threshold_s=50) is liveness.Verdict.ALIVE
    assert verdict(candidate(impostor.pid, started, worker_hostname="elsewhere")) is (
        liveness.Verdict.ALIVE
    )


def test_a_pid_that_cannot_be_probed_counts_as_alive(
    impostor: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    started = procs.process_start_time(impostor.pid)

    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    identity = procs.ProcessIdentity(impostor.pid, started)
    with monkeypatch.context() as patch:  # undone before the fixture kills the impostor
        patch.setattr(procs.os, "kill", refuse)
        assert procs.probe(impostor.pid) is procs.Liveness.INCONCLUSIVE
        assert procs.is_same_process(identity, procs.WORKER_MARKER) is (procs.Liveness.INCONCLUSIVE)
        assert verdict(candidate(impostor.pid, started)) is liveness.Verdict.ALIVE
        assert verdict(candidate(impostor.pid, started), hang_threshold_s=1) is (
            liveness.Verdict.ALIVE
        )


def stale_ghost_job(db: Db, folder: Path, pid: int, started_at: float | None) -> int:
    """A job left `running` by a worker row whose pid is `pid`, silent for 100 s:
    the rows a worker that died long ago leaves behind."""
    marker = folder / "ran"
    queue = open_write(str(db))
    spec = JobSpec(argv=["sh", "-c", f"echo $SPOOLCTL_ATTEMPT >> {marker}"])
    job_id = queue.write(lambda conn: submit(conn, spec, time.time())).job_id
    queue.engine.dispose()
    old = time.time() - 100
    _sql(
        db,
        "INSERT INTO workers (id, hostname, pid, process_started_at, boot_id, pid_space, queue,"
        " concurrency, started_at, heartbeat_at, state, jobs_run)"
        " VALUES ('ghost', ?, ?, ?, ?, ?, 'default', 1, ?, ?, 'running', 0)",
        (socket.gethostname(), pid, started_at, procs.boot_id(), procs.pid_space(), old, old),
    )
    _sql(
        db,
        "UPDATE jobs SET state = 'running', locked_by = 'ghost', locked_pid = ?,"
        " locked_at = ?, heartbeat_at = ?, started_at = ? WHERE id = ?",
        (pid, old, old, old, job_id),
    )
    _sql(
        db,
        "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state,"
        " started_at, stdout_path, stderr_path) VALUES (?, 1, 'ghost', ?, 'running', ?,"
        " '/nonexistent/out', '/nonexistent/err')",
        (job_id, pid, old),
    )
    return job_id


def test_a_stale_job_whose_worker_pid_was_recycled_is_reaped_end_to_end(
    db: Db, tmp_path: Path, impostor: subprocess.Popen[bytes]
) -> None:
    started = procs.process_start_time(impostor.pid)
    assert started is not None
    job_id = stale_ghost_job(db, tmp_path, impostor.pid, started - 50)

    drain(db)

    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("done", 1, 1)
    assert attempts_of(db, job_id)[0]["failure_reason"] == "worker_crash"
    assert (tmp_path / "ran").read_text() == "2\n"
    assert impostor.poll() is None, "the unrelated process holding the pid was touched"


def test_a_stale_job_whose_worker_is_still_that_process_is_left_alone(
    db: Db, tmp_path: Path, impostor: subprocess.Popen[bytes]
) -> None:
    job_id = stale_ghost_job(db, tmp_path, impostor.pid, procs.process_start_time(impostor.pid))

    result = cli("work", "--once", db=db, json=True)

    assert result.exit_code == 0 and result.data == {"claimed": False}
    assert (job(db, job_id)["state"], job(db, job_id)["crashes"]) == ("running", 0)
    assert events_of(db, job_id) == ["added"]
    assert impostor.poll() is None


def test_the_reap_rechecks_staleness_inside_its_transaction(
    db: Db, tmp_path: Path, impostor: subprocess.Popen[bytes]
) -> None:
    started = procs.process_start_time(impostor.pid)
    assert started is not None
    job_id = stale_ghost_job(db, tmp_path, impostor.pid, started - 50)
    queue = open_write(str(db))
    try:
        with read_tx(queue.engine) as conn:
            (cand,) = reaper.reap_candidates(conn, time.time(), REAP_THRESHOLD_S)
        _sql(db, "UPDATE jobs SET heartbeat_at = ? WHERE id = ?", (time.time(), job_id))
        with write_tx(queue.engine) as conn:
            late = reaper.reap(conn, cand, now=time.time(), threshold_s=1.0, reaper_id="r")
        assert late is None
        assert job(db, job_id)["state"] == "running"
        assert attempts_of(db, job_id)[0]["state"] == "running"
        assert events_of(db, job_id) == ["added"]

        _sql(db, "UPDATE jobs SET heartbeat_at = ? WHERE id = ?", (time.time() - 100, job_id))
        with write_tx(queue.engine) as conn:
            reaped = reaper.reap(conn, cand, now=time.time(), threshold_s=1.0, reaper_id="r")
        assert reaped is not None and reaped.value == "queued"
        assert events_of(db, job_id) == ["added", "reaped"]
    finally:
        queue.engine.dispose()


# -- hung workers ------------------------------------------------------------


@pytest.mark.sqlite_only("frozen workers on PostgreSQL: tests/pg/test_fleet.py")
def test_a_stopped_worker_is_fenced_after_the_hang_threshold(db: Path, tmp_path: Path) -> None:
    job_id = submit_probe(db, tmp_path)
    hung = start_worker(db)
    leader, grandchild = orphan_pids(tmp_path)
    hung.send_signal(signal.SIGSTOP)
    try:
        drain(db, env={"SPOOLCTL_HANG_THRESHOLD": "2"})
        assert hung.wait(timeout=patience(10)) == -signal.SIGKILL, "the hung worker was not fenced"
    finally:
        hung.kill()
        hung.wait()

    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("done", 1, 1)
    assert attempts_of(db, job_id)[0]["failure_reason"] == "worker_crash"
    assert json.loads((tmp_path / "check.2").read_text()) == [], "job ran twice at once"
    assert not pid_alive(leader) and not pid_alive(grandchild)


def test_a_stopped_worker_within_the_hang_threshold_is_left_alone(db: Db, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    queue = open_write(str(db))
    spec = JobSpec(argv=["sh", "-c", f"echo $SPOOLCTL_ATTEMPT >> {marker}; sleep 0.5"])
    job_id = queue.write(lambda conn: submit(conn, spec, time.time())).job_id
    queue.engine.dispose()
    stopped = start_worker(db)
    wait_for(marker.exists, what="job started")
    stopped.send_signal(signal.SIGSTOP)
    watcher = start_worker(db, "--poll-interval", "0.1")
    try:
        # Let the job go stale well past the reap threshold while a peer watches.
        wait_for(
            lambda: time.time() - job(db, job_id)["heartbeat_at"] > REAP_THRESHOLD_S + 1.5,
            what="a stale heartbeat",
        )
        assert job(db, job_id)["state"] == "running"
        assert stopped.poll() is None, "an inconclusive (stopped) worker was killed"
        stopped.send_signal(signal.SIGCONT)
        wait_for(lambda: job(db, job_id)["state"] == "done", what="the job to finish")
    finally:
        for proc in (stopped, watcher):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=patience(10))
    assert (job(db, job_id)["crashes"], marker.read_text()) == (0, "1\n")
    assert events_of(db, job_id) == ["added", "claimed", "succeeded"]


def test_killing_a_process_we_did_not_spawn_does_not_wait_for_its_parent_to_reap_it() -> None:
    """The orphan of a dead worker, or a fenced worker, is not our child: its
    exit must count once it is a zombie, not once its parent gets round to it."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "print(child.pid, flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert procs.wait_gone(pid, 0.2) is False
        started = time.monotonic()
        signal_sent = procs.kill_process_if_same(
            procs.ProcessIdentity(pid, procs.process_start_time(pid)), "sleep", wait_s=5.0
        )
        assert signal_sent is True
        assert time.monotonic() - started < 1.0
        assert not pid_alive(pid)
    finally:
        parent.kill()
        parent.wait()


def test_a_crashed_worker_restarted_under_the_same_id_still_gets_its_job_reaped(
    db: Db, tmp_path: Path
) -> None:
    """The restarted worker takes over the `workers` row of its dead previous
    incarnation; that row now names a live process, but the job was claimed by
    the dead one (its locked_pid) and must still be recovered."""
    job_id = submit_probe(db, tmp_path)
    first = start_worker(db, "--worker-id", "fixed")
    orphan_pids(tmp_path)
    crash_worker(first)

    restarted = start_worker(db, "--worker-id", "fixed")
    try:
        wait_for(lambda: job(db, job_id)["state"] == "done", timeout=15, what="the rerun")
        (row,) = rows(db, "SELECT state, pid FROM workers")
        assert (row["state"], row["pid"]) == ("running", restarted.pid)
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=patience(10))
    assert (job(db, job_id)["crashes"], job(db, job_id)["attempts"]) == (1, 1)
    assert json.loads((tmp_path / "check.2").read_text()) == []


def test_an_orphan_group_is_only_killed_while_its_number_is_still_the_jobs() -> None:
    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = procs.process_start_time(leader.pid)
        assert started is not None
        recycled = procs.ProcessIdentity(leader.pid, started - 50)
        # a recycled pid means the job's group is gone (the number was free): not killed
        assert procs.end_group(recycled, leader.pid) is None
        bare = procs.end_group(procs.ProcessIdentity(leader.pid, None), leader.pid)
        assert bare is not None and "start time" in bare, "a bare pid is never confirmed"
        assert leader.poll() is None, "a group whose leader pid was recycled was killed"

        same = procs.ProcessIdentity(leader.pid, started)
        assert procs.end_group(same, leader.pid) is None
        assert leader.wait(timeout=patience(5)) == -signal.SIGKILL
    finally:
        leader.kill()
        leader.wait()
