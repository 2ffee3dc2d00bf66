"""Text-mode errors say what went wrong and what to do next: the first line
stays exactly `spoolctl: CODE: message` (the envelope's error), a second line
`  hint: ...` names the next step unless the message already does, and --json
output carries no hint. The tests with a queue run on SQLite and on PostgreSQL."""

from __future__ import annotations

import json

import pytest

from spoolctl.cli import run
from spoolctl.cli.reply import HINTS, error_hint
from spoolctl.errors import (
    DB_UNUSABLE_REASONS,
    ERROR_CODES,
    Locked,
    SafetyBlock,
    SchemaOutdated,
    SchemaTooNew,
)
from tests.helpers import REPO, Db

pytestmark = pytest.mark.both_backends


def text_and_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[list[str], dict]:
    """stderr lines of the text run, and the error object of the same run with --json."""
    code = run(args)
    lines = capsys.readouterr().err.splitlines()
    json_args = [args[0], "--json", *args[1:]] if args else ["--json"]
    assert run(json_args) == code != 0
    error: dict = json.loads(capsys.readouterr().out)["errors"][0]
    return lines, error


def queue_with_one_job(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["add", "--db", str(db), "--key", "k", "--", "true"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("args", "code", "advice"),
    [
        (["add", "--tiemout", "5"], "UNKNOWN_FLAG", "run 'spoolctl add --help'"),
        (["add"], "MISSING_REQUIRED", "run 'spoolctl add --help'"),
        (["list", "--state", "bogus"], "INVALID_INPUT", "run 'spoolctl list --help'"),
        (["events", "--wait", "--follow"], "INVALID_INPUT", "run 'spoolctl events --help'"),
        (["stauts"], "UNKNOWN_COMMAND", "run 'spoolctl --help'"),
        (["show", "99"], "NOT_FOUND", "run 'spoolctl list'"),
        (["retry", "1"], "CONFLICT", "run 'spoolctl show 1'"),
        (["wait", "1", "--timeout", "0"], "TIMEOUT", "--timeout"),
        (["add", "--key", "k", "--", "false"], "IDEMPOTENCY_CONFLICT", "'spoolctl wait 1'"),
    ],
)
def test_an_error_line_is_followed_by_the_next_step(
    db: Db, capsys: pytest.CaptureFixture[str], args: list[str], code: str, advice: str
) -> None:
    queue_with_one_job(db, capsys)
    argv = [*args[:1], "--db", str(db), *args[1:]] if args[0] != "stauts" else args
    lines, error = text_and_json(capsys, argv)
    assert error["code"] == code
    assert lines[0] == f"spoolctl: {code}: {error['message']}"
    assert len(lines) == 2 and lines[1].startswith("  hint: "), lines
    assert advice in lines[1]
    assert "hint" not in error and "hint" not in error["detail"]


@pytest.mark.parametrize(
    "args",
    [
        [],  # the message already says `run spoolctl --help`
        ["prune", "--older-than", "1d"],  # SAFETY_BLOCK names its confirming flag
    ],
)
def test_no_hint_when_the_message_already_says_what_to_do(
    db: Db, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert run([*args[:1], "--db", str(db), *args[1:]] if args else []) != 0
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("spoolctl: ")
    assert "hint:" not in err


def test_json_mode_prints_no_hint(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["show", "--db", str(db), "--json", "99"]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "hint:" not in captured.out  # (the path in the message may say "hint")


def test_hints_for_errors_raised_below_the_cli() -> None:
    locked = error_hint(Locked("the queue database stayed locked; try again"), None)
    assert locked is not None and "SPOOLCTL_BUSY_TIMEOUT" in locked
    outdated = SchemaOutdated("q.db is old; run: spoolctl migrate --db q.db")
    assert error_hint(outdated, None) is None
    too_new = error_hint(SchemaTooNew("q.db is newer than this spoolctl"), None)
    assert too_new is not None and "upgrade spoolctl" in too_new


def test_every_error_code_is_decided() -> None:
    """A new error code must get a hint or be knowingly left without one, and
    DB_UNUSABLE one per reason (keys `CODE:reason`)."""
    codes = {key.partition(":")[0] for key in HINTS}
    assert codes | {SafetyBlock.code} == set(ERROR_CODES)
    reasons = {key.partition(":")[2] for key in HINTS if key.startswith("DB_UNUSABLE:")}
    left_generic = {"server_too_old", "replaced", "unusable"}  # their messages say what to do
    assert reasons | left_generic == set(DB_UNUSABLE_REASONS)


def test_the_quick_start_shows_the_real_error_text(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["add", "--db", str(db), "--", "true"]) == 0  # the quick start's queue exists
    capsys.readouterr()
    assert run(["show", "--db", str(db), "99"]) == 1
    shown = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    for line in capsys.readouterr().err.splitlines():
        assert f"\n{line}\n" in shown, line
