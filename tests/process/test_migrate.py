"""`spoolctl migrate` and the revision policy on open (docs/migrations.md), through
the real command line; races and workers of another version as real processes."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spoolctl.db.revision import HEAD_REVISION, KNOWN_REVISIONS
from tests.helpers import Result, child_env, cli, inproc, rows, start_worker, wait_for
from tests.unit.test_migrations import ATTEMPTS_0005, JOBS_0005, WORKERS_0001

pytestmark = pytest.mark.subprocess

OLD = KNOWN_REVISIONS[0]
TABLES = ("jobs", "attempts", "workers", "job_events")


def run(capsys: pytest.CaptureFixture[str], db: Path, verb: str, *args: str) -> Result:
    return inproc(verb, "--db", str(db), "--json", *args, capsys=capsys)


def revision_of(db: Path) -> str:
    return str(rows(db, "SELECT version_num FROM alembic_version")[0][0])


EVERY_REVISIONS_COLUMNS = {
    "job_events": "id, job_id, at, event, worker_id, detail",
    "jobs": JOBS_0005,
    "attempts": ATTEMPTS_0005,
    "workers": WORKERS_0001,
}
"""Columns compared across revisions where a later one adds some (0005's
job_events.seq, null on SQLite; 0007's cgroup, usage and limit columns;
0008's workers.pid_space)."""


def contents(db: Path) -> dict[str, Any]:
    found: dict[str, Any] = {
        t: [tuple(r) for r in rows(db, f"SELECT {EVERY_REVISIONS_COLUMNS.get(t, '*')} FROM {t}")]
        for t in TABLES
    }
    found["sqlite_sequence"] = sorted(tuple(r) for r in rows(db, "SELECT * FROM sqlite_sequence"))
    return found


def error(result: Result) -> dict[str, Any]:
    assert result.envelope["ok"] is False
    return result.envelope["errors"][0]  # type: ignore[no-any-return]


@pytest.fixture
def old_db(db: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A queue at the oldest revision holding a done job and a delayed one."""
    assert run(capsys, db, "add", "--", "true").exit_code == 0
    assert run(capsys, db, "work", "--once").data["job_state"] == "done"
    assert run(capsys, db, "add", "--after", "1h", "--key", "later", "--", "true").exit_code == 0
    down = run(capsys, db, "migrate", "--downgrade", OLD, "--yes", "--no-backup")
    assert down.data["to_revision"] == OLD
    return db


def test_read_only_use_of_a_missing_db_creates_nothing(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for verb, *args in (("list",), ("status",), ("migrate", "--status"), ("migrate", "--history")):
        assert run(capsys, db, verb, *args).exit_code == 0, verb
    status = run(capsys, db, "migrate", "--status").data
    assert status | {"db_path": None} == {
        "db_path": None,
        "exists": False,
        "current": None,
        "head": HEAD_REVISION,
        "pending": list(KNOWN_REVISIONS),
        "legacy_detected": False,
        "legacy_schema_version": None,
        "up_to_date": False,
    }
    sql = run(capsys, db, "migrate", "--sql").data["sql"]
    assert "CREATE TABLE jobs" in sql
    assert not db.parent.exists()


def test_migrate_creates_a_missing_db_at_head(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = run(capsys, db, "migrate").data
    assert (data["from_revision"], data["to_revision"]) == (None, HEAD_REVISION)
    assert data["applied"] == list(KNOWN_REVISIONS)
    assert data["backup_path"] is None
    assert revision_of(db) == HEAD_REVISION
    assert db.stat().st_mode & 0o777 == 0o600


def test_the_first_mutating_verb_creates_the_db_at_head(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, db, "add", "--", "true").data["job_id"] == 1
    assert revision_of(db) == HEAD_REVISION


def test_an_older_db_is_refused_naming_both_revisions_and_the_command(
    old_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = contents(old_db)
    for verb, *args in (("list",), ("status",), ("add", "--", "true"), ("work", "--once")):
        result = run(capsys, old_db, verb, *args)
        assert result.exit_code == 3, verb
        problem = error(result)
        assert problem["code"] == "SCHEMA_OUTDATED"
        for part in (OLD, HEAD_REVISION, f"spoolctl migrate --db {old_db}"):
            assert part in problem["message"]
    assert contents(old_db) == before
    assert revision_of(old_db) == OLD


def test_auto_migrate_upgrades_on_open_with_a_backup(
    old_db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOOLCTL_AUTO_MIGRATE", "1")
    listed = run(capsys, old_db, "list")
    assert listed.exit_code == 0, listed.stdout
    assert [j["id"] for j in listed.data["jobs"]] == [2, 1]
    assert revision_of(old_db) == HEAD_REVISION
    assert len(list(old_db.parent.glob(f"queue.db.bak-{OLD}-*"))) == 1


def test_a_newer_db_is_refused_and_nothing_is_written(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "add", "--", "true")
    stamp_future(db)
    before = contents(db)
    for verb, *args in (
        ("list",),
        ("add", "--", "true"),
        ("work", "--once"),
        ("migrate",),
        ("migrate", "--sql"),
        ("migrate", "--downgrade", OLD, "--yes"),
    ):
        result = run(capsys, db, verb, *args)
        assert result.exit_code == 3, verb
        assert error(result)["code"] == "SCHEMA_TOO_NEW", verb
    assert contents(db) == before
    assert revision_of(db) == "9999_future"
    assert list(db.parent.glob("*.bak-*")) == []


def stamp_future(db: Path) -> None:
    """What a newer spoolctl's migrate leaves behind: a revision this code does not know."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_future'")
    conn.close()


def test_upgrade_writes_a_consistent_backup_named_after_the_old_revision(
    old_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = contents(old_db)
    data = run(capsys, old_db, "migrate").data
    assert (data["from_revision"], data["to_revision"]) == (OLD, HEAD_REVISION)
    assert data["applied"] == list(KNOWN_REVISIONS[1:])
    assert data["legacy_adopted"] is False
    backup = Path(data["backup_path"])
    assert backup.parent == old_db.parent
    assert re.fullmatch(rf"queue\.db\.bak-{OLD}-\d{{8}}T\d{{6}}Z", backup.name)
    assert revision_of(backup) == OLD
    assert contents(backup) == before
    assert contents(old_db) == before
    assert backup.stat().st_mode & 0o777 == 0o600


def test_no_backup_skips_it(old_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = run(capsys, old_db, "migrate", "--no-backup").data
    assert data["backup_path"] is None
    assert data["applied"] == list(KNOWN_REVISIONS[1:])
    assert list(old_db.parent.glob("*.bak-*")) == []


def test_sql_prints_the_upgrade_and_changes_nothing(
    old_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = contents(old_db)
    text = inproc("migrate", "--db", str(old_db), "--sql", capsys=capsys)
    assert text.exit_code == 0
    assert "ALTER TABLE _alembic_tmp_jobs RENAME TO jobs" in text.stdout
    assert f"UPDATE alembic_version SET version_num='{HEAD_REVISION}'" in text.stdout
    assert revision_of(old_db) == OLD
    assert contents(old_db) == before


def test_to_and_downgrade_move_one_step_each_way(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, db, "migrate", "--to", OLD).data["applied"] == [OLD]
    assert revision_of(db) == OLD
    up = run(capsys, db, "migrate", "--to", "head").data
    assert up["applied"] == list(KNOWN_REVISIONS[1:])
    down = run(capsys, db, "migrate", "--downgrade", OLD, "--yes").data
    assert (down["direction"], down["applied"], down["to_revision"]) == (
        "downgrade",
        list(reversed(KNOWN_REVISIONS[1:])),
        OLD,
    )
    assert revision_of(Path(down["backup_path"])) == HEAD_REVISION


def test_downgrade_without_yes_is_a_safety_block(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "migrate")
    result = run(capsys, db, "migrate", "--downgrade", OLD)
    assert result.exit_code == 2
    assert error(result)["code"] == "SAFETY_BLOCK"
    assert revision_of(db) == HEAD_REVISION


@pytest.mark.parametrize(
    "args",
    [
        ("--to", OLD),
        ("--to", "0003_bogus"),
        ("--downgrade", HEAD_REVISION, "--yes", "--to", OLD),
        ("--status", "--history"),
        ("--status", "--to", "head"),
        ("--sql", "--yes"),
    ],
)
def test_contradictory_requests_are_invalid_input(
    args: tuple[str, ...], db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "migrate")
    result = run(capsys, db, "migrate", *args)
    assert result.exit_code == 1, result.stdout
    assert error(result)["code"] == "INVALID_INPUT"
    assert revision_of(db) == HEAD_REVISION


def test_every_mode_has_text_output(old_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expectations = {
        ("--status",): f"current:  {OLD}",
        ("--history",): f"{KNOWN_REVISIONS[-2]} -> {HEAD_REVISION} (head)",
        ("--sql",): "CREATE TABLE _alembic_tmp_jobs",
        (): "backup: ",
        ("--to", "head"): "nothing to do",
        ("--downgrade", OLD, "--yes"): f"Downgraded {old_db} from {HEAD_REVISION} to {OLD}",
    }
    for args, fragment in expectations.items():
        result = inproc("migrate", "--db", str(old_db), *args, capsys=capsys)
        assert result.exit_code == 0, (args, result.stderr)
        assert fragment in result.stdout, (args, result.stdout)


def hold_write_lock(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def has_open(pid: int, db: Path) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd_dir / fd) == str(db) for fd in os.listdir(fd_dir))
    except OSError:
        return False


def test_two_racing_migrates_upgrade_once(old_db: Path, tmp_path: Path) -> None:
    """Both start while the file is write-locked, so both really wait on BEGIN
    IMMEDIATE; run from a folder without alembic.ini."""
    assert not (Path.cwd() / "alembic.ini").exists()
    before = contents(old_db)
    lock = hold_write_lock(old_db)
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "spoolctl", "migrate", "--db", str(old_db), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    wait_for(lambda: all(has_open(p.pid, old_db) for p in racers), what="both racers opening")
    lock.execute("COMMIT")
    lock.close()
    outcomes = [Result(p.wait(60), *p.communicate()) for p in racers]
    assert [o.exit_code for o in outcomes] == [0, 0], [o.stderr for o in outcomes]
    applied = sorted(o.data["applied"] for o in outcomes)
    assert applied == [[], list(KNOWN_REVISIONS[1:])]
    assert len(list(old_db.parent.glob("*.bak-*"))) == 1
    assert revision_of(old_db) == HEAD_REVISION
    assert contents(old_db) == before


def idle_worker(db: Path, log: Path) -> subprocess.Popen[str]:
    worker = start_worker(db, "--poll-interval", "0.2", log=log)
    wait_for(
        lambda: rows(
            db, "SELECT 1 FROM workers WHERE pid = ? AND state = 'running'", (worker.pid,)
        ),
        what="the worker to register",
    )
    return worker


def test_a_worker_stops_at_its_next_transaction_when_the_file_is_downgraded(
    old_db: Path, tmp_path: Path
) -> None:
    """A worker of the newer code meets an older file: SCHEMA_OUTDATED, nothing lost."""
    upgraded = cli("migrate", "--no-backup", db=old_db)
    assert upgraded.exit_code == 0, upgraded.stderr
    worker = idle_worker(old_db, tmp_path / "worker.log")
    downgraded = cli("migrate", "--downgrade", OLD, "--yes", db=old_db)
    assert downgraded.exit_code == 0, downgraded.stderr
    after_downgrade = contents(old_db)
    assert worker.wait(30) == 3
    envelope = (tmp_path / "worker.log").read_text()
    assert '"code": "SCHEMA_OUTDATED"' in envelope
    assert contents(old_db) == after_downgrade
    assert revision_of(old_db) == OLD


def test_a_worker_stops_without_writing_when_a_newer_spoolctl_migrated_the_file(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "add", "--after", "1h", "--", "true")
    worker = idle_worker(db, tmp_path / "worker.log")
    stamp_future(db)
    stamped = contents(db)
    assert worker.wait(30) == 3
    assert '"code": "SCHEMA_TOO_NEW"' in (tmp_path / "worker.log").read_text()
    assert contents(db) == stamped


OLD_RELEASE = (
    "import sys; from spoolctl.db import revision; "
    f"revision.HEAD_REVISION = {OLD!r}; revision.KNOWN_REVISIONS = ({OLD!r},); "
    "import spoolctl.services.claim as claim, spoolctl.services.outcome as outcome; "
    "claim.is_paused = lambda conn, queue: False; "
    "import spoolctl.services.claim_statements as sql; "
    "sql.TAKE_NEXT = type('OneByOne', (), {'send': lambda self, conn, params: self, "
    "'all': lambda self, *given: []})(); "
    "from sqlalchemy import literal_column as column; "
    "import spoolctl.services.dependencies as dependencies; "
    "dependencies.AWAITED = column('0').label('awaited'); "
    "import os; os.environ['SPOOLCTL_CGROUP'] = 'off'; "
    "from spoolctl.db.prepared import Prepared; "
    "sql.CLAIMABLE_QUERY = sql.CLAIMABLE_QUERY.with_only_columns("
    "*list(sql.CLAIMABLE_QUERY.selected_columns)[:5]); "
    "sql.CLAIMABLE_QUERY._where_criteria = sql.CLAIMABLE_QUERY._where_criteria[:3]; "
    "from spoolctl.db import tables; from spoolctl.db.tables import jobs, attempts; "
    "tables.metadata; "
    "jobs.indexes -= {i for i in jobs.indexes if i.name == 'ix_jobs_needs_limits'}; "
    "[t._columns.remove(t.c[n]) for t, n in ((jobs, 'memory_bytes'), (jobs, 'cpus'), "
    "(jobs, 'require_limits'), (attempts, 'cgroup'), (attempts, 'peak_memory_bytes'), "
    "(attempts, 'cpu_time_s'), (tables.workers, 'pid_space'))]; "
    "[jobs._columns.remove(jobs.c[n]) for n in ('suspended_at', 'signal_before_timeout', "
    "'signal_before_timeout_s', 'requeue_exits', 'max_requeues', 'requeues')]; "
    "[t._columns.remove(t.c[n]) for t, n in ((jobs, 'weight'), (jobs, 'gpus'), "
    "(jobs, 'gpu_share'), (jobs, 'gpu_memory_bytes'), (jobs, 'gpu_model'), "
    "(attempts, 'host'), (attempts, 'devices'), (tables.workers, 'inventory'))]; "
    "from spoolctl.db.prepared import PreparedFor, item_bind; "
    "sql.INSERT_ATTEMPTS = PreparedFor(lambda n: insert(attempts).values([{"
    "'job_id': bindparam(item_bind('b_job', i)), 'attempt_no': bindparam(item_bind('b_no', i)), "
    "'worker_id': bindparam('b_worker'), 'worker_pid': bindparam('b_pid'), "
    "'state': 'running', 'started_at': bindparam('b_now'), "
    "'stdout_path': bindparam(item_bind('b_stdout', i)), "
    "'stderr_path': bindparam(item_bind('b_stderr', i))} for i in range(n)])"
    ".returning(attempts.c.id, attempts.c.job_id)); "
    "import spoolctl.services.placement as placement; "
    "placement.release = lambda conn, attempt_ids: 0; "
    "placement.release_lingering = lambda conn, now, here: []; "
    "import spoolctl.services.control as control; "
    "control.pending = lambda conn, attempt_ids: []; "
    "del sql._TAKEN['suspended_at']; from sqlalchemy import update, bindparam, insert; "
    "sql.TAKE = Prepared(update(jobs).where(jobs.c.id == bindparam('b_id'), "
    "jobs.c.state == 'queued').values(**sql._TAKEN)); "
    "import spoolctl.services.job_spec as spec; "
    "spec.STORED = tuple(f for f in spec.STORED if f.key not in "
    "('memory_bytes', 'cpus', 'require_limits', 'signal_before_timeout', "
    "'signal_before_timeout_s', 'requeue_exits', 'max_requeues')); "
    "spec.ROW_COLUMNS = tuple(c for c in spec.ROW_COLUMNS if c in jobs.c); "
    "import spoolctl.services.statements as st; from sqlalchemy import insert, bindparam; "
    "st.LEAN[st.INSERT_JOB] = Prepared(insert(jobs).values("
    "{c: bindparam(c) for c in spec.ROW_COLUMNS}).returning(jobs.c.id)); "
    "import spoolctl.services.heartbeat as beat; row = beat.worker_row; "
    "beat.worker_row = lambda info, now: {k: v for k, v in row(info, now).items() "
    "if k not in ('pid_space', 'inventory')}; "
    "import spoolctl.worker.firing as firing; firing.due_schedules = lambda conn, now: []; "
    "from spoolctl.cli import main; main(sys.argv[1:])"
)
"""spoolctl as the release whose head was the oldest revision: the same code,
except that it knows no later revision and never looks at the tables or
columns later revisions added (paused lanes, job dependencies, schedules,
0007's limits and cgroups, 0008's pid space, 0009's steering, 0010's
requests, devices and holds): its jobs carry no limits or requests, its
claims take the one-by-one path (the one-statement claim reads the lanes
table in SQL) without the limit and request columns, its attempts record no
host or devices and hold none, it looks for no requests to steer its
jobs, it runs jobs without cgroups (whose path and
usage 0007 records), and it registers without a pid space or an inventory."""


def old_release(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", OLD_RELEASE, *args],
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )


def test_a_worker_of_the_old_release_stops_when_migrate_upgrades_the_file(
    db: Path, tmp_path: Path
) -> None:
    added = old_release("add", "--db", str(db), "--json", "--", "true")
    assert added.wait(30) == 0
    log = tmp_path / "old-worker.log"
    with log.open("w") as out:
        worker = old_release("work", "--db", str(db), "--json", stdout=out)
    wait_for(
        lambda: rows(db, "SELECT 1 FROM jobs WHERE id = 1 AND state = 'done'"),
        what="the old worker to run job 1",
    )
    assert revision_of(db) == OLD
    history = {t: contents(db)[t] for t in ("jobs", "attempts", "job_events")}
    upgraded = cli("migrate", db=db, json=True)
    assert upgraded.exit_code == 0, upgraded.stderr
    assert upgraded.data["applied"] == list(KNOWN_REVISIONS[1:])
    after_upgrade = contents(db)
    assert worker.wait(30) == 3
    assert '"code": "SCHEMA_TOO_NEW"' in log.read_text()
    assert contents(db) == after_upgrade
    assert {t: after_upgrade[t] for t in history} == history


def test_downgrade_below_0003_refuses_while_a_job_waits_or_a_lane_is_paused(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = "0002_state_checks"
    assert run(capsys, db, "add", "--", "true").exit_code == 0
    assert run(capsys, db, "add", "--after-job", "1", "--", "true").data["state"] == "waiting"
    refused = run(capsys, db, "migrate", "--downgrade", previous, "--yes", "--no-backup")
    assert refused.exit_code == 5
    assert error(refused)["code"] == "CONFLICT"
    assert "1 waiting job(s): 2" in error(refused)["message"]
    assert run(capsys, db, "cancel", "2").exit_code == 0
    assert run(capsys, db, "pause", "default").exit_code == 0
    before = contents(db)
    refused = run(capsys, db, "migrate", "--downgrade", previous, "--yes")
    assert "paused lanes default" in error(refused)["message"]
    assert (revision_of(db), contents(db)) == (HEAD_REVISION, before)
    assert sorted(p.name for p in db.parent.glob("*.bak-*")) == [], "a refusal left its backup"
    assert run(capsys, db, "resume", "default").exit_code == 0
    down = run(capsys, db, "migrate", "--downgrade", previous, "--yes", "--no-backup")
    assert down.exit_code == 0 and revision_of(db) == previous
    assert [r["state"] for r in rows(db, "SELECT state FROM jobs ORDER BY id")] == [
        "queued",
        "canceled",
    ]


RELEASE_0002 = OLD_RELEASE.replace(repr(OLD), repr(KNOWN_REVISIONS[1]))
"""spoolctl as the release before lanes and dependencies (head 0002)."""


def test_a_worker_of_the_0002_release_stops_when_the_file_goes_to_0003(
    db: Path, tmp_path: Path
) -> None:
    added = subprocess.run(
        [sys.executable, "-c", RELEASE_0002, "add", "--db", str(db), "--json", "--", "true"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stdout + added.stderr
    assert revision_of(db) == KNOWN_REVISIONS[1]
    log = tmp_path / "old-worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-c", RELEASE_0002, "work", "--db", str(db), "--json"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(),
        )
    wait_for(lambda: rows(db, "SELECT 1 FROM jobs WHERE id = 1 AND state = 'done'"))
    upgraded = cli("migrate", db=db, json=True)
    assert upgraded.data["applied"] == list(KNOWN_REVISIONS[2:])
    after_upgrade = contents(db)
    assert worker.wait(30) == 3
    assert '"code": "SCHEMA_TOO_NEW"' in log.read_text()
    assert contents(db) == after_upgrade
