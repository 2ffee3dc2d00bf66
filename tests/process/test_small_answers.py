"""Small answers a person reads: a `wait` TIMEOUT over thousands of jobs
fits a line (its detail keeps every id), a schedule's NOT_FOUND points at
`schedule list`, and cron's nicknames (`@daily` and the rest) are schedules."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json

pytestmark = pytest.mark.subprocess


def test_a_wait_timeout_names_ten_ids_and_keeps_all_in_detail(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    lines = "".join(json.dumps({"argv": ["true"], "after": "1h"}) + "\n" for _ in range(3000))
    batch = tmp_path / "jobs.ndjson"
    batch.write_text(lines)
    added = cli("add", "--db", str(db), "--json", "--batch", str(batch))
    assert added.exit_code == 0, added.stdout
    ids = [str(i) for i in range(1, 3001)]
    text = cli("wait", "--db", str(db), "--timeout", "0", *ids)
    assert text.exit_code == 4
    first = text.stderr.splitlines()[0]
    assert first.endswith("1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2,990 more"), first
    assert len(text.stderr) < 400
    result = cli_json("wait", "--timeout", "0", *ids, db=db)
    error = result.envelope["errors"][0]
    assert (error["code"], error["detail"]["pending_count"]) == ("TIMEOUT", 3000)
    assert error["detail"]["pending"] == list(range(1, 3001))
    few = cli("wait", "--db", str(db), "--timeout", "0", "7", "8")
    assert few.stderr.splitlines()[0].endswith(": 7, 8")


def test_a_missing_schedule_hints_at_schedule_list(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    for argv in (("schedule", "show"), ("schedule", "pause"), ("schedule", "remove")):
        result = cli(*argv, "--db", str(db), "nope")
        assert result.exit_code == 1
        assert "hint: run 'spoolctl schedule list' for the schedules" in result.stderr
    job = cli("show", "--db", str(db), "99")
    assert "hint: run 'spoolctl list' for the jobs" in job.stderr


@pytest.mark.parametrize(
    ("nickname", "after_first"),
    [
        ("@hourly", 3600),
        ("@daily", 86400),
        ("@midnight", 86400),
        ("@weekly", 7 * 86400),
        ("@MONTHLY", None),
        ("@yearly", None),
        ("@annually", None),
    ],
)
def test_cron_nicknames_are_schedules(
    tmp_path: Path, nickname: str, after_first: int | None
) -> None:
    db = tmp_path / "q.db"
    argv = ("schedule", "add", "--db", str(db), "--json", "s", "--cron", nickname)
    result = cli(*argv, "--timezone", "UTC", "--", "true")
    assert result.exit_code == 0, result.stdout
    data = result.envelope["data"]
    assert data["cron"] == nickname.lower()
    times = [datetime.fromtimestamp(t, UTC) for t in data["upcoming"]]
    assert (times[0].minute, times[0].second) == (0, 0)
    if after_first is not None:
        assert (times[1] - times[0]).total_seconds() == after_first
    if nickname != "@hourly":
        assert times[0].hour == 0
    if nickname == "@weekly":
        assert times[0].weekday() == 6  # Sunday, as cron's 0
    if nickname in ("@yearly", "@annually"):
        assert (times[0].month, times[0].day) == (1, 1)


def test_a_nickname_with_no_fire_times_is_refused(tmp_path: Path) -> None:
    argv = ("schedule", "add", "--db", str(tmp_path / "q.db"), "--json", "s", "--cron", "@reboot")
    result = cli(*argv, "--", "true")
    error = result.envelope["errors"][0]
    assert (result.exit_code, error["code"]) == (1, "INVALID_INPUT")
    assert "@daily" in error["message"]
