"""Pausing a lane: workers (real processes) stop claiming from it within their
pickup latency while a running job finishes; `add` still queues; a drain of a
paused lane returns at once; pause and resume are idempotent, recorded with
who, when and why, ledgered as events, and shown by status and workers. On
SQLite and on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    Db,
    add,
    child_env,
    cli_json,
    inproc,
    job,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]
IDLE_PROOF_S = 1.0
"""How long a queued job must stay unclaimed to show a paused lane is not
served: many times the idle worker's pickup latency (milliseconds)."""


def run(capsys: pytest.CaptureFixture[str], db: Db, *args: str) -> Any:
    result = inproc(args[0], "--db", str(db), "--json", *args[1:], capsys=capsys)
    return result


def state(db: Db, job_id: int) -> str:
    return str(job(db, job_id)["state"])


def test_a_paused_lane_is_not_claimed_while_the_running_job_finishes(
    db: Db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = tmp_path / "gate"
    first = add(db, "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done")
    worker = start_worker(db)
    wait_for(lambda: state(db, first) == "running", what="the worker to start job 1")
    paused = run(capsys, db, "pause", "default", "--reason", "deploy")
    assert paused.exit_code == 0 and paused.data["changed"] is True
    second = add(db, "true")
    assert state(db, second) == "queued", "add to a paused lane still queues"
    gate.touch()
    wait_for(lambda: state(db, first) == "done", what="the running job to finish")
    time.sleep(IDLE_PROOF_S)
    assert state(db, second) == "queued"
    assert worker.poll() is None, "pausing stops no worker"
    assert run(capsys, db, "resume", "default").data["changed"] is True
    wait_for(lambda: state(db, second) == "done", timeout=10, what="job 2 after resume")
    worker.terminate()
    assert worker.wait(30) == 0


def test_other_lanes_keep_running(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, db, "pause", "blocked")
    held = add(db, "true", opts=("--queue", "blocked"))
    free = add(db, "true", opts=("--queue", "free"))
    drained = run(capsys, db, "work", "--drain", "--queue", "free")
    assert drained.data["drained"] is True and drained.data["paused"] is False
    assert (state(db, held), state(db, free)) == ("queued", "done")


def test_a_drain_of_a_paused_lane_returns_at_once_saying_so(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = add(db, "true")
    run(capsys, db, "pause", "default")
    started = time.monotonic()
    result = cli_json("work", "--drain", "--db", str(db))
    assert time.monotonic() - started < 10
    assert result.exit_code == 0
    assert result.data["paused"] is True
    assert (result.data["drained"], result.data["executed"]) == (False, 0)
    assert state(db, job_id) == "queued"
    text = inproc("work", "--db", str(db), "--drain", capsys=capsys)
    assert "paused" in text.stdout


def test_pause_and_resume_are_idempotent_recorded_and_ledgered(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    add(db, "true")
    first = run(capsys, db, "pause", "default", "--reason", "disk full")
    again = run(capsys, db, "pause", "default")
    assert (first.exit_code, again.exit_code) == (0, 0)
    assert (first.data["changed"], again.data["changed"]) == (True, False)
    assert again.data["changed_queues"] == []
    lane = first.data["paused_lanes"][0]
    assert lane["queue"] == "default" and lane["reason"] == "disk full"
    assert "@" in lane["paused_by"] and "pid" in lane["paused_by"]
    assert lane["paused_at"] == pytest.approx(time.time(), abs=60)
    resumed = run(capsys, db, "resume", "default")
    twice = run(capsys, db, "resume", "default")
    assert (resumed.data["changed"], twice.data["changed"]) == (True, False)
    assert twice.data["paused_lanes"] == []
    ledger = rows(
        db, "SELECT job_id, event, detail FROM job_events WHERE job_id IS NULL ORDER BY id"
    )
    assert [(r["job_id"], r["event"]) for r in ledger] == [(None, "paused"), (None, "resumed")]
    events = run(capsys, db, "events").data["events"]
    assert [e["event"] for e in events if e["job_id"] is None] == ["paused", "resumed"]
    assert events[-1]["detail"]["queue"] == "default"


def test_status_and_workers_show_paused_lanes(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    add(db, "true")
    add(db, "true", opts=("--queue", "other"))
    run(capsys, db, "pause", "other", "--reason", "maintenance")
    status = run(capsys, db, "status").data
    assert [p["queue"] for p in status["paused_lanes"]] == ["other"]
    assert status["queues"]["other"]["paused"] is True
    assert status["queues"]["default"]["paused"] is False
    assert [p["queue"] for p in run(capsys, db, "workers").data["paused_lanes"]] == ["other"]
    text = inproc("status", "--db", str(db), capsys=capsys).stdout
    assert "paused lanes: 1" in text and "maintenance" in text


def test_pause_all_and_resume_all(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    for queue in ("a", "b", "c"):
        add(db, "true", opts=("--queue", queue))
    run(capsys, db, "pause", "b")
    everything = run(capsys, db, "pause", "--all")
    assert everything.data["queues"] == ["a", "b", "c"]
    assert everything.data["changed_queues"] == ["a", "c"]
    assert everything.data["queue"] is None
    resumed = run(capsys, db, "resume", "--all")
    assert resumed.data["changed_queues"] == ["a", "b", "c"]
    assert rows(db, "SELECT count(*) FROM lanes")[0][0] == 0


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("pause",), "MISSING_REQUIRED"),
        (("resume",), "MISSING_REQUIRED"),
        (("pause", "x", "--all"), "INVALID_INPUT"),
        (("pause", "bad name"), "INVALID_INPUT"),
        (("pause", "x", "--reason", ""), "INVALID_INPUT"),
        (("resume", "-x"), "UNKNOWN_FLAG"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    db: Db, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: str
) -> None:
    add(db, "true")
    before = rows(db, "SELECT count(*) FROM job_events")[0][0]
    result = run(capsys, db, *args)
    assert result.exit_code == 1
    assert result.envelope["errors"][0]["code"] == code
    assert rows(db, "SELECT count(*) FROM lanes")[0][0] == 0
    assert rows(db, "SELECT count(*) FROM job_events")[0][0] == before


def test_shell_completion_offers_the_new_verbs_and_flags() -> None:
    def complete(words: str) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "spoolctl"],
            env=child_env(
                {
                    "_SPOOLCTL_COMPLETE": "bash_complete",
                    "COMP_WORDS": words,
                    "COMP_CWORD": str(len(words.split()) - 1),
                }
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
        return [line.split(",", 1)[1] for line in proc.stdout.splitlines()]

    assert {"pause"} <= set(complete("spoolctl pa"))
    assert {"resume", "retry"} <= set(complete("spoolctl re"))
    assert "--reason" in complete("spoolctl pause --re")
    assert "--after-job" in complete("spoolctl add --after-")
    assert "--with-dependents" in complete("spoolctl retry --with")
    assert "--waiting" in complete("spoolctl list --wa")
