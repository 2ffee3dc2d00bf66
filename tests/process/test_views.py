"""Views that fit, through the real CLI: `list`, `status`, `workers` and
`schedule list` fit COLUMNS (or the terminal's width) with their free-text
cells cut by `…`, `--wide` and a pipe without COLUMNS show every cell whole,
headings sit over their columns with colour on, NO_COLOR turns colour off,
and `show` prints what the job's state makes meaningful."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import unicodedata
from pathlib import Path

import pytest

from tests.helpers import Result, child_env, cli

pytestmark = [pytest.mark.timeout(120), pytest.mark.subprocess]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
WORDS = "a fairly long command line that goes on and on "
LONG = "echo " + WORDS * 4
LANE = "a-lane-name-long-enough-to-be-cut-somewhere"
REASON = "waiting for the storage team to finish moving the build cache to new disks"
VIEWS = (["list"], ["status"], ["workers", "--all"], ["schedule", "list"])


def shown(*args: str, db: Path, env: dict[str, str] | None = None) -> Result:
    """A view's answer (`--db` last: `schedule list` is two words)."""
    return cli(*args, "--db", str(db), env=env)


def display_width(line: str) -> int:
    """Columns on a terminal, counted apart from the code under test."""
    line = ANSI.sub("", line)
    return sum(
        0
        if unicodedata.combining(ch)
        else 2
        if unicodedata.east_asian_width(ch) in ("W", "F")
        else 1
        for ch in line
    )


@pytest.fixture
def busy(db: Path) -> Path:
    """Long commands, a long lane, a long error, a stopped worker, a
    schedule and a paused lane with a long reason."""
    for argv in (
        ["--", "sh", "-c", LONG],
        ["--queue", LANE, "--", "echo", "日本語のコマンド" * 6],
        ["--max-retries", "0", "--", "sh", "-c", f"echo {WORDS * 3} >&2; exit 3"],
    ):
        assert cli("add", *argv, db=db).exit_code == 0
    assert cli("work", "--drain", db=db).exit_code == 0
    assert cli("add", "--queue", LANE, "--", "sh", "-c", LONG, db=db).exit_code == 0
    nightly = ["schedule", "add", "nightly-" + "x" * 30, "--cron", "0 3 * * *", "--db", str(db)]
    assert cli(*nightly, "--", "sh", "-c", LONG).exit_code == 0
    assert cli("pause", LANE, "--reason", REASON, db=db).exit_code == 0
    return db


def test_the_views_fit_80_columns_and_cut_with_an_ellipsis(busy: Path) -> None:
    narrow = {"COLUMNS": "80", "NO_COLOR": "1"}
    cut = 0
    for view in VIEWS:
        result = shown(*view, db=busy, env=narrow)
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines, view
        assert max(map(display_width, lines)) <= 80, (view, result.stdout)
        assert "\x1b" not in result.stdout
        cut += result.stdout.count("…")
    assert cut >= 4
    listed = shown("list", db=busy, env=narrow).stdout
    assert LONG.strip() not in listed and "sh -c 'echo a f" in listed


@pytest.mark.parametrize("how", ["--wide", "a pipe"])
def test_wide_and_a_pipe_without_columns_show_every_cell_whole(busy: Path, how: str) -> None:
    env = {"COLUMNS": "80"} if how == "--wide" else {}
    wide = ["--wide"] if how == "--wide" else []
    listed = shown("list", *wide, db=busy, env=env)
    assert f"sh -c '{LONG}'" in listed.stdout and "…" not in listed.stdout
    status = shown("status", *wide, db=busy, env=env).stdout
    assert REASON in status and WORDS * 3 in status and "…" not in status
    schedules = shown("schedule", "list", *wide, db=busy, env=env).stdout
    assert "nightly-" + "x" * 30 in schedules
    assert (
        cli("list", "--json", *wide, db=busy, env=env).data == cli("list", "--json", db=busy).data
    )


def run_in_terminal(argv: list[str], env: dict[str, str], columns: int) -> str:
    """argv's output on a pseudo-terminal `columns` wide, until it exits."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
    finally:
        proc.wait(timeout=30)
        os.close(leader)
    return seen.decode().replace("\r\n", "\n")


def column_starts(heading: str, names: list[str]) -> list[int]:
    return [heading.index(name) for name in names]


@pytest.mark.parametrize("columns", [80, 60])
def test_on_a_terminal_colour_keeps_headings_over_their_columns(busy: Path, columns: int) -> None:
    env = child_env()
    env.pop("NO_COLOR", None)
    env.pop("COLUMNS", None)
    argv = [sys.executable, "-m", "spoolctl", "list", "--db", str(busy)]
    drawn = run_in_terminal(argv, env, columns)
    assert "\x1b[31m" in drawn or "\x1b[32m" in drawn, "states in colour"
    lines = ANSI.sub("", drawn).splitlines()
    assert max(map(display_width, lines)) <= columns, drawn
    headers = lines[0].split()  # a narrow terminal leaves some columns out
    assert headers[:3] == ["ID", "STATE", "QUEUE"] and headers[-1] == "COMMAND"
    starts = column_starts(lines[0], headers)
    for line in lines[1:]:
        for start in starts[1:]:
            assert line[start - 2 : start] == "  " and line[start] != " ", (line, start)
    plain = run_in_terminal(argv, {**env, "NO_COLOR": "1"}, columns).splitlines()
    assert "\x1b[" not in "".join(plain)
    assert column_starts(plain[0], headers) == starts


def test_show_prints_what_the_state_makes_meaningful(db: Path) -> None:
    assert cli("add", "--max-crashes", "2", "--", "true", db=db).exit_code == 0
    assert cli("work", "--drain", db=db).exit_code == 0
    done = cli("show", "1", db=db, env={"NO_COLOR": "1"}).stdout
    assert "next run" not in done and "  finished  " in done and "None" not in done
    assert "max_crashes 2" in done
    assert cli("add", "--memory", "512M", "--cpus", "0.5", "--", "true", db=db).exit_code == 0
    queued = cli("show", "2", db=db, env={"NO_COLOR": "1"}).stdout
    assert "  next run  " in queued and "None" not in queued and "max_crashes" not in queued
    assert "  memory    512M" in queued and "  cpus      0.5" in queued


def test_the_web_job_page_shows_limits_and_the_times_that_matter(db: Path) -> None:
    from tests.process.test_web import client_for

    assert cli("add", "--", "true", db=db).exit_code == 0
    assert cli("work", "--drain", db=db).exit_code == 0
    assert cli("add", "--memory", "512M", "--cpus", "0.5", "--", "true", db=db).exit_code == 0
    assert cli("add", "--timeout", "none", "--", "true", db=db).exit_code == 0
    with client_for(db) as client:
        done = client.get("/jobs/1").text
        queued = client.get("/jobs/2").text
        endless = client.get("/jobs/3").text
    assert "<dt>Timeout</dt><dd>none</dd>" in endless and "<dt>Timeout</dt><dd>300 s</dd>" in done
    assert "Next run" not in done and "<dt>Finished</dt>" in done
    assert "<dt>memory</dt><dd>512M</dd>" in queued and "<dt>cpus</dt><dd>0.5</dd>" in queued
    assert "Next run" in queued and "<dt>Finished</dt>" not in queued
