"""A refused verb changes nothing: every verb, run as a real process on a file
spoolctl must not use as it is (a foreign SQLite database, a legacy database
of the original spoolctl, a queue of a newer revision), leaves every file in
the folder byte for byte as it was, and creates or removes none. The one
exception is `migrate` adopting a legacy file, which is what it is for.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spoolctl.cli.contract import verb_commands
from spoolctl.db.revision import KNOWN_REVISIONS
from tests.helpers import Result, add_job, cli
from tests.unit.test_legacy import copy_fixture

pytestmark = [pytest.mark.timeout(600), pytest.mark.subprocess]

NEWER_REVISION = "9999_from_a_newer_spoolctl"
# Arguments that make each verb reach the queue file (and return promptly).
# A verb missing here runs with none: a new verb is covered without an edit.
CASES: dict[str, list[list[str]]] = {
    "add": [["--", "true"]],
    "work": [["--once"], ["--drain"]],
    "wait": [["1", "--timeout", "0"]],
    "show": [["1"]],
    "output": [["1"]],
    "feedback": [["1"]],
    "events": [[]],
    "retry": [["1"], ["1", "--force"]],
    "cancel": [["1"], ["1", "--running", "--yes"]],
    "prune": [["--older-than", "1s", "--yes"], ["--older-than", "1s", "--dry-run"]],
    "pause": [["default"]],
    "resume": [["default"]],
    "migrate": [
        [],
        ["--status"],
        ["--history"],
        ["--sql"],
        ["--to", KNOWN_REVISIONS[0]],
        ["--downgrade", KNOWN_REVISIONS[0], "--yes"],
    ],
    "config-validate": [[]],
    "robot-docs": [["guide"]],
}
ADOPTING = ([], ["--to", KNOWN_REVISIONS[0]])


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under the folder (relative path -> sha256 of its bytes)."""
    found = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def foreign(folder: Path, *, wal: bool) -> Path:
    """An SQLite database of some other program, in the given journal mode."""
    db = folder / "queue.db"
    conn = sqlite3.connect(db)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine, not a queue')")
    conn.commit()
    conn.close()
    return db


def newer(folder: Path) -> Path:
    """A queue a newer spoolctl migrated: a revision this code does not know."""
    db = folder / "queue.db"
    add_job(db, "true")
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = ?", (NEWER_REVISION,))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


def legacy(name: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        return copy_fixture(name, folder)

    return make


FILES: dict[str, Callable[[Path], Path]] = {
    "foreign": lambda folder: foreign(folder, wal=False),
    "foreign-wal": lambda folder: foreign(folder, wal=True),
    "legacy-v1": legacy("v1-populated.db"),
    "legacy-v2": legacy("v2-populated.db"),
    "legacy-v6": legacy("v6-populated"),
    "newer": newer,
}


def invocations() -> list[tuple[str, list[str]]]:
    return [(verb, args) for verb in verb_commands() for args in CASES.get(verb, [[]])]


def run_verb(db: Path, verb: str, args: list[str]) -> Result:
    takes_db = any(p.name == "db" for p in verb_commands()[verb].params)
    env = {"SPOOLCTL_DB": str(db)}
    return cli(verb, *args, db=db if takes_db else None, env=env, json=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FILES))
def test_every_verb_leaves_a_file_it_refuses_exactly_as_it_was(kind: str, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    made = FILES[kind](source)
    spool = made.parent
    before = snapshot(spool)
    assert not [name for name in before if name.endswith(("-wal", "-shm", "-journal"))]

    def one(index_call: tuple[int, tuple[str, list[str]]]) -> tuple[str, list[str], Result, bool]:
        index, (verb, args) = index_call
        folder = shutil.copytree(spool, tmp_path / f"run-{index}")
        result = run_verb(folder / made.name, verb, args)
        unchanged = snapshot(folder) == before
        return verb, args, result, unchanged

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(one, enumerate(invocations())))
    changed = []
    for verb, args, result, unchanged in outcomes:
        assert "Traceback" not in result.stdout + result.stderr, (verb, args)
        adopting = kind.startswith("legacy") and verb == "migrate" and args in ADOPTING
        if adopting:
            assert result.exit_code == 0 and result.data["legacy_adopted"] is True, result.stdout
        elif not unchanged:
            changed.append((verb, args, result.exit_code))
    assert changed == [], f"{kind}: these verbs changed or created files: {changed}"


@pytest.mark.parametrize("wal", [False, True])
@pytest.mark.parametrize(
    "args", [["status"], ["add", "--", "true"], ["migrate"], ["work", "--once"]]
)
def test_a_foreign_database_is_named_as_such_not_sent_to_migrate(
    args: list[str], wal: bool, tmp_path: Path
) -> None:
    db = foreign(tmp_path, wal=wal)
    result = cli(*args[:1], *args[1:], db=db, json=True)
    assert result.exit_code == 3, result.stdout + result.stderr
    error = result.envelope["errors"][0]
    assert error["code"] == "DB_UNUSABLE"
    assert "not a spoolctl queue" in error["message"]
    assert "spoolctl migrate --db" not in error["message"]
    assert error["detail"]["reason"] == "not_a_queue"
    text = cli(*args, db=db)
    assert text.exit_code == 3
    assert "not a spoolctl queue" in text.stderr and "Traceback" not in text.stderr


def test_a_legacy_file_in_rollback_mode_is_not_switched_to_wal_by_a_refusal(
    tmp_path: Path,
) -> None:
    db = copy_fixture("v2-populated.db", tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    before = snapshot(db.parent)
    for args in (["add", "--", "true"], ["work", "--once"], ["status"], ["migrate", "--sql"]):
        result = cli(*args[:1], *args[1:], db=db, json=True)
        assert result.exit_code != 0 or args[0] == "migrate", (args, result.stdout)
        assert snapshot(db.parent) == before, args
    header = db.read_bytes()[18:20]
    assert header == b"\x01\x01", "the journal mode in the header changed"
    adopted = cli("migrate", db=db, json=True)
    assert adopted.exit_code == 0, adopted.stdout
    assert db.read_bytes()[18:20] == b"\x02\x02", "an adopted file is put in WAL mode"


def test_doctor_names_a_foreign_database_and_how_to_fix_it(tmp_path: Path) -> None:
    db = foreign(tmp_path, wal=False)
    before = snapshot(tmp_path)
    result = cli("doctor", db=db, json=True)
    checks = {c["id"]: c for c in result.data["checks"]}
    schema = checks["schema_version"]
    assert schema["status"] == "fail" and "not a spoolctl queue" in schema["message"]
    assert "--db" in schema["remediation"] and "migrate" not in schema["remediation"]
    assert snapshot(tmp_path) == before
