"""Bytes are data (docs/concepts.md, Jobs): argv after `--` and `-c` accept any bytes
the OS passes (Unix arguments need not be UTF-8) and the job receives exactly
those bytes; JSON shows them losslessly (a byte that is not UTF-8 is the
escape `\\udcXX`, PEP 383, which Python's json reads back and os.fsencode
turns into the same byte). Text fields that are not UTF-8 are INVALID_INPUT,
and so are batches nested too deeply or holding 5,000-digit numbers, with a
plain message; none of it changes the queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Result, child_env, cli_json, rows

pytestmark = pytest.mark.subprocess

RAW = b"caf\xe9 \xff\xfe tail"


def spoolctl(*args: bytes | str, stdin: bytes | None = None) -> Result:
    """A real process given raw bytes as arguments."""
    argv = [os.fsencode(sys.executable), b"-m", b"spoolctl"]
    argv += [a if isinstance(a, bytes) else a.encode() for a in args]
    proc = subprocess.run(argv, capture_output=True, env=child_env(), timeout=60, input=stdin)
    return Result(
        proc.returncode,
        proc.stdout.decode("utf-8", "surrogateescape"),
        proc.stderr.decode("utf-8", "surrogateescape"),
    )


def raw_output(db: Path, job_id: int) -> bytes:
    argv = [sys.executable, "-m", "spoolctl", "output", str(job_id), "--db", str(db)]
    proc = subprocess.run(
        [*argv, "--raw", "--stream", "stdout"], capture_output=True, env=child_env(), timeout=60
    )
    return proc.stdout


def test_argv_and_shell_strings_carry_any_bytes(db: Path) -> None:
    as_argv = spoolctl("add", "--json", "--db", str(db), "--", "printf", b"%s", RAW)
    as_shell = spoolctl("add", "--json", "--db", str(db), "-c", b"printf '%s' '" + RAW + b"'")
    for added in (as_argv, as_shell):
        assert added.exit_code == 0, added.stdout + added.stderr
        assert len(added.stdout.splitlines()) == 1
    drained = cli_json("work", "--drain", db=db)
    assert drained.data["executed"] == 2, drained.stdout
    assert raw_output(db, 1) == RAW and raw_output(db, 2) == RAW

    shown = cli_json("show", "1", db=db)
    assert "\\udce9" in shown.stdout and "\\udcff" in shown.stdout
    argv = shown.data["job"]["argv"]
    assert [os.fsencode(a) for a in argv] == [b"printf", b"%s", RAW]
    listed = cli_json("list", db=db).data["jobs"]
    assert os.fsencode(listed[0]["argv"][2]).endswith(RAW + b"'")


@pytest.mark.parametrize(
    "flag",
    [
        ["--note", b"n\xff"],
        ["--tag", b"k=\xff"],
        ["--tag", b"\xfe=v"],
        ["--key", b"k\xff"],
        ["--queue", b"q\xff"],
        ["--env", b"K=\xff"],
        ["--cwd", b"/tmp/\xff"],
        ["--db", b"/tmp/\xff.db"],
    ],
)
def test_text_fields_that_are_not_utf8_are_refused(db: Path, flag: list[bytes | str]) -> None:
    cli_json("add", "--", "true", db=db)
    before = rows(db, "SELECT * FROM jobs")
    args = ["add", "--json", *(["--db", str(db)] if flag[0] != "--db" else []), *flag]
    refused = spoolctl(*args, "--", "true")
    (error,) = refused.envelope["errors"]
    assert (refused.exit_code, error["code"]) == (1, "INVALID_INPUT"), error
    assert "UTF-8" in error["message"]
    assert rows(db, "SELECT * FROM jobs") == before


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b'{"argv": ["true"], "note": "\\ud800"}', "not valid UTF-8"),
        (b'{"argv": ["printf", "\\ud800"]}', "lone surrogate"),
        (b'{"argv": ["true"], "note": "\xff"}', "UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"argv": ["true"], "priority": ' + b"7" * 5000 + b"}", "more than 4300 digits"),
        (b'{"argv": ["true"], "note": "' + b"x" * (1 << 21) + b'"}', "longer than"),
    ],
    ids=["surrogate-note", "surrogate-argv", "not-utf8", "nested", "digits", "huge"],
)
def test_batches_that_cannot_be_jobs_are_refused_plainly(db: Path, line: bytes, words: str) -> None:
    cli_json("add", "--", "true", db=db)
    before = rows(db, "SELECT * FROM jobs")
    refused = spoolctl(
        "add", "--json", "--db", str(db), "--batch", "-", stdin=b'{"argv": ["true"]}\n' + line
    )
    (error,) = refused.envelope["errors"]
    assert (refused.exit_code, error["code"]) == (1, "INVALID_INPUT"), error
    assert words in error["message"] and len(error["message"]) < 300
    assert rows(db, "SELECT * FROM jobs") == before


def test_a_batch_line_may_carry_argv_bytes_as_escapes(db: Path) -> None:
    line = json.dumps({"argv": ["printf", "%s", os.fsdecode(RAW)]})
    added = spoolctl("add", "--json", "--db", str(db), "--batch", "-", stdin=line.encode())
    assert added.exit_code == 0, added.stdout
    assert cli_json("work", "--drain", db=db).data["executed"] == 1
    assert raw_output(db, 1) == RAW
