"""Adopting databases of the original standard-library spoolctl.

Every test works on a copy of `tests/fixtures/legacy/` (never the
originals) and checks the adopted file row by row against the fixtures'
`expected.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from spoolctl.db.revision import HEAD_REVISION, KNOWN_REVISIONS
from tests.helpers import REPO, Result, inproc

FIXTURES = Path(os.environ.get("SPOOLCTL_LEGACY_FIXTURES", REPO / "tests/fixtures/legacy"))
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())["fixtures"]
NAMES = sorted(EXPECTED)
DERIVED_REASON = {
    "failed": "unknown",
    "timed_out": "timeout",
    "canceled": "canceled",
    "abandoned": "worker_crash",
}
JOB_DEFAULTS = {"queue": "default", "priority": 0, "crashes": 0, "tags": {}, "env": {}}
PLAIN_JOB_FIELDS = (
    "state",
    "attempts",
    "max_retries",
    "max_crashes",
    "timeout_seconds",
    "idempotency_key",
    "note",
    "cwd",
    "created_at",
    "next_run_at",
    "started_at",
    "finished_at",
    "locked_by",
    "locked_pid",
    "locked_at",
    "heartbeat_at",
    "last_exit_code",
    "last_error",
)
PLAIN_ATTEMPT_FIELDS = (
    "job_id",
    "attempt_no",
    "worker_id",
    "worker_pid",
    "state",
    "started_at",
    "finished_at",
    "exit_code",
    "error",
)


def copy_fixture(name: str, dest: Path) -> Path:
    """A writable copy; for the spool-folder fixture, the whole folder (moved)."""
    expected = EXPECTED[name]
    if expected["kind"] == "v6-spool-directory":
        spool = dest / "moved-spool"
        shutil.copytree(FIXTURES / name, spool)
        for folder, _dirs, files in os.walk(spool):
            os.chmod(folder, 0o700)
            for file in files:
                os.chmod(Path(folder) / file, 0o600)
        return spool / "queue.db"
    (dest / "spool").mkdir(mode=0o700)
    db = dest / "spool" / "queue.db"
    shutil.copyfile(FIXTURES / expected["db"], db)
    db.chmod(0o600)
    return db


def table(db: Path, sql: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(sql)]
    finally:
        conn.close()


def by_id(db: Path, name: str) -> dict[int, dict[str, Any]]:
    return {row["id"]: row for row in table(db, f"SELECT * FROM {name}")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def adopt(db: Path, capsys: pytest.CaptureFixture[str]) -> Result:
    result = inproc("migrate", "--db", str(db), "--json", capsys=capsys)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result


@pytest.fixture(params=NAMES)
def adopted(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, Path, dict[str, Any]]:
    db = copy_fixture(request.param, tmp_path)
    return request.param, db, adopt(db, capsys).data


def test_migrate_reports_the_adoption_and_a_backup_of_the_original(
    adopted: tuple[str, Path, dict[str, Any]],
) -> None:
    name, db, data = adopted
    version = EXPECTED[name]["schema_version"]
    assert data["legacy_adopted"] is True
    assert data["legacy_schema_version"] == version
    assert (data["from_revision"], data["to_revision"]) == (None, HEAD_REVISION)
    assert data["applied"] == list(KNOWN_REVISIONS)
    backup = Path(data["backup_path"])
    assert backup.parent == db.parent
    assert backup.name.startswith(f"queue.db.bak-legacy-v{version}-")
    assert table(backup, "SELECT value FROM meta") == [{"value": str(version)}]
    assert len(table(backup, "SELECT id FROM jobs")) == EXPECTED[name]["row_counts"]["jobs"]
    assert backup.stat().st_mode & 0o077 == 0
    quarantined = [j["id"] for j in EXPECTED[name]["jobs"] if "quarantined" in j]
    assert data["quarantined_job_ids"] == quarantined
    assert data["quarantined_rows"] == len(quarantined)


def adopted_values(want: dict[str, Any]) -> dict[str, Any]:
    """What adoption must make of a row: as held, or as quarantined."""
    return {**want, **want.get("quarantined", {})}


def assert_adoption_time(found: float | None) -> None:
    """A quarantined row that had not finished is finished at adoption."""
    assert found is not None and abs(found - time.time()) < 600, found


def test_every_job_survives_with_its_id(adopted: tuple[str, Path, dict[str, Any]]) -> None:
    name, db, _ = adopted
    jobs = by_id(db, "jobs")
    assert sorted(jobs) == [j["id"] for j in EXPECTED[name]["jobs"]]
    for held in EXPECTED[name]["jobs"]:
        got, want = jobs[held["id"]], adopted_values(held)
        assert json.loads(got["argv"]) == want["argv"]
        for field in PLAIN_JOB_FIELDS:
            if field == "finished_at" and "quarantined" in held and want[field] is None:
                assert_adoption_time(got[field])
                continue
            assert got[field] == want[field], (want["id"], field)
        for field, default in JOB_DEFAULTS.items():
            stored = json.loads(got[field]) if field in ("tags", "env") else got[field]
            assert stored == (default if want[field] is None else want[field]), (want["id"], field)
        latest = max(want["attempt_rows"], key=lambda a: a["attempt_no"], default=None)
        derived = None if latest is None else reason(name, latest)
        assert got["last_failure_reason"] == want.get("last_failure_reason", derived)


def reason(name: str, attempt: dict[str, Any]) -> str | None:
    """The fixture's own failure_reason, or the documented mapping where it had none."""
    if EXPECTED[name]["attempts_have_failure_reason"]:
        return attempt["failure_reason"]  # type: ignore[no-any-return]
    return DERIVED_REASON.get(attempt["state"])


