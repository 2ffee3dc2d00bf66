"""Revision scripts: pytest-alembic's four checks, plus upgrades and downgrades
that carry data, so every row (and every AUTOINCREMENT high-water mark)
is shown to survive each released revision."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from pytest_alembic.tests import (  # noqa: F401 - collected as tests of this module
    test_model_definitions_match_ddl,
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)
from sqlalchemy import Engine

from spoolctl.db import revision
from spoolctl.db.backends.sqlite import ensure_spool, make_engine
from spoolctl.db.migration import migrate_file
from spoolctl.db.tables import metadata
from tests.helpers import driver_of

TABLES = ("jobs", "attempts", "workers", "job_events")


@pytest.fixture
def alembic_config() -> Config:
    """The very Config the CLI builds (no ini file)."""
    return revision.alembic_config()


@pytest.fixture
def alembic_engine(tmp_path: Path) -> Iterator[Engine]:
    """A temp-file engine from spoolctl's own factory, set up as `migrate` uses it."""
    path = tmp_path / "alembic.db"
    ensure_spool(path)  # engines never create the file (mode=rw)
    engine = make_engine(path, write=True, busy_timeout_s=5, foreign_keys=False)
    yield engine
    engine.dispose()


def test_head_constants_match_the_scripts() -> None:
    scripts = ScriptDirectory.from_config(revision.alembic_config())
    assert scripts.get_current_head() == revision.HEAD_REVISION
    shipped = [s.revision for s in reversed(list(scripts.walk_revisions()))]
    assert list(revision.KNOWN_REVISIONS) == shipped


def shape(db: Path) -> dict[str, Any]:
    """Everything that defines each table, independent of how its DDL was spelled."""
    conn = sqlite3.connect(db)
    try:
        found: dict[str, Any] = {}
        for table in (t.name for t in metadata.sorted_tables):
            sql = conn.execute(
                "SELECT sql FROM sqlite_master WHERE type='table' AND name=?", (table,)
            ).fetchone()[0]
            found[table] = {
                "columns": conn.execute(f"PRAGMA table_info({table})").fetchall(),
                "foreign_keys": conn.execute(f"PRAGMA foreign_key_list({table})").fetchall(),
                "checks": sorted(re.findall(r"CONSTRAINT (\w+) CHECK \((.*)\)", sql)),
                "autoincrement": "AUTOINCREMENT" in sql,
                "indexes": sorted(
                    " ".join(row[0].split())
                    for row in conn.execute(
                        "SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name=? "
                        "AND sql IS NOT NULL",
                        (table,),
                    )
                ),
                "unique": sorted(
                    row[1] for row in conn.execute(f"PRAGMA index_list({table})") if row[3] == "u"
                ),
            }
        return found
    finally:
        conn.close()


def test_migrated_schema_matches_the_models_exactly(tmp_path: Path) -> None:
    """Stricter than autogenerate: CHECKs, partial and DESC indexes, AUTOINCREMENT."""
    migrated = tmp_path / "migrated.db"
    migrate_file(driver_of(migrated))
    modeled = tmp_path / "modeled.db"
    ensure_spool(modeled)
    engine = make_engine(modeled, write=True, busy_timeout_s=5)
    metadata.create_all(engine)
    engine.dispose()
    assert shape(migrated) == shape(modeled)
    assert any("WHERE idempotency_key IS NOT NULL" in i for i in shape(migrated)["jobs"]["indexes"])


def populate(db: Path) -> None:
    """Rows in every table at revision 0001, with the newest ids deleted (as prune does)."""
    conn = sqlite3.connect(db)
    with conn:
        for i in range(1, 7):
            conn.execute(
                "INSERT INTO jobs (id, argv, state, next_run_at, created_at, idempotency_key, "
                "tags, env, note, last_failure_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    i,
                    f'["echo","{i}"]',
                    ("queued", "done", "dead")[i % 3],
                    10.0 + i,
                    1.0 + i,
                    f"key-{i}",
                    '{"t":"v"}',
                    '{"K":"V"}',
                    f"note {i}",
                    "process_exit",
                ),
            )
            conn.execute(
                "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, "
                "started_at, failure_reason, stdout_path, stderr_path) "
                "VALUES (?, 1, 'w', 42, 'failed', ?, 'process_exit', ?, ?)",
                (i, 2.0 + i, f"/s/output/{i}/1/stdout", f"/s/output/{i}/1/stderr"),
            )
            conn.execute(
                "INSERT INTO job_events (job_id, at, event, detail) VALUES (?, ?, 'added', ?)",
                (i, 1.0 + i, f'{{"n":{i}}}'),
            )
        conn.execute(
            "INSERT INTO workers (id, hostname, pid, queue, started_at, heartbeat_at, state) "
            "VALUES ('w', 'h', 42, 'default', 1, 2, 'stopped')"
        )
        for table in ("job_events", "attempts"):
            conn.execute(f"DELETE FROM {table} WHERE job_id = 6")
        conn.execute("DELETE FROM jobs WHERE id = 6")
    conn.close()


