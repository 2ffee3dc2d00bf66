"""Schedules through the verbs and real `spoolctl work` processes: the
envelope and bad input of every verb, several workers racing over many slots
(each slot fired exactly once), failing occurrences that keep firing with
their dead jobs visible, and the cron library left unloaded by `add` and by
a worker with no schedules, and prune's way with occurrences. `add
--after-job-any` is here too. The firing service with chosen clock readings
is in tests/unit/test_schedules.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    Db,
    add_job,
    child_env,
    cli,
    execute,
    inproc,
    job,
    rows,
    start_worker,
    wait_for,
)
from tests.unit.test_schedules import T0, add, occurrences, set_state, tick

pytestmark = pytest.mark.subprocess


def envelope(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def code_of(result: Any) -> str:
    return str(envelope(result)["errors"][0]["code"])


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--cron", "61 * * * *"], "INVALID_INPUT", "bad cron expression"),
        (["--cron", "* * * * * *"], "INVALID_INPUT", "one minute is the finest"),
        (
            ["--cron", "0 3 * * *", "--timezone", "Mars/Olympus"],
            "INVALID_INPUT",
            "unknown time zone",
        ),
        (["--every", "0.5s"], "INVALID_INPUT", "at least 1s"),
        (["--every", "5m", "--cron", "* * * * *"], "INVALID_INPUT", "cannot be used together"),
        ([], "MISSING_REQUIRED", "--cron"),
    ],
)
def test_bad_input_is_refused_with_the_reason_and_changes_nothing(
    tmp_path: Path, capsys: Any, args: list[str], code: str, says: str
) -> None:
    db = str(tmp_path / "q.db")
    result = inproc("schedule add", "--db", db, "--json", "n", *args, "--", "true", capsys=capsys)
    assert code_of(result) == code and says in envelope(result)["errors"][0]["message"]
    listed = inproc("schedule list", "--db", db, "--json", capsys=capsys)
    assert envelope(listed)["data"]["count"] == 0


def test_the_verbs_speak_the_envelope(tmp_path: Path, capsys: Any) -> None:
    db = str(tmp_path / "q.db")

    def run(*args: str) -> dict[str, Any]:
        return envelope(inproc(args[0], "--db", db, "--json", *args[1:], capsys=capsys))

    flags = ["--queue", "ops", "--max-retries", "0", "--tag", "k=v"]
    added = run(
        "schedule add",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        *flags,
        "--",
        "./backup.sh",
    )
    assert added["ok"] and added["data"]["timezone"] == "Europe/Berlin"
    assert added["data"]["job"]["queue"] == "ops" and added["data"]["job"]["max_retries"] == 0
    assert len(added["data"]["upcoming"]) == 3
    again = run("schedule add", "nightly", "--every", "1h", "--", "true")
    assert again["errors"][0]["code"] == "CONFLICT"
    assert run("schedule add", "nightly", "--every", "1h", "--replace", "--", "true")["ok"]
    assert (
        run("schedule add", "bad name", "--every", "1h", "--", "true")["errors"][0]["code"]
        == "INVALID_INPUT"
    )
    assert run("schedule pause", "nightly", "--reason", "x")["data"]["paused"] is True
    assert run("schedule list")["data"]["schedules"][0]["paused_reason"] == "x"
    assert run("schedule resume", "nightly")["data"]["changed"] is True
    ran = run("schedule run", "nightly")["data"]
    shown = run("schedule show", "nightly")["data"]
    assert [o["job_id"] for o in shown["occurrences"]] == [ran["job_id"]]
    assert shown["schedule"]["last"]["state"] == "queued"
    assert [j["id"] for j in run("list", "--schedule", "nightly")["data"]["jobs"]] == [
        ran["job_id"]
    ]
    plan = run("status")["data"]["schedules"]
    assert plan["count"] == 1 and plan["next"]["name"] == "nightly"
    text = inproc("status", "--db", db, capsys=capsys).stdout
    assert "schedules: 1 (next: nightly 60m from now)" in text
    assert run("schedule remove", "nightly")["data"]["removed"] is True
    assert run("schedule show", "nightly")["errors"][0]["code"] == "NOT_FOUND"
    status = run("status")["data"]
    assert status["schedules"] == {"count": 0, "next": None}


def stop(workers: list[subprocess.Popen[str]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGINT)
    for worker in workers:
        worker.communicate(timeout=30)


@pytest.mark.both_backends
def test_racing_workers_fire_each_slot_exactly_once(db: Db) -> None:
    """Three workers (on PostgreSQL: each its own process with its own
    connections, as separate machines would be) over a one-second schedule
    whose every slot must become a job: each slot fired once, none missed."""
    added = cli(
        "schedule add",
        "tick",
        "--every",
        "1s",
        "--catch-up",
        "all",
        "--overlap",
        "allow",
        "-c",
        "echo $SPOOLCTL_SCHEDULED_FOR",
        db=db,
        json=True,
    )
    assert added.exit_code == 0, added.stdout + added.stderr
    workers = [start_worker(db, "--poll-interval", "0.2", "--concurrency", "4") for _ in range(3)]
    try:
        wait_for(lambda: len(rows(db, "SELECT id FROM schedule_occurrences")) >= 4, timeout=30)
    finally:
        stop(workers)
    found = rows(db, "SELECT slot_at, job_id, outcome FROM schedule_occurrences ORDER BY slot_at")
    anchor = added.data["anchor_at"]
    assert [r["slot_at"] for r in found] == [anchor + k for k in range(len(found))]
    assert {r["outcome"] for r in found} == {"fired"}
    jobs = [r["job_id"] for r in found]
    assert len(set(jobs)) == len(jobs) == len(rows(db, "SELECT id FROM jobs"))
    fired = rows(db, "SELECT count(*) FROM job_events WHERE event = 'schedule_fired'")
    assert fired[0][0] == len(found)


@pytest.mark.both_backends
def test_a_schedule_whose_jobs_fail_keeps_firing_and_its_dead_jobs_show(db: Db) -> None:
    added = cli(
        "schedule add",
        "flaky",
        "--every",
        "1s",
        "--max-retries",
        "0",
        "-c",
        "exit 3",
        db=db,
        json=True,
    )
    assert added.exit_code == 0, added.stderr
    workers = [start_worker(db, "--poll-interval", "0.2")]
    try:
        wait_for(lambda: len(rows(db, "SELECT id FROM jobs WHERE state = 'dead'")) >= 2, timeout=30)
    finally:
        stop(workers)
    dead = cli("list", "--schedule", "flaky", "--state", "dead", db=db, json=True)
    assert dead.data["count"] >= 2
    shown = cli("schedule show", "flaky", db=db, json=True).data
    assert "dead" in {o["state"] for o in shown["occurrences"]}


def test_add_and_an_idle_worker_never_load_the_cron_library(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from spoolctl.cli import run
        assert run(["add", "--db", {str(tmp_path / "q.db")!r}, "--", "true"]) == 0
        assert "cronsim" not in sys.modules, "add"
        assert run(["work", "--drain", "--db", {str(tmp_path / "q.db")!r}]) == 0
        assert "cronsim" not in sys.modules, "work"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.both_backends
def test_after_job_any_runs_once_its_parents_end_however_they_end(db: Db) -> None:
    failing = add_job(db, "sh", "-c", "exit 3", max_retries=0)
    passing = add_job(db, "true")
    child = add_job(db, "sh", "-c", "echo $SPOOLCTL_PARENTS", after_jobs_any=(failing, passing))
    strict = add_job(db, "true", after_jobs=(failing,), after_jobs_any=(passing,))
    assert job(db, child)["state"] == "waiting"
    drained = cli("work", "--drain", db=db, json=True)
    assert drained.exit_code == 0, drained.stderr
    assert job(db, child)["state"] == "done"
    out = cli("output", str(child), "--stream", "stdout", "--raw", db=db)
    assert out.stdout.strip() == f"{failing}:dead,{passing}:done"
    assert job(db, strict)["state"] == "canceled"  # a failed success-parent still cancels
    assert job(db, strict)["last_failure_reason"] == "dependency_failed"


@pytest.mark.both_backends
def test_after_jobs_any_in_a_batch_names_earlier_lines(db: Db, tmp_path: Path) -> None:
    batch = tmp_path / "b.ndjson"
    batch.write_text(
        '{"cmd": "exit 1", "max_retries": 0}\n{"argv": ["true"], "after_jobs_any": ["@1"]}\n'
    )
    added = cli("add", "--batch", str(batch), db=db, json=True)
    first, second = added.data["job_ids"]
    assert job(db, second)["state"] == "waiting"
    assert cli("work", "--drain", db=db, json=True).exit_code == 0
    assert [job(db, i)["state"] for i in (first, second)] == ["dead", "done"]


def skewed_spoolctl(skew: float, *args: str) -> subprocess.CompletedProcess[str]:
    """spoolctl on a machine whose clock is `skew` seconds off."""
    from tests.pg.test_clock import SKEWED_PYTHON

    return subprocess.run(
        [sys.executable, "-c", SKEWED_PYTHON, f"{skew:+g}", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_on_postgresql_the_server_s_clock_decides_what_is_due(pg_url: str) -> None:
    """A schedule added on a machine ten minutes slow is anchored at the
    server's now; a worker on a machine ten minutes fast fires a slot only
    once the server's clock reaches it."""
    from tests.pg.test_fleet import server_epoch

    added = skewed_spoolctl(
        -600, "schedule add", "--db", pg_url, "--json", "soon", "--every", "1h", "--", "true"
    )
    assert added.returncode == 0, added.stdout + added.stderr
    anchor = json.loads(added.stdout)["data"]["anchor_at"]
    assert abs(anchor - server_epoch(pg_url)) < 5
    later = str(server_epoch(pg_url) + 300)
    assert (
        cli(
            "schedule add", "later", "--every", "1h", "--starting", later, "--", "true", db=pg_url
        ).exit_code
        == 0
    )
    drained = skewed_spoolctl(+600, "work", "--db", pg_url, "--drain", "--json")
    assert drained.returncode == 0, drained.stdout + drained.stderr
    fired = rows(
        pg_url, "SELECT s.name FROM schedule_occurrences o JOIN schedules s ON s.id = o.schedule_id"
    )
    assert [r[0] for r in fired] == ["soon"]


