"""Revision 0009_steering going down and up again, on SQLite and PostgreSQL:
the downgrade refuses (CONFLICT, nothing changed) while an unfinished job
uses what 0008 cannot hold (`--requeue-exit`, `--signal-before-timeout`, a
suspended running job, a request not yet settled); once they ended, it turns
a requeued attempt into a failed one and its reason into `process_exit`, the
exit code kept, and the upgrade brings the table and columns back."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spoolctl.db.revision import HEAD_REVISION, KNOWN_REVISIONS
from tests.helpers import Db, add_job, execute, inproc, rows, run_as_worker

pytestmark = pytest.mark.both_backends

BELOW = KNOWN_REVISIONS[KNOWN_REVISIONS.index("0009_steering") - 1]


def run(capsys: Any, db: Db, verb: str, *args: str) -> Any:
    return inproc(verb, "--db", str(db), "--json", *args, capsys=capsys)


def revision_of(db: Db) -> str:
    return str(rows(db, "SELECT version_num FROM alembic_version")[0][0])


def down(capsys: Any, db: Db) -> Any:
    return run(capsys, db, "migrate", "--downgrade", BELOW, "--yes", "--no-backup")


def snapshot(db: Db) -> list[Any]:
    return [
        tuple(r)
        for table in ("jobs", "attempts", "control_requests", "job_events")
        for r in rows(db, f"SELECT * FROM {table} ORDER BY id")
    ]


def refused_for(capsys: Any, db: Db, job_id: int) -> None:
    before = snapshot(db)
    refused = down(capsys, db)
    assert refused.exit_code == 5, refused.stdout
    error = refused.envelope["errors"][0]
    assert error["code"] == "CONFLICT"
    assert error["detail"]["jobs"] == [job_id]
    assert revision_of(db) == HEAD_REVISION
    assert snapshot(db) == before


def test_downgrade_refuses_while_an_unfinished_job_uses_steering(db: Db, capsys: Any) -> None:
    later = f"{time.time() + 3600:.0f}"
    requeuing = run(capsys, db, "add", "--at", later, "--requeue-exit", "75", "--", "true")
    refused_for(capsys, db, requeuing.envelope["data"]["job_id"])
    assert run(capsys, db, "cancel", str(requeuing.envelope["data"]["job_id"])).exit_code == 0
    warned = run(
        capsys, db, "add", "--at", later, "--signal-before-timeout", "USR1@1m", "--", "true"
    )
    refused_for(capsys, db, warned.envelope["data"]["job_id"])
    assert run(capsys, db, "cancel", str(warned.envelope["data"]["job_id"])).exit_code == 0
    suspended = add_job(db, "sleep", "100")
    run_as_worker(db, suspended, suspended=True)
    refused_for(capsys, db, suspended)
    running = add_job(db, "sleep", "100")
    execute(db, "UPDATE jobs SET locked_by = 'w2' WHERE id = ?", (suspended,))
    run_as_worker(db, running, suspended=False)
    assert run(capsys, db, "cancel", str(suspended), "--running", "--yes").exit_code == 0
    asked = run(capsys, db, "signal", str(running), "--no-wait")
    assert asked.exit_code == 0, asked.stdout
    refused_for(capsys, db, running)
    assert run(capsys, db, "cancel", str(running), "--running", "--yes").exit_code == 0
    went = down(capsys, db)
    assert went.exit_code == 0, went.stdout
    assert revision_of(db) == BELOW
    up = run(capsys, db, "migrate", "--no-backup")
    assert up.exit_code == 0 and revision_of(db) == HEAD_REVISION
    assert rows(db, "SELECT count(*) FROM control_requests")[0][0] == 0


def test_a_requeued_attempt_goes_down_as_failed_with_its_exit_code(db: Db, capsys: Any) -> None:
    job_id = add_job(db, "true")
    now = time.time()
    execute(
        db,
        "UPDATE jobs SET state = 'done', finished_at = ?, last_failure_reason = 'requeue_exit', "
        "requeues = 1 WHERE id = ?",
        (now, job_id),
    )
    execute(
        db,
        "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, started_at, "
        "finished_at, exit_code, failure_reason, stdout_path, stderr_path) "
        "VALUES (?, 1, 'w1', 1, 'requeued', ?, ?, 75, 'requeue_exit', 'o', 'e')",
        (job_id, now, now),
    )
    went = down(capsys, db)
    assert went.exit_code == 0, went.stdout
    assert [
        tuple(r) for r in rows(db, "SELECT state, exit_code, failure_reason FROM attempts")
    ] == [("failed", 75, "process_exit")]
    assert rows(db, "SELECT last_failure_reason FROM jobs")[0][0] == "process_exit"
    with pytest.raises(Exception, match=r"(?i)check"):  # the narrowed CHECK holds again
        execute(db, "UPDATE attempts SET state = 'requeued'")
    up = run(capsys, db, "migrate", "--no-backup")
    assert up.exit_code == 0 and revision_of(db) == HEAD_REVISION
    assert rows(db, "SELECT requeues FROM jobs")[0][0] == 0