JOBS_0005 = (
    "id, argv, state, queue, priority, next_run_at, created_at, started_at, "
    "finished_at, attempts, crashes, max_retries, max_crashes, timeout_seconds, "
    "idempotency_key, tags, note, cwd, env, locked_by, locked_pid, locked_at, "
    "heartbeat_at, last_exit_code, last_error, last_failure_reason"
)
ATTEMPTS_0005 = (
    "id, job_id, attempt_no, worker_id, worker_pid, state, started_at, finished_at, "
    "exit_code, error, failure_reason, stdout_path, stderr_path, job_pid, job_pgid, "
    "job_started_at"
)
WORKERS_0001 = (
    "id, hostname, pid, process_started_at, boot_id, queue, slots, concurrency, "
    "started_at, heartbeat_at, stopped_at, state, jobs_run"
)
EVERY_REVISIONS_COLUMNS = {
    "job_events": "id, job_id, at, event, worker_id, detail",
    "jobs": JOBS_0005,
    "attempts": ATTEMPTS_0005,
    "workers": WORKERS_0001,
}
"""Columns compared across revisions where a later one adds some (0005's
job_events.seq stays null on SQLite: `unpositioned` checks it; 0007's
cgroup, usage and limit columns and 0008's workers.pid_space start null)."""


def contents(db: Path) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    try:
        found: dict[str, Any] = {
            t: conn.execute(
                f"SELECT {EVERY_REVISIONS_COLUMNS.get(t, '*')} FROM {t} ORDER BY 1"
            ).fetchall()
            for t in TABLES
        }
        found["sqlite_sequence"] = sorted(conn.execute("SELECT * FROM sqlite_sequence"))
        found["fk_violations"] = conn.execute("PRAGMA foreign_key_check").fetchall()
        return found
    finally:
        conn.close()


def unpositioned(db: Path) -> bool:
    """Every event of an SQLite queue at head has seq null (there are some)."""
    conn = sqlite3.connect(db)
    try:
        seqs = [row[0] for row in conn.execute("SELECT seq FROM job_events")]
    finally:
        conn.close()
    return bool(seqs) and all(seq is None for seq in seqs)


