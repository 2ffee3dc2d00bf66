"""`add`'s defaults a person can live with: `--timeout none` (and 0), compound
durations, the config file's `defaults` table (an explicit flag wins, a bad
value is INVALID_INPUT), `--quiet`, `--cwd` checked at submit, `--here`,
the text that shows the default timeout, and the smaller answers (`--cpus`
below a cgroup's quantum, `--after-job-any` on a job that ended).

In-process; the worker side (a job with no timeout outliving a short
queue-wide default, a job run --here) is tests/process/test_add_here.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from spoolctl import validate
from spoolctl.cli import lean
from spoolctl.cli.add_reply import added_reply, defaulted
from spoolctl.cli.feedback import timeout_note
from spoolctl.errors import InvalidInput
from spoolctl.services.job_defaults import (
    HERE_ENV,
    here_environment,
    queue_defaults,
    timeout_words,
)
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submission import Submitted
from tests.helpers import Db, Result, has_queue, inproc, rows

Capsys = pytest.CaptureFixture[str]


def add(db: Db, capsys: Capsys, *args: str) -> Result:
    return inproc("add", "--db", str(db), "--json", *args, capsys=capsys)


def stored(db: Db, job_id: int) -> Any:
    return rows(db, "SELECT * FROM jobs WHERE id = ?", (job_id,))[0]


def job_count(db: Db) -> int:
    return 0 if not has_queue(db) else int(rows(db, "SELECT count(*) FROM jobs")[0][0])


def config(tmp_path: Path, defaults: Any) -> Path:
    """A config file in the current folder (tmp_path) holding `defaults`."""
    path = tmp_path / ".spoolctl" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"version": 1, "defaults": defaults}))
    return path


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("none", 0), ("0", 0), ("0s", 0), ("300", 300), ("90m", 5400), ("1h30m", 5400)],
)
def test_timeout_none_and_zero_mean_no_timeout_stored_as_zero(raw: str, seconds: int) -> None:
    assert validate.timeout_seconds(raw) == seconds


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("1h30m", 5400), ("2d12h", 216_000), ("1m30s", 90), ("1d1s", 86_401), ("90m", 5400)],
)
def test_compound_durations_are_read_wherever_a_duration_is(raw: str, seconds: float) -> None:
    assert validate.duration(raw) == seconds


@pytest.mark.parametrize("raw", ["30m1h", "1h1h", "1.5h30m", "1H30M", "h30m", "1h 30m", "1h-30m"])
def test_a_compound_duration_out_of_order_or_malformed_is_refused(raw: str) -> None:
    with pytest.raises(InvalidInput):
        validate.duration(raw)


def test_cpus_below_a_cgroups_smallest_quota_is_refused_not_rounded() -> None:
    assert validate.cpus("0.01") == 0.01
    with pytest.raises(InvalidInput, match=r"at least 0\.01"):
        validate.cpus("0.0001")


def test_timeout_words() -> None:
    assert [timeout_words(s) for s in (0, 45, 300, 5400, 86_401)] == [
        "none",
        "45 s",
        "5 min",
        "1 h 30 min",
        "1 d 1 s",
    ]


def test_add_timeout_none_stores_zero(db: Db, capsys: Capsys) -> None:
    for raw in ("none", "0"):
        result = add(db, capsys, "--timeout", raw, "--", "true")
        assert result.exit_code == 0, result.stdout
        assert stored(db, result.data["job_id"])["timeout_seconds"] == 0
    shown = inproc("show", "--db", str(db), "1", capsys=capsys).stdout
    assert "timeout   none" in shown


def test_a_batch_line_may_say_timeout_none(db: Db, capsys: Capsys, tmp_path: Path) -> None:
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"], "timeout": "none"}\n{"argv": ["true"], "timeout": 0}\n')
    result = add(db, capsys, "--batch", str(batch))
    assert result.exit_code == 0, result.stdout
    assert [r[0] for r in rows(db, "SELECT timeout_seconds FROM jobs ORDER BY id")] == [0, 0]


def test_show_says_the_default_timeout(db: Db, capsys: Capsys) -> None:
    add(db, capsys, "--", "true")
    shown = inproc("show", "--db", str(db), "1", capsys=capsys).stdout
    assert "timeout   300s (the default; --timeout none: no limit)" in shown


def test_config_defaults_set_every_flag_and_an_explicit_flag_wins(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    config(
        tmp_path,
        {
            "timeout": "none",
            "max_retries": 0,
            "priority": 7,
            "queue": "builds",
            "max_crashes": 2,
            "memory": "512M",
            "cpus": 1.5,
            "note": "from config",
        },
    )
    first = add(db, capsys, "--", "true")
    assert first.exit_code == 0, first.stdout
    row = stored(db, first.data["job_id"])
    assert (row["timeout_seconds"], row["max_retries"], row["priority"], row["queue"]) == (
        0,
        0,
        7,
        "builds",
    )
    assert (row["max_crashes"], row["memory_bytes"], row["cpus"], row["note"]) == (
        2,
        512 << 20,
        1.5,
        "from config",
    )
    second = add(db, capsys, "--timeout", "60", "--priority", "1", "--", "true")
    row = stored(db, second.data["job_id"])
    assert (row["timeout_seconds"], row["priority"], row["max_retries"]) == (60, 1, 0)


def test_config_defaults_are_every_batch_lines_last_default(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    config(tmp_path, {"timeout": "10m", "priority": 3})
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["true"], "timeout": 5}\n')
    result = add(db, capsys, "--priority", "4", "--batch", str(batch))
    assert result.exit_code == 0, result.stdout
    found = rows(db, "SELECT timeout_seconds, priority FROM jobs ORDER BY id")
    assert [tuple(r) for r in found] == [(600, 4), (5, 4)]


@pytest.mark.parametrize(
    ("defaults", "named"),
    [
        ({"timeout": "soon"}, "defaults.timeout"),
        ({"timeout": -1}, "defaults.timeout"),
        ({"max_retries": 1.5}, "defaults.max_retries"),
        ({"max_retries": -1}, "defaults.max_retries"),
        ({"queue": "bad queue"}, "defaults.queue"),
        ({"cpus": 0.0001}, "defaults.cpus"),
        ({"here": "yes"}, "defaults.here"),
        ({"key": "k"}, "defaults.key"),
        ({"nope": 1}, "defaults.nope"),
        ([1, 2], "defaults"),
    ],
)
def test_a_bad_config_default_is_invalid_input_and_adds_nothing(
    db: Db, capsys: Capsys, tmp_path: Path, defaults: Any, named: str
) -> None:
    path = config(tmp_path, defaults)
    result = add(db, capsys, "--", "true")
    assert result.exit_code == 1, result.stdout
    error = result.envelope["errors"][0]
    assert error["code"] == "INVALID_INPUT"
    assert error["detail"]["field"] == named and str(path) in error["message"]
    assert job_count(db) == 0


def test_queue_defaults_reads_by_the_flags_rules() -> None:
    read = queue_defaults({"timeout": "1h30m", "memory": "1G", "here": True})
    assert read.fields == {"timeout_seconds": 5400, "memory_bytes": 1 << 30}
    assert read.here is True
    assert queue_defaults(None) == queue_defaults({})


def test_quiet_prints_the_id_alone(db: Db, capsys: Capsys, tmp_path: Path) -> None:
    for flag in ("-q", "--quiet"):
        out = inproc("add", "--db", str(db), flag, "--", "true", capsys=capsys)
        assert out.exit_code == 0
        assert out.stdout == f"{job_count(db)}\n"
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["true"]}\n')
    out = inproc("add", "--db", str(db), "-q", "--batch", str(batch), capsys=capsys)
    assert out.stdout == "3\n4\n"
    bad = inproc("add", "--db", str(db), "-q", "--timeout", "soon", "--", "true", capsys=capsys)
    assert bad.exit_code == 1 and bad.stdout == "" and "INVALID_INPUT" in bad.stderr


def test_quiet_on_the_lean_path_is_the_id_alone(db: Db, capsys: Capsys) -> None:
    inproc("add", "--db", str(db), "--", "true", capsys=capsys)  # the queue exists
    assert lean.answer(["add", "--db", str(db), "-q", "--", "true"]) == 0
    assert capsys.readouterr().out == "2\n"


def test_quiet_with_json_prints_the_envelope(db: Db, capsys: Capsys) -> None:
    result = add(db, capsys, "-q", "--", "true")
    assert result.envelope["data"]["job_id"] == 1


def test_cwd_that_does_not_exist_is_refused_at_submit(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    for cwd in ("missing", str(tmp_path / "missing" / "deeper"), "a-file"):
        result = add(db, capsys, "--cwd", cwd, "--", "pwd")
        assert result.exit_code == 1, result.stdout
        error = result.envelope["errors"][0]
        assert error["code"] == "INVALID_INPUT" and error["detail"]["field"] == "cwd"
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["true"], "cwd": "missing"}\n')
    assert add(db, capsys, "--batch", str(batch)).exit_code == 1
    assert job_count(db) == 0


def test_cwd_is_not_checked_when_the_queue_is_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL the workers may run on another machine: the check is
    left to where the job runs (the decision is by the queue's name alone)."""
    from spoolctl.db.where import named_db

    assert named_db("postgresql://u@h/db").plain_file() is None


