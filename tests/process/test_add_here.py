"""`add`'s defaults with a real worker behind them: a job given
`--timeout none` outlives a short timeout the queue's config file makes the
default (and the job killed by that default says so in `feedback`), and a
job added `--here` runs in the submitter's folder with the submitter's
environment alone, not the worker's; on a terminal, `add` (the lean path and
the click verb alike) says the timeout and retries a job got. `add` runs as
a process of its own in the folder it is given, so it reads that folder's
config file."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.helpers import (
    Db,
    child_env,
    job,
    start_worker,
    stop_started_workers,
    wait_for,
)


def run_in(folder: Path, db: Db, verb: str, *args: str, env: dict[str, str] | None = None) -> str:
    """`spoolctl VERB --db DB ARGS` run as a process in `folder`: its stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl", verb, "--db", str(db), *args],
        cwd=folder,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def add_in(folder: Path, db: Db, *args: str, env: dict[str, str] | None = None) -> int:
    """`spoolctl add --json ARGS` run as a process in `folder`; the job's id."""
    return int(json.loads(run_in(folder, db, "add", "--json", *args, env=env))["data"]["job_id"])


def test_timeout_none_outlives_a_short_default_from_the_config(db: Db, tmp_path: Path) -> None:
    (tmp_path / ".spoolctl").mkdir()
    (tmp_path / ".spoolctl" / "config.json").write_text(
        json.dumps({"version": 1, "defaults": {"timeout": 1, "max_retries": 0}})
    )
    started, release = tmp_path / "started", tmp_path / "release"
    waits = f"touch {started}; while [ ! -e {release} ]; do sleep 0.05; done"
    lasting = add_in(tmp_path, db, "--timeout", "none", "--priority", "9", "--", "sh", "-c", waits)
    start_worker(db, "--concurrency", "2")
    try:
        wait_for(started.exists, what="the job without a timeout to start")
        # started after it, so timed out by the 1 s default while it still runs
        cut = add_in(tmp_path, db, "--", "sleep", "60")
        wait_for(lambda: job(db, cut)["state"] == "dead", what="the default timeout to fire")
        assert job(db, cut)["last_failure_reason"] == "timeout"
        assert job(db, lasting)["state"] == "running"
        release.touch()
        wait_for(lambda: job(db, lasting)["state"] == "done", what="the released job to end")
    finally:
        release.touch()
        stop_started_workers()
    assert job(db, lasting)["timeout_seconds"] == 0
    verdict = run_in(tmp_path, db, "feedback", str(cut))
    assert "killed by the queue's default 1 s timeout; use --timeout" in verdict, verdict


def test_here_runs_in_the_submitters_folder_with_its_environment(db: Db, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    script = 'pwd; echo "S=$SUBMITTER_ONLY W=${WORKER_ONLY-unset}"'
    here = add_in(proj, db, "--here", "--", "sh", "-c", script, env={"SUBMITTER_ONLY": "yes"})
    plain = add_in(proj, db, "--", "sh", "-c", script, env={"SUBMITTER_ONLY": "yes"})
    worker = start_worker(db, "--drain", env={"WORKER_ONLY": "1"})
    worker.communicate(timeout=120)
    assert worker.returncode == 0
    lines = run_in(tmp_path, db, "output", str(here), "--stream", "stdout").splitlines()
    assert lines[1:] == [str(proj), "S=yes W=unset"]  # under a header line
    worker_side = run_in(tmp_path, db, "output", str(plain), "--stream", "stdout").splitlines()
    assert worker_side[1:] == [str(tmp_path), "S= W=1"]  # without --here: the worker's


def on_a_terminal(folder: Path, db: Db, *args: str) -> str:
    """`spoolctl add --db DB ARGS` with its stdout a terminal: what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "add", "--db", str(db), *args],
        cwd=folder,
        env=child_env({"NO_COLOR": "1"}),
        stdout=follower,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's far end closed: the process ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_add_on_a_terminal_says_the_default_timeout_on_both_paths(db: Db, tmp_path: Path) -> None:
    first = on_a_terminal(tmp_path, db, "--", "true")  # creates the queue: the full way
    lean = on_a_terminal(tmp_path, db, "--", "true")  # the lean path answers
    given = on_a_terminal(tmp_path, db, "--timeout", "90m", "--max-retries", "0", "--", "true")
    hint = "(the default; --timeout none: no limit)"
    assert first == f"Added job 1\n  timeout 5 min {hint}, max retries 3 (the default)\n"
    assert lean == first.replace("job 1", "job 2")
    assert given == "Added job 3\n  timeout 1 h 30 min, max retries 0\n"
    assert on_a_terminal(tmp_path, db, "-q", "--", "true") == "4\n"
