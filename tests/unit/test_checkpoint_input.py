"""The input of `add --signal-before-timeout`, `--requeue-exit` and
`--max-requeues` (docs/steering.md), in-process: every way in (`add`'s
flags, the lean path, `add --batch` lines, `schedule add`, the config
file's `defaults` table) stores the same columns, and every bad value is
INVALID_INPUT with the queue unchanged. The worker side is
tests/process/test_checkpoint.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spoolctl.cli import lean
from spoolctl.errors import InvalidInput
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.schedules import job_of
from tests.helpers import Db, Result, has_queue, inproc, rows

Capsys = pytest.CaptureFixture[str]
NEW_KEYS = ("signal_before_timeout", "requeue_exits", "max_requeues")


def add(db: Db, capsys: Capsys, *args: str) -> Result:
    return inproc("add", "--db", str(db), "--json", *args, capsys=capsys)


def job_count(db: Db) -> int:
    return 0 if not has_queue(db) else int(rows(db, "SELECT count(*) FROM jobs")[0][0])


def refused(result: Result) -> str:
    """The error's message, once checked to be INVALID_INPUT (exit 1)."""
    assert result.exit_code == 1, result.stdout
    (error,) = result.envelope["errors"]
    assert error["code"] == "INVALID_INPUT", error
    return str(error["message"])


def config(tmp_path: Path, defaults: Any) -> None:
    path = tmp_path / ".spoolctl" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"version": 1, "defaults": defaults}))


def steering(db: Db, job_id: int) -> tuple[Any, ...]:
    sql = (
        "SELECT signal_before_timeout, signal_before_timeout_s, requeue_exits, max_requeues, "
        "requeues FROM jobs WHERE id = ?"
    )
    return tuple(rows(db, sql, (job_id,))[0])


def test_the_flags_store_their_columns(db: Db, capsys: Capsys) -> None:
    flags = ("--timeout", "1h", "--signal-before-timeout", "usr1@1m30s")
    result = add(db, capsys, *flags, "--requeue-exit", "75", "--requeue-exit", "3", "--", "true")
    assert result.exit_code == 0, result.stdout
    assert steering(db, result.data["job_id"]) == ("SIGUSR1", 90, "[3,75]", None, 0)
    bounded = add(db, capsys, "--requeue-exit", "75", "--max-requeues", "0", "--", "true")
    assert steering(db, bounded.data["job_id"])[2:] == ("[75]", 0, 0)
    shown = inproc("show", "--db", str(db), "1", capsys=capsys).stdout
    assert "warning   SIGUSR1 90s before the timeout" in shown
    assert "requeue   on exit 3, 75: 0 of 10 requeues" in shown


@pytest.mark.parametrize(
    "args",
    [
        ("--signal-before-timeout", "FOO@1m"),
        ("--signal-before-timeout", "KILL@1m"),
        ("--signal-before-timeout", "SIGSTOP@1m"),
        ("--signal-before-timeout", "USR1@0"),
        ("--signal-before-timeout", "USR1"),
        ("--signal-before-timeout", "USR1@soon"),
        ("--timeout", "60", "--signal-before-timeout", "USR1@1m"),
        ("--timeout", "60", "--signal-before-timeout", "USR1@2m"),
        ("--timeout", "none", "--signal-before-timeout", "USR1@1s"),
        ("--max-requeues", "3"),
        ("--requeue-exit", "75", "--max-requeues", "-1"),
        ("--requeue-exit", "0"),
        ("--requeue-exit", "256"),
        ("--requeue-exit", "x"),
    ],
)
def test_bad_input_is_refused_and_adds_nothing(
    db: Db, capsys: Capsys, args: tuple[str, ...]
) -> None:
    refused(add(db, capsys, *args, "--", "true"))
    assert lean.answer(["add", "--db", str(db), *args, "--", "true"]) is None
    assert job_count(db) == 0


