"""Each attempt in a cgroup of its own, on this machine's real cgroups (the
CI machine runs as root): a job that calls setsid() and empties its
environment (so neither its process group nor its attempt token finds it)
still dies with its attempt, on a timeout and on a reap; the cgroup records
what the attempt used and is removed; where cgroups cannot be made (an
unprivileged user) jobs run with process groups, and every verb says so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolctl.runner.containment import cgroup, hierarchy, sites
from tests.helpers import (
    Strays,
    add_job,
    attempts_of,
    child_env,
    cli,
    job,
    pid_alive,
    rows,
    start_worker,
    wait_for,
)
from tests.process.test_error_codes import as_nobody

pytestmark = [pytest.mark.timeout(60)]

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpu\\040acct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
"""
HYBRID_SELF = "4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n9:name=systemd:/\n0::/\n"
V2_ONLY = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_hierarchies_are_read_from_mountinfo_never_a_fixed_path() -> None:
    layout = hierarchy.layout_of(HYBRID, HYBRID_SELF)
    assert layout.v2 == "/sys/fs/cgroup/unified"
    assert layout.v1 == {
        "cpu": "/sys/fs/cgroup/cpu",
        "cpuacct": "/sys/fs/cgroup/cpu acct",  # \040 unescaped
        "memory": "/sys/fs/cgroup/memory/process_api/abc",
    }
    user_service = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/spool.service\n"
    assert hierarchy.layout_of(V2_ONLY, user_service).v2 == (
        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/spool.service"
    )
    # a container's mount shows a subtree: paths below it map, others do not
    subtree = "29 23 0:26 /docker/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert hierarchy.layout_of(subtree, "0::/docker/c1/job\n").v2 == "/sys/fs/cgroup/job"
    assert hierarchy.layout_of(subtree, "0::/elsewhere\n").v2 is None
    assert hierarchy.layout_of("", "0::/\n") == hierarchy.Layout()


def root_required() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (as CI does): it makes real cgroups")


def escaping(pidfile: Path, *, ignore_term: bool = False) -> list[str]:
    """A job whose child leaves the session (setsid) and the environment
    (env -i: no attempt token), writes its pid and sleeps; the leader waits."""
    trap = "trap '' TERM; " if ignore_term else ""
    inner = f"{trap}echo \\$\\$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300"
    script = f'setsid env -i /bin/sh -c "{inner}" </dev/null >/dev/null 2>&1 & exec sleep 300'
    return ["sh", "-c", script]


@pytest.fixture
def escapees() -> Iterator[Strays]:
    """Processes a test saw escape; killed afterwards whatever the outcome."""
    found = Strays()
    yield found
    found.kill()


def escaped(pidfile: Path, escapees: Strays) -> int:
    """The escapee's pid once it runs, after checking it did escape: it leads
    its own session and carries no attempt token."""
    wait_for(pidfile.exists, 15, what="the job's child to start")
    pid = int(pidfile.read_text())
    escapees.keep(pid)
    assert os.getsid(pid) == pid, "the child left the job's session"
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"SPOOLCTL_ATTEMPT_TOKEN" not in environ, "the child dropped the attempt token"
    return pid


def cgroup_dirs(attempt: dict[str, object]) -> list[str]:
    recorded = attempt["cgroup"]
    assert isinstance(recorded, str) and recorded, "the attempt recorded no cgroup"
    return recorded.splitlines()


@pytest.mark.subprocess
def test_a_timeout_ends_a_child_that_left_its_group_and_token(
    tmp_path: Path, escapees: Strays
) -> None:
    root_required()
    db = tmp_path / "queue.db"
    job_id = add_job(db, *escaping(tmp_path / "pid"), timeout_seconds=1, max_retries=0)
    worker = start_worker(db, "--once")
    pid = escaped(tmp_path / "pid", escapees)
    assert worker.wait(timeout=30) == 0
    assert not pid_alive(pid), "the escaped child outlived its timed-out attempt"
    (attempt,) = attempts_of(db, job_id)
    assert attempt["failure_reason"] == "timeout"
    for directory in cgroup_dirs(attempt):
        assert not os.path.exists(directory), f"{directory} was not removed"


@pytest.mark.subprocess
def test_without_containment_the_same_child_escapes_the_timeout(
    tmp_path: Path, escapees: Strays
) -> None:
    """The failure mode containment removes, as it stands with process groups:
    what makes the test above mean something."""
    db = tmp_path / "queue.db"
    job_id = add_job(db, *escaping(tmp_path / "pid"), timeout_seconds=1, max_retries=0)
    worker = start_worker(db, "--once", env={"SPOOLCTL_CGROUP": "off"})
    pid = escaped(tmp_path / "pid", escapees)
    assert worker.wait(timeout=30) == 0
    assert pid_alive(pid), "with process groups only, a setsid() child escapes"
    assert attempts_of(db, job_id)[0]["cgroup"] is None


