"""Workers in separate PID namespaces that share one cgroup tree (containers
on one host without a cgroup namespace, `unshare --pid`): a worker removes
the empty leftover directories only of workers in its own PID namespace,
whose pids it can judge. Another namespace's worker's pid names nothing
here, or another process: its directory, empty between two jobs, is never
taken for a dead worker's. On this machine's real cgroups (the CI machine
runs as root)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spoolctl.runner import containment
from spoolctl.runner.containment import cgroup, sites
from tests.helpers import UNSHARE, child_env, cli, needs_namespaces, rows, wait_for
from tests.process.test_containment import root_required
from tests.process.test_pid_namespaces import Machine

pytestmark = [pytest.mark.timeout(120)]


def absent_pid() -> int:
    """A pid no process has in this namespace: above the kernel's pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def worker_folders(worker_id: str) -> list[str]:
    """A worker's directories in every site a worker here uses, whatever
    the format of their names."""
    found = []
    for site in containment.report().sites:
        top = os.path.join(site.base, sites.TOP)
        with os.scandir(top) as entries:
            found += [e.path for e in entries if e.name.startswith(f"w-{worker_id}-")]
    return sorted(found)


def subfolders(folder: str) -> list[str]:
    with os.scandir(folder) as entries:
        return [e.name for e in entries if e.is_dir()]


def test_the_leftover_sweep_judges_only_directories_of_its_own_pid_namespace() -> None:
    root_required()
    status = containment.report()
    assert status.contained, status.reason
    top = os.path.join(status.sites[0].base, sites.TOP)
    cgroup.make(top)
    worker_id, gone = f"ns-sweep-{secrets.token_hex(4)}", absent_pid()
    own = sites.pid_namespace()
    other = f"n{int(own[1:]) + 1}"  # any PID namespace but this one
    theirs = os.path.join(top, sites.tag(worker_id, gone, other))
    older = os.path.join(top, sites.legacy_tag(worker_id, gone))
    mine = os.path.join(top, sites.tag(worker_id, gone))
    made = [theirs, older, mine]
    try:
        for folder in made:
            cgroup.make(folder)
            cgroup.make(os.path.join(folder, "a1"))  # an ended attempt's, empty

        containment.Containment(status, "").remove_empty_leftovers()

        assert os.path.isdir(os.path.join(theirs, "a1")), (
            "another namespace's worker's directory was removed: its pid means nothing here"
        )
        assert os.path.isdir(os.path.join(older, "a1")), (
            "a directory named without its namespace (an older spoolctl's) was removed"
        )
        assert not os.path.exists(mine), "this namespace's dead worker's directory was left"
    finally:
        for folder in made:
            cgroup.remove(os.path.join(folder, "a1"))
            cgroup.remove(folder)


PIDS_TAKEN = 100
"""How many processes the first namespace's PID 1 runs before its worker, so
that the worker's pid there is one no process has in the second namespace,
whose worker is its PID 1 and has started only a few processes."""
NS_INIT = (
    f'i=0; while [ $i -lt {PIDS_TAKEN} ]; do /bin/true; i=$((i+1)); done; "$@" > "$0.log" 2>&1'
)


@pytest.mark.subprocess
def test_a_namespaced_workers_idle_directories_survive_another_namespaces_worker(
    tmp_path: Path,
) -> None:
    root_required()
    needs_namespaces()
    db = tmp_path / "queue.db"
    made = cli("migrate", db=db, json=True)
    assert made.exit_code == 0, made.stdout + made.stderr
    suffix = secrets.token_hex(4)
    kept, sweeper = f"ns-kept-{suffix}", f"ns-sweeper-{suffix}"
    work = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--poll-interval", "0.2"]
    popen = subprocess.Popen(
        [*UNSHARE, "sh", "-c", NS_INIT, str(tmp_path / "kept"), *work, "--worker-id", kept],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    first = Machine("kept", popen, tmp_path / "kept")
    try:
        registered = "SELECT pid FROM workers WHERE id = ? AND heartbeat_at > started_at"
        (row,) = wait_for(lambda: rows(db, registered, (kept,)), 60, what="the worker's loop")
        assert row["pid"] > PIDS_TAKEN, "the worker's pid is one the sweeper's namespace lacks"
        folders = worker_folders(kept)
        assert folders and all(f.endswith(f"-{row['pid']}") for f in folders), folders
        wait_for(
            lambda: not any(subfolders(f) for f in folders),
            15,
            what="the worker's directories to be empty (probe removed)",
        )

        second = subprocess.run(
            [*UNSHARE, *work, "--once", "--worker-id", sweeper],  # its PID 1, as in a container
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert second.returncode == 0, second.stderr
        assert "containment: a cgroup per attempt" in second.stderr, second.stderr
        assert worker_folders(sweeper) == [], "the sweeper's own directories are left"
        assert worker_folders(kept) == folders, (
            "a worker in another PID namespace removed the idle worker's directories"
        )
    finally:
        with contextlib.suppress(AssertionError, OSError, subprocess.TimeoutExpired):
            os.kill(first.worker_pid(), signal.SIGTERM)  # it removes its own directories
            popen.wait(timeout=30)
        first.destroy()
        for folder in worker_folders(kept):
            cgroup.remove(folder)
