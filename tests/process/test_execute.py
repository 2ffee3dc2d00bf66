"""Executing attempts with real worker and job processes: success, failure with
backoff and dead-lettering, timeouts that kill the whole process group, spawn
failures the worker survives, per-attempt output, environment and cwd. On
SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.database import open_write
from spoolctl.db.engine import write_tx
from spoolctl.services.deadletter import requeue
from tests.helpers import (
    Db,
    add_job,
    attempts_of,
    cli,
    events_of,
    execute,
    job,
    pid_alive,
    spool_dir,
    wait_for,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_backends, pytest.mark.subprocess]


def work(db: Db, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = cli("work", *args, db=db, env=env, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.data  # type: ignore[no-any-return]


def drain(db: Db, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return work(db, "--drain", *args, env=env)


def read(path: str) -> str:
    return Path(path).read_text()


def set_due_now(db: Db, job_id: int) -> None:
    """Let time pass for the scheduler without sleeping: make the job due."""
    execute(db, "UPDATE jobs SET next_run_at = 0 WHERE id = ?", (job_id,))


def test_success_records_the_attempt_and_its_output(db: Db) -> None:
    job_id = add_job(db, "sh", "-c", "echo hello; echo oops >&2")

    data = drain(db)

    assert data["drained"] is True and data["executed"] == 1
    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["last_exit_code"]) == ("done", 0, 0)
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["attempt_no"], attempt["state"], attempt["exit_code"]) == (1, "succeeded", 0)
    assert attempt["failure_reason"] is None
    folder = spool_dir(db) / "output" / f"{job_id // 1000}xxx"
    assert attempt["stdout_path"] == str(folder / f"{job_id}.1.stdout")
    assert attempt["stderr_path"] == str(folder / f"{job_id}.1.stderr")
    assert read(attempt["stdout_path"]) == "hello\n"
    assert read(attempt["stderr_path"]) == "oops\n"
    assert events_of(db, job_id) == ["added", "claimed", "succeeded"]


def test_failures_retry_with_backoff_then_dead_letter_keeping_every_output(db: Db) -> None:
    script = 'echo "run $SPOOLCTL_ATTEMPT"; test "$SPOOLCTL_ATTEMPT" -ge 3 || exit 3'
    job_id = add_job(db, "sh", "-c", script, max_retries=1)

    assert drain(db)["executed"] == 2  # the drain waits out the 2 s backoff

    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("dead", 2, 0)
    assert (row["last_exit_code"], row["last_error"]) == (3, "exit 3")
    assert row["last_failure_reason"] == "process_exit"
    first, second = attempts_of(db, job_id)
    for attempt in (first, second):
        assert (attempt["state"], attempt["exit_code"]) == ("failed", 3)
        assert (attempt["failure_reason"], attempt["error"]) == ("process_exit", "exit 3")
    assert second["started_at"] - first["finished_at"] >= 2.0
    assert events_of(db, job_id) == ["added", "claimed", "failed", "claimed", "failed", "dead"]

    queue = open_write(str(db))
    with write_tx(queue.engine) as conn:
        requeue(conn, job_id, force=False, now=time.time())
    queue.engine.dispose()
    drain(db)

    assert job(db, job_id)["state"] == "done"
    outputs = [read(a["stdout_path"]) for a in attempts_of(db, job_id)]
    assert outputs == ["run 1\n", "run 2\n", "run 3\n"], "an attempt's output was overwritten"
    assert len({a["stdout_path"] for a in attempts_of(db, job_id)}) == 3


def test_backoff_is_two_then_four_seconds_and_is_honoured(db: Db) -> None:
    job_id = add_job(db, "sh", "-c", "exit 1", max_retries=5)

    assert work(db, "--once")["job_state"] == "queued"
    first = attempts_of(db, job_id)[0]
    assert job(db, job_id)["next_run_at"] - first["finished_at"] == pytest.approx(2.0, abs=1e-3)
    # a loaded machine can take the 2 s to start the next process: keep the job
    # not due for as long as the check takes, so that it tests the rule, not the clock
    execute(db, "UPDATE jobs SET next_run_at = ? WHERE id = ?", (time.time() + 3600, job_id))
    assert work(db, "--once") == {"claimed": False}, "claimed before its backoff ran out"

    set_due_now(db, job_id)
    assert work(db, "--once")["attempt_no"] == 2
    second = attempts_of(db, job_id)[1]
    assert job(db, job_id)["next_run_at"] - second["finished_at"] == pytest.approx(4.0, abs=1e-3)
    assert job(db, job_id)["attempts"] == 2


def group_script(pidfile: Path, trap: str = "") -> list[str]:
    """A shell that starts two grandchildren, records every pid, and waits."""
    return [
        "sh",
        "-c",
        f"{trap} sleep 100 & echo $! >> {pidfile}; sleep 100 & echo $! >> {pidfile};"
        f" echo $$ >> {pidfile}; wait",
    ]


def recorded_pids(pidfile: Path) -> list[int]:
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 3
    return pids


@pytest.mark.slow
def test_timeout_kills_the_whole_process_group(db: Db, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    job_id = add_job(db, *group_script(pidfile), timeout_seconds=1, max_retries=0)

    drain(db)

    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["failure_reason"]) == ("timed_out", "timeout")
    assert attempt["finished_at"] - attempt["started_at"] == pytest.approx(1.0, abs=0.5)
    row = job(db, job_id)
    assert (row["state"], row["last_error"]) == ("dead", "timed out after 1s")
    assert events_of(db, job_id) == ["added", "claimed", "timed_out", "dead"]
    assert ended_by(db, job_id) == (None, None, 15), "a timeout's exit code is null (0.4.11)"
    shown = cli("show", str(job_id), db=db).stdout.splitlines()
    (line,) = [ln for ln in shown if ln.split()[1:2] == ["timed_out"]]  # the attempts table
    assert line.split()[1:4] == ["timed_out", "timeout", "SIGTERM"], line
    assert "exit code -  reason timeout" in cli("feedback", str(job_id), db=db).stdout
    for pid in recorded_pids(pidfile):
        wait_for(lambda pid=pid: not pid_alive(pid), 3, what=f"pid {pid} to die")


def ended_by(db: Db, job_id: int) -> tuple[int | None, int | None, int | None]:
    """(exit_code, last_exit_code, signal) of the job's only attempt as `show
    --json` gives them; the timed_out event's detail names the same signal."""
    data = cli("show", str(job_id), db=db, json=True).data
    (attempt,) = data["attempts"]
    (ending,) = [e for e in data["events"] if e["event"] in ("failed", "timed_out")]
    detail = ending["detail"]
    assert (detail["attempt"], detail["exit_code"], detail["signal"]) == (
        1,
        attempt["exit_code"],
        attempt["signal"],
    )
    return attempt["exit_code"], data["job"]["last_exit_code"], attempt["signal"]


@pytest.mark.slow
@pytest.mark.sqlite_only(
    "process handling, 6 s: how PostgreSQL records a timeout is shown by"
    " test_timeout_kills_the_whole_process_group"
)
def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(db: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    argv = group_script(pidfile, trap="trap '' TERM;")
    job_id = add_job(db, *argv, timeout_seconds=1, max_retries=0)

    drain(db)

    (attempt,) = attempts_of(db, job_id)
    assert attempt["state"] == "timed_out"
    assert ended_by(db, job_id) == (None, None, 9), "the leader was not SIGKILLed"
    assert 5.9 <= attempt["finished_at"] - attempt["started_at"] < 8.0  # 1 s + 5 s grace
    for pid in recorded_pids(pidfile):
        wait_for(lambda pid=pid: not pid_alive(pid), 3, what=f"pid {pid} to die")


def test_a_job_killed_from_outside_keeps_its_exit_code_and_names_the_signal(db: Db) -> None:
    """Not a timeout: exit_code stays -9 (as in 0.4.11), and `signal` says 9."""
    killed = add_job(db, "sh", "-c", "kill -KILL $$", max_retries=0)
    failed = add_job(db, "sh", "-c", "exit 3", max_retries=0)

    drain(db)

    assert ended_by(db, killed) == (-9, -9, 9)
    assert ended_by(db, failed) == (3, 3, None)


def test_spawn_failures_are_recorded_and_the_worker_keeps_going(db: Db, tmp_path: Path) -> None:
    missing_program = add_job(db, str(tmp_path / "no-such-program"), max_retries=0)
    missing_cwd = add_job(db, "true", cwd=str(tmp_path / "no-such-dir"), max_retries=0)
    fine = add_job(db, "echo", "still here")

    assert drain(db)["executed"] == 3

    for job_id in (missing_program, missing_cwd):
        (attempt,) = attempts_of(db, job_id)
        assert (attempt["state"], attempt["failure_reason"]) == ("failed", "spawn_failed")
        assert attempt["exit_code"] is None and "spawn failed" in attempt["error"]
        assert job(db, job_id)["state"] == "dead"
        assert job(db, job_id)["last_failure_reason"] == "spawn_failed"
        assert events_of(db, job_id) == ["added", "claimed", "failed", "dead"]
    assert job(db, fine)["state"] == "done"
    assert read(attempts_of(db, fine)[0]["stdout_path"]) == "still here\n"


def test_environment_is_layered_and_cwd_honoured(db: Db, tmp_path: Path) -> None:
    folder = tmp_path / "jobdir"
    folder.mkdir()
    show = "import json, os; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
    job_id = add_job(
        db,
        sys.executable,
        "-c",
        show,
        cwd=str(folder),
        env={"GREETING": "a=b c", "SHARED": "from the job"},
    )

    worker_env = {"WORKER_ONLY": "w", "SHARED": "from the worker"}
    drain(db, "--worker-id", "w-env", env=worker_env)

    seen = json.loads(read(attempts_of(db, job_id)[0]["stdout_path"]))
    env = seen["env"]
    assert seen["cwd"] == str(folder)
    assert (env["GREETING"], env["SHARED"], env["WORKER_ONLY"]) == ("a=b c", "from the job", "w")
    assert env["SPOOLCTL_JOB_ID"] == str(job_id)
    assert env["SPOOLCTL_ATTEMPT"] == "1"
    assert env["SPOOLCTL_QUEUE"] == "default"
    assert env["SPOOLCTL_WORKER_ID"] == "w-env"
    assert env["SPOOLCTL_SLOT"] == "0"


def test_argv_never_goes_through_a_shell(db: Db) -> None:
    job_id = add_job(db, "echo", "$HOME;ls", "*", "`id`", "a  b")

    drain(db)

    assert read(attempts_of(db, job_id)[0]["stdout_path"]) == "$HOME;ls * `id` a  b\n"
