"""retry, cancel and prune: state changes by hand, their safety blocks, and
prune's promise never to touch a file outside the spool's output folder. On
SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spoolctl.db.outage import Reconnecting
from tests.helpers import (
    Db,
    add,
    attempts_of,
    cli,
    events_of,
    execute_all,
    job,
    pid_alive,
    start_worker,
    wait_for,
)
from tests.populated import Populated, populate, run_quiet

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]


@pytest.fixture
def q(db: Db) -> Populated:
    return populate(db)


def test_retry_requeues_a_dead_job_with_a_fresh_budget(q: Populated) -> None:
    result = q.json("retry", str(q.dead))
    assert result.envelope["data"] == {
        "job_id": q.dead,
        "state": "queued",
        "previous_state": "dead",
    }
    row = job(q.db, q.dead)
    assert (row["state"], row["attempts"], row["crashes"]) == ("queued", 0, 0)
    assert events_of(q.db, q.dead)[-1] == "retried"
    assert q.outcome("retry", str(q.dead)) == (5, "CONFLICT")
    assert q.outcome("retry", str(q.done)) == (5, "CONFLICT")
    assert q.outcome("retry", "999") == (1, "NOT_FOUND")


def test_cancel_queued_and_refuse_finished(q: Populated) -> None:
    result = q.json("cancel", str(q.scheduled))
    assert result.envelope["data"] == {
        "job_id": q.scheduled,
        "state": "canceled",
        "was_running": False,
    }
    assert result.envelope["warnings"] == []
    assert q.outcome("cancel", str(q.done)) == (5, "CONFLICT")
    assert q.outcome("cancel", str(q.scheduled)) == (5, "CONFLICT")
    assert q.outcome("retry", str(q.scheduled))[0] == 0


@pytest.fixture
def worker(q: Populated, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = start_worker(q.db, log=tmp_path / "worker.log")
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_sleeper(q: Populated, pid_file: Path) -> tuple[int, int]:
    """A job that sleeps in its first attempt and succeeds in later ones."""
    script = f'echo $$ > {pid_file}; [ "$SPOOLCTL_ATTEMPT" = 1 ] && exec sleep 60; exit 0'
    job_id = add(q.db, "sh", "-c", script)
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="job started")
    return job_id, int(pid_file.read_text())


@pytest.mark.usefixtures("worker")
def test_cancel_running_needs_yes_and_the_worker_kills_the_group(
    q: Populated, tmp_path: Path
) -> None:
    job_id, pid = start_sleeper(q, tmp_path / "pid")
    assert q.outcome("cancel", str(job_id)) == (2, "SAFETY_BLOCK")
    assert q.outcome("cancel", str(job_id), "--yes") == (2, "SAFETY_BLOCK")
    assert q.outcome("cancel", str(job_id), "--running") == (2, "SAFETY_BLOCK")
    assert job(q.db, job_id)["state"] == "running"
    result = q.json("cancel", str(job_id), "--running", "--yes")
    assert result.envelope["data"]["was_running"] is True
    assert [w["code"] for w in result.envelope["warnings"]] == ["KILL_ASYNC"]
    wait_for(lambda: not pid_alive(pid), timeout=10, what="canceled job's process killed")
    assert job(q.db, job_id)["state"] == "canceled"
    assert attempts_of(q.db, job_id)[0]["failure_reason"] == "canceled"


@pytest.mark.usefixtures("worker")
def test_retry_force_on_a_running_job_kills_it_and_runs_it_again(
    q: Populated, tmp_path: Path
) -> None:
    job_id, pid = start_sleeper(q, tmp_path / "pid")
    assert q.outcome("retry", str(job_id)) == (2, "SAFETY_BLOCK")
    result = q.json("retry", str(job_id), "--force")
    assert result.envelope["data"]["previous_state"] == "running"
    assert [w["code"] for w in result.envelope["warnings"]] == ["KILL_ASYNC"]
    wait_for(lambda: not pid_alive(pid), timeout=10, what="first attempt killed")
    wait_for(lambda: job(q.db, job_id)["state"] == "done", timeout=20, what="second attempt")
    assert [a["attempt_no"] for a in attempts_of(q.db, job_id)] == [1, 2]


def test_prune_needs_dry_run_or_yes_not_both(q: Populated) -> None:
    assert q.outcome("prune", "--older-than", "0") == (2, "SAFETY_BLOCK")
    assert q.outcome("prune", "--older-than", "0", "--yes", "--dry-run") == (1, "INVALID_INPUT")
    assert q.outcome("prune", "--dry-run") == (1, "MISSING_REQUIRED")
    assert q.outcome("prune", "--older-than", "soon", "--dry-run") == (1, "INVALID_INPUT")


def test_prune_dry_run_changes_nothing(q: Populated) -> None:
    before = q.jobs()
    every = ("--state", "done,dead,canceled")
    report = q.json("prune", "--older-than", "0", "--dry-run", *every).envelope["data"]
    assert report["dry_run"] is True and report["actual"] is False
    assert (report["matched"], report["deleted_jobs"], report["deleted_attempts"]) == (3, 3, 2)
    assert report["freed_bytes"] == len("hello\n") + len("oops\n")
    default = q.json("prune", "--older-than", "0", "--dry-run").envelope["data"]
    assert default["matched"] == 1, "by default only done jobs are pruned, as 0.4.11 did"
    assert q.jobs() == before


def test_prune_deletes_files_then_rows_of_old_terminal_jobs(q: Populated) -> None:
    assert q.json("prune", "--older-than", "1h", "--yes").envelope["data"]["matched"] == 0
    report = q.json("prune", "--older-than", "0", "--state", "done", "--yes").envelope["data"]
    assert (report["deleted_jobs"], report["deleted_attempts"], report["deleted_events"]) == (
        1,
        1,
        3,
    )
    shared = q.spool / "output" / f"{q.done // 1000}xxx"
    assert not (shared / f"{q.done}.1.stdout").exists()
    assert not (shared / f"{q.done}.1.stderr").exists()
    assert (shared / f"{q.dead}.1.stderr").exists()
    remaining = {j["id"] for j in q.jobs()["jobs"]}
    assert remaining == {q.dead, q.scheduled, q.canceled}
    assert q.json("prune", "--older-than", "0", "-y").envelope["data"]["deleted_jobs"] == 0
    rest = q.json("prune", "--older-than", "0", "--state", "dead,canceled", "--yes")
    assert rest.envelope["data"]["deleted_jobs"] == 2 and rest.envelope["data"]["irreversible"]
    assert {j["id"] for j in q.jobs()["jobs"]} == {q.scheduled}
    assert (q.spool / "output").is_dir()


def test_prune_never_deletes_a_file_outside_the_output_folder(q: Populated, tmp_path: Path) -> None:
    outside, linked = tmp_path / "precious.txt", tmp_path / "linked.txt"
    outside.write_text("keep me")
    linked.write_text("keep me too")
    link = q.spool / "output" / f"{q.dead // 1000}xxx" / f"{q.dead}.1.stderr"
    link.unlink()
    link.symlink_to(linked)
    escape = q.spool / "output" / os.path.relpath(outside, q.spool / "output")  # ../../precious.txt
    update = "UPDATE attempts SET stdout_path = ? WHERE job_id = ?"
    execute_all(q.db, (update, (str(escape), q.dead)), (update, (str(outside), q.done)))
    every = ("--state", "done,dead,canceled")
    report = q.json("prune", "--older-than", "0", "--yes", *every).envelope["data"]
    assert report["deleted_jobs"] == 3
    assert outside.read_text() == "keep me" and linked.read_text() == "keep me too"
    assert sorted(report["skipped_paths"]) == sorted([str(escape), str(link), str(outside)])


@pytest.mark.usefixtures("worker")
def test_output_follow_streams_a_running_attempt_until_it_ends(
    q: Populated, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second >&2"
    job_id = add(q.db, "sh", "-c", script)
    wait_for(lambda: job(q.db, job_id)["state"] == "running", what="job running")
    threading.Timer(0.5, gate.touch).start()
    result = run_quiet(*q.args("output", str(job_id), "--follow", "--json"))
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    chunks = [(f["stream"], f["text"]) for f in frames[:-1]]
    assert chunks == [("stdout", "first\n"), ("stderr", "second\n")]
    assert frames[-1]["control"] == {
        "type": "end",
        "reason": "attempt_ended",
        "attempt_state": "succeeded",
    }


def follow_after_a_first_look(
    q: Populated, job_id: int, meanwhile: list[str], monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    """`output --follow --json` in this process; once it has looked and found
    no attempt (its first pause), `spoolctl MEANWHILE` runs. Its frames, or
    its one envelope."""
    looked: list[float] = []
    pause = Reconnecting.pause

    def first_look_then(self: Reconnecting, seconds: float) -> None:
        if not looked:
            looked.append(seconds)
            ran = cli(*meanwhile, db=q.db)
            assert ran.exit_code == 0, ran.stdout + ran.stderr
        pause(self, seconds)

    monkeypatch.setattr(Reconnecting, "pause", first_look_then)
    result = run_quiet(*q.args("output", str(job_id), "--follow", "--json", "--idle-timeout", "60"))
    assert looked, "it looked before the job ran"
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_output_follow_waits_for_a_job_that_has_not_started(
    q: Populated, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = add(q.db, "echo", "late")
    frames = follow_after_a_first_look(q, job_id, ["work", "--once"], monkeypatch)
    assert frames == [
        {"stream": "stdout", "offset": 0, "text": "late\n"},
        {"control": {"type": "end", "reason": "attempt_ended", "attempt_state": "succeeded"}},
    ]


def test_output_follow_on_a_job_that_ends_without_an_attempt_warns_no_attempts_yet(
    q: Populated, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = add(q.db, "echo", "never")
    (envelope,) = follow_after_a_first_look(q, job_id, ["cancel", str(job_id)], monkeypatch)
    assert envelope["ok"] and envelope["data"]["attempt_no"] is None
    assert [w["code"] for w in envelope["warnings"]] == ["NO_ATTEMPTS_YET"]


def test_output_follow_gives_up_on_a_job_not_started_after_its_idle_timeout(
    q: Populated,
) -> None:
    waited = q.json("output", str(q.scheduled), "--follow", "--idle-timeout", "0.3")
    (error,) = waited.envelope["errors"]
    assert (waited.exit_code, error["code"]) == (4, "TIMEOUT")
    assert error["detail"] == {"job_id": q.scheduled, "state": "queued"}
    assert "--idle-timeout" in error["remediation"]
    assert q.outcome("output", str(q.done), "--idle-timeout", "1") == (1, "INVALID_INPUT")
