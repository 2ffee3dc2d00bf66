"""Revision 0006_schedules going down and up again, on SQLite and PostgreSQL:
the downgrade refuses while a schedule exists (SAFETY_BLOCK) unless given
--drop-schedules, and while a job waits for a parent's any end (CONFLICT),
changing nothing either time; after it, the jobs a schedule made stay."""

from __future__ import annotations

from typing import Any

import pytest

from spoolctl.db.revision import DROP_SCHEDULES_FLAG, HEAD_REVISION, KNOWN_REVISIONS
from tests.helpers import Db, inproc, rows

pytestmark = pytest.mark.both_backends

BELOW = KNOWN_REVISIONS[KNOWN_REVISIONS.index("0006_schedules") - 1]


def run(capsys: Any, db: Db, verb: str, *args: str) -> Any:
    return inproc(verb, "--db", str(db), "--json", *args, capsys=capsys)


def revision_of(db: Db) -> str:
    return str(rows(db, "SELECT version_num FROM alembic_version")[0][0])


def down(capsys: Any, db: Db, *more: str) -> Any:
    return run(capsys, db, "migrate", "--downgrade", BELOW, "--yes", "--no-backup", *more)


def test_downgrade_refuses_while_schedules_exist_unless_told_to_drop_them(
    db: Db, capsys: Any
) -> None:
    assert run(capsys, db, "schedule add", "nightly", "--every", "1h", "--", "true").exit_code == 0
    ran = run(capsys, db, "schedule run", "nightly")
    job_id = ran.envelope["data"]["job_id"]
    refused = down(capsys, db)
    assert refused.exit_code == 2, refused.stdout
    found = refused.envelope["errors"][0]
    assert found["code"] == "SAFETY_BLOCK" and DROP_SCHEDULES_FLAG in found["message"]
    assert found["detail"]["schedules"] == ["nightly"]
    assert revision_of(db) == HEAD_REVISION
    assert rows(db, "SELECT name FROM schedules")[0][0] == "nightly"
    went = down(capsys, db, DROP_SCHEDULES_FLAG)
    assert went.exit_code == 0, went.stdout
    assert revision_of(db) == BELOW
    assert [r[0] for r in rows(db, "SELECT id FROM jobs")] == [job_id]
    up = run(capsys, db, "migrate", "--no-backup")
    assert up.exit_code == 0 and revision_of(db) == HEAD_REVISION
    assert rows(db, "SELECT count(*) FROM schedules")[0][0] == 0


def test_downgrade_refuses_while_a_job_waits_for_any_end(db: Db, capsys: Any) -> None:
    assert run(capsys, db, "add", "--", "true").exit_code == 0
    child = run(capsys, db, "add", "--after-job-any", "1", "--", "true")
    assert child.envelope["data"]["state"] == "waiting"
    refused = down(capsys, db)
    assert refused.envelope["errors"][0]["code"] == "CONFLICT"
    assert refused.envelope["errors"][0]["detail"]["waiting_jobs"] == [2]
    assert revision_of(db) == HEAD_REVISION
    assert run(capsys, db, "cancel", "2").exit_code == 0
    assert down(capsys, db).exit_code == 0
    assert revision_of(db) == BELOW
    assert rows(db, "SELECT count(*) FROM job_dependencies")[0][0] == 0


def test_drop_schedules_only_applies_to_a_downgrade(db: Db, capsys: Any) -> None:
    for extra in (["--to", "head"], []):
        refused = run(capsys, db, "migrate", *extra, DROP_SCHEDULES_FLAG)
        assert refused.envelope["errors"][0]["code"] == "INVALID_INPUT"