def test_removing_a_schedule_while_its_job_runs_lets_the_job_finish_and_fires_no_more(
    tmp_path: Path,
) -> None:
    db = tmp_path / "q.db"
    marker = tmp_path / "ran"
    added = cli(
        "schedule add",
        "slow",
        "--every",
        "1s",
        "-c",
        f"sleep 1; echo x >> {marker}",
        db=db,
        json=True,
    )
    assert added.exit_code == 0, added.stderr
    workers = [start_worker(db, "--poll-interval", "0.2")]
    try:
        running = wait_for(lambda: rows(db, "SELECT id FROM jobs WHERE state = 'running'"))
        assert cli("schedule remove", "slow", db=db, json=True).exit_code == 0
        made = len(rows(db, "SELECT id FROM jobs"))
        wait_for(lambda: job(db, running[0][0])["state"] == "done", timeout=30)
        idle_since = time.monotonic()
        wait_for(lambda: time.monotonic() - idle_since > 1.5, interval=0.1)  # a few polls
    finally:
        stop(workers)
    assert len(rows(db, "SELECT id FROM jobs")) == made
    done = rows(db, "SELECT id FROM jobs WHERE state = 'done'")
    assert running[0][0] in [r[0] for r in done]
    assert marker.read_text().count("x") == len(done)