def test_every_attempt_survives_and_output_paths_follow_the_spool(
    adopted: tuple[str, Path, dict[str, Any]],
) -> None:
    name, db, data = adopted
    attempts = by_id(db, "attempts")
    expected = [a | {"job_id": j["id"]} for j in EXPECTED[name]["jobs"] for a in j["attempt_rows"]]
    assert sorted(attempts) == sorted(a["id"] for a in expected)
    moved = 0
    for held in expected:
        got, want = attempts[held["id"]], adopted_values(held)
        for field in PLAIN_ATTEMPT_FIELDS:
            if field == "finished_at" and "quarantined" in held and want[field] is None:
                assert_adoption_time(got[field])
                continue
            assert got[field] == want[field], (want["id"], field)
        quarantined = "quarantined" in held
        assert got["failure_reason"] == (
            want["failure_reason"] if quarantined else reason(name, want)
        )
        for stream in ("stdout", "stderr"):
            captured = want.get(stream)
            if captured is None:
                assert got[f"{stream}_path"] == want[f"{stream}_path"]
                continue
            path = Path(got[f"{stream}_path"])
            assert path == db.parent / captured["relpath"]
            assert path.read_text() == captured["text"]
            moved += 1
    assert data["relocated_output_paths"] == moved


def test_every_event_survives(adopted: tuple[str, Path, dict[str, Any]]) -> None:
    name, db, _ = adopted
    events = by_id(db, "job_events")
    expected = [e | {"job_id": j["id"]} for j in EXPECTED[name]["jobs"] for e in j["events"]]
    assert sorted(events) == sorted(e["id"] for e in expected)
    for want in expected:
        got = events[want["id"]]
        for field in ("job_id", "at", "event", "worker_id"):
            assert got[field] == want[field], (want["id"], field)
        detail = None if got["detail"] is None else json.loads(got["detail"])
        assert detail == want["detail"]


def test_the_file_is_stamped_at_head_with_sequences_kept(
    adopted: tuple[str, Path, dict[str, Any]],
) -> None:
    name, db, _ = adopted
    tables = {r["name"] for r in table(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert "meta" not in tables
    assert not {t for t in tables if t.startswith("legacy_")}
    assert table(db, "SELECT version_num FROM alembic_version") == [{"version_num": HEAD_REVISION}]
    sequences = {r["name"]: r["seq"] for r in table(db, "SELECT * FROM sqlite_sequence")}
    assert sequences == EXPECTED[name]["sqlite_sequence"]
    assert table(db, "PRAGMA foreign_key_check") == []
    assert table(db, "PRAGMA integrity_check") == [{"integrity_check": "ok"}]


@pytest.mark.parametrize("name", NAMES)
def test_the_next_job_gets_the_id_the_original_would_give(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = copy_fixture(name, tmp_path)
    adopt(db, capsys)
    added = inproc("add", "--db", str(db), "--json", "--", "true", capsys=capsys)
    assert added.data["job_id"] == EXPECTED[name]["next_job_id"]


@pytest.mark.parametrize("name", NAMES)
def test_other_verbs_refuse_an_unadopted_file_and_change_nothing(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = copy_fixture(name, tmp_path)
    before = sha256(db)
    for args in (("list",), ("status",), ("add", "--", "true"), ("work", "--once")):
        result = inproc(args[0], "--db", str(db), "--json", *args[1:], capsys=capsys)
        assert result.exit_code == 3, args
        error = result.envelope["errors"][0]
        assert error["code"] == "SCHEMA_OUTDATED", args
        assert "spoolctl migrate" in error["message"]
    assert sha256(db) == before
    assert not {r["name"] for r in table(db, "SELECT name FROM sqlite_master")} & {
        "alembic_version",
        "workers",
    }


def test_status_and_sql_describe_the_adoption_without_changing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = copy_fixture("v2-populated.db", tmp_path)
    before = sha256(db)
    status = inproc("migrate", "--db", str(db), "--json", "--status", capsys=capsys).data
    assert status["legacy_detected"] is True
    assert (status["current"], status["pending"]) == (None, list(KNOWN_REVISIONS))
    sql = inproc("migrate", "--db", str(db), "--json", "--sql", capsys=capsys).data["sql"]
    for statement in (
        "ALTER TABLE jobs RENAME TO legacy_jobs",
        "INSERT INTO jobs",
        "DROP TABLE meta",
    ):
        assert statement in sql
    assert sha256(db) == before
    assert list(tmp_path.glob("spool/*.bak-*")) == []


def test_an_attempt_in_an_unknown_state_is_quarantined_without_its_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = copy_fixture("v1-populated.db", tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA ignore_check_constraints=ON")
    with conn:
        conn.execute("UPDATE attempts SET state = 'vanished', error = 'lost' WHERE id = 1")
    conn.close()
    data = adopt(db, capsys).data
    assert (data["quarantined_rows"], data["quarantined_job_ids"]) == (1, [])
    attempt = table(db, "SELECT state, failure_reason, error FROM attempts WHERE id = 1")[0]
    assert (attempt["state"], attempt["failure_reason"]) == ("abandoned", "unknown")
    assert "'vanished'" in attempt["error"] and "'lost'" in attempt["error"]
    assert table(db, "SELECT state FROM jobs WHERE id = 1") == [{"state": "queued"}]
