"""Where a pid means a process: a worker probes another's pid only in the same
pid space (machine id, PID namespace, cgroup namespace), judges every other
worker by the lease rule, and never fences or kills itself or its own jobs
whatever its verdict. The end-to-end runs with real PID namespaces are in
tests/process/test_pid_namespaces.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolctl.cli.database import open_write
from spoolctl.db.engine import read_tx
from spoolctl.runner import liveness, procs
from spoolctl.services import reaper
from tests.helpers import UNSHARE, Db, add_job, execute_all, needs_namespaces, pid_alive, wait_for

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(60)]

HERE = procs.pid_space()


def test_a_pid_namespace_of_its_own_is_another_pid_space() -> None:
    needs_namespaces()
    inside = subprocess.run(
        [
            *UNSHARE,
            sys.executable,
            "-c",
            "from spoolctl.runner import procs; print(procs.pid_space())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inside.returncode == 0, inside.stderr
    assert HERE is not None and HERE.startswith("machine ")
    assert inside.stdout.strip() not in ("", "None", HERE)
    assert procs.pid_space() == HERE, "the same process, the same space"


@pytest.fixture
def marked() -> Iterator[subprocess.Popen[bytes]]:
    """A live process carrying the `spoolctl` marker, in a session of its own."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "spoolctl", "work"],
        start_new_session=True,
    )
    wait_for(lambda: "spoolctl" in " ".join(_cmdline(proc.pid)), what="its exec")
    yield proc
    proc.kill()
    proc.wait()


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


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
        worker_pid_space=HERE,
    )
    fields.update(changes)
    return reaper.Candidate(**fields)  # type: ignore[arg-type]


def verdict(cand: reaper.Candidate, hang_threshold_s: float) -> liveness.Verdict:
    return liveness.owner_verdict(
        cand,
        now=time.time(),
        hang_threshold_s=hang_threshold_s,
        boot_id=procs.boot_id(),
        hostname=socket.gethostname(),
        pid_space=HERE,
    )


def test_a_worker_of_another_or_an_unknown_pid_space_is_judged_by_its_lease(
    marked: subprocess.Popen[bytes],
) -> None:
    """Same host name and boot: its pid is still nobody's business here. A
    gone pid does not make it dead, nor a live one alive, nor is it fenced."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    started = procs.process_start_time(marked.pid)
    assert verdict(candidate(gone.pid, 1.0), 600) is liveness.Verdict.DEAD
    assert verdict(candidate(marked.pid, started), 50) is liveness.Verdict.HUNG
    for space in ("machine x pid 4:1@1 cgroup 4:2", None):
        for pid, at in ((gone.pid, 1.0), (marked.pid, started)):
            cand = candidate(pid, at, worker_pid_space=space)
            assert verdict(cand, 600) is liveness.Verdict.ALIVE, (space, pid)
            assert verdict(cand, 50) is liveness.Verdict.LEASE_EXPIRED, (space, pid)
    assert verdict(candidate(gone.pid, 1.0), 600) is liveness.Verdict.DEAD
    assert not liveness.probeable("h", "s", hostname="h", pid_space=None)


def test_a_worker_never_fences_itself_or_one_of_its_jobs(
    marked: subprocess.Popen[bytes],
) -> None:
    """`marked` stands for this worker (or a job of it): its own pid, with its
    start time and the marker, is what a misjudged owner looks like."""
    identity = procs.ProcessIdentity(marked.pid, procs.process_start_time(marked.pid))
    cand = candidate(marked.pid, identity.started_at)
    assert verdict(cand, 50) is liveness.Verdict.HUNG
    assert liveness.fence(cand, frozenset({marked.pid})) is False
    assert marked.poll() is None and pid_alive(marked.pid)
    assert liveness.fence(cand, frozenset({1})) is True
    assert marked.wait(timeout=10) != 0


def test_ending_an_orphan_never_kills_a_process_of_the_judges_own_jobs() -> None:
    """The recorded leader, group and token of a dead worker's attempt that
    happen to name a job of this worker (its leader, or a child in its
    session): nothing of it is killed, and the recorded group counts as gone
    (its number is held here by something else)."""
    job = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert job.stdout is not None
    child = int(job.stdout.readline())
    try:
        for pid in (job.pid, child):
            started = procs.process_start_time(pid)
            cand = candidate(
                9, None, job_identity=procs.ProcessIdentity(pid, started), job_pgid=pid
            )
            check = liveness.end_orphan(cand, same_machine=True, spared=frozenset({job.pid}))
            assert check.gone, check
        assert job.poll() is None and pid_alive(child), "the judge killed its own job"
    finally:
        job.kill()
        job.wait()
        subprocess.run(["kill", "-9", str(child)], capture_output=True)


def test_a_worker_row_registered_after_the_claim_does_not_describe_the_claimer(
    db: Db,
) -> None:
    """A process restarted under the same worker id in a fresh PID namespace
    can get the very pid the dead one had: the row it registered (after the
    job was claimed) is not the claimer's, whose pid space is then unknown."""
    job_id = add_job(db, "true")
    old = time.time() - 100
    execute_all(
        db,
        (
            "INSERT INTO workers (id, hostname, pid, process_started_at, boot_id, pid_space, queue,"
            " concurrency, started_at, heartbeat_at, state, jobs_run) VALUES"
            " ('w', ?, 2, ?, ?, ?, 'default', 1, ?, ?, 'running', 0)",
            (socket.gethostname(), time.time() - 1, procs.boot_id(), HERE, old + 50, time.time()),
        ),
        (
            "UPDATE jobs SET state = 'running', locked_by = 'w', locked_pid = 2, locked_at = ?,"
            " heartbeat_at = ? WHERE id = ?",
            (old, old, job_id),
        ),
    )
    queue = open_write(str(db))
    try:
        with read_tx(queue.engine) as conn:
            (cand,) = reaper.reap_candidates(conn, time.time(), 1.0)
    finally:
        queue.engine.dispose()
    assert (cand.worker_hostname, cand.worker_pid_space, cand.worker_heartbeat_at) == (
        None,
        None,
        None,
    )
    assert cand.worker_identity == procs.ProcessIdentity(2, None)
    assert verdict(cand, 600) is liveness.Verdict.ALIVE
    assert verdict(cand, 50) is liveness.Verdict.LEASE_EXPIRED