def test_every_is_anchored_at_starting_and_never_fires_before_it_was_added(
    tmp_path: Path, capsys: Any
) -> None:
    db = str(tmp_path / "q.db")
    start = 1_700_000_007.0  # long past: slots are start + k * 10 min
    result = inproc(
        "schedule add",
        "--db",
        db,
        "--json",
        "tenmin",
        "--every",
        "10m",
        "--starting",
        str(start),
        "--",
        "true",
        capsys=capsys,
    )
    data = envelope(result)["data"]
    assert data["anchor_at"] == start
    first, second, third = data["upcoming"]
    assert (first - start) % 600 == 0 and time.time() - 1 <= first <= time.time() + 600
    assert (second, third) == (first + 600, first + 1200)


@pytest.mark.parametrize(
    "verb", ["schedule pause", "schedule resume", "schedule remove", "schedule run"]
)
def test_a_verb_naming_a_schedule_of_a_missing_queue_creates_no_queue(
    tmp_path: Path, capsys: Any, verb: str
) -> None:
    result = inproc(verb, "--db", str(tmp_path / "q.db"), "--json", "nightly", capsys=capsys)
    assert code_of(result) == "NOT_FOUND"
    assert "no queue exists" in envelope(result)["errors"][0]["message"]
    assert list(tmp_path.iterdir()) == [], "nothing is created for a verb that finds nothing"


