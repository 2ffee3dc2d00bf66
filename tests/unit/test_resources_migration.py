"""Revision 0010_resources going down and up again, on SQLite and PostgreSQL:
the downgrade refuses (SAFETY_BLOCK, nothing changed) while a device is held
or an unfinished job asks for a weight or GPUs, unless given
--drop-resources, which then really drops the holds (before the tables they
reference) and the requests; a finished job's request does not block, and
every row a queue at 0009 holds survives the way down and up again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spoolctl.db.revision import DROP_RESOURCES_FLAG, HEAD_REVISION, KNOWN_REVISIONS
from spoolctl.db.tables import attempts, jobs, workers
from tests.helpers import Db, execute, inproc, is_postgres, rows, run_as_worker

pytestmark = pytest.mark.both_backends

BELOW = KNOWN_REVISIONS[KNOWN_REVISIONS.index("0010_resources") - 1]
NEW_COLUMNS = {
    "jobs": ("weight", "gpus", "gpu_share", "gpu_memory_bytes", "gpu_model"),
    "attempts": ("host", "devices"),
    "workers": ("inventory",),
}
NEW_TABLES = ("devices", "device_holds")
UUID = "GPU-5f1a3c9e-0000-4000-8000-000000000001"
WHOLE = 720720
"""A whole device's units (`tables.DEVICE_UNITS`)."""


def run(capsys: Any, db: Db, verb: str, *args: str) -> Any:
    return inproc(verb, "--db", str(db), "--json", *args, capsys=capsys)


def revision_of(db: Db) -> str:
    return str(rows(db, "SELECT version_num FROM alembic_version")[0][0])


def down(capsys: Any, db: Db, *more: str) -> Any:
    return run(capsys, db, "migrate", "--downgrade", BELOW, "--yes", "--no-backup", *more)


def table_names(db: Db) -> set[str]:
    if is_postgres(db):
        found = rows(db, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    else:
        found = rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return {str(r[0]) for r in found}


def old_columns(table: Any) -> str:
    """The table's columns at 0009 (what a downgrade keeps)."""
    kept = [c.name for c in table.columns if c.name not in NEW_COLUMNS.get(table.name, ())]
    return ", ".join(f'"{name}"' for name in kept)


def snapshot_0009(db: Db) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables 0010 adds columns to, in 0009's columns."""
    found = {
        table.name: [
            tuple(r) for r in rows(db, f"SELECT {old_columns(table)} FROM {table.name} ORDER BY 1")
        ]
        for table in (jobs, attempts, workers)
    }
    found["job_events"] = [tuple(r) for r in rows(db, "SELECT * FROM job_events ORDER BY id")]
    return found


def snapshot(db: Db) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: [tuple(r) for r in rows(db, f"SELECT * FROM {table} ORDER BY 1")]
        for table in ("jobs", "attempts", "workers", "job_events", *NEW_TABLES)
    }


def later_job(capsys: Any, db: Db, *args: str) -> int:
    added = run(capsys, db, "add", "--at", f"{time.time() + 3600:.0f}", *args, "--", "true")
    assert added.exit_code == 0, added.stdout
    return int(added.envelope["data"]["job_id"])


def hold_a_device(
    db: Db, job_id: int, attempt_state: str = "canceled", uuid: str = UUID, attempt_no: int = 1
) -> int:
    """The job's attempt holds a whole device, as a claim on host h1 leaves it
    (a canceled one: an orphan not yet confirmed gone keeps its hold)."""
    now = time.time()
    ended = None if attempt_state == "running" else now
    execute(
        db,
        "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, started_at, "
        "finished_at, stdout_path, stderr_path, host, devices) "
        "VALUES (?, ?, 'w1', 1, ?, ?, ?, 'o', 'e', 'h1', ?)",
        (job_id, attempt_no, attempt_state, now, ended, uuid),
    )
    attempt_id = int(
        rows(
            db, "SELECT id FROM attempts WHERE job_id = ? AND attempt_no = ?", (job_id, attempt_no)
        )[0][0]
    )
    execute(
        db,
        "INSERT INTO devices (uuid, host, idx, model, memory_bytes, held, seen_at) "
        "VALUES (?, 'h1', 0, 'NVIDIA H100 80GB HBM3', 85000000000, ?, ?)",
        (uuid, WHOLE, now),
    )
    execute(
        db,
        "INSERT INTO device_holds (device_uuid, attempt_id, job_id, units, worker_id, held_at) "
        "VALUES (?, ?, ?, ?, 'w1', ?)",
        (uuid, attempt_id, job_id, WHOLE, now),
    )
    return attempt_id


def refused_for(capsys: Any, db: Db, job_ids: list[int]) -> None:
    before = snapshot(db)
    refused = down(capsys, db)
    assert refused.exit_code == 2, refused.stdout
    error = refused.envelope["errors"][0]
    assert error["code"] == "SAFETY_BLOCK"
    assert DROP_RESOURCES_FLAG in error["message"]
    assert error["detail"]["flag"] == DROP_RESOURCES_FLAG
    assert error["detail"]["jobs"] == job_ids
    assert revision_of(db) == HEAD_REVISION
    assert snapshot(db) == before


