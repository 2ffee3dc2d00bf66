"""A libpq connection string as `--db` (docs/postgresql.md, connection
settings): `host=… port=… dbname=… user=… password=…` names the PostgreSQL
database and connects as the postgresql:// URL with the same parameters; it
is never taken for an SQLite file name, and its password never shows. One
that libpq cannot parse is INVALID_INPUT; without psycopg it is
EXTRA_MISSING, as a URL is. An SQLite path of that shape is written
`./host=x.db`, and its `add` never imports psycopg."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.helpers import REPO, Result, child_env, cli, cli_json, inproc, rows
from tests.pg_server import PgServer

pytestmark = pytest.mark.subprocess
Capsys = pytest.CaptureFixture[str]

SECRET = "s3§cr"
"""A password around a character no message holds: found in the output, it is the password."""


def conninfo(server: PgServer, url: str) -> str:
    """The connection string of the database of `url` on the test server."""
    database = make_url(url).database
    return (
        f"host={server.host} port={server.port} password={server.password} "
        f"dbname={database} user={server.user}"
    )


def test_a_connection_string_names_the_postgresql_queue_and_never_shows_its_password(
    pg_server: PgServer, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    given = conninfo(pg_server, pg_url)
    env = {"SPOOLCTL_SPOOL_DIR": str(tmp_path / "spool")}
    said: list[Result] = []

    added = cli_json("add", "--", "echo", "landed", db=given, env=env)
    said.append(added)
    assert added.exit_code == 0, added.stdout + added.stderr
    said.append(cli("add", "--", "true", db=given, env=env))
    assert said[-1].exit_code == 0, said[-1].stderr
    stored = rows(pg_url, "SELECT id, argv FROM jobs ORDER BY id")
    assert [(r[0], json.loads(r[1])) for r in stored] == [
        (added.data["job_id"], ["echo", "landed"]),
        (added.data["job_id"] + 1, ["true"]),
    ], "the jobs are in PostgreSQL"

    equivalent = (
        f"postgresql://{pg_server.user}:{pg_server.password}@{pg_server.host}:"
        f"{pg_server.port}/{make_url(pg_url).database}"
    )
    shown = cli_json("config-show", db=equivalent, env=env).data["values"]["db_path"]
    for verb in ("status", "doctor", "config-show", "list"):
        as_json = cli_json(verb, db=given, env=env)
        said += [as_json, cli(verb, db=given, env=env)]
        assert as_json.envelope["ok"] is True, (verb, as_json.stdout, as_json.stderr)
    status, doctor, config, listed = (said[i].data for i in (2, 4, 6, 8))
    assert status["counts"]["queued"] == 2 and listed["count"] == 2
    checks = {c["id"]: c["status"] for c in doctor["checks"]}
    assert checks["database_connect"] == checks["database_writable"] == "pass", doctor
    assert config["values"]["db_path"] == doctor["config"]["db_path"] == shown, (
        "shown as the equivalent URL, password masked"
    )
    assert "***" in shown
    for result in said:
        assert pg_server.password not in result.stdout + result.stderr, result.stdout
    assert list(cwd.iterdir()) == [], "nothing was created in the working directory"


GARBLED = [
    f"host=h password={SECRET} dbname=q bogus=1",  # an option libpq does not know
    f"host=h password=se {SECRET} dbname=q",  # a space in a value, not quoted
    f"host=h password='{SECRET} dbname=q",  # a quote never closed
    f"host=h user=u password={SECRET}",  # no database
    f"host=h port=54x password={SECRET} dbname=q",
    f"host=h1,h2,h3 port=1,2 password={SECRET} dbname=q",
    f"dbname=q sslpassword={SECRET} hots=h",
]


@pytest.mark.parametrize("value", GARBLED)
def test_a_connection_string_libpq_cannot_use_is_invalid_input_and_creates_nothing(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    added = inproc("add", "--json", "--db", value, "--", "true", capsys=capsys)
    error = added.envelope["errors"][0]
    assert (added.exit_code, error["code"]) == (1, "INVALID_INPUT"), error
    for verb in ("status", "doctor", "config-show"):
        for as_json in ([], ["--json"]):
            shown = inproc(verb, *as_json, "--db", value, capsys=capsys)
            assert "§" not in shown.stdout + shown.stderr, (verb, shown.stdout, shown.stderr)
    assert "§" not in added.stdout + added.stderr
    assert list(tmp_path.iterdir()) == [], "a connection string became a file"


def test_without_psycopg_a_connection_string_is_extra_missing(tmp_path: Path) -> None:
    blocker = tmp_path / "hide"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['psycopg'] = None\n")
    env = child_env({"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for value in (
        f"host=localhost password={SECRET} dbname=q user=u",
        f"postgresql://u:{SECRET}@h1:5432,h2:5432/q?target_session_attrs=read-write",
    ):
        for verb in (["add", "--json", "--db", value, "--", "true"], ["status", "--db", value]):
            proc = subprocess.run(
                [sys.executable, "-m", "spoolctl", *verb],
                capture_output=True,
                text=True,
                env=env,
                cwd=cwd,
                timeout=60,
            )
            assert proc.returncode == 3, (verb, proc.stdout, proc.stderr)
            assert "EXTRA_MISSING" in proc.stdout + proc.stderr
            assert "§" not in proc.stdout + proc.stderr
    assert list(cwd.iterdir()) == []


def test_an_sqlite_path_shaped_like_one_is_written_with_dot_slash(tmp_path: Path) -> None:
    """`./host=x.db` is a file, and its `add` (the hot path) loads neither
    psycopg nor the PostgreSQL driver."""
    listing = tmp_path / "modules.json"
    script = (
        "import sys, json\nfrom spoolctl.cli import run\n"
        "code = run(['add', '--json', '--db', './host=x.db', '--', 'true'])\n"
        f"open({str(listing)!r}, 'w').write(json.dumps(sorted(sys.modules)))\nsys.exit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "host=x.db").is_file()
    loaded = set(json.loads(listing.read_text()))
    assert not any(m.split(".")[0] == "psycopg" for m in loaded)
    assert "spoolctl.db.backends.postgresql" not in loaded
