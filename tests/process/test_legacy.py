"""Adopted databases of the original standard-library spoolctl, worked by real
workers and jobs: a running job of a dead worker is reaped, old output is
shown, new output is written beside it and prune takes both, and odd rows are
quarantined and still reported once jobs run. The adoption itself, row by row,
is in tests/unit/test_legacy.py (on copies of `tests/fixtures/legacy/`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, inproc
from tests.unit.test_legacy import EXPECTED, adopt, copy_fixture, table


@pytest.mark.subprocess
def test_a_job_left_running_by_a_dead_worker_is_reaped_afterwards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = copy_fixture("v6-populated", tmp_path)
    adopt(db, capsys)
    ran = cli_json("work", "--once", "--queue", "default", db=db)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert ran.data["job_id"] == 20
    job = table(db, "SELECT state, crashes, last_failure_reason FROM jobs WHERE id = 19")[0]
    assert job == {"state": "queued", "crashes": 1, "last_failure_reason": "worker_crash"}
    attempt = table(db, "SELECT state, failure_reason FROM attempts WHERE job_id = 19")
    assert attempt == [{"state": "abandoned", "failure_reason": "worker_crash"}]
    events = [r["event"] for r in table(db, "SELECT event FROM job_events WHERE job_id = 19")]
    assert events == ["added", "claimed", "reaped"]


@pytest.mark.subprocess
def test_output_shows_an_old_attempts_captured_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = copy_fixture("v6-populated", tmp_path)
    adopt(db, capsys)
    shown = cli("output", "16", "--attempt", "2", "--stream", "stdout", "--raw", db=db)
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout == "attempt-begin\nattempt-end\n"


@pytest.mark.subprocess
def test_new_attempts_write_the_new_layout_beside_adopted_output_and_prune_takes_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Adopted output keeps its folder layout (`output/<job>/<n>/`); a job run
    after adoption writes the shared-folder layout (`output/0xxx/<job>.1.*`);
    both stay readable, and prune deletes the files of both layouts."""
    db = copy_fixture("v6-populated", tmp_path)
    adopt(db, capsys)
    output = db.parent / "output"
    done = [j["id"] for j in EXPECTED["v6-populated"]["jobs"] if j["state"] == "done"]
    assert all((output / str(job)).is_dir() for job in done)
    added = cli_json("add", "--priority", "10", "--", "sh", "-c", "echo new; echo bad >&2", db=db)
    job = added.data["job_id"]
    ran = cli_json("work", "--once", "--queue", "default", db=db)
    assert ran.exit_code == 0 and (ran.data["job_id"], ran.data["job_state"]) == (job, "done")
    shared = output / f"{job // 1000}xxx"
    assert (shared / f"{job}.1.stdout").read_text() == "new\n"
    for shown_job, expected in ((1, "err\n"), (job, "bad\n")):
        shown = cli("output", str(shown_job), "--stream", "stderr", "--raw", db=db)
        assert (shown.exit_code, shown.stdout) == (0, expected), shown.stderr

    pruned = cli_json("prune", "--older-than", "0", "--state", "done", "--yes", db=db)

    assert pruned.exit_code == 0, pruned.stdout
    assert pruned.data["deleted_jobs"] == len(done) + 1
    assert [job for job in done if (output / str(job)).exists()] == [], "adopted folders stay"
    assert not shared.exists(), "the new layout's files (and their emptied folder) stay"
    assert pruned.data["skipped_paths"] == []
    assert (output / "2" / "1" / "stdout").read_text() == "out\n", "a dead job's output went"


@pytest.mark.slow
@pytest.mark.subprocess
def test_odd_rows_are_quarantined_and_reported_in_text_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hand-added rows of v2-populated.db: an unknown job state and a negative
    count would break a CHECK of the current schema; adoption goes on, and says so."""
    db = copy_fixture("v2-populated.db", tmp_path)
    result = inproc("migrate", "--db", str(db), capsys=capsys)
    assert result.exit_code == 0, result.stderr
    assert "quarantined 2 odd row(s)" in result.stdout and "jobs 8, 9" in result.stdout
    dead = table(db, "SELECT id, last_error FROM jobs WHERE id IN (8, 9) AND state = 'dead'")
    assert [row["id"] for row in dead] == [8, 9]
    assert "'exploded'" in dead[0]["last_error"] and "'boom'" in dead[0]["last_error"]
    assert "-2" in dead[1]["last_error"]
    assert (
        table(db, "SELECT count(*) AS n FROM attempts WHERE state = 'running' AND job_id = 8")[0][
            "n"
        ]
        == 0
    )
    claimed = inproc("work", "--db", str(db), "--json", "--drain", capsys=capsys)
    assert claimed.exit_code == 0, claimed.stdout
    assert table(db, "SELECT state FROM jobs WHERE id = 9") == [{"state": "dead"}]
