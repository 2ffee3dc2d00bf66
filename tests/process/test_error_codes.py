"""INTERNAL means a bug, and only that (docs/json-contract.md, Error codes).

Every error path the code raises is walked in its source: each raise names
a SpoolError whose code is not INTERNAL, or is in ALLOWED with why it can
never reach a user as INTERNAL. Then each case that used to be answered as
a bug is run for real and gets its documented code: a database that cannot
be used is DB_UNUSABLE with its reason, a server that does not answer is
UNREACHABLE, a missing extra is EXTRA_MISSING."""

from __future__ import annotations

import ast
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

import spoolctl
from spoolctl import errors
from spoolctl.errors import install_command
from tests.helpers import REPO, Result, add, child_env, cli_json

pytestmark = pytest.mark.subprocess

PACKAGE = Path(spoolctl.__file__).parent
ALLOWED: dict[tuple[str, str], str] = {
    ("db/tables.py", "AttributeError"): "module __getattr__: Python's protocol for a missing name",
    ("db/backends/postgresql/errors.py", "DBAPIError"): "wraps psycopg's own error to translate it",
    ("db/backends/postgresql/errors.py", "translated"): "returns the translated public error",
    ("db/codec.py", "DamagedValue"): "caught by every reader of a stored value (hostile rows)",
    ("db/backends/sqlite/engine.py", "RevisionMismatch"): "caught by Queue: the public error",
    ("db/backends/postgresql/begin.py", "RevisionMismatch"): "caught by Queue: the public error",
    ("db/backends/postgresql/limits.py", "ValueError"): (
        "guards inlining the SQL of our own durations (f'{n}ms'): no user value reaches it"
    ),
    ("resources.py", "BadRequest"): (
        "caught by services/job_spec.py's gpus_kept: INVALID_INPUT naming --gpus"
    ),
    ("cli/options.py", "NotImplementedError"): "the abstract check of a parameter type",
    ("cli/options.py", "SpoolUsage"): "carries one of our errors through click's parser",
    ("cli/contract.py", "click.BadParameter"): "click's parse error: an input error",
    ("db/outage.py", "StopRequested"): "a stop signal: its callers end as on a signal (exit 0)",
    ("runner/wakeup.py", "StopRequested"): "a stop signal: its callers end as on a signal (exit 0)",
    ("web/actions.py", "Refused"): "the dashboard's HTTP refusal of an action (a 4xx page)",
    ("web/app.py", "Refused"): "the dashboard's HTTP refusal of an action (a 4xx page)",
    ("runner/capacity.py", "ValueError"): (
        "a worker built with no slot: --concurrency is checked first, so no user value reaches it"
    ),
    ("runner/capacity.py", "NoPlace"): (
        "a place given past the worker's slots: the claim takes only what fits, so a bug"
    ),
    ("cli/job_flags.py", "AssertionError"): (
        "guards the declaration of a job's attributes as the CLI is built: no user value reaches it"
    ),
    ("services/job_spec.py", "AssertionError"): (
        "guards the declaration of a job's attributes: a field read by hand has no batch reader"
    ),
    ("services/update.py", "AssertionError"): (
        "guards the columns `update` sets: cli/update.py passes only its declared ones"
    ),
    ("db/lean.py", "Unanswered"): (
        "the lean path declines: cli/lean_add.py and cli/lean_read.py catch it, and the click "
        "verb answers in the contract's words"
    ),
    ("cli/lean_read.py", "Unanswered"): (
        "the lean path declines: caught in the same module, and the click verb answers"
    ),
    ("cli/lean_add.py", "AssertionError"): (
        "guards the declaration: only the flags that take a value are read by value"
    ),
    ("runner/spawn.py", "_named"): "Popen's OSError for a program that cannot run: the attempt's "
    "spawn_failed outcome (runner/supervise.py), never a verb's error",
}


def raise_sites() -> list[tuple[str, str, int]]:
    """(module path, raised name, line) of every `raise X` in the package;
    both names of a `raise A if ... else B`."""
    sites = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                module = str(path.relative_to(PACKAGE))
                sites += [(module, name, node.lineno) for name in raised_names(node.exc)]
    return sites


def raised_names(exc: ast.expr) -> list[str]:
    if isinstance(exc, ast.IfExp):
        return raised_names(exc.body) + raised_names(exc.orelse)
    target = exc.func if isinstance(exc, ast.Call) else exc
    return [ast.unparse(target)]


