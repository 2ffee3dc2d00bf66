"""The lean path of `add` (`cli/lean.py`): its SQL is what SQLAlchemy
compiles from the tables today, and it answers every input exactly as the
click verb does: the same rows, the same events, the same envelope and text,
byte for byte (the request id, its time and the elapsed milliseconds of an
envelope aside), or it leaves the input to the click verb having written
nothing. In-process, on SQLite (the lean path's one backend)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spoolctl import cli
from spoolctl.cli import app, lean
from spoolctl.db import lean_sql
from spoolctl.db.backends import sqlite_at
from spoolctl.db.lean import LeanQueue
from spoolctl.db.revisions import HEAD_REVISION
from spoolctl.services.statements import LEAN, lean_sql_module
from tests.unit.test_add import REJECTED

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.25
VARYING = re.compile(r'"(request_id|ts_iso|elapsed_ms)": ("[^"]*"|\d+)')
"""What differs between any two envelopes: masked before comparing."""

ANSWERED: list[list[str]] = [
    ["--", "true"],
    ["--priority", "5", "--queue", "gpu", "--", "echo", "hi"],
    ["--priority=-7", "--timeout", "90", "--", "sleep", "1"],
    ["--timeout", "1h", "--max-retries", "0", "--max-crashes", "2", "--", "x"],
    ["--note", "a note", "--cwd", "/tmp", "--", "pwd"],
    ["--cwd", ".", "--", "pwd"],
    ["--timeout", "none", "--", "true"],
    ["--timeout", "1h30m", "-q", "--", "true"],
    ["--quiet", "--timeout", "0", "--", "true"],
    ["--memory", "512M", "--cpus", "0.5", "--", "true"],
    ["--key", "fresh", "--", "true"],
    ["--key", "seeded", "--", "true"],
    ["--key", "seeded", "--note", "other", "--", "true"],
    ["--queue", "q" * 64, "--priority", "2147483647", "--timeout", str(2**63 - 1), "--", "t"],
    ["--", "-x", "--", "ünïcode ✓"],
]
"""Inputs the lean path answers itself."""
LEFT: list[list[str]] = [
    ["--key", "seeded", "--priority", "3", "--", "true"],  # IDEMPOTENCY_CONFLICT
    ["--priority", "1", "--priority", "2", "--", "true"],  # click keeps the last
    ["--json=1", "--", "true"],
    ["--bogus", "--", "true"],
    ["--tag", "team=a", "--", "true"],
    ["--env", "A=1", "--", "true"],
    ["--after", "5", "--", "true"],
    ["--require-limits", "--memory", "1G", "--", "true"],
    ["-c", "echo hi"],
    ["--help"],
    ["--priority", "--", "true"],
    ["--db"],
    ["true"],
    ["-q", "--quiet", "--", "true"],
    ["--cwd", "rel/dir", "--", "pwd"],  # no such folder here: INVALID_INPUT
    ["--here", "--", "true"],
    *(args for _, args, _ in REJECTED),
]
"""Inputs the lean path leaves to the click verb (most of them bad)."""


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)


@pytest.fixture
def seeded(tmp_path: Path, frozen: None) -> Path:
    """A queue holding one job under the key `seeded`, its WAL folded in,
    to be copied for each run."""
    db = tmp_path / "seed" / "queue.db"
    assert app.run(["add", "--db", str(db), "--key", "seeded", "--", "true"]) == 0
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


def test_the_generated_sql_is_what_sqlalchemy_compiles_from_the_tables() -> None:
    committed = (REPO / "spoolctl" / "db" / "lean_sql.py").read_text(encoding="utf-8")
    assert committed == lean_sql_module(), "run: python scripts/gen_docs.py"
    assert lean_sql.HEAD_REVISION == HEAD_REVISION


def test_a_queue_engine_runs_the_same_sql(seeded: Path) -> None:
    """What an engine of the SQLite driver compiles at run time is the text."""
    engine = sqlite_at(seeded).engine(write=True, expected_revision=HEAD_REVISION)
    try:
        for name, prepared in LEAN.items():
            compiled = prepared.compiled_for(engine.dialect)
            sql, order, _ = lean_sql.STATEMENTS[name]
            assert (compiled.sql, compiled.order) == (sql, tuple(order.split())), name
    finally:
        engine.dispose()


def _run(
    path: Path, seed: Path, args: list[str], capsys: pytest.CaptureFixture[str], *, full: bool
) -> tuple[int, str, str, list[Any], bool]:
    """One run on a fresh copy of the seed at `path`: exit code, stdout
    (masked), stderr, every row of jobs and job_events, whether the lean
    path answered."""
    shutil.rmtree(path.parent, ignore_errors=True)
    shutil.copytree(seed.parent, path.parent)
    code, answered = _answer(["add", "--db", str(path), *args], capsys, full=full)
    out, err = capsys.readouterr()
    with sqlite3.connect(path) as conn:
        stored = [
            conn.execute("SELECT * FROM jobs ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM job_events ORDER BY id").fetchall(),
        ]
    conn.close()
    return code, VARYING.sub(r'"\1": "?"', out), err, stored, answered


def _both(
    tmp_path: Path, seed: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...], bool]]:
    place = tmp_path / "run" / "queue.db"
    for as_json in ([], ["--json"]):
        full = _run(place, seed, [*as_json, *args], capsys, full=True)
        lean_run = _run(place, seed, [*as_json, *args], capsys, full=False)
        yield full[:4], lean_run[:4], lean_run[4]


@pytest.mark.parametrize("args", ANSWERED, ids=lambda a: " ".join(a)[:40])
def test_the_lean_path_answers_as_the_click_verb(
    tmp_path: Path, seeded: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for full, lean_run, answered in _both(tmp_path, seeded, args, capsys):
        assert answered, "the lean path left an input it is meant to answer"
        assert lean_run == full


@pytest.mark.parametrize("args", LEFT, ids=lambda a: " ".join(a)[:40])
def test_what_the_lean_path_leaves_is_answered_by_the_click_verb_alone(
    tmp_path: Path, seeded: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for full, lean_run, answered in _both(tmp_path, seeded, args, capsys):
        assert not answered
        assert lean_run == full


def test_no_queue_yet_goes_the_full_way_which_creates_it(
    tmp_path: Path, frozen: None, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "new" / "queue.db"
    assert lean.answer(["add", "--db", str(db), "--", "true"]) is None
    assert not db.exists(), "the lean path created something"
    assert cli.run(["add", "--db", str(db), "--", "true"]) == 0
    assert lean.answer(["add", "--db", str(db), "--", "true"]) == 0
    assert capsys.readouterr().out == "Added job 1\nAdded job 2\n"


def test_another_revision_goes_the_full_way_which_refuses_it(
    seeded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sqlite3.connect(seeded) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0007_containment'")
    conn.close()
    before = seeded.read_bytes()
    assert lean.answer(["add", "--db", str(seeded), "--json", "--", "true"]) is None
    assert seeded.read_bytes() == before
    code = cli.run(["add", "--db", str(seeded), "--json", "--", "true"])
    assert code != 0 and '"SCHEMA_OUTDATED"' in capsys.readouterr().out


def test_a_lock_held_beyond_the_lean_wait_goes_the_full_way(
    seeded: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The full path then waits for the lock and names its holder (LOCKED)."""
    monkeypatch.setattr("spoolctl.db.lean.LEAN_LOCK_WAIT_S", 0.0)
    monkeypatch.setenv("SPOOLCTL_BUSY_TIMEOUT", "0")
    holder = sqlite3.connect(seeded, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        assert lean.answer(["add", "--db", str(seeded), "--", "true"]) is None
        code = cli.run(["add", "--db", str(seeded), "--json", "--", "true"])
        assert code == 4 and '"LOCKED"' in capsys.readouterr().out
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with sqlite3.connect(seeded) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
    conn.close()


# -- status, list and show -------------------------------------------------------

STATES = ("queued", "running", "done", "failed", "dead", "canceled", "waiting")
READ_ANSWERED: list[list[str]] = [
    ["status"],
    ["status", "--limit", "0"],
    ["status", "--limit=1"],
    ["status", "--limit", "1000"],
    ["list"],
    *(["list", "--state", state] for state in STATES),
    ["list", "--state", " dead "],
    ["list", "--state", "done,done"],
    ["list", "--waiting"],
    ["list", "--waiting", "--state", "dead"],
    ["list", "--queue", "other"],
    ["list", "--queue=nosuch"],
    ["list", "--priority-min", "3"],
    ["list", "--priority-min=-5"],
    ["list", "--limit", "0"],
    ["list", "--limit", "2"],
    ["list", "--state", "queued", "--queue", "default", "--priority-min", "0", "--limit", "1"],
    ["list", "--state", "running", "--queue", "default"],
    ["list", "--queue", "default", "--limit", "1"],
    ["list", "--state", "done", "--priority-min", "0"],
    ["show", "999"],
    ["show", " 3 "],
    ["status", "--wide"],
    ["list", "--wide"],
    ["list", "--state", "queued", "--wide"],
]
"""Read verbs the lean path answers itself (both as text and with --json;
`show` in full below)."""
READ_LEFT: list[list[str]] = [
    ["status", "--watch", "--json"],
    ["status", "--interval", "1"],
    ["status", "--limit", "-1"],
    ["status", "--limit", "1001"],
    ["status", "--limit", "x"],
    ["status", "--limit", "1", "--limit", "2"],
    ["status", "--limit"],
    ["status", "--bogus"],
    ["status", "extra"],
    ["status", "--json=1"],
    ["status", "--help"],
    ["list", "--state", "done,dead"],
    ["list", "--state", "suspended"],  # no named statement: the click verb's query
    ["list", "--state", "suspended,queued"],
    ["list", "--state", "bogus"],
    ["list", "--state", ""],
    ["list", "--state", ","],
    ["list", "--tag", "team=ml"],
    ["list", "--tag", "team"],
    ["list", "--schedule", "nightly"],
    ["list", "--limit", "1001"],
    ["list", "--priority-min", "2147483648"],
    ["list", "--priority-min", "-3"],  # click takes it; the lean path leaves a dash
    ["list", "--queue", "bad name!"],
    ["list", "--queue", "--json"],
    ["list", "--waiting=1"],
    ["list", "--wide=1"],
    ["list", "--wide", "--wide"],
    ["list", "extra"],
    ["list", "--", "x"],
    ["show"],
    ["show", "0"],
    ["show", "-1"],
    ["show", "abc"],
    ["show", "1", "2"],
    ["show", "--db"],
]
"""Read verbs the lean path leaves to the click verb (most of them bad)."""


def _tamper(db: Path, *statements: str) -> None:
    """Run the statements (CHECK constraints bypassed, as a hand's edit
    may) and fold the WAL into the file."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        for statement in statements:
            conn.execute(statement)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


@pytest.fixture(scope="module")
def busy_queue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Jobs in every state (set by hand: no process starts here), a running
    job suspended, attempts, dead jobs, workers (running and stopped,
    one waited for a server), a running job flagged an unconfirmed orphan, a
    paused lane, schedules (one paused), dependencies, a job waiting for
    limits: built in-process, its WAL folded in."""
    from tests.populated import run_quiet

    db = tmp_path_factory.mktemp("busy") / "queue.db"
    for args in (
        ["add", "--tag", "team=ml", "--env", "SECRET=xyz", "--", "sh", "-c", "echo hello"],
        ["add", "--max-retries", "0", "-c", "echo oops >&2; exit 3"],
        ["add", "--after", "1h", "--queue", "other", "--priority", "5", "--", "true"],
        ["add", "--", "true"],
        ["cancel", "4"],
        ["add", "--after-job", "2", "--", "true"],
        ["add", "--after-job", "3", "--priority", "9", "--note", "n", "--", "echo", "ü"],
        ["add", "--require-limits", "--memory", "1G", "--", "true"],
        ["add", "--queue", "gpu", "--", "sleep", "9"],
        ["add", "--queue", "gpu", "--key", "k", "--cwd", "/tmp", "--", "false"],
        ["add", "--queue", "gpu", "--", "sleep", "10"],
        ["add", "--queue", "gpu", "--", "big"],
        ["pause", "other", "--reason", "deploy"],
        ["schedule", "add", "nightly", "--every", "1h", "--", "true"],
        ["schedule", "add", "weekly", "--every", "7d", "--", "true"],
        ["schedule", "pause", "weekly"],
    ):
        words = 2 if args[0] == "schedule" else 1
        result = run_quiet(*args[:words], "--db", str(db), *args[words:])
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
    attempt = (
        "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, started_at, "
        "finished_at, exit_code, failure_reason, stdout_path, stderr_path) VALUES "
    )
    _tamper(
        db,
        "UPDATE jobs SET state = 'done', started_at = 3.0, finished_at = 4.0, "
        "last_exit_code = 0 WHERE id = 1",
        attempt + "(1, 1, 'w0', 2, 'succeeded', 3.0, 4.0, 0, NULL, '/o/1', '/e/1')",
        "UPDATE jobs SET state = 'dead', attempts = 1, started_at = 3.0, finished_at = 5.0, "
        "last_exit_code = 3, last_error = 'exit 3' WHERE id = 2",
        attempt + "(2, 1, 'w0', 2, 'failed', 3.0, 5.0, NULL, 'timeout', '/o/2', '/e/2')",
        "INSERT INTO job_events (job_id, at, event, worker_id, detail) VALUES "
        "(2, 5.0, 'timed_out', 'w0', '{\"attempt\": 1, \"signal\": 9}')",
        "UPDATE jobs SET state = 'failed', attempts = 1 WHERE id = 9",
        attempt + "(9, 1, 'w0', 2, 'failed', 3.0, 5.0, 1, 'process_exit', '/o/9', '/e/9')",
    )
    _tamper(
        db,
        "INSERT INTO workers (id, hostname, pid, queue, started_at, heartbeat_at, state) "
        "VALUES ('w1', 'h', 1, 'gpu', 1.0, 1799999990.0, 'running'), "
        "('w0', 'h', 2, 'default', 0.5, 2.0, 'stopped')",
        "UPDATE jobs SET state = 'running', locked_by = 'w1', started_at = 5.0 WHERE id = 8",
        "UPDATE jobs SET state = 'running', locked_by = 'w1', started_at = 5.0, "
        "suspended_at = 7.0 WHERE id = 10",
        "UPDATE jobs SET suspended_at = 8.0 WHERE id = 1",  # stale: a done job is not suspended
        "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, started_at, "
        "stdout_path, stderr_path) SELECT id, 1, 'w1', 1, 'running', 5.0, 'o', 'e' "
        "FROM jobs WHERE id IN (8, 10)",
        "INSERT INTO job_events (job_id, at, event, worker_id, detail) "
        "SELECT j.id, 6.0, 'orphan_unconfirmed', 'w2', "
        "json_object('attempt_id', a.id, 'pid', 77, 'reason', 'gone', 'dead_worker', 'w9') "
        "FROM jobs j JOIN attempts a ON a.job_id = j.id WHERE j.id = 8",
        "INSERT INTO job_events (job_id, at, event, worker_id, detail) VALUES "
        "(NULL, 2.0, 'waited_for_server', 'w1', "
        '\'{"waited_s": 3.5, "failed_tries": 2, "error": "down"}\')',
    )
    gpus = ", ".join(
        f'{{"uuid": "GPU-{i}", "index": {i}, "model": "Fake A100", "memory_bytes": 1024}}'
        for i in (0, 1)
    )
    inventory = f'{{"slots": 2, "memory_bytes": null, "host": "h", "devices": [{gpus}]}}'
    _tamper(  # w1 has two GPUs, job 8 holds half of one, job 11 asks for 16
        db,
        f"UPDATE workers SET inventory = '{inventory}' WHERE id = 'w1'",
        "INSERT INTO devices (uuid, host, idx, model, memory_bytes, held, seen_at) VALUES "
        "('GPU-0', 'h', 0, 'Fake A100', 1024, 360360, 1.0), "
        "('GPU-1', 'h', 1, 'Fake A100', 1024, 0, 1.0)",
        "UPDATE attempts SET host = 'h', devices = 'GPU-0' WHERE job_id = 8",
        "INSERT INTO device_holds (device_uuid, attempt_id, job_id, units, worker_id, held_at) "
        "SELECT 'GPU-0', id, 8, 360360, 'w1', 5.0 FROM attempts WHERE job_id = 8",
        "UPDATE jobs SET gpus = 16 WHERE id = 11",
    )
    return db


@pytest.fixture(scope="module")
def damaged_queue(busy_queue: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The busy queue with rows edited by hand (tests/process/test_hostile_rows.py)."""
    db = tmp_path_factory.mktemp("damaged") / "queue.db"
    shutil.copyfile(busy_queue, db)
    _tamper(
        db,
        "UPDATE jobs SET argv = 'not json' WHERE id = 1",
        "UPDATE jobs SET tags = '[\"x\"]', env = '\"PATH=/x\"' WHERE id = 2",
        "UPDATE jobs SET state = 'zombie', priority = 'high' WHERE id = 3",
        "UPDATE jobs SET created_at = 1e308, next_run_at = 'x' WHERE id = 4",
        "UPDATE job_events SET event = 'teleported', detail = '{bad' WHERE job_id = 2",
        "UPDATE attempts SET state = 'lost' WHERE job_id = 1",
        "UPDATE workers SET heartbeat_at = 'later' WHERE id = 'w1'",
    )
    return db


def _dump(db: Path) -> list[Any]:
    with sqlite3.connect(db) as conn:
        found = [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("jobs", "job_events", "attempts", "workers", "lanes", "schedules")
        ]
    conn.close()
    return found


def _read_run(
    db: Path, args: list[str], capsys: pytest.CaptureFixture[str], *, full: bool
) -> tuple[tuple[int, str, str], bool]:
    code, answered = _answer([args[0], "--db", str(db), *args[1:]], capsys, full=full)
    out, err = capsys.readouterr()
    return (code, VARYING.sub(r'"\1": "?"', out), err), answered


def _read_both(
    db: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[tuple[int, str, str], tuple[int, str, str], bool]]:
    before = _dump(db)
    for line in (args, [args[0], "--json", *args[1:]]):
        full, _ = _read_run(db, line, capsys, full=True)
        lean_run, answered = _read_run(db, line, capsys, full=False)
        yield full, lean_run, answered
    assert _dump(db) == before, "a read changed the queue"


def _ids(args: list[str]) -> str:
    return " ".join(args)[:50]


@pytest.mark.parametrize("args", READ_ANSWERED, ids=_ids)
def test_the_lean_path_reads_as_the_click_verb(
    busy_queue: Path, frozen: None, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for i, (full, lean_run, answered) in enumerate(_read_both(busy_queue, args, capsys)):
        assert answered or (args[0] == "show" and i == 0), "the lean path left its input"
        assert lean_run == full
    if args[0] != "show":
        assert full[0] == 0 and full[1], full


@pytest.mark.parametrize("columns", ["30", "40", "80", "200", "0", "x"])
@pytest.mark.parametrize("args", [["status"], ["list"], ["list", "--wide"]], ids=_ids)
def test_the_lean_path_fits_the_width_as_the_click_verb(
    busy_queue: Path,
    frozen: None,
    args: list[str],
    columns: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COLUMNS (a bad value: no limit) cuts the same cells on both paths."""
    monkeypatch.setenv("COLUMNS", columns)
    for full, lean_run, answered in _read_both(busy_queue, args, capsys):
        assert answered and lean_run == full


@pytest.mark.parametrize("args", READ_LEFT, ids=_ids)
def test_what_the_lean_path_leaves_of_a_read_is_the_click_verbs(
    busy_queue: Path, frozen: None, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for full, lean_run, answered in _read_both(busy_queue, args, capsys):
        assert not answered
        assert lean_run == full


@pytest.mark.parametrize("job_id", range(1, 11))
def test_the_lean_path_shows_every_job_as_the_click_verb(
    busy_queue: Path, frozen: None, job_id: int, capsys: pytest.CaptureFixture[str]
) -> None:
    line = ["show", "--json", str(job_id)]
    full, _ = _read_run(busy_queue, line, capsys, full=True)
    lean_run, answered = _read_run(busy_queue, line, capsys, full=False)
    assert answered and lean_run == full and full[0] == 0


@pytest.mark.parametrize(
    "args",
    [["status"], ["list"], ["list", "--state", "queued"], *(["show", str(i)] for i in range(1, 6))],
    ids=_ids,
)
def test_the_lean_path_reads_damaged_rows_as_the_click_verb(
    damaged_queue: Path, frozen: None, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for full, lean_run, _ in _read_both(damaged_queue, args, capsys):
        assert lean_run == full


def test_the_busy_queue_holds_what_the_reads_show(
    busy_queue: Path, frozen: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The differential tests above compare answers that hold something."""
    assert lean.answer(["status", "--db", str(busy_queue), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert all(data["counts"][s] for s in ("queued", "running", "done", "dead", "canceled"))
    assert data["counts"]["waiting"] == 2 and data["counts"]["failed"] == 1
    assert data["recent_dead"] and data["orphans_unconfirmed"] and data["paused_lanes"]
    (worker,) = data["workers"]
    assert worker["running_jobs"] and worker["waited_for_server"]["failed_tries"] == 2
    assert worker["suspended_jobs"] == [10] and data["suspended"] == 1
    assert data["queues"]["gpu"]["suspended"] == 1
    assert data["schedules"]["count"] == 2 and data["waiting_for_limits"]
    assert lean.answer(["list", "--db", str(busy_queue), "--json", "--waiting"]) == 0
    jobs = json.loads(capsys.readouterr().out)["data"]["jobs"]
    assert [j["after_jobs"] for j in jobs] == [[3], [2]]
    assert lean.answer(["show", "--db", str(busy_queue), "--json", "2"]) == 0
    shown = json.loads(capsys.readouterr().out)["data"]
    assert shown["attempts"][0]["signal"] == 9 and shown["dependents"] == [5]
    assert lean.answer(["list", "--db", str(busy_queue), "--json", "--state", "dead"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["jobs"][0]["attempts_total"] == 1
    assert lean.answer(["list", "--db", str(busy_queue), "--json", "--state", "running"]) == 0
    running = json.loads(capsys.readouterr().out)["data"]["jobs"]
    assert [(j["id"], j["suspended"], j["suspended_at"]) for j in running] == [
        (10, True, 7.0),
        (8, False, None),
    ]
    assert lean.answer(["list", "--db", str(busy_queue)]) == 0
    assert "suspended" in capsys.readouterr().out.splitlines()[2]
    assert lean.answer(["show", "--db", str(busy_queue), "--json", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["job"]["suspended_at"] is None
    assert data["devices"] == {"count": 2, "held": 0.5, "free": 1.5}
    assert [j["job_id"] for j in data["unplaceable"]["jobs"]] == [11]
    assert worker["inventory"]["devices"][0]["holders"][0]["job_id"] == 8
    assert [(j["id"], j["devices"]) for j in running] == [(10, []), (8, ["GPU-0"])]
    assert lean.answer(["show", "--db", str(busy_queue), "--json", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["attempts"][0]["holds"] == ["GPU-0"]
    assert lean.answer(["show", "--db", str(busy_queue), "--json", "11"]) == 0
    assert "16 GPU(s)" in json.loads(capsys.readouterr().out)["data"]["unplaceable"]


def test_a_read_of_no_queue_goes_the_full_way_which_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "none" / "queue.db"
    for verb in (["status"], ["list"], ["show", "--json", "1"]):
        assert lean.answer([verb[0], "--db", str(db), *verb[1:]]) is None
    assert not db.parent.exists(), "the lean path created something"
    assert cli.run(["status", "--db", str(db)]) == 0
    assert "NO_QUEUE" in capsys.readouterr().err


def test_a_read_of_another_revision_goes_the_full_way_which_refuses_it(
    seeded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _tamper(seeded, "UPDATE alembic_version SET version_num = '0007_containment'")
    before = seeded.read_bytes()
    for verb in (["status"], ["list"], ["show", "--json", "1"]):
        assert lean.answer([verb[0], "--db", str(seeded), "--json", *verb[1:]]) is None
    assert seeded.read_bytes() == before
    assert cli.run(["status", "--db", str(seeded), "--json"]) != 0
    assert '"SCHEMA_OUTDATED"' in capsys.readouterr().out


def test_the_light_style_writes_what_click_writes() -> None:
    import click

    from spoolctl.cli.look import COLORS, styled

    for fg in [None, *COLORS]:
        for bold in (None, True, False):
            assert styled("dead", fg=fg, bold=bold) == click.style("dead", fg=fg, bold=bold)


def test_the_request_id_is_a_random_uuid() -> None:
    import uuid

    from spoolctl.cli.reply import random_uuid_hex

    for _ in range(200):
        found = uuid.UUID(hex=random_uuid_hex())
        assert (found.version, found.variant) == (4, uuid.RFC_4122)
        assert found.hex == str(found).replace("-", "")


def _answer(line: list[str], capsys: pytest.CaptureFixture[str], *, full: bool) -> tuple[int, bool]:
    """Run one command line (output captured since a clean slate) by the
    click verb alone (full) or as `spoolctl.cli.run` does (the lean path,
    else the click verb): its exit code, and whether the lean path answered."""
    capsys.readouterr()
    if full:
        return app.run(line), False
    found = lean.answer(line)
    if found is not None:
        return found, True
    return cli.run(line), False


def test_an_unexpected_error_on_the_lean_path_is_internal_not_a_traceback(
    seeded: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(LeanQueue, "write", broken)
    code = cli.run(["add", "--db", str(seeded), "--json", "--", "true"])
    out = capsys.readouterr().out
    assert code == 3 and '"INTERNAL"' in out and "unexpected RuntimeError: a bug" in out
    with sqlite3.connect(seeded) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
    conn.close()