def test_a_schedule_keeps_the_limits_of_add_for_its_occurrences(
    tmp_path: Path, capsys: Any
) -> None:
    db = str(tmp_path / "q.db")
    added = inproc(
        "schedule add",
        "--db",
        db,
        "--json",
        "capped",
        "--every",
        "1h",
        "--memory",
        "64M",
        "--cpus",
        "0.5",
        "--require-limits",
        "--",
        "true",
        capsys=capsys,
    )
    assert envelope(added)["ok"], added.stdout
    ran = envelope(inproc("schedule run", "--db", db, "--json", "capped", capsys=capsys))
    row = job(db, ran["data"]["job_id"])
    assert (row["memory_bytes"], row["cpus"], row["require_limits"]) == (64 << 20, 0.5, 1)


SCHEDULE_VERBS = ["add", "list", "pause", "remove", "resume", "run", "show"]


@pytest.mark.parametrize("args", [["schedule"], ["schedule", "--help"], ["schedule", "-h"]])
def test_schedule_alone_or_with_help_lists_its_verbs(args: list[str]) -> None:
    result = cli(*args)
    assert (result.exit_code, result.stderr) == (0, ""), result.stderr
    assert result.stdout.startswith("Usage: spoolctl schedule VERB [ARGS]...")
    listed = result.stdout.split("Commands:")[1].split("Options:")[0]
    assert [line.split()[0] for line in listed.strip().splitlines()] == SCHEDULE_VERBS
    assert "'spoolctl schedule VERB --help'" in result.stdout


def test_schedule_with_json_but_no_sub_verb_is_missing_required_in_one_envelope() -> None:
    result = cli("schedule", json=True)
    assert result.exit_code == 1 and result.stderr == ""
    error = result.envelope["errors"][0]
    assert error["code"] == "MISSING_REQUIRED"
    assert error["detail"]["verbs"] == [f"schedule {word}" for word in SCHEDULE_VERBS]
    assert error["remediation"] == "run 'spoolctl schedule --help' for its usage and examples"
    bare = cli("--json")
    assert (bare.exit_code, bare.envelope["errors"][0]["code"]) == (1, "MISSING_REQUIRED")


