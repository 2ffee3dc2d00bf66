"""`cancel --running` stops a job as a timeout does: its worker sends the
job's process group SIGTERM (or the signal `--signal` names), waits the
grace period, then SIGKILLs it; `--now` SIGKILLs at once. Real workers, and
jobs whose signal handlers write a file."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    Db,
    add_job,
    attempts_of,
    cli,
    events_of,
    job,
    patience,
    pid_alive,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_backends, pytest.mark.subprocess]

FAST = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.2"}


@pytest.fixture
def worker(db: Db, tmp_path: Path) -> Iterator[Path]:
    """A loop worker that logs its attempts as JSON lines; yields the log."""
    log = tmp_path / "worker.log"
    proc = start_worker(db, "--log-format", "json", env=FAST, log=log)
    try:
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=patience(30))


def handling(tmp_path: Path, sig: str, *, ignore: bool = False) -> list[str]:
    """A job that writes its pid, then sleeps; on `sig` its handler writes
    `got-<sig>` and exits 0 (or, with ignore, the signal is ignored)."""
    action = "" if ignore else f"echo got-{sig} > {tmp_path / 'handled'}; exit 0"
    script = f"trap '{action}' {sig}; echo $$ > {tmp_path / 'pid'}; sleep 60 & wait; sleep 60"
    return ["sh", "-c", script]


def started(db: Db, job_id: int, tmp_path: Path) -> int:
    pid_file = tmp_path / "pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="job start")
    wait_for(lambda: attempts_of(db, job_id)[0]["job_pid"] is not None, what="spawn recorded")
    return int(pid_file.read_text())


def ended_record(log: Path, job_id: int) -> dict[str, Any]:
    """The worker's `attempt_ended` line for the job, once written."""

    def find() -> dict[str, Any] | None:
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == "attempt_ended" and record["job_id"] == job_id:
                    return record  # type: ignore[no-any-return]
        return None

    found: dict[str, Any] = wait_for(find, timeout=30, what="the attempt's end logged")
    return found


def canceled_detail(db: Db, job_id: int) -> dict[str, Any]:
    sql = "SELECT detail FROM job_events WHERE job_id = ? AND event = 'canceled'"
    (row,) = rows(db, sql, (job_id,))
    detail: dict[str, Any] = json.loads(row["detail"])
    return detail


def test_cancel_sends_term_first_and_the_handler_runs(db: Db, tmp_path: Path, worker: Path) -> None:
    job_id = add_job(db, *handling(tmp_path, "TERM"))
    pid = started(db, job_id, tmp_path)

    result = cli("cancel", str(job_id), "--running", "--yes", db=db, json=True)

    assert result.exit_code == 0, result.stderr
    (warning,) = result.envelope["warnings"]
    assert warning["code"] == "KILL_ASYNC" and "SIGTERM" in warning["message"]
    wait_for(lambda: (tmp_path / "handled").exists(), timeout=30, what="the TERM handler")
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the job to end")
    assert (tmp_path / "handled").read_text() == "got-TERM\n"
    record = ended_record(worker, job_id)
    assert (record["exit_code"], record["result"]) == (0, "lost_ownership"), record
    assert record["job_state"] is None, "its end changes nothing: the job is not its worker's"
    assert job(db, job_id)["state"] == "canceled"
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["failure_reason"]) == ("canceled", "canceled")
    assert events_of(db, job_id) == ["added", "claimed", "canceled"]
    assert canceled_detail(db, job_id) == {"was_running": True, "signal": "SIGTERM"}


def test_cancel_now_kills_without_the_handler(db: Db, tmp_path: Path, worker: Path) -> None:
    job_id = add_job(db, *handling(tmp_path, "TERM"))
    pid = started(db, job_id, tmp_path)

    result = cli("cancel", str(job_id), "--running", "--yes", "--now", db=db)

    assert result.exit_code == 0, result.stderr
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the job killed")
    assert not (tmp_path / "handled").exists(), "SIGKILL runs no handler"
    assert job(db, job_id)["state"] == "canceled"
    assert canceled_detail(db, job_id)["signal"] == "SIGKILL"


def test_a_job_that_ignores_term_is_killed_after_the_grace(
    db: Db, tmp_path: Path, worker: Path
) -> None:
    job_id = add_job(db, *handling(tmp_path, "TERM", ignore=True))
    pid = started(db, job_id, tmp_path)
    after = add_job(db, "true")

    assert cli("cancel", str(job_id), "--running", "--yes", db=db).exit_code == 0

    wait_for(lambda: not pid_alive(pid), timeout=40, what="the job killed after the grace")
    record = ended_record(worker, job_id)
    assert record["signal"] == signal.SIGKILL, record
    assert job(db, job_id)["state"] == "canceled"
    wait_for(lambda: job(db, after)["state"] == "done", what="the worker to carry on")


def test_signal_chooses_the_first_signal(db: Db, tmp_path: Path, worker: Path) -> None:
    job_id = add_job(db, *handling(tmp_path, "INT"))
    pid = started(db, job_id, tmp_path)

    result = cli("cancel", str(job_id), "--running", "--yes", "--signal", "int", db=db)

    assert result.exit_code == 0, result.stderr
    wait_for(lambda: (tmp_path / "handled").exists(), timeout=30, what="the INT handler")
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the job to end")
    assert (tmp_path / "handled").read_text() == "got-INT\n"
    assert canceled_detail(db, job_id)["signal"] == "SIGINT"


@pytest.mark.parametrize(
    "flags",
    [
        ("--signal", "NOPE"),
        ("--signal", "0"),
        ("--signal", "999"),
        ("--signal", ""),
        ("--signal", "TERM", "--now"),
    ],
)
def test_a_bad_signal_is_refused_and_changes_nothing(db: Db, flags: tuple[str, ...]) -> None:
    job_id = add_job(db, "true")

    result = cli("cancel", str(job_id), "--running", "--yes", *flags, db=db, json=True)

    assert (result.exit_code, result.envelope["errors"][0]["code"]) == (1, "INVALID_INPUT")
    assert "Traceback" not in result.stderr
    assert job(db, job_id)["state"] == "queued"
    assert events_of(db, job_id) == ["added"]
