"""No window without an identity: a worker SIGKILLed in the first milliseconds
after it spawned a job leaves an orphan that the reaper still finds and kills
before the job runs again.

Each round runs a job that holds an exclusive flock on its own file
(`flock -n -E 99 FILE sleep N`: exit 99 if the lock is already held). The
first attempt holds it for 4 s, longer than the reap threshold plus the 2 s
crash backoff, so a copy left running would still hold it at the rerun.
Worker A is SIGKILLed 0–20 ms after its job process appears, before it can
have recorded the job's pid; worker B reaps and re-runs the job. If the
orphan were not killed first, B's copy would find the lock held and exit 99.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests.helpers import (
    SOAK,
    add_job,
    attempts_of,
    cli,
    job,
    kill_worker_and_guard,
    start_worker,
)

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("flock") is None, reason="needs util-linux flock"),
    pytest.mark.subprocess,
]

ROUNDS = round(25 * SOAK)
PARALLEL = 10
KNOBS = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.1", "SPOOLCTL_TEST_REAP_THRESHOLD": "0.5"}
LOCK_HELD = 99
HOLD_LOCK = (
    'if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then t=4; else t=0.2; fi; '
    f'exec flock -n -E {LOCK_HELD} "$0" sleep "$t"'
)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return [c.pid for c in psutil.Process(pid).children()]


def _jobs_of(pid: int) -> list[int]:
    """The worker's children in sessions of their own: its jobs, not its
    lease guard (which stays in the worker's group)."""
    found = []
    for child in _children(pid):
        with contextlib.suppress(ProcessLookupError):
            if os.getsid(child) == child:
                found.append(child)
    return found


def _kill_soon_after_spawn(worker: subprocess.Popen[str], delay_s: float) -> bool:
    """SIGKILL the worker and its lease guard delay_s after its first job
    appears (the guard may not have heard of it yet: the reaper must find it);
    False if it ended before spawning anything."""
    deadline = time.monotonic() + 30
    while not _jobs_of(worker.pid):
        if worker.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    time.sleep(delay_s)
    kill_worker_and_guard(worker)
    return True


def _submit(folder: Path) -> tuple[Path, int]:
    db = folder / "spool" / "queue.db"
    lock = folder / "job.lock"
    return db, add_job(db, "sh", "-c", HOLD_LOCK, str(lock))


def _round(db: Path, delay_s: float) -> dict[str, object]:
    """Subprocesses only: safe to run from a thread."""
    spawned = _kill_soon_after_spawn(start_worker(db, env=KNOBS), delay_s)
    rerun = cli("work", "--drain", "--poll-interval", "0.05", db=db, env=KNOBS, json=True)
    return {
        "delay_ms": round(delay_s * 1000, 1),
        "spawned": spawned,
        "rerun_exit": rerun.exit_code,
        "rerun_output": rerun.stdout + rerun.stderr,
    }


@pytest.mark.slow
def test_a_worker_killed_right_after_spawning_never_leaves_a_second_copy(
    tmp_path: Path,
) -> None:
    rng = random.Random()
    delays = [rng.uniform(0.0, 0.020) for _ in range(ROUNDS)]
    queues = [_submit(tmp_path / f"r{i}") for i in range(ROUNDS)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda i: _round(queues[i][0], delays[i]), range(ROUNDS)))
    for (db, job_id), result in zip(queues, results, strict=True):
        result["state"] = job(db, job_id)["state"]
        tried = attempts_of(db, job_id)
        result["attempts"] = [(a["state"], a["exit_code"]) for a in tried]
        result["pid_recorded"] = tried[0]["job_pid"] is not None
        assert result["spawned"], result
        assert result["rerun_exit"] == 0, result
        assert result["state"] == "done", result
        exits = [code for _, code in result["attempts"]]  # type: ignore[attr-defined]
        assert LOCK_HELD not in exits, f"a second copy found the lock held: {result}"
        assert result["attempts"][0] == ("abandoned", None), result  # type: ignore[index]
        assert result["attempts"][-1] == ("succeeded", 0), result  # type: ignore[index]
    in_window = sum(not r["pid_recorded"] for r in results)
    print(f"{in_window} of {ROUNDS} rounds killed the worker before it recorded the pid")
    assert in_window >= ROUNDS // 10, "too few rounds hit the window this test is about"