def revision_of(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def populated_0001(tmp_path: Path) -> Path:
    db = tmp_path / "queue.db"
    migrate_file(driver_of(db), "0001_initial")
    populate(db)
    return db


def test_every_row_survives_the_upgrade_from_0001(populated_0001: Path) -> None:
    before = contents(populated_0001)
    assert ("jobs", 6) in before["sqlite_sequence"]
    result = migrate_file(driver_of(populated_0001), backup=False)
    assert result.applied == list(revision.KNOWN_REVISIONS[1:])
    assert revision_of(populated_0001) == revision.HEAD_REVISION
    assert contents(populated_0001) == before
    assert unpositioned(populated_0001), "SQLite reads its ledger by id: seq stays null"
    conn = sqlite3.connect(populated_0001)
    with conn:
        cursor = conn.execute(
            "INSERT INTO jobs (argv, state, next_run_at, created_at) "
            "VALUES ('[\"x\"]', 'queued', 1, 1)"
        )
    assert cursor.lastrowid == 7, "a deleted id must never be handed out again"
    conn.close()


def test_every_row_survives_a_downgrade_and_upgrade_at_head(populated_0001: Path) -> None:
    migrate_file(driver_of(populated_0001), backup=False)
    at_head = contents(populated_0001)
    migrate_file(driver_of(populated_0001), "0001_initial", downgrade=True, backup=False)
    assert revision_of(populated_0001) == "0001_initial"
    assert contents(populated_0001) == at_head
    migrate_file(driver_of(populated_0001), backup=False)
    assert contents(populated_0001) == at_head


def test_head_rejects_a_state_outside_the_vocabulary(populated_0001: Path) -> None:
    migrate_file(driver_of(populated_0001), backup=False)
    conn = sqlite3.connect(populated_0001)
    with pytest.raises(sqlite3.IntegrityError, match="ck_jobs_state"):
        conn.execute("UPDATE jobs SET state = 'bogus' WHERE id = 1")
    with pytest.raises(sqlite3.IntegrityError, match="ck_attempts_failure_reason"):
        conn.execute("UPDATE attempts SET failure_reason = 'bogus' WHERE id = 1")
    conn.close()


def test_list_filters_are_served_by_the_new_indexes(populated_0001: Path) -> None:
    migrate_file(driver_of(populated_0001), backup=False)
    conn = sqlite3.connect(populated_0001)
    conn.execute("ANALYZE")
    plans = {
        index: " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
        for index, sql in (
            ("ix_jobs_state_id", "SELECT id FROM jobs WHERE state = 'dead' ORDER BY id DESC"),
            ("ix_jobs_queue_id", "SELECT id FROM jobs WHERE queue = 'q' ORDER BY id DESC"),
        )
    }
    conn.close()
    for index, plan in plans.items():
        assert index in plan, plan


def test_revisions_are_found_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / "alembic.ini").exists()
    shipped = {p.name for p in (revision.migrations_dir() / "versions").glob("0*.py")}
    assert {f"{rev}.py" for rev in revision.KNOWN_REVISIONS} <= shipped


JOB_STATES_0002 = ("queued", "running", "done", "failed", "dead", "canceled")
ATTEMPT_STATES = ("running", "succeeded", "failed", "timed_out", "abandoned", "canceled")


def populate_every_state(db: Path) -> None:
    """At 0002: a job in every job state, an attempt in every attempt state,
    events and workers, with the newest job deleted (as prune does)."""
    conn = sqlite3.connect(db)
    with conn:
        for i, state in enumerate(JOB_STATES_0002, 1):
            conn.execute(
                "INSERT INTO jobs (id, argv, state, queue, priority, next_run_at, created_at, "
                "started_at, finished_at, attempts, crashes, max_crashes, idempotency_key, tags, "
                "env, note, cwd, locked_by, locked_pid, locked_at, heartbeat_at, last_exit_code, "
                "last_error, last_failure_reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    i,
                    f'["echo","{i}"]',
                    state,
                    f"q{i % 2}",
                    i - 3,
                    10.0 + i,
                    1.0 + i,
                    2.0 + i,
                    3.0 + i,
                    i,
                    i // 2,
                    i if i % 2 else None,
                    f"key-{i}",
                    '{"t":"v"}',
                    '{"K":"V"}',
                    f"note {i}",
                    "/tmp",
                    "w" if state == "running" else None,
                    42 if state == "running" else None,
                    2.0 + i,
                    2.5 + i,
                    i - 1,
                    f"error {i}",
                    (
                        "process_exit",
                        "timeout",
                        "spawn_failed",
                        "worker_crash",
                        "canceled",
                        "unknown",
                    )[i - 1],
                ),
            )
            for n, attempt_state in enumerate(ATTEMPT_STATES, 1):
                conn.execute(
                    "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, "
                    "started_at, finished_at, exit_code, error, failure_reason, stdout_path, "
                    "stderr_path, job_pid, job_pgid, job_started_at) "
                    "VALUES (?, ?, 'w', 42, ?, ?, ?, ?, ?, ?, ?, ?, 7, 7, 1.5)",
                    (
                        i,
                        n,
                        attempt_state,
                        2.0 + n,
                        3.0 + n,
                        n,
                        f"e{n}",
                        None if attempt_state in ("running", "succeeded") else "process_exit",
                        f"/s/output/{i}/{n}/stdout",
                        f"/s/output/{i}/{n}/stderr",
                    ),
                )
            for event in ("added", "claimed", "failed", "orphan_unconfirmed"):
                conn.execute(
                    "INSERT INTO job_events (job_id, at, event, worker_id, detail) "
                    "VALUES (?, ?, ?, 'w', ?)",
                    (i, 1.0 + i, event, f'{{"n":{i}}}'),
                )
        conn.execute(
            "INSERT INTO workers (id, hostname, pid, process_started_at, boot_id, queue, slots, "
            "concurrency, started_at, heartbeat_at, stopped_at, state, jobs_run) "
            "VALUES ('w', 'h', 42, 1.0, 'boot', 'q0', 2, 3, 1, 2, 3, 'stopped', 9)"
        )
        conn.execute(
            "INSERT INTO jobs (id, argv, state, next_run_at, created_at) "
            "VALUES (7, '[\"x\"]', 'done', 1, 1)"
        )
        conn.execute("DELETE FROM jobs WHERE id = 7")
    conn.close()


