"""Rows edited by hand, damaged or hostile: they are reported, never followed,
and never a traceback.

- an attempt whose output path names a file outside the spool (directly, by
  `..`, or through a symlink): `output`, `feedback` and `prune` never read,
  follow or delete it;
- a command (argv) that is not a JSON list of strings, an env that is not an
  object of strings: never executed, quarantined to `dead` on claim;
- a state no spoolctl writes (CHECK constraints bypassed), a timeout or a
  priority that is not a number: every verb still answers with an envelope and
  a documented exit code.

On SQLite and on PostgreSQL, except the damage PostgreSQL cannot hold (its
CHECK constraints cannot be bypassed, its columns keep their types).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from spoolctl.errors import ERROR_CODES
from tests.helpers import (
    Db,
    add,
    attempts_of,
    cli,
    cli_json,
    execute,
    is_postgres,
    job,
    rows,
)
from tests.populated import Populated, populate, run_quiet

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_backends, pytest.mark.subprocess]
SECRET = "TOP-SECRET-CONTENT"


def tamper(db: Db, sql: str, params: tuple[object, ...] = ()) -> None:
    """Write behind spoolctl's back, past the CHECK constraints of revision 0002
    (on PostgreSQL within them: it enforces every constraint)."""
    if is_postgres(db):
        execute(db, sql, params)
        return
    conn = sqlite3.connect(db, timeout=10)
    try:
        conn.execute("PRAGMA ignore_check_constraints=ON")
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


@pytest.fixture
def q(db: Db) -> Populated:
    return populate(db)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def point_outside(q: Populated, secret: Path) -> tuple[Path, Path]:
    """The done job's stdout row names the secret by a `..` path; its stderr
    file is replaced by a symlink to the secret. Returns both row paths."""
    (attempt,) = attempts_of(q.db, q.done)
    output = q.spool / "output"
    dotdot = output / os.path.relpath(secret, output)  # ../../outside/secret.txt
    link = Path(attempt["stderr_path"])
    link.unlink()
    link.symlink_to(secret)
    tamper(q.db, "UPDATE attempts SET stdout_path = ? WHERE id = ?", (str(dotdot), attempt["id"]))
    return dotdot, link


def no_leak(*outputs: str) -> None:
    for text in outputs:
        assert SECRET not in text
        assert "Traceback" not in text


def test_output_and_feedback_never_read_a_file_outside_the_spool(
    q: Populated, secret: Path
) -> None:
    dotdot, link = point_outside(q, secret)

    shown = cli_json("output", str(q.done), db=q.db)
    fed = cli_json("feedback", str(q.done), db=q.db)
    raw = cli("output", str(q.done), "--raw", db=q.db)
    text = cli("output", str(q.done), db=q.db)

    no_leak(shown.stdout, fed.stdout, raw.stdout, raw.stderr, text.stdout, text.stderr)
    for result in (shown, fed):
        assert result.exit_code == 0
        streams = result.data["streams"]
        assert (streams["stdout"]["path"], streams["stderr"]["path"]) == (str(dotdot), str(link))
        if is_postgres(q.db):  # the copy stored in the database is read, never a file
            assert [s["source"] for s in streams.values()] == ["database"] * 2
            assert result.envelope["warnings"] == []
            continue
        assert streams["stdout"]["missing"] and streams["stderr"]["missing"]
        codes = [w["code"] for w in result.envelope["warnings"]]
        assert codes == ["OUTPUT_PATH_REFUSED"] * 2
    if is_postgres(q.db):
        assert (raw.exit_code, raw.stdout) == (0, "hello\n")
    else:
        assert raw.exit_code == 0 and "outside the spool" in raw.stderr
    assert secret.read_text() == SECRET


def test_prune_never_deletes_or_follows_a_path_outside_the_spool(
    q: Populated, secret: Path
) -> None:
    _, link = point_outside(q, secret)

    result = cli_json("prune", "--older-than", "0s", "--state", "done", "--yes", db=q.db)

    assert result.exit_code == 0, result.stdout
    assert rows(q.db, "SELECT id FROM jobs WHERE id = ?", (q.done,)) == []
    assert secret.read_text() == SECRET, "prune followed a row (or a symlink) out of the spool"
    assert link.is_symlink(), "a symlink inside the spool was skipped, not followed"


DAMAGED_ARGV = ['{"not": "a list"}', "not json", "[]", '["sh", 5]', "null"]


def test_a_damaged_command_or_env_is_never_executed(q: Populated, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    ids = [add(q.db, "touch", str(marker)) for _ in range(len(DAMAGED_ARGV) + 2)]
    for job_id, raw in zip(ids, DAMAGED_ARGV, strict=False):
        tamper(q.db, "UPDATE jobs SET argv = ? WHERE id = ?", (raw, job_id))
    tamper(q.db, "UPDATE jobs SET env = '[1, 2]' WHERE id = ?", (ids[-2],))
    tamper(q.db, "UPDATE jobs SET env = '{\"K\": 5}' WHERE id = ?", (ids[-1],))

    drained = cli_json("work", "--drain", db=q.db)

    assert drained.exit_code == 0 and drained.data["executed"] == 0, drained.stdout
    assert not marker.exists(), "a damaged row was executed"
    for job_id in ids:
        row = job(q.db, job_id)
        assert row["state"] == "dead" and row["last_error"].startswith("damaged row")
        assert attempts_of(q.db, job_id) == []


HOSTILE = {
    "argv": "UPDATE jobs SET argv = 'not json' WHERE id = :id",
    "tags": "UPDATE jobs SET tags = '[\"x\"]' WHERE id = :id",
    "event": "UPDATE job_events SET event = 'teleported', detail = '{bad' WHERE job_id = :id",
    "env": "UPDATE jobs SET env = '\"PATH=/x\"' WHERE id = :id",
    "paths": "UPDATE attempts SET stdout_path = '', stderr_path = '/dev/zero' WHERE job_id = :id",
}
HOSTILE_SQLITE = {
    "state": "UPDATE jobs SET state = 'zombie' WHERE id = :id",
    "timeout": "UPDATE jobs SET timeout_seconds = 'soon' WHERE id = :id",
    "priority": "UPDATE jobs SET priority = 'high' WHERE id = :id",
    "attempt_state": "UPDATE attempts SET state = 'lost' WHERE job_id = :id",
    "worker": "UPDATE workers SET state = 'sleepy', heartbeat_at = 'later'",
    "nulls": "UPDATE jobs SET state = 'running', locked_by = NULL, heartbeat_at = NULL, "
    "started_at = NULL, next_run_at = 'x' WHERE id = :id",
    "times": "UPDATE jobs SET created_at = 1e308, finished_at = -1e308, "
    "priority = 9223372036854775807 WHERE id = :id",
}
"""Damage only SQLite can hold: a bypassed CHECK, text in a number column, a
number beyond PostgreSQL's INTEGER."""


