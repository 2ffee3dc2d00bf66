"""A worker that answers: at the first Ctrl-C it says which jobs it waits for
and how to force the stop; a job its forced stop (the second Ctrl-C) kills is
requeued as a worker crash, its retries kept; on a terminal it writes a line
as each job starts and ends (`--quiet`: none; `--verbose`: also on a pipe).
Real `spoolctl work` processes, their stderr a pseudo-terminal or a pipe."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    Db,
    add_job,
    attempts_of,
    child_env,
    events_of,
    job,
    patience,
    pid_alive,
    signal_taken,
    wait_for,
)

pytestmark = [pytest.mark.timeout(90), pytest.mark.subprocess]


class Terminal:
    """A `spoolctl work` whose stdin, stdout and stderr are a pseudo-terminal,
    read as it draws."""

    def __init__(self, db: Db, *args: str) -> None:
        self.leader, follower = pty.openpty()
        argv = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), *args]
        self.proc = subprocess.Popen(
            argv, stdin=follower, stdout=follower, stderr=follower, env=child_env(), close_fds=True
        )
        os.close(follower)
        self.seen = b""

    def read_until(self, wanted: bytes, timeout: float = 30) -> bytes:
        """What it drew so far, once `wanted` is among it."""
        deadline = time.monotonic() + patience(timeout)
        while wanted not in self.seen:
            assert time.monotonic() < deadline, f"never drew {wanted!r}: {self.seen!r}"
            ready, _, _ = select.select([self.leader], [], [], 0.2)
            if ready:
                try:
                    self.seen += os.read(self.leader, 4096)
                except OSError:  # it exited and the terminal hung up
                    break
        assert wanted in self.seen, f"never drew {wanted!r}: {self.seen!r}"
        return self.seen

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=patience(20))
        os.close(self.leader)


def test_first_ctrl_c_says_what_it_waits_for_and_the_second_requeues_as_a_crash(
    db: Db, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    job_id = add_job(db, "sh", "-c", f"echo $$ > {pid_file}; exec sleep 60", max_retries=1)
    worker = Terminal(db)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="job start")
        pid = int(pid_file.read_text())
        worker.read_until(f"job {job_id} started".encode())

        signal_taken(worker.proc, signal.SIGINT)
        drawn = worker.read_until(b"Ctrl-C again")

        notice = drawn.split(b"stopping:", 1)[1].decode()
        assert f"{job_id} (sh -c " in notice, notice
        assert "requeued as a worker crash" in notice, notice
        assert pid_alive(pid), "the first Ctrl-C kills nothing"
        assert job(db, job_id)["state"] == "running"

        worker.proc.send_signal(signal.SIGINT)
        worker.read_until(b"stopped:")
        assert worker.proc.wait(timeout=patience(20)) == 0
    finally:
        worker.close()
    wait_for(lambda: not pid_alive(pid), 10, what="the job killed")
    row = job(db, job_id)
    assert (row["state"], row["attempts"], row["crashes"]) == ("queued", 1, 1)
    assert row["last_failure_reason"] == "worker_crash"
    assert row["attempts"] - row["crashes"] == 0, "no retry spent: the job did not fail"
    (attempt,) = attempts_of(db, job_id)
    assert (attempt["state"], attempt["failure_reason"]) == ("abandoned", "worker_crash")
    assert events_of(db, job_id) == ["added", "claimed", "failed"]


def test_a_forced_stop_spends_the_crash_budget_not_the_retries(db: Db, tmp_path: Path) -> None:
    """max_retries 0 would make any failure dead; max_crashes 0 makes a crash dead."""
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; exec sleep 60"
    kept = add_job(db, "sh", "-c", script, max_retries=0)
    worker = Terminal(db)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="job start")
        signal_taken(worker.proc, signal.SIGINT)
        worker.read_until(b"Ctrl-C again")
        worker.proc.send_signal(signal.SIGINT)
        assert worker.proc.wait(timeout=patience(20)) == 0
    finally:
        worker.close()
    assert job(db, kept)["state"] == "queued", "max_retries 0, yet requeued: not a failure"


def test_on_a_terminal_each_job_start_and_end_is_a_line(db: Db) -> None:
    ok = add_job(db, "true")
    bad = add_job(db, "sh", "-c", "exit 3", max_retries=0)
    worker = Terminal(db, "--drain")
    try:
        drawn = worker.read_until(b"drained:").decode()
        assert worker.proc.wait(timeout=patience(20)) == 0
    finally:
        worker.close()
    lines = [line.strip() for line in drawn.replace("\r", "\n").split("\n") if line.strip()]
    assert f"job {ok} started (attempt 1, pid " in drawn
    (ended_ok,) = [line for line in lines if line.startswith(f"job {ok} ended:")]
    assert ended_ok.startswith(f"job {ok} ended: exit 0, after ") and ended_ok.endswith("-> done")
    (ended_bad,) = [line for line in lines if line.startswith(f"job {bad} ended:")]
    assert ended_bad.startswith(f"job {bad} ended: exit 3, after ") and ended_bad.endswith(
        "-> dead"
    )
    assert "draining:" not in drawn, "the job lines are the progress"


def test_quiet_keeps_the_terminal_as_it_was(db: Db) -> None:
    add_job(db, "true")
    worker = Terminal(db, "--drain", "--quiet")
    try:
        drawn = worker.read_until(b"drained:")
        assert worker.proc.wait(timeout=patience(20)) == 0
    finally:
        worker.close()
    assert b"started" not in drawn and b"ended:" not in drawn
    assert b"\rdraining: 1 attempt (1 succeeded)" in drawn


def drain_piped(db: Db, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--drain", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=patience(60),
        stdin=subprocess.DEVNULL,
    )


def test_on_a_pipe_job_lines_only_with_verbose(db: Db) -> None:
    first = add_job(db, "true")
    plain = drain_piped(db)
    assert plain.returncode == 0, plain.stderr
    assert "started" not in plain.stderr and "ended:" not in plain.stderr
    assert plain.stdout.strip() == "drained: 1 attempt, 1 succeeded"

    second = add_job(db, "true")
    verbose = drain_piped(db, "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert f"job {second} started" in verbose.stderr
    assert f"job {second} ended: exit 0" in verbose.stderr
    assert f"job {first}" not in verbose.stderr


def test_quiet_and_verbose_are_exclusive(db: Db) -> None:
    proc = drain_piped(db, "--quiet", "--verbose")
    assert proc.returncode == 1
    assert "cannot be used together" in proc.stderr


def test_the_stop_notice_takes_a_line_of_its_own_under_a_progress_line(
    db: Db, tmp_path: Path
) -> None:
    add_job(db, "true")
    pid_file = tmp_path / "pid"
    add_job(db, "sh", "-c", f"echo $$ > {pid_file}; exec sleep 60")
    worker = Terminal(db, "--drain", "--quiet")
    try:
        worker.read_until(b"draining: 1 attempt")
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="job start")
        signal_taken(worker.proc, signal.SIGINT)
        drawn = worker.read_until(b"Ctrl-C again")
        worker.proc.send_signal(signal.SIGINT)
        assert worker.proc.wait(timeout=patience(20)) == 0
    finally:
        worker.close()
    assert b"\rstopping: waiting for the running job to end: 2 (sh -c " in drawn, drawn