def test_the_lean_path_stores_what_the_click_verb_does(db: Db, capsys: Capsys) -> None:
    args = ["--timeout", "10", "--signal-before-timeout", "TERM@5"]
    assert add(db, capsys, *args, "--", "true").exit_code == 0  # the queue made first
    assert lean.answer(["add", "--db", str(db), "-q", *args, "--", "true"]) == 0
    assert steering(db, 1) == steering(db, 2) == ("SIGTERM", 5, None, None, 0)


def test_a_timeout_from_the_defaults_table_is_checked_too(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    config(tmp_path, {"timeout": "30s"})
    message = refused(add(db, capsys, "--signal-before-timeout", "USR1@30s", "--", "true"))
    assert "30s" in message
    config(tmp_path, {"timeout": "none"})
    refused(add(db, capsys, "--signal-before-timeout", "USR1@1s", "--", "true"))
    assert job_count(db) == 0


def test_the_defaults_table_sets_them(db: Db, capsys: Capsys, tmp_path: Path) -> None:
    config(
        tmp_path,
        {"signal_before_timeout": "USR1@2m", "requeue_exits": [75, 75], "max_requeues": 4},
    )
    result = add(db, capsys, "--", "true")
    assert result.exit_code == 0, result.stdout
    assert steering(db, result.data["job_id"]) == ("SIGUSR1", 120, "[75]", 4, 0)
    refused(add(db, capsys, "--timeout", "none", "--", "true"))  # the default warning cannot apply
    config(tmp_path, {"max_requeues": 4})
    assert "defaults.max_requeues" in refused(add(db, capsys, "--", "true"))
    config(tmp_path, {"requeue_exits": [0]})
    assert "defaults.requeue_exits" in refused(add(db, capsys, "--", "true"))
    assert job_count(db) == 1


def test_batch_lines_read_them_and_a_bad_line_adds_nothing(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    batch = tmp_path / "jobs.ndjson"
    good = {"argv": ["true"], "signal_before_timeout": "USR1@2m", "requeue_exits": [75]}
    bad = {"argv": ["true"], "timeout": 60, "signal_before_timeout": "USR1@2m"}
    batch.write_text(f"{json.dumps(good)}\n{json.dumps(bad)}\n")
    message = refused(add(db, capsys, "--batch", str(batch)))
    assert message.startswith("batch line 2:"), message
    assert job_count(db) == 0
    batch.write_text(f"{json.dumps(good)}\n")
    result = add(db, capsys, "--batch", str(batch), "--max-requeues", "5")
    assert result.exit_code == 0, result.stdout
    assert steering(db, 1) == ("SIGUSR1", 120, "[75]", 5, 0)


def test_schedule_add_keeps_them_and_refuses_what_add_refuses(db: Db, capsys: Capsys) -> None:
    base = ("schedule", "add", "nightly", "--db", str(db), "--json", "--every", "1h")
    bad = inproc(*base, "--max-requeues", "2", "--", "true", capsys=capsys)
    refused(bad)
    good = inproc(
        *base,
        "--requeue-exit",
        "75",
        "--signal-before-timeout",
        "USR1@1m",
        "--",
        "true",
        capsys=capsys,
    )
    assert good.exit_code == 0, good.stdout
    job = good.data["job"]
    assert (job["requeue_exits"], job["signal_before_timeout"]) == ([75], "SIGUSR1@60")


def test_a_schedule_stored_before_these_flags_still_reads() -> None:
    """A schedule's job kept by a release without the flags lacks their keys:
    its occurrences get their defaults, and it is not taken for damaged."""
    kept = JobSpec(["true"]).scheduled()
    older = {k: v for k, v in kept.items() if k not in NEW_KEYS}
    read = job_of(SimpleNamespace(job=json.dumps(older), name="nightly"))
    assert read == JobSpec(["true"])
    assert "signal_before_timeout_s" not in kept, "kept once, as the attribute"
    for damaged in ({**older, "nonsense": 1}, {k: v for k, v in older.items() if k != "argv"}):
        with pytest.raises(InvalidInput):
            job_of(SimpleNamespace(job=json.dumps(damaged), name="nightly"))