def verbs(job_id: int) -> list[list[str]]:
    jid = str(job_id)
    return [
        ["list"],
        ["list", "--state", "queued"],
        ["status"],
        ["show", jid],
        ["feedback", jid],
        ["output", jid],
        ["wait", jid, "--timeout", "0"],
        ["events"],
        ["workers", "--all"],
        ["cancel", jid],
        ["retry", jid],
        ["prune", "--dry-run", "--older-than", "0s"],
    ]


@pytest.mark.parametrize("damage", sorted(HOSTILE))
def test_every_verb_reports_a_hostile_row_without_a_traceback(q: Populated, damage: str) -> None:
    every_verb_reports(q, HOSTILE, damage)


@pytest.mark.sqlite_only("PostgreSQL cannot hold this damage")
@pytest.mark.parametrize("damage", sorted(HOSTILE_SQLITE))
def test_every_verb_reports_a_hostile_row_only_sqlite_can_hold(q: Populated, damage: str) -> None:
    every_verb_reports(q, HOSTILE_SQLITE, damage)


def every_verb_reports(q: Populated, hostile: Mapping[str, str], damage: str) -> None:
    sql = hostile[damage].replace(":id", str(q.done))
    tamper(q.db, sql)
    for args in verbs(q.done):
        text = run_quiet(*q.args(*args))
        assert "Traceback" not in text.stdout + text.stderr, (args, text.stderr)
        assert "INTERNAL" not in text.stderr, (args, text.stderr)
        result = q.json(*args)
        assert text.exit_code == result.exit_code, args
        assert "Traceback" not in result.stdout + result.stderr, (args, result.stderr)
        envelope = result.envelope
        if envelope["ok"]:
            assert result.exit_code in (0, 1, 4), (args, result.stdout)  # wait: not done / timeout
        else:
            (error,) = envelope["errors"]
            assert error["code"] != "INTERNAL", (args, error)
            assert ERROR_CODES[error["code"]] == result.exit_code


@pytest.mark.sqlite_only("PostgreSQL keeps no text in an INTEGER column")
def test_a_timeout_that_is_not_a_number_is_quarantined_not_fatal_to_workers(
    q: Populated,
) -> None:
    """SQLite keeps text in an INTEGER column: such a job once crashed every
    worker that claimed it (each then reaped and claimed again by the next)."""
    bad = add(q.db, "true")
    fine = add(q.db, "true")
    tamper(q.db, "UPDATE jobs SET timeout_seconds = 'soon' WHERE id = ?", (bad,))

    result = cli_json("work", "--drain", db=q.db)

    assert result.exit_code == 0, result.stdout + result.stderr
    assert job(q.db, fine)["state"] == "done"
    assert job(q.db, bad)["state"] == "dead"
    assert job(q.db, bad)["last_error"].startswith("damaged row")
    assert attempts_of(q.db, bad) == []


@pytest.mark.parametrize("timeout", [-5, 0, 2**62])
def test_a_negative_zero_or_huge_timeout_never_hangs_or_crashes_a_worker(
    q: Populated, timeout: int
) -> None:
    job_id = add(q.db, "true")
    tamper(
        q.db, "UPDATE jobs SET timeout_seconds = ?, max_retries = 0 WHERE id = ?", (timeout, job_id)
    )
    started = time.monotonic()

    result = cli_json("work", "--drain", db=q.db)

    assert result.exit_code == 0, result.stdout + result.stderr
    assert time.monotonic() - started < 20
    assert job(q.db, job_id)["state"] in ("done", "dead")
    if not is_postgres(q.db):
        assert os.path.exists(q.db)