def test_a_sub_verb_of_schedule_that_does_not_exist_is_still_unknown() -> None:
    result = cli("schedule", "lsit", json=True)
    error = result.envelope["errors"][0]
    assert (result.exit_code, error["code"]) == (1, "UNKNOWN_COMMAND")
    assert error["detail"] == {"command": "schedule lsit", "did_you_mean": "schedule list"}
    flag = cli("schedule", "--bogus", json=True)
    assert (flag.exit_code, flag.envelope["errors"][0]["code"]) == (1, "UNKNOWN_FLAG")
    late = cli("schedule", "list", json=True).envelope["errors"][0]  # --json before `list`
    assert late["code"] == "INVALID_INPUT" and "spoolctl schedule list" in late["message"]


# Prune and the occurrences, driven through the firing service as
# tests/unit/test_schedules.py drives it, on SQLite and on PostgreSQL.


@pytest.mark.both_backends
@pytest.mark.subprocess
def test_a_pruned_job_leaves_its_occurrence_without_a_job(db: Db) -> None:
    add(db)
    (first,) = tick(db, T0)
    set_state(db, first.job_ids[0], "canceled")
    execute(db, "UPDATE jobs SET finished_at = 1")
    pruned = cli("prune", "--older-than", "0", "--state", "canceled", "--yes", db=db, json=True)
    assert pruned.exit_code == 0 and pruned.data["deleted_jobs"] == 1, pruned.stdout
    assert [(o["outcome"], o["job_id"]) for o in occurrences(db)] == [("fired", None)]


@pytest.mark.both_backends
@pytest.mark.subprocess
def test_prune_deletes_past_occurrences_without_a_job_but_keeps_each_schedules_latest(
    db: Db,
) -> None:
    """Without it a schedule's table grows by a row a slot forever."""
    add(db)
    add(db, "t", every=3600.0)  # one slot in this test: its latest, its job pruned
    jobs_at = {}
    for i, state in enumerate(["done", "running", None, "running"]):
        fired = {f.name: f for f in tick(db, T0 + 60 * i)}
        if state is None:  # the previous job still runs: this slot is skipped
            assert fired["s"].skipped == [T0 + 60 * i]
            set_state(db, jobs_at[T0 + 60], "done")
            continue
        jobs_at[T0 + 60 * i] = fired["s"].job_ids[0]
        set_state(db, fired["s"].job_ids[0], state)
    execute(
        db,
        "UPDATE jobs SET state = 'done' WHERE id IN (SELECT o.job_id FROM"
        " schedule_occurrences o JOIN schedules s ON s.id = o.schedule_id"
        " WHERE s.name = 't')",
    )
    execute(db, "UPDATE jobs SET finished_at = 1 WHERE state = 'done'")
    execute(db, "UPDATE schedule_occurrences SET at = 1")
    before = occurrences(db)
    assert [o["outcome"] for o in before] == ["fired", "fired", "fired", "skipped", "fired"]

    dry = cli("prune", "--older-than", "0", "--dry-run", db=db, json=True)
    assert dry.exit_code == 0, dry.stdout
    assert (dry.data["deleted_jobs"], dry.data["deleted_occurrences"]) == (3, 3)
    assert occurrences(db) == before

    pruned = cli("prune", "--older-than", "0", "--yes", db=db, json=True)
    assert pruned.exit_code == 0, pruned.stdout
    assert (pruned.data["deleted_jobs"], pruned.data["deleted_occurrences"]) == (3, 3)
    left = rows(
        db,
        "SELECT s.name, o.slot_at, o.outcome, o.job_id FROM schedule_occurrences o"
        " JOIN schedules s ON s.id = o.schedule_id ORDER BY s.name",
    )
    assert [tuple(r) for r in left] == [
        ("s", T0 + 180, "fired", jobs_at[T0 + 180]),  # its job still runs
        ("t", T0, "fired", None),  # t's latest slot, its job pruned
    ]
    assert tick(db, T0 + 60) == []  # a worker whose clock lags fires no pruned slot again
    set_state(db, jobs_at[T0 + 180], "done")
    (fired,) = tick(db, T0 + 240)  # firing goes on from the kept latest slot
    assert fired.name == "s" and len(fired.job_ids) == 1