@pytest.mark.subprocess
def test_the_reaper_ends_a_dead_workers_escaped_child_by_its_cgroup(
    tmp_path: Path, escapees: Strays
) -> None:
    root_required()
    db = tmp_path / "queue.db"
    job_id = add_job(db, *escaping(tmp_path / "pid", ignore_term=True), max_retries=0)
    first = start_worker(db)
    pid = escaped(tmp_path / "pid", escapees)
    wait_for(lambda: attempts_of(db, job_id)[0]["cgroup"], 15, what="the spawn record")
    (attempt,) = attempts_of(db, job_id)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert pid_alive(pid), "the escaped child outlives its worker"

    wait_for(
        lambda: time.time() - job(db, job_id)["heartbeat_at"] > 1.5,
        15,
        what="the job to go stale (reap threshold 1 s)",
    )
    result = cli("work", "--once", db=db, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr

    row = job(db, job_id)
    assert (row["state"], row["crashes"]) != ("running", 0), "the job was not reaped"
    assert not pid_alive(pid), "the reaper requeued the job with its escaped child alive"
    for directory in cgroup_dirs(attempt):
        assert not os.path.exists(directory), f"{directory} was not removed"
        worker_dir = os.path.dirname(directory)
        assert not os.path.exists(worker_dir), f"the dead worker's {worker_dir} was left"


@pytest.mark.subprocess
def test_an_attempts_cpu_time_and_peak_memory_come_from_its_cgroup(tmp_path: Path) -> None:
    root_required()
    db = tmp_path / "queue.db"
    busy = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"
    job_id = add_job(db, "sh", "-c", busy)
    result = cli("work", "--once", db=db, json=True)
    assert result.exit_code == 0, result.stderr
    shown = cli("show", str(job_id), db=db, json=True).data
    (attempt,) = shown["attempts"]
    assert attempt["state"] == "succeeded"
    assert attempt["cpu_time_s"] > 0.05, attempt
    assert attempt["peak_memory_bytes"] > 0, attempt
    for directory in cgroup_dirs(attempt):
        assert not os.path.exists(directory)


def run_as_nobody(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*as_nobody(), sys.executable, "-m", "spoolctl", *args]
    return subprocess.run(
        argv, capture_output=True, text=True, env=child_env(), cwd=folder, timeout=60
    )


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder user nobody can reach and write (pytest's own are root's 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="spoolctl-nobody-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.subprocess
def test_an_unprivileged_worker_runs_jobs_with_process_groups_and_says_so(
    shared_folder: Path,
) -> None:
    folder = shared_folder
    db = str(folder / "queue.db")
    added = run_as_nobody(folder, "add", "--json", "--db", db, "--", "sh", "-c", "echo ran")
    assert added.returncode == 0, added.stderr

    worked = run_as_nobody(folder, "work", "--once", "--db", db)

    assert worked.returncode == 0, worked.stderr
    assert "succeeded -> done" in worked.stdout
    (line,) = [x for x in worked.stderr.splitlines() if x.startswith("containment:")]
    assert line.startswith("containment: process groups and attempt tokens (")
    assert "cgroup" in line  # the reason names what could not be used
    doctor = run_as_nobody(folder, "doctor", "--json", "--db", db)
    checks = {c["id"]: c for c in json.loads(doctor.stdout)["data"]["checks"]}
    assert checks["containment"]["status"] == "pass"
    assert "process groups" in checks["containment"]["message"]
    caps = run_as_nobody(folder, "capabilities", "--json")
    mode = json.loads(caps.stdout)["data"]["containment"]
    assert mode["mode"] == "process_group" and mode["reason"], mode


def v1_freezer_dir() -> str:
    freezer = hierarchy.discover().v1.get("freezer")
    if freezer is None:
        pytest.fail("this machine has a v1 freezer hierarchy (the CI machine does)")
    return freezer


@pytest.mark.subprocess
def test_without_cgroup_kill_a_frozen_cgroup_is_killed_whole(tmp_path: Path) -> None:
    """The kill of kernels before cgroup.kill (and of a v1 freezer primary):
    freeze, SIGKILL each process, thaw; a process that forks meanwhile cannot
    run to escape, and nothing is left."""
    root_required()
    leaf = os.path.join(v1_freezer_dir(), f"spoolctl-test-{os.getpid()}")
    os.mkdir(leaf)
    try:
        pidfile = tmp_path / "pid"
        script = f"echo $$ > {leaf}/cgroup.procs; " + " ".join(
            escaping(pidfile, ignore_term=True)[2:]
        )
        leader = subprocess.Popen(["sh", "-c", script], start_new_session=True)
        wait_for(pidfile.exists, 15, what="the child to start")
        child = int(pidfile.read_text())
        assert os.getsid(child) == child != leader.pid
        assert not os.path.exists(os.path.join(leaf, "cgroup.kill"))
        cgroup.kill(leaf)
        assert cgroup.wait_empty(leaf, 5), "processes left in the killed cgroup"
        assert leader.wait(timeout=5) == -signal.SIGKILL
        wait_for(lambda: not pid_alive(child), 5, what="the escaped child to die")
        assert cgroup.read(leaf, "freezer.state").strip() == "THAWED"
    finally:
        assert cgroup.remove(leaf, 5)


@pytest.mark.subprocess
def test_an_idle_dead_workers_leftover_cgroup_directory_is_removed(
    tmp_path: Path,
) -> None:
    root_required()
    db = tmp_path / "queue.db"
    add_job(db, "true")
    first = start_worker(db)
    (row,) = wait_for(lambda: rows(db, "SELECT id, pid FROM workers"), 15, what="registration")
    base = hierarchy.discover().v2
    assert base is not None
    left = os.path.join(base, "spoolctl", sites.tag(row["id"], row["pid"]))
    wait_for(lambda: os.path.isdir(left), 15, what="the worker's cgroup directory")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert os.path.isdir(left), "a SIGKILLed worker leaves its directory"

    second = start_worker(db)  # removes it as it starts (its owner is gone), or buries it
    try:
        wait_for(lambda: not os.path.exists(left), 20, what="the dead worker's directory to go")
        state = "SELECT state FROM workers WHERE id = ?"
        wait_for(
            lambda: rows(db, state, (row["id"],))[0]["state"] == "dead",
            20,
            what="the dead worker to be buried",
        )
    finally:
        second.terminate()
        second.wait(timeout=20)
    assert not os.path.exists(left)
