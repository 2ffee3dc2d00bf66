"""A job an attempt of which still holds a device (an orphan not confirmed
gone keeps its hold, docs/migrations.md) keeps its rows: `prune` leaves it
in place and names it in held_jobs until the hold is released, `remove`
refuses it (CONFLICT naming the devices, nothing changed), and `retry` runs
it again while the old attempt keeps its hold. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import Db, execute, inproc, is_postgres, rows
from tests.unit.test_resources_migration import hold_a_device, later_job

pytestmark = pytest.mark.both_backends

OTHER = "GPU-5f1a3c9e-0000-4000-8000-000000000002"


def run(capsys: Any, db: Db, verb: str, *args: str) -> Any:
    return inproc(verb, "--db", str(db), "--json", *args, capsys=capsys)


def prune(capsys: Any, db: Db, *args: str) -> dict[str, Any]:
    pruned = run(capsys, db, "prune", "--older-than", "0", "--state", "done,canceled", *args)
    assert pruned.exit_code == 0, pruned.stdout
    return dict(pruned.envelope["data"])


def canceled_holding(capsys: Any, db: Db, uuid: str) -> tuple[int, int]:
    """A canceled job whose canceled attempt's orphan still holds `uuid`."""
    job_id = later_job(capsys, db)
    assert run(capsys, db, "cancel", str(job_id)).exit_code == 0
    return job_id, hold_a_device(db, job_id, uuid=uuid)


def holds(db: Db) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in rows(db, "SELECT device_uuid, attempt_id, job_id, units FROM device_holds")
    ]


def dangling(db: Db) -> list[Any]:
    if is_postgres(db):
        return []  # PostgreSQL checks every reference as it is written
    return list(rows(db, "PRAGMA foreign_key_check"))


def test_prune_keeps_a_job_whose_attempt_holds_a_device_until_it_is_released(
    db: Db, capsys: Any
) -> None:
    held, attempt_id = canceled_holding(capsys, db, OTHER)
    plain = later_job(capsys, db)
    assert run(capsys, db, "cancel", str(plain)).exit_code == 0
    before = holds(db)
    looked = prune(capsys, db, "--dry-run")
    assert (looked["matched"], looked["deleted_jobs"], looked["held_jobs"]) == (1, 1, [held])
    pruned = prune(capsys, db, "--yes")
    assert (pruned["deleted_jobs"], pruned["held_jobs"]) == (1, [held])
    assert [r[0] for r in rows(db, "SELECT id FROM jobs")] == [held]
    assert [r[0] for r in rows(db, "SELECT id FROM attempts")] == [attempt_id]
    assert holds(db) == before and dangling(db) == []
    text = inproc(
        "prune", "--db", str(db), "--older-than", "0", "--state", "canceled", "--yes", capsys=capsys
    )
    assert f"kept job(s) {held}: an attempt still holds a device" in text.stdout, text.stdout
    execute(db, "DELETE FROM device_holds")  # the sweep found its processes gone
    execute(db, "UPDATE devices SET held = 0")
    released = prune(capsys, db, "--yes")
    assert (released["deleted_jobs"], released["held_jobs"]) == (1, [])
    assert rows(db, "SELECT id FROM jobs") == [] and dangling(db) == []


def test_remove_refuses_a_job_whose_old_attempt_holds_a_device(db: Db, capsys: Any) -> None:
    job_id = later_job(capsys, db)
    hold_a_device(db, job_id)  # a retried job: queued, its first attempt's orphan lingers
    before = {t: rows(db, f"SELECT * FROM {t} ORDER BY 1") for t in ("jobs", "attempts")}
    before_holds = holds(db)
    refused = run(capsys, db, "remove", str(job_id))
    assert refused.exit_code == 5, refused.stdout
    error = refused.envelope["errors"][0]
    assert error["code"] == "CONFLICT"
    assert error["detail"]["devices"] == [before_holds[0][0]]
    assert before_holds[0][0] in error["message"] and "still holds" in error["message"]
    assert {t: rows(db, f"SELECT * FROM {t} ORDER BY 1") for t in before} == before
    assert holds(db) == before_holds


def test_retry_runs_the_job_again_while_the_old_attempt_keeps_its_hold(db: Db, capsys: Any) -> None:
    job_id, _ = canceled_holding(capsys, db, OTHER)
    before = holds(db)
    retried = run(capsys, db, "retry", str(job_id))
    assert retried.exit_code == 0, retried.stdout
    assert rows(db, "SELECT state FROM jobs WHERE id = ?", (job_id,))[0][0] == "queued"
    assert holds(db) == before
