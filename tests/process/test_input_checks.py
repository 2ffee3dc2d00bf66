"""Input that looked valid and was not: each is refused with its documented
code and changes nothing, whichever way it comes in (the command line, an
`add --batch` line, the environment, a config file, the dashboard).

- `metrics --output` writes only a new file or a text file such as an earlier
  exposition: never through a symbolic link, onto a folder, device, FIFO or
  socket, into the queue's spool folder, or over a file that is not text.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from spoolctl import layout
from spoolctl.cli.batch import BATCH_LINE_MAX
from spoolctl.cli.contract import verb_commands
from spoolctl.db.revision import HEAD_REVISION, KNOWN_REVISIONS
from tests.helpers import REPO, Result, add_job, child_env, rows
from tests.populated import run_quiet, takes_db
from tests.process.test_totality import BOUNDS, sample
from tests.process.test_web import client_for

pytestmark = pytest.mark.subprocess  # the batch reader is fed from a real process


def fingerprint(path: Path) -> tuple[Any, ...]:
    """What a path is, without following it: its inode and type, and what it
    holds (a file's bytes, a folder's names, a link's target)."""
    found = os.lstat(path)
    if stat.S_ISREG(found.st_mode):
        held: Any = path.read_bytes()
    elif stat.S_ISDIR(found.st_mode):
        held = sorted(os.listdir(path))
    elif stat.S_ISLNK(found.st_mode):
        held = os.readlink(path)
    else:
        held = None
    return found.st_ino, stat.S_IFMT(found.st_mode), found.st_rdev, held


def refused_output(db: Path, target: Path) -> dict[str, Any]:
    """`metrics --output target`: INVALID_INPUT, exit 1, and target as it was."""
    existed = os.path.lexists(target)
    before = fingerprint(target) if existed else None
    beside = sorted(os.listdir(target.parent)) if target.parent.is_dir() else None
    result = run_quiet("metrics", "--db", str(db), "--output", str(target), "--json")
    assert result.exit_code == 1, (target, result.stdout)
    error: dict[str, Any] = result.envelope["errors"][0]
    assert error["code"] == "INVALID_INPUT" and error["detail"]["flag"] == "--output", error
    if existed:
        assert fingerprint(target) == before, target
    else:
        assert not os.path.lexists(target), target
    if beside is not None:
        assert sorted(os.listdir(target.parent)) == beside, "no temporary file either"
    return error


EXPOSITION = "# HELP spoolctl_jobs Jobs.\n# TYPE spoolctl_jobs gauge\nspoolctl_jobs 1.0\n"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a unix socket's path has at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="spool-", dir="/tmp"))
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def test_metrics_output_never_replaces_what_is_not_a_metrics_file(
    db: Path, tmp_path: Path, short_dir: Path
) -> None:
    add_job(db, "true")
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.prom"
    folder.mkdir()
    (folder / "inside").write_text("kept\n")
    earlier = tmp_path / "real.prom"
    earlier.write_text(EXPOSITION)
    link = tmp_path / "link.prom"
    link.symlink_to(earlier)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    alias = tmp_path / "alias.prom"
    os.link(db, alias)  # the queue file under a name outside its spool folder
    sock = short_dir / "s.prom"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    try:
        refusals = [
            (fifo, "not_a_regular_file"),
            (folder, "not_a_regular_file"),
            (db.parent, "not_a_regular_file"),
            (sock, "not_a_regular_file"),
            (link, "symlink"),
            (db, "inside_spool"),
            (db.parent / "queue.db-wal", "inside_spool"),
            (db.parent / "queue.db-shm", "inside_spool"),
            (db.parent / "queue.db-journal", "inside_spool"),
            (db.parent / "output" / "x.prom", "inside_spool"),
            (other, "not_a_metrics_file"),
            (alias, "not_a_metrics_file"),
        ]
        for target, reason in refusals:
            assert refused_output(db, target)["detail"]["reason"] == reason, target
    finally:
        listener.close()
    assert fingerprint(earlier)[3] == EXPOSITION.encode()
    listed = run_quiet("list", "--db", str(db), "--json")
    assert listed.envelope["data"]["count"] == 1, "the queue is whole"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a device node")
def test_metrics_output_never_replaces_a_device(db: Path, tmp_path: Path) -> None:
    """As root a rename replaced /dev/null itself; a null device of the
    test's own stands in for it."""
    add_job(db, "true")
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert refused_output(db, device)["detail"]["reason"] == "not_a_regular_file"
    assert stat.S_ISCHR(os.lstat(device).st_mode)


def test_metrics_output_replaces_an_earlier_exposition_and_makes_a_new_file(
    db: Path, tmp_path: Path
) -> None:
    add_job(db, "true")
    earlier = tmp_path / "spoolctl.prom"
    earlier.write_text(EXPOSITION)
    beside_the_queue = db.parent / "spoolctl.prom"  # `--db ./queue.db --output ./x.prom`
    for target in (earlier, tmp_path / "new.prom", beside_the_queue):
        result = run_quiet("metrics", "--db", str(db), "--output", str(target), "--json")
        assert result.exit_code == 0, result.stdout
        assert 'spoolctl_jobs{queue="default",state="queued"} 1.0' in target.read_text()


# -- add --batch: no line is held whole past its limit -----------------------------


def job_count(db: Path) -> int:
    listed = run_quiet("list", "--db", str(db), "--json", "--limit", "0")
    return int(listed.envelope["data"]["count"])


PEAK_OF_CHILD = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "sys.stderr.write(f'peak_rss_kib={usage.ru_maxrss}')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)
"""Run a command and write its peak RSS (kernel accounting) to stderr last.
A process's peak counts the memory of whoever forked it (Linux carries the
high-water mark of the forked image across exec), so the command is started
from this small interpreter, not from the test process, whose memory grows
with every test before it."""


def test_a_batch_of_endless_input_without_a_newline_is_refused_in_bounded_memory(
    db: Path,
) -> None:
    """256 MiB of NUL bytes without a newline: the reader stops at the limit
    of one line (it read all of it before, several times its size in
    memory); its peak memory, measured by the kernel for this child alone,
    stays far below the input. Nothing is queued, not even the valid line
    before it."""
    add_job(db, "true")
    argv = [sys.executable, "-m", "spoolctl", "add", "--db", str(db), "--json", "--batch", "-"]
    proc = subprocess.Popen(
        [sys.executable, "-c", PEAK_OF_CHILD, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    chunk = bytes(1 << 20)
    try:
        proc.stdin.write(b'{"argv": ["true"]}\n')
        for _ in range(256):
            proc.stdin.write(chunk)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it stopped reading: what is asked of it
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.wait() == 1, (out, err)
    peak_kib = int(err.rsplit(b"peak_rss_kib=", 1)[1])
    (error,) = json.loads(out)["errors"]
    assert error["code"] == "INVALID_INPUT" and error["detail"]["line"] == 2, error
    assert f"batch line 2: the line is longer than {BATCH_LINE_MAX} characters" == error["message"]
    assert peak_kib * 1024 < 200 * 1024 * 1024, f"peak RSS {peak_kib} KiB"
    assert job_count(db) == 1


def test_a_batch_line_may_be_as_long_as_the_limit_and_no_longer(db: Path, tmp_path: Path) -> None:
    add_job(db, "true")
    head = '{"argv": ["true"]'
    exact = head + " " * (BATCH_LINE_MAX - len(head) - 1) + "}"
    assert len(exact) == BATCH_LINE_MAX
    batch = tmp_path / "jobs.ndjson"
    batch.write_text(exact + "\n" + exact)
    accepted = run_quiet("add", "--db", str(db), "--json", "--batch", str(batch))
    assert accepted.exit_code == 0 and accepted.envelope["data"]["count"] == 2, accepted.stdout
    batch.write_text(exact + "\n" + exact + " \n" + exact + "\n")
    refused = run_quiet("add", "--db", str(db), "--json", "--batch", str(batch))
    assert refused.exit_code == 1, refused.stdout
    (error,) = refused.envelope["errors"]
    assert error["code"] == "INVALID_INPUT" and error["detail"]["line"] == 2, error
    assert "longer than" in error["message"]
    assert job_count(db) == 3


# -- a queue name is the whole text: `$` also matched before a final newline ---------

NEWLINED = "lane\n"


def lanes(db: Path) -> list[Any]:
    return [tuple(r) for r in rows(db, "SELECT * FROM lanes ORDER BY queue")]


def refused_input(result: Result) -> dict[str, Any]:
    assert result.exit_code == 1, result.stdout + result.stderr
    (error,) = result.envelope["errors"]
    assert error["code"] == "INVALID_INPUT", error
    return dict(error)


def test_a_queue_name_ending_in_a_newline_is_refused_everywhere(db: Path, tmp_path: Path) -> None:
    add_job(db, "true")
    before = (job_count(db), lanes(db))
    q = ["--db", str(db), "--json"]
    for args in (
        ["add", *q, "--queue", NEWLINED, "--", "true"],
        ["pause", *q, NEWLINED],
        ["resume", *q, NEWLINED],
        ["schedule", "add", *q, NEWLINED, "--every", "1h", "--", "true"],
        ["list", *q, "--queue", NEWLINED],
    ):
        refused_input(run_quiet(*args))
    batch = tmp_path / "jobs.ndjson"
    batch.write_text(json.dumps({"argv": ["true"], "queue": NEWLINED}) + "\n")
    error = refused_input(run_quiet("add", "--db", str(db), "--json", "--batch", str(batch)))
    assert error["message"].startswith("batch line 1: queue must be"), error
    assert (job_count(db), lanes(db)) == before
    assert rows(db, "SELECT count(*) FROM schedules")[0][0] == 0


def test_the_dashboard_refuses_a_lane_name_ending_in_a_newline(db: Path) -> None:
    add_job(db, "true")
    before = lanes(db)
    with client_for(db, actions=True) as client:
        page = client.get("/").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        for action in ("pause", "resume"):
            answer = client.post(f"/lanes/lane%0A/{action}", data={"csrf": csrf.group(1)})
            assert answer.status_code == 400, (action, answer.text)
        assert client.post("/lanes/lane/pause", data={"csrf": csrf.group(1)}).status_code == 303
    assert [r[0] for r in lanes(db)] == [*(r[0] for r in before), "lane"]


# -- SPOOLCTL_AUTO_MIGRATE takes 1 or 0, and nothing else silently -----------------


NEEDED = {"prune": ["--yes"], "schedule add": ["--every", "1h"], "update": ["--priority", "1"]}
"""So that the verb gets past its own checks to the queue."""
ARGUMENTS = {"copy-to": ["postgresql://u@127.0.0.1:1/none"]}
"""Where a valid sample of the totality tests is not valid for the verb."""


def verb_line(verb: str, db: Path) -> list[str]:
    """The verb with --db, --json, whatever bounds it to no wait, and a valid
    value for each required option and argument (as the totality tests build it)."""
    command = verb_commands()[verb]
    args = [*verb.split(), "--db", str(db), "--json", *BOUNDS.get(verb, [])]
    args += NEEDED.get(verb, [])
    args += [
        w for p in command.params if p.required and isinstance(p, click.Option) for w in sample(p)
    ]
    given = [w for p in command.params if isinstance(p, click.Argument) for w in sample(p)]
    return [*args, "--", *ARGUMENTS.get(verb, given)]


@pytest.mark.parametrize("value", ["true", "yes", " 1", "2"])
def test_an_auto_migrate_value_but_0_or_1_is_refused_by_every_verb_that_reads_it(
    db: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    add_job(db, "true")
    before = [tuple(r) for r in rows(db, "SELECT * FROM jobs")]
    monkeypatch.setenv("SPOOLCTL_AUTO_MIGRATE", value)
    readers = [v for v in verb_commands() if takes_db(v) and v not in ("web", "doctor")]
    for verb in readers:
        error = refused_input(run_quiet(*verb_line(verb, db)))
        assert "SPOOLCTL_AUTO_MIGRATE must be 1" in error["message"], (verb, error)
    doctor = run_quiet("doctor", "--db", str(db), "--json")
    assert doctor.exit_code == 3, doctor.stdout
    (env,) = [c for c in doctor.envelope["data"]["checks"] if c["id"] == "env_valid"]
    assert env["status"] == "fail" and "SPOOLCTL_AUTO_MIGRATE" in env["message"]
    assert [tuple(r) for r in rows(db, "SELECT * FROM jobs")] == before


def test_auto_migrate_0_and_unset_refuse_an_outdated_queue_and_1_upgrades_it(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_job(db, "true")
    old = KNOWN_REVISIONS[0]
    down = run_quiet("migrate", "--db", str(db), "--downgrade", old, "--yes", "--no-backup")
    assert down.exit_code == 0, down.stdout + down.stderr
    for value in ("0", "", "true"):
        monkeypatch.setenv("SPOOLCTL_AUTO_MIGRATE", value)
        status = run_quiet("status", "--db", str(db), "--json")
        code = "INVALID_INPUT" if value == "true" else "SCHEMA_OUTDATED"
        assert status.envelope["errors"][0]["code"] == code, (value, status.stdout)
        assert rows(db, "SELECT version_num FROM alembic_version")[0][0] == old
    monkeypatch.setenv("SPOOLCTL_AUTO_MIGRATE", "1")
    assert run_quiet("status", "--db", str(db), "--json").exit_code == 0
    assert rows(db, "SELECT version_num FROM alembic_version")[0][0] == HEAD_REVISION


# -- config-validate refuses the db_path every verb refuses --------------------------

SECRET = "pw-Zq9x"
BAD_DB_PATHS = [
    "a\u0000b",  # "\u0000" in the file: a NUL escape
    "\ud800",  # a lone surrogate: no byte stands behind it
    f"postgresql:/u:{SECRET}@h/db",
    f"mysql://u:{SECRET}@h/db",
    f" postgresql://u:{SECRET}@127.0.0.1:1/db",
    f"postgresql://u:{SECRET}@127.0.0.1:1x/db",
    "..",  # relative to the file's folder: a folder, never a queue file
]


@pytest.mark.parametrize("db_path", BAD_DB_PATHS, ids=range(len(BAD_DB_PATHS)))
def test_config_validate_refuses_a_db_path_that_every_verb_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_path: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    config = tmp_path / ".spoolctl" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"version": 1, "db_path": db_path}))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for args in (
        ["config-validate"],
        ["config-validate", str(config)],
        ["add", "--", "true"],
        ["status"],
        ["config-show"],
    ):
        result = run_quiet(args[0], "--json", *args[1:])
        error = refused_input(result)
        assert SECRET not in result.stdout + result.stderr, args
        assert str(config) in error["message"], (args, error)
    text = run_quiet("config-validate")
    assert text.exit_code == 1 and "Traceback" not in text.stderr, text.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "nothing was created"


def test_config_validate_passes_what_the_verbs_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    config = tmp_path / ".spoolctl" / "config.json"
    config.parent.mkdir()
    for db_path in ("queue.db", "sqlite:///queue.db", "postgresql://u@127.0.0.1:1/db"):
        config.write_text(json.dumps({"version": 1, "db_path": db_path}))
        result = run_quiet("config-validate", "--json")
        assert result.exit_code == 0 and result.envelope["data"]["valid"], result.stdout
        shown = run_quiet("config-show", "--json")
        assert shown.exit_code == 0 and shown.envelope["data"]["sources"]["db_path"] == "config"


# -- numbers are ASCII digits: int() and float() read other scripts' digits too ------

OTHER_DIGITS = ["\u0663", "\uff13", "\u0969", "1_0"]
"""3 in Arabic-Indic and fullwidth digits, in Devanagari, and an underscore
(int() reads them all: `cancel ٣` canceled job 3)."""


def all_jobs(db: Path) -> list[Any]:
    return [tuple(r) for r in rows(db, "SELECT * FROM jobs ORDER BY id")]


def test_job_ids_in_other_digits_are_refused_and_change_nothing(db: Path) -> None:
    for _ in range(3):
        add_job(db, "true")
    before = all_jobs(db)
    for digits in OTHER_DIGITS:
        for verb in ("cancel", "show", "retry"):
            error = refused_input(run_quiet(verb, "--db", str(db), "--json", digits))
            assert "digits 0-9" in error["message"], (verb, error)
    assert all_jobs(db) == before
    assert run_quiet("cancel", "--db", str(db), "--json", "3").exit_code == 0
    canceled = all_jobs(db)
    for digits in OTHER_DIGITS:
        refused_input(run_quiet("retry", "--db", str(db), "--json", digits))
    assert all_jobs(db) == canceled
    assert run_quiet("show", "--db", str(db), "--json", " 3 ").exit_code == 0, "ASCII is taken"


def test_every_number_parser_takes_ascii_digits_only(db: Path, tmp_path: Path) -> None:
    add_job(db, "true")
    before = all_jobs(db)
    q = ["--db", str(db), "--json"]
    three = "\uff13"
    for args in (
        ["add", *q, "--priority", three, "--", "true"],
        ["add", *q, "--max-retries", three, "--", "true"],
        ["add", *q, "--timeout", three, "--", "true"],
        ["add", *q, "--cpus", three, "--", "true"],
        ["add", *q, "--at", three, "--", "true"],
        ["add", *q, "--after-job", "\u0661", "--", "true"],
        ["list", *q, "--limit", three],
        ["events", *q, "--since-id", three],
        ["wait", *q, "--timeout", "0", "--poll-interval", three, "1"],
        ["output", *q, "1", "--attempt", "\u0661"],
    ):
        refused_input(run_quiet(*args))
    batch = tmp_path / "jobs.ndjson"
    for line in (
        {"argv": ["true"], "priority": three},
        {"argv": ["true"], "timeout": three},
        {"argv": ["true"], "cpus": three},
        {"argv": ["true"], "at": three},
    ):
        batch.write_text(json.dumps(line) + "\n")
        refused_input(run_quiet("add", *q, "--batch", str(batch)))
    batch.write_text(
        '{"argv": ["true"]}\n' + json.dumps({"argv": ["true"], "after_jobs": ["@\u0661"]}) + "\n"
    )
    error = refused_input(run_quiet("add", *q, "--batch", str(batch)))
    assert error["message"].startswith("batch line 2: after_jobs items are"), error
    assert all_jobs(db) == before


def test_the_environment_takes_ascii_digits_only(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_job(db, "true")
    before = all_jobs(db)
    for digits in OTHER_DIGITS:
        monkeypatch.setenv("SPOOLCTL_BUSY_TIMEOUT", digits)
        error = refused_input(run_quiet("add", "--db", str(db), "--json", "--", "true"))
        assert "SPOOLCTL_BUSY_TIMEOUT" in error["message"], error
    assert all_jobs(db) == before


def test_an_output_file_named_in_other_digits_belongs_to_no_job() -> None:
    assert layout.job_of("3.1.stdout") == 3
    for digits in OTHER_DIGITS:
        assert layout.job_of(f"{digits}.1.stdout") is None
        assert layout.job_of(f"3.{digits}.stderr") is None


def test_the_dashboard_takes_ascii_job_ids_only(db: Path) -> None:
    add_job(db, "true")
    before = all_jobs(db)
    arabic_one = "%D9%A1"  # ١, as a browser sends it
    with client_for(db, actions=True) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/").text)
        assert csrf is not None
        assert client.get(f"/jobs/{arabic_one}").status_code == 400
        assert client.get(f"/events?job={arabic_one}").status_code == 400
        for action in ("cancel", "retry"):
            answer = client.post(f"/jobs/{arabic_one}/{action}", data={"csrf": csrf.group(1)})
            assert answer.status_code == 400, (action, answer.text)
        assert client.get("/jobs/1").status_code == 200
    assert all_jobs(db) == before


# -- the lease guard carries the worker's command line, as docs/security.md says -----

GUARDED = """
import sys
from spoolctl.runner.lease_guard import LeaseGuard
guard = LeaseGuard(3600.0)
print(guard.pid, flush=True)
sys.stdin.read()
guard.close()
"""


def test_the_lease_guard_shows_the_workers_command_line_password_included() -> None:
    """A fork keeps its parent's argv: the guard's /proc/PID/cmdline holds a
    password given in --db as the worker's does, and the security page says
    so, with the ways to keep it out of the URL."""
    url = f"postgresql://spool:{SECRET}@db.example/spool"
    argv = [sys.executable, "-c", GUARDED, "work", "--db", url]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env()
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        guard = int(proc.stdout.readline())
        worker_line = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        guard_line = Path(f"/proc/{guard}/cmdline").read_bytes()
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert guard_line == worker_line and SECRET.encode() in guard_line
    page = (REPO / "docs" / "security.md").read_text()
    section = page.split("**Passwords in command lines.**", 1)[1].split("\n- **", 1)[0]
    for words in (
        "lease guard",
        "/proc/PID/cmdline",
        "PGPASSFILE",
        "passfile=",
        "db_path",
        "SPOOLCTL_DB",
        "every job",
    ):
        assert words in " ".join(section.split()), words
