"""`work --log-format json`: one JSON object per line on stderr for each
attempt's start and end and each reap, with the keys docs/monitoring.md
lists; without the flag stderr carries none of them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, add_job, attempts_of, child_env, start_worker, wait_for

pytestmark = pytest.mark.subprocess

STARTED_KEYS = {
    "event",
    "at",
    "worker_id",
    "queue",
    "job_id",
    "attempt_id",
    "attempt_no",
    "pid",
    "slot",
    "error",
}
ENDED_KEYS = {
    "event",
    "at",
    "worker_id",
    "queue",
    "job_id",
    "attempt_id",
    "attempt_no",
    "result",
    "exit_code",
    "signal",
    "failure_reason",
    "error",
    "duration_s",
    "job_state",
}
CONTAINMENT_KEYS = {
    "event",
    "at",
    "worker_id",
    "mode",
    "reason",
    "kill",
    "cgroup_root",
    "memory_limit",
    "cpu_limit",
}
REAPED_KEYS = {
    "event",
    "at",
    "worker_id",
    "job_id",
    "attempt_id",
    "dead_worker",
    "verdict",
    "job_state",
}


def drain(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--drain", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def records(stderr: str) -> list[dict[str, Any]]:
    """Every line of stderr, each of which must be one JSON object."""
    found = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert all(isinstance(r, dict) for r in found)
    return found


def test_each_attempt_start_and_end_is_one_json_line(db: Path) -> None:
    ok = add_job(db, "true")
    bad = add_job(db, "sh", "-c", "exit 3", max_retries=0)
    proc = drain(db, "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    said, *logged = records(proc.stderr)
    assert said["event"] == "containment" and set(said) == CONTAINMENT_KEYS, said
    assert said["mode"] in ("cgroup", "process_group") and said["reason"]
    assert "containment:" not in proc.stderr, "no human line among the JSON ones"
    assert [(r["event"], r["job_id"]) for r in logged] == [
        ("attempt_started", ok),
        ("attempt_ended", ok),
        ("attempt_started", bad),
        ("attempt_ended", bad),
    ]
    started, ended = logged[0], logged[1]
    assert set(started) == STARTED_KEYS and set(ended) == ENDED_KEYS
    assert started["pid"] > 0 and started["attempt_no"] == 1 and started["queue"] == "default"
    assert ended["result"] == "succeeded" and ended["job_state"] == "done"
    assert ended["exit_code"] == 0 and ended["failure_reason"] is None
    assert ended["duration_s"] >= 0
    failed = logged[3]
    assert failed["result"] == "process_exit" and failed["exit_code"] == 3
    assert failed["failure_reason"] == "process_exit" and failed["job_state"] == "dead"
    assert {r["worker_id"] for r in [said, *logged]} == {started["worker_id"]}
    assert started["attempt_id"] == attempts_of(db, ok)[0]["id"]


def test_the_default_stays_the_human_report(db: Path) -> None:
    add_job(db, "true")
    proc = drain(db)
    assert proc.returncode == 0, proc.stderr
    assert "attempt_started" not in proc.stderr + proc.stdout
    assert proc.stdout.strip() == "drained: 1 attempt, 1 succeeded"


def test_a_reap_is_one_json_line_naming_the_dead_worker(db: Path) -> None:
    job = add_job(db, "sleep", "30", max_crashes=0)
    owner = start_worker(db, "--worker-id", "doomed-worker")
    wait_for(
        lambda: (a := attempts_of(db, job)) and a[0]["job_pid"],
        timeout=20,
        what="the job's spawn record",
    )
    owner.send_signal(signal.SIGKILL)
    owner.communicate(timeout=10)
    proc = drain(db, "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    reaped = [r for r in records(proc.stderr) if r["event"] == "reaped"]
    assert len(reaped) == 1, proc.stderr
    assert set(reaped[0]) == REAPED_KEYS
    assert reaped[0]["job_id"] == job and reaped[0]["dead_worker"] == "doomed-worker"
    assert reaped[0]["job_state"] == "dead", "max_crashes 0: the first crash dead-letters"
    assert reaped[0]["verdict"] == "dead"


def test_every_logged_key_is_documented() -> None:
    text = (REPO / "docs" / "monitoring.md").read_text()
    section = text.split("## Worker logs for machines", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))
    logged = STARTED_KEYS | ENDED_KEYS | REAPED_KEYS | CONTAINMENT_KEYS | {"pid", "reason"}
    assert logged <= documented, sorted(logged - documented)
