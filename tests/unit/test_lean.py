"""The lean path of `add` (`cli/lean.py`): its SQL is what SQLAlchemy
compiles from the tables today, and it answers every input exactly as the
click verb does: the same rows, the same events, the same envelope and text,
byte for byte (the request id, its time and the elapsed milliseconds of an
envelope aside), or it leaves the input to the click verb having written
nothing. In-process, on SQLite (the lean path's one backend)."""

from __future__ import annotations

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
    ["--cwd", "rel/dir", "--", "pwd"],
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
            assert (compiled.sql, compiled.order) == (sql, order), name
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
    line = ["add", "--db", str(path), *args]
    capsys.readouterr()
    answered = False
    if full:
        code = app.run(line)
    else:
        found = lean.answer(line)
        answered = found is not None
        code = found if found is not None else cli.run(line)
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