def error_factories() -> dict[str, type[errors.SpoolError]]:
    """Functions of the package that return one of our errors (by their
    return annotation): raising what they return raises that class."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.returns is not None:
                returned = getattr(errors, ast.unparse(node.returns), None)
                if isinstance(returned, type) and issubclass(returned, errors.SpoolError):
                    found[node.name] = returned
    return found


def test_every_raise_names_a_documented_code_or_a_reason() -> None:
    unexplained = []
    used: set[tuple[str, str]] = set()
    factories = error_factories()
    for module, name, line in raise_sites():
        found = getattr(errors, name, None) or factories.get(name.rsplit(".", 1)[-1])
        if (module, name) in ALLOWED:
            used.add((module, name))
            continue
        if isinstance(found, type) and issubclass(found, errors.SpoolError):
            if found.code == "INTERNAL" and found is not engine_signal():
                unexplained.append(f"{module}:{line} raises {name}, which is INTERNAL")
            continue
        unexplained.append(f"{module}:{line} raises {name}: not a SpoolError with its own code")
    assert unexplained == []
    assert sorted(set(ALLOWED) - used) == [], "stale entries in ALLOWED"


def engine_signal() -> type[errors.SpoolError]:
    from spoolctl.db.engine import RevisionMismatch

    return RevisionMismatch


def test_internal_is_made_only_by_the_catch_all() -> None:
    """Internal(...) appears once: the last resort in cli.run."""
    made = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "Internal":
                made.append(str(path.relative_to(PACKAGE)))
    assert made == ["cli/__init__.py"]


def test_every_published_code_but_internal_has_its_own_class() -> None:
    classes = [cls for cls in errors.ERROR_CLASSES if cls.code != "INTERNAL"]
    assert len({cls.code for cls in classes}) == len(classes)
    codes = [cls.code for cls in errors.ERROR_CLASSES]
    assert codes[-3:] == ["DB_UNUSABLE", "UNREACHABLE", "EXTRA_MISSING"], "appended, not inserted"
    assert [errors.ERROR_CODES[c] for c in codes[-3:]] == [3, 4, 3]


def unusable(result: Result, reason: str) -> dict[str, Any]:
    assert result.exit_code == 3, result.stdout + result.stderr
    (error,) = result.envelope["errors"]
    assert (error["code"], error["detail"]["reason"]) == ("DB_UNUSABLE", reason), error
    assert "report this as a bug" not in error["remediation"]
    return dict(error)


def a_queue(tmp_path: Path) -> Path:
    db = tmp_path / "spool" / "queue.db"
    add(db, "true")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


@pytest.mark.parametrize("verb", [["status"], ["add", "--", "true"], ["migrate", "--status"]])
def test_random_bytes_and_a_truncated_queue_are_damaged(tmp_path: Path, verb: list[str]) -> None:
    noise = tmp_path / "noise.db"
    noise.write_bytes(os.urandom(8192))
    truncated = a_queue(tmp_path)
    with open(truncated, "r+b") as handle:
        handle.truncate(truncated.stat().st_size // 2)
    for db in (noise, truncated):
        before = db.read_bytes()
        error = unusable(cli_json(*verb, db=db), "damaged")
        assert str(db) in error["message"]
        assert db.read_bytes() == before


def test_an_sqlite_file_of_another_program_is_not_a_queue(tmp_path: Path) -> None:
    other = tmp_path / "notes.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    for verb in (["list"], ["work", "--once"], ["migrate"]):
        unusable(cli_json(*verb, db=other), "not_a_queue")


def as_nobody() -> list[str]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test runs as root (as CI does), to drop to user nobody with setpriv")
    nobody = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def test_a_queue_this_user_cannot_read_is_unreadable_with_a_hint(tmp_path: Path) -> None:
    db = a_queue(tmp_path)
    db.parent.chmod(0o700)
    os.chmod(tmp_path, 0o755)
    argv = [*as_nobody(), sys.executable, "-m", "spoolctl", "add", "--json", "--db", str(db)]
    proc = subprocess.run(
        [*argv, "--", "true"], capture_output=True, text=True, env=child_env(), cwd="/", timeout=60
    )
    error = unusable(Result(proc.returncode, proc.stdout, proc.stderr), "unreadable")
    assert "permissions" in error["remediation"]


def test_doctor_without_the_postgresql_extra_and_a_url_names_the_install(tmp_path: Path) -> None:
    """psycopg is hidden from the process: the URL is EXTRA_MISSING, with the
    command that installs it."""
    blocker = tmp_path / "hide"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['psycopg'] = None\nsys.modules['starlette'] = None\n"
    )
    env = child_env({"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"})
    for args, extra in (
        (["status", "--json", "--db", "postgresql://u@localhost/q"], "postgresql"),
        (["add", "--json", "--db", "postgresql://u@localhost/q", "--", "true"], "postgresql"),
        (["web", "--json", "--db", str(tmp_path / "q.db")], "web"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "spoolctl", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        (error,) = Result(proc.returncode, proc.stdout, proc.stderr).envelope["errors"]
        assert (proc.returncode, error["code"]) == (3, "EXTRA_MISSING"), error
        assert error["detail"]["install"] == install_command(extra)  # this environment's
        assert install_command(extra) in error["message"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_that_does_not_answer_is_unreachable() -> None:
    url = f"postgresql://spool:pw@127.0.0.1:{closed_port()}/queue"
    for verb in (["status"], ["add", "--", "true"]):
        result = cli_json(*verb, db=url)
        (error,) = result.envelope["errors"]
        assert (result.exit_code, error["code"]) == (4, "UNREACHABLE"), error
        assert "BUSY_TIMEOUT" not in error["remediation"]


def test_a_refused_login_a_missing_database_and_a_foreign_one(pg_server: Any, pg_url: str) -> None:
    wrong = make_url(pg_url).set(password="wr0ng-pw").render_as_string(hide_password=False)
    error = unusable(cli_json("status", db=wrong), "login_refused")
    assert "wr0ng-pw" not in str(error)
    missing = make_url(pg_url).set(database="no_such_queue_db")
    unusable(cli_json("add", "--", "true", db=missing.render_as_string(False)), "no_such_database")
    foreign = make_url(pg_url).database
    with pg_server.connect(foreign, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    for verb in (["status"], ["add", "--", "true"], ["migrate"]):
        unusable(cli_json(*verb, db=pg_url), "not_a_queue")
    with pg_server.connect(foreign) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert [row[0] for row in tables] == ["invoices"], "a foreign database was changed"