@pytest.fixture
def populated_0002(tmp_path: Path) -> Path:
    db = tmp_path / "queue.db"
    migrate_file(driver_of(db), "0002_state_checks")
    populate_every_state(db)
    return db


def test_a_queue_with_jobs_in_every_state_keeps_every_row_from_0002_to_head(
    populated_0002: Path,
) -> None:
    before = contents(populated_0002)
    assert sorted(r[2] for r in before["jobs"]) == sorted(JOB_STATES_0002)
    result = migrate_file(driver_of(populated_0002), backup=False)
    assert result.applied == list(revision.KNOWN_REVISIONS[2:])
    after = contents(populated_0002)
    for table in (*TABLES, "sqlite_sequence", "fk_violations"):
        assert len(after[table]) == len(before[table]), table
        for old_row, new_row in zip(before[table], after[table], strict=True):
            assert new_row == old_row, table
    conn = sqlite3.connect(populated_0002)
    with conn:
        cursor = conn.execute(
            "INSERT INTO jobs (argv, state, next_run_at, created_at) "
            "VALUES ('[\"x\"]', 'waiting', 1, 1)"
        )
    assert cursor.lastrowid == 8, "a deleted id must never be handed out again"
    conn.close()


def at_head_with(db: Path, *statements: str) -> dict[str, Any]:
    migrate_file(driver_of(db), backup=False)
    conn = sqlite3.connect(db)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()
    return contents(db)


@pytest.mark.parametrize(
    "blocker",
    [
        "INSERT INTO lanes (queue, paused_at, paused_by) VALUES ('q0', 1, 'me')",
        "UPDATE jobs SET state = 'waiting' WHERE id = 1",
    ],
    ids=["paused_lane", "waiting_job"],
)
def test_downgrade_to_0002_refuses_while_a_lane_is_paused_or_a_job_waits(
    populated_0002: Path, blocker: str
) -> None:
    from spoolctl.errors import Conflict

    before = at_head_with(populated_0002, blocker)
    with pytest.raises(Conflict, match="cannot downgrade below 0003"):
        migrate_file(driver_of(populated_0002), "0002_state_checks", downgrade=True, backup=False)
    assert revision_of(populated_0002) == revision.HEAD_REVISION
    assert contents(populated_0002) == before


def test_downgrade_to_0002_keeps_every_job_and_maps_what_0002_cannot_hold(
    populated_0002: Path,
) -> None:
    before = contents(populated_0002)
    at_head_with(
        populated_0002,
        "INSERT INTO job_dependencies (job_id, after_job_id) VALUES (6, 5)",
        "UPDATE jobs SET last_failure_reason = 'dependency_failed', "
        "last_error = 'dependency failed: job 5 is dead' WHERE id = 6",
        "INSERT INTO job_events (job_id, at, event, detail) VALUES (NULL, 9, 'paused', '{}')",
        "INSERT INTO job_events (job_id, at, event) VALUES (6, 9, 'dependency_failed')",
    )
    migrate_file(driver_of(populated_0002), "0002_state_checks", downgrade=True, backup=False)
    assert revision_of(populated_0002) == "0002_state_checks"
    after = contents(populated_0002)
    assert after["fk_violations"] == []
    job6 = next(r for r in after["jobs"] if r[0] == 6)
    assert (job6[2], job6[-1], job6[-2]) == (
        "canceled",
        "canceled",
        "dependency failed: job 5 is dead",
    )
    assert [r for r in after["job_events"] if r[1] is None] == []
    assert [r for r in after["jobs"] if r[0] != 6] == [r for r in before["jobs"] if r[0] != 6]
    assert after["attempts"] == before["attempts"]
    migrate_file(driver_of(populated_0002), backup=False)
    assert revision_of(populated_0002) == revision.HEAD_REVISION
