"""A SIGKILLed worker's devices are not given out while its orphan lives.

A worker with one declared device runs a 1-GPU job and is SIGKILLed with its
lease guard (the job lives on, as after the OOM killer). A second worker on
the same host, with the same device, runs as another user (`setpriv`, as
tests/process/test_recovery.py does): its reaper finds the first worker dead
but cannot end the orphan, so the job stays running, flagged
`orphan_unconfirmed`, and keeps its hold on the device. A second 1-GPU job
must wait: the worker runs a plain job added after it, so it claimed with
the GPU job due, and the GPU job is still queued, the device still held by
the orphan's attempt. Once the orphan is killed, the reaper requeues the
first job and releases its hold, and only then is the device given to the
waiting job (its claim comes after the reap in the ledger).

SQLite alone: the reaper's judgement of an orphan is process handling, the
same on both backends; the holds' release with the reap is the claim's and
the reaper's, proven on both in-process (unit/test_placement.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.database import open_write
from spoolctl.db.tables import DEVICE_UNITS
from tests.helpers import (
    STARTED_WORKERS,
    Strays,
    attempts_of,
    child_env,
    events_of,
    job,
    kill_worker_and_guard,
    pid_alive,
    rows,
    wait_for,
)
from tests.placement_marks import add_with_request, mark_argv

pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.timeout(180)]

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
ORPHAN = 'if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then echo $$ > "$1"; exec sleep 600; fi'
"""The first attempt stays (its pid in $1); a rerun ends at once."""
GPU = {"uuid": "GPU-box-0", "index": 0, "model": "Fake A100", "memory": 80 << 30}


def add(db: Path, argv: list[str], request: dict[str, Any]) -> int:
    """Submit as root, the queue closed after (no -wal left with root's mode)."""
    queue = open_write(str(db))
    try:
        return add_with_request(queue, argv, request)
    finally:
        queue.engine.dispose()


def event_ids(db: Path, job_id: int, event: str) -> list[int]:
    found = rows(db, "SELECT id FROM job_events WHERE job_id = ? AND event = ?", (job_id, event))
    return [int(r["id"]) for r in found]


def start(argv: list[str], env: dict[str, str], *, as_nobody: bool) -> subprocess.Popen[str]:
    """A worker as root, or as user nobody."""
    wrapped = [*AS_NOBODY, *argv] if as_nobody else argv
    popen = subprocess.Popen(
        wrapped, env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    STARTED_WORKERS.append(popen)
    return popen


def settled(db: Path, plain: int, other: subprocess.Popen[str]) -> None:
    """Wait for the plain job added after the flag: the other worker has
    claimed with the GPU job due."""
    try:
        wait_for(lambda: job(db, plain)["state"] == "done", what="the plain job after the flag")
    except AssertionError as exc:
        other.kill()
        said = other.communicate()[0][-3000:]
        found = rows(db, "SELECT id, state, last_error FROM jobs")
        raise AssertionError(f"{exc}: {[tuple(r) for r in found]}\n{said}") from None


def test_a_killed_workers_device_waits_for_its_orphan() -> None:
    assert os.getuid() == 0 and shutil.which("setpriv"), (
        "this test runs a worker as another user: it needs root and setpriv (CI has both)"
    )
    base = Path(tempfile.mkdtemp(prefix="spoolctl-gpu-orphan-", dir="/tmp"))
    os.chmod(base, 0o755)
    strays = Strays()
    workers: list[subprocess.Popen[str]] = []
    try:
        db, marks, pidfile = base / "spool" / "queue.db", base / "marks", base / "orphan.pid"
        marks.mkdir()
        os.chmod(marks, 0o777)
        first = add(db, ["sh", "-c", ORPHAN, "job", str(pidfile)], {"gpus": 1})
        os.chmod(db.parent, 0o777)  # the other user's worker opens the queue
        os.chmod(db, 0o666)  # SQLite gives -wal and -shm the database file's mode
        env = {"SPOOLCTL_TEST_HOSTNAME": "gpubox", "SPOOLCTL_TEST_GPUS": json.dumps([GPU])}
        argv = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--json"]
        argv += ["--gpus", "all", "--concurrency", "2", "--poll-interval", "0.1"]
        workers.append(start(argv, env, as_nobody=False))
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the job")
        orphan = strays.keep(int(pidfile.read_text()))
        wait_for(lambda: attempts_of(db, first)[0]["job_pid"] == orphan, what="its pid")
        kill_worker_and_guard(workers[0])  # with its lease guard: the job lives on
        for folder in [db.parent / "output", *(db.parent / "output").rglob("*")]:
            if folder.is_dir():  # the other user's jobs write their output beside the first's
                os.chmod(folder, 0o777)

        waiting = add(db, mark_argv(marks, 0), {"gpus": 1})
        workers.append(start(argv, env, as_nobody=True))
        wait_for(lambda: "orphan_unconfirmed" in events_of(db, first), what="the flag")
        settled(db, add(db, mark_argv(marks, 0), {}), workers[1])

        assert job(db, waiting)["state"] == "queued", "the device was given out under the orphan"
        assert job(db, first)["state"] == "running" and pid_alive(orphan)
        (attempt,) = attempts_of(db, first)
        holds = rows(db, "SELECT attempt_id, device_uuid, units FROM device_holds")
        assert [tuple(h) for h in holds] == [(attempt["id"], GPU["uuid"], DEVICE_UNITS)]
        devices = rows(db, "SELECT uuid, held FROM devices")
        assert [tuple(r) for r in devices] == [(GPU["uuid"], DEVICE_UNITS)]

        os.kill(orphan, signal.SIGKILL)  # the operator ends it
        wait_for(lambda: job(db, waiting)["state"] == "done", what="the waiting GPU job")
        wait_for(lambda: job(db, first)["state"] == "done", what="the first job's rerun")
        (reaped,) = event_ids(db, first, "reaped")
        (claimed,) = event_ids(db, waiting, "claimed")
        assert claimed > reaped, "the device was given out before the orphan's reap"
        assert rows(db, "SELECT * FROM device_holds") == []
    finally:
        for popen in workers:
            if popen.poll() is None:
                popen.kill()
            popen.wait()
        strays.kill()
        shutil.rmtree(base, ignore_errors=True)