def test_downgrade_refuses_while_held_or_asked_for_unless_told_to_drop_them(
    db: Db, capsys: Any
) -> None:
    asking = later_job(capsys, db)
    execute(db, "UPDATE jobs SET gpus = 1, gpu_share = 2 WHERE id = ?", (asking,))
    refused_for(capsys, db, [asking])
    weighted = later_job(capsys, db)
    execute(db, "UPDATE jobs SET weight = 4 WHERE id = ?", (weighted,))
    refused_for(capsys, db, [asking, weighted])
    assert run(capsys, db, "cancel", str(asking)).exit_code == 0
    assert run(capsys, db, "cancel", str(weighted)).exit_code == 0
    orphan = later_job(capsys, db)
    assert run(capsys, db, "cancel", str(orphan)).exit_code == 0
    held_by = hold_a_device(db, orphan)
    refused_for(capsys, db, [orphan])
    running = later_job(capsys, db)
    run_as_worker(db, running, suspended=False)
    execute(db, "UPDATE jobs SET gpus = 1 WHERE id = ?", (running,))
    refused_for(capsys, db, [orphan, running])
    plain = later_job(capsys, db, "--memory", "1G")
    went = down(capsys, db, DROP_RESOURCES_FLAG)
    assert went.exit_code == 0, went.stdout
    assert revision_of(db) == BELOW
    assert not set(NEW_TABLES) & table_names(db)
    assert [tuple(r) for r in rows(db, "SELECT id, state FROM jobs ORDER BY id")] == [
        (asking, "canceled"),
        (weighted, "canceled"),
        (orphan, "canceled"),
        (running, "running"),
        (plain, "queued"),
    ]
    assert rows(db, "SELECT memory_bytes FROM jobs WHERE id = ?", (plain,))[0][0] == 1 << 30
    assert [r[0] for r in rows(db, "SELECT job_id FROM attempts WHERE id = ?", (held_by,))] == [
        orphan
    ]
    up = run(capsys, db, "migrate", "--no-backup")
    assert up.exit_code == 0 and revision_of(db) == HEAD_REVISION
    assert rows(db, "SELECT count(*) FROM device_holds")[0][0] == 0
    assert rows(db, "SELECT count(*) FROM devices")[0][0] == 0
    assert rows(db, "SELECT gpus FROM jobs WHERE id = ?", (running,))[0][0] is None


def test_every_row_survives_down_and_up_and_finished_requests_do_not_block(
    db: Db, capsys: Any
) -> None:
    done = later_job(capsys, db)
    hold_a_device(db, done, attempt_state="succeeded")
    execute(db, "DELETE FROM device_holds")
    execute(db, "UPDATE devices SET held = 0")
    execute(
        db,
        "UPDATE jobs SET state = 'done', finished_at = ?, weight = 2, gpus = 1, gpu_share = 1, "
        "gpu_memory_bytes = 40000000000, gpu_model = 'H100*' WHERE id = ?",
        (time.time(), done),
    )
    execute(
        db,
        "INSERT INTO workers (id, hostname, pid, queue, started_at, heartbeat_at, state, "
        "inventory) VALUES ('w1', 'h1', 1, 'default', 1.5, 2.5, 'stopped', ?)",
        ('{"slots": 2, "devices": []}',),
    )
    waiting = run(capsys, db, "add", "--after-job", str(later_job(capsys, db)), "--", "true")
    assert waiting.envelope["data"]["state"] == "waiting"
    later_job(capsys, db, "--memory", "2G")
    at_head = snapshot_0009(db)
    went = down(capsys, db)
    assert went.exit_code == 0, went.stdout
    assert revision_of(db) == BELOW
    assert snapshot_0009(db) == at_head
    up = run(capsys, db, "migrate", "--no-backup")
    assert up.exit_code == 0 and revision_of(db) == HEAD_REVISION
    assert snapshot_0009(db) == at_head
    for table, columns in NEW_COLUMNS.items():
        nulls = rows(db, f"SELECT {', '.join(columns)} FROM {table}")
        assert nulls and all(value is None for r in nulls for value in r), table
    top = max(r[0] for r in at_head["jobs"])
    assert later_job(capsys, db) == top + 1


def test_drop_resources_only_applies_to_a_downgrade(db: Db, capsys: Any) -> None:
    assert run(capsys, db, "migrate").exit_code == 0
    for extra in (["--to", "head"], []):
        refused = run(capsys, db, "migrate", *extra, DROP_RESOURCES_FLAG)
        error = refused.envelope["errors"][0]
        assert error["code"] == "INVALID_INPUT" and DROP_RESOURCES_FLAG in error["message"]
    assert revision_of(db) == HEAD_REVISION


def test_the_offline_downgrade_deletes_the_holds_before_dropping_their_tables(
    db: Db, capsys: Any
) -> None:
    assert run(capsys, db, "migrate").exit_code == 0
    sql = run(capsys, db, "migrate", "--sql", "--downgrade", BELOW).envelope["data"]["sql"]
    steps = [
        sql.index(step)
        for step in (
            "DELETE FROM device_holds",
            "DROP TABLE device_holds",
            "DROP TABLE devices",
            f"UPDATE alembic_version SET version_num='{BELOW}'",
        )
    ]
    assert steps == sorted(steps), sql
    assert revision_of(db) == HEAD_REVISION