def test_here_captures_the_folder_and_the_environment(
    db: Db, capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "proj"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("SUBMITTER_ONLY", "yes")
    result = add(db, capsys, "--here", "--", "pwd")
    assert result.exit_code == 0, result.stdout
    row = stored(db, result.data["job_id"])
    env = json.loads(row["env"])
    assert row["cwd"] == str(work) and result.data["cwd"] == str(work)
    assert env["SUBMITTER_ONLY"] == "yes" and env[HERE_ENV] == "1"
    assert env["PATH"] == os.environ["PATH"]


def test_here_with_explicit_cwd_and_env_the_explicit_ones_win(
    db: Db, capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARED", "from-shell")
    other = tmp_path / "other"
    other.mkdir()
    result = add(db, capsys, "--here", "--cwd", str(other), "--env", "SHARED=flag", "--", "pwd")
    row = stored(db, result.data["job_id"])
    assert row["cwd"] == str(other)
    assert json.loads(row["env"])["SHARED"] == "flag"


def test_here_as_the_config_default_and_no_here_turns_it_off(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    config(tmp_path, {"here": True})
    assert lean.answer(["add", "--db", str(db), "--", "true"]) is None  # the full way captures
    on = add(db, capsys, "--", "true")
    assert stored(db, on.data["job_id"])["cwd"] == str(tmp_path)
    off = add(db, capsys, "--no-here", "--", "true")
    row = stored(db, off.data["job_id"])
    assert row["cwd"] is None and json.loads(row["env"] or "{}") == {}


def test_here_leaves_out_what_a_job_env_cannot_hold_and_says_so(
    db: Db, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUGE_VALUE", "v" * (validate.ENV_VALUE_MAX + 1))
    result = add(db, capsys, "--here", "--", "true")
    assert result.exit_code == 0
    assert "HUGE_VALUE" not in json.loads(stored(db, 1)["env"])
    assert [w["code"] for w in result.envelope["warnings"]] == ["HERE_ENV_SKIPPED"]
    assert "HUGE_VALUE" in result.envelope["warnings"][0]["message"]


def test_here_environment_marks_the_snapshot() -> None:
    kept, skipped = here_environment({"A": "1", "B" * 200: "x"})
    assert kept == {"A": "1", HERE_ENV: "1"} and skipped == ["B" * 200]


SUBMITTED = Submitted(
    job_id=7,
    state="queued",
    deduplicated=False,
    next_run_at=0.0,
    priority=0,
    lane="default",
    cwd=None,
    env_keys=[],
)


def test_the_terminal_text_shows_the_default_timeout_and_retries() -> None:
    spec = JobSpec(argv=["make"])
    text = added_reply(SUBMITTED, spec, terminal=True, defaulted=defaulted(set(), {})).text
    assert text == (
        "Added job 7\n"
        "  timeout 5 min (the default; --timeout none: no limit), max retries 3 (the default)"
    )
    spec = JobSpec(argv=["make"], timeout_seconds=0, max_retries=0)
    given = defaulted({"max_retries"}, {"timeout_seconds": 0})
    text = added_reply(SUBMITTED, spec, terminal=True, defaulted=given).text
    assert text == "Added job 7\n  timeout none (the queue's default), max retries 0"
    assert added_reply(SUBMITTED, spec).text == "Added job 7"  # not a terminal: as before
    assert added_reply(SUBMITTED, spec, quiet=True, terminal=True).text == "7"


def test_after_job_any_on_an_ended_job_says_it_ended() -> None:
    spec = JobSpec(argv=["x"], after_jobs_any=(15,))
    assert added_reply(SUBMITTED, spec).text == "Added job 7 (jobs 15 have ended)"
    spec = JobSpec(argv=["x"], after_jobs=(3,), after_jobs_any=(15,))
    assert added_reply(SUBMITTED, spec).text == "Added job 7 (jobs 3 are done; jobs 15 have ended)"


def test_feedback_names_the_default_timeout() -> None:
    job = {"timeout_seconds": 300, "last_failure_reason": "timeout"}
    note = timeout_note(job, "timeout", None)
    assert note == "killed by the default 5 min timeout; use --timeout (e.g. --timeout 1h or none)"
    assert timeout_note({**job, "timeout_seconds": 60}, "timeout", None) is None
    assert timeout_note(job, "process_exit", None) is None
    queue_wide = {"timeout_seconds": 1200}
    assert timeout_note({**job, "timeout_seconds": 1200}, "timeout", queue_wide) == (
        "killed by the queue's default 20 min timeout; use --timeout (e.g. --timeout 1h or none)"
    )


def test_config_validate_reads_the_defaults_as_add_does(
    tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = config(tmp_path, {"timeout": "1h30m", "here": True})
    good = inproc("config-validate", str(path), "--json", capsys=capsys)
    assert good.exit_code == 0 and good.envelope["data"]["valid"] is True
    config(tmp_path, {"timeout": "soon"})
    bad = inproc("config-validate", str(path), "--json", capsys=capsys)
    assert bad.exit_code == 1
    assert bad.envelope["errors"][0]["detail"]["field"] == "defaults.timeout"


def test_schedule_add_takes_timeout_none_and_a_compound_interval(db: Db, capsys: Capsys) -> None:
    made = inproc(
        "schedule",
        "add",
        "--db",
        str(db),
        "--every",
        "1h30m",
        "--timeout",
        "none",
        "nightly",
        "--",
        "true",
        capsys=capsys,
    )
    assert made.exit_code == 0, made.stderr
    shown = inproc("schedule", "show", "--db", str(db), "nightly", "--json", capsys=capsys)
    assert '"timeout_seconds": 0' in shown.stdout and '"every_s": 5400.0' in shown.stdout
