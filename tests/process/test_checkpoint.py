"""`add --signal-before-timeout` and `--requeue-exit` on real workers
(docs/steering.md): a job warned before its timeout checkpoints, exits with
its requeue code and resumes in its next attempt, which reads
SPOOLCTL_REQUEUES; the `warned` and `requeued` events are in the ledger;
the timeout itself is unchanged for a job that ignores the warning; a
requeue loop stops at --max-requeues, then the usual retries, then dead;
requeues keep the retry budget; `retry` starts the requeues again."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    Db,
    add,
    attempts_of,
    cli,
    events_of,
    job,
    patience,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.both_backends, pytest.mark.subprocess]

FAST = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.2"}


@pytest.fixture
def worker(db: Db) -> Iterator[subprocess.Popen[str]]:
    """A loop worker, stopped (SIGTERM) at the end."""
    proc = start_worker(db, env=FAST)
    try:
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=patience(30))


def in_state(db: Db, job_id: int, state: str) -> bool:
    return bool(job(db, job_id)["state"] == state)


def details(db: Db, job_id: int, event: str) -> list[dict[str, Any]]:
    sql = "SELECT detail FROM job_events WHERE job_id = ? AND event = ? ORDER BY id"
    return [json.loads(r["detail"]) for r in rows(db, sql, (job_id, event))]


def training(folder: Path) -> list[str]:
    """A training-like job: resumes from its checkpoint file if one is
    there (writes `resumed` with SPOOLCTL_REQUEUES, exits 0); else works
    until SIGUSR1, which makes it write the checkpoint (with
    SPOOLCTL_REQUEUES) and exit 75."""
    ckpt, resumed = folder / "checkpoint", folder / "resumed"
    script = (
        f'if [ -f {ckpt} ]; then echo "$SPOOLCTL_REQUEUES" > {resumed}; exit 0; fi; '
        f"trap 'echo \"$SPOOLCTL_REQUEUES\" > {ckpt}; exit 75' USR1; "
        "while :; do sleep 0.05; done"
    )
    return ["sh", "-c", script]


def test_a_warned_job_checkpoints_is_requeued_and_resumes(
    db: Db, tmp_path: Path, worker: subprocess.Popen[str]
) -> None:
    warning = ("--timeout", "4s", "--signal-before-timeout", "USR1@2s", "--requeue-exit", "75")
    job_id = add(db, *training(tmp_path), opts=warning)

    wait_for(lambda: in_state(db, job_id, "done"), timeout=60, what="the job resumed and done")

    assert (tmp_path / "checkpoint").read_text() == "0\n", "USR1 reached the first attempt"
    assert (tmp_path / "resumed").read_text() == "1\n", "SPOOLCTL_REQUEUES grew"
    first, second = attempts_of(db, job_id)
    assert (first["state"], first["failure_reason"], first["exit_code"]) == (
        "requeued",
        "requeue_exit",
        75,
    )
    assert (second["state"], second["exit_code"]) == ("succeeded", 0)
    row = job(db, job_id)
    assert (row["requeues"], row["attempts"], row["crashes"]) == (1, 0, 0)
    assert events_of(db, job_id) == [
        "added",
        "claimed",
        "warned",
        "requeued",
        "claimed",
        "succeeded",
    ]
    assert details(db, job_id, "warned") == [{"attempt": 1, "signal": "SIGUSR1", "before_s": 2}]
    assert details(db, job_id, "requeued") == [{"attempt": 1, "exit_code": 75, "requeues": 1}]
    shown = cli("show", str(job_id), db=db, json=True).data["job"]
    assert {k: shown[k] for k in ("signal_before_timeout", "signal_before_timeout_s")} == {
        "signal_before_timeout": "SIGUSR1",
        "signal_before_timeout_s": 2,
    }
    assert (shown["requeue_exits"], shown["max_requeues"], shown["requeues"]) == ([75], None, 1)


def test_a_job_that_ignores_the_warning_still_times_out(
    db: Db, tmp_path: Path, worker: subprocess.Popen[str]
) -> None:
    """The warning changes nothing of the timeout: TERM at the deadline, and
    a timeout is never a requeue, whatever the exit code."""
    script = f"trap 'echo warned > {tmp_path / 'warned'}' USR1; while :; do sleep 0.05; done"
    opts = ("--timeout", "3", "--signal-before-timeout", "USR1@1", "--requeue-exit", "143")
    job_id = add(db, "sh", "-c", script, opts=(*opts, "--max-retries", "0"))

    wait_for(lambda: in_state(db, job_id, "dead"), timeout=60, what="the job timed out, dead")

    assert (tmp_path / "warned").read_text() == "warned\n"
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["failure_reason"]) == ("timed_out", "timeout")
    assert events_of(db, job_id) == ["added", "claimed", "warned", "timed_out", "dead"]
    assert job(db, job_id)["requeues"] == 0


def test_a_requeue_loop_stops_at_its_bound_then_retries_then_dead(db: Db, tmp_path: Path) -> None:
    seen = tmp_path / "requeues"
    script = f'echo "$SPOOLCTL_REQUEUES" >> {seen}; exit 75'
    opts = ("--requeue-exit", "75", "--max-requeues", "2", "--max-retries", "1")
    job_id = add(db, "sh", "-c", script, opts=opts)
    worker = start_worker(db, env=FAST)
    try:
        wait_for(lambda: in_state(db, job_id, "dead"), timeout=60, what="the loop stopped, dead")
    finally:
        stop(worker)

    states = [(a["state"], a["failure_reason"]) for a in attempts_of(db, job_id)]
    assert states == [
        ("requeued", "requeue_exit"),
        ("requeued", "requeue_exit"),
        ("failed", "process_exit"),
        ("failed", "process_exit"),
    ]
    assert seen.read_text().split() == ["0", "1", "2", "2"]
    row = job(db, job_id)
    assert (row["requeues"], row["attempts"]) == (2, 2)
    assert [e for e in events_of(db, job_id) if e != "claimed"] == [
        "added",
        "requeued",
        "requeued",
        "failed",
        "failed",
        "dead",
    ]

    retried = cli("retry", str(job_id), db=db, json=True)
    assert retried.exit_code == 0, retried.stderr
    row = job(db, job_id)
    assert (row["state"], row["requeues"], row["attempts"]) == ("queued", 0, 0)


def test_requeues_keep_the_retry_budget(db: Db, tmp_path: Path, worker: Any) -> None:
    """With no retry at all (--max-retries 0), a job requeued three times
    still runs a fourth time: a requeue is not a failure."""
    script = '[ "$SPOOLCTL_REQUEUES" -ge 3 ] && exit 0; exit 75'
    opts = ("--requeue-exit", "75", "--requeue-exit", "76", "--max-retries", "0")
    job_id = add(db, "sh", "-c", script, opts=opts)

    wait_for(lambda: in_state(db, job_id, "done"), timeout=60, what="the fourth attempt done")

    assert [a["state"] for a in attempts_of(db, job_id)] == [
        "requeued",
        "requeued",
        "requeued",
        "succeeded",
    ]
    row = job(db, job_id)
    assert (row["requeues"], row["attempts"], row["requeue_exits"]) == (3, 0, "[75,76]")
