"""`update`: jobs that have not started take new values by `add`'s rules,
each change ledgered with its old and new value; a job that runs or ended
is CONFLICT; ids, --batch and filters change all or nothing; and an update
racing a real worker's claim either changes the job before it runs or is
CONFLICT, never half. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from spoolctl.validate import TAG_MAX_COUNT
from tests.helpers import (
    Db,
    Result,
    add_job,
    attempts_of,
    child_env,
    cli,
    events_of,
    job,
    patience,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.both_backends, pytest.mark.subprocess]

CHANGE = ("--queue", "moved", "--priority", "5", "--timeout", "77")
"""The race's update: a lane no worker serves, a priority and a timeout."""
LATER = 3600.0
"""A run time this far ahead keeps a job queued while no worker looks."""


def update(db: Db, *args: str) -> Result:
    return cli("update", *args, db=db, json=True)


def outcome(result: Result) -> tuple[int, str | None]:
    errors = result.envelope["errors"]
    return result.exit_code, errors[0]["code"] if errors else None


def updated_details(db: Db, job_id: int) -> list[dict[str, Any]]:
    sql = "SELECT detail FROM job_events WHERE job_id = ? AND event = 'updated' ORDER BY id"
    return [json.loads(r["detail"]) for r in rows(db, sql, (job_id,))]


def snapshot(db: Db) -> tuple[list[dict[str, Any]], list[Any]]:
    """Every job row (a running job's heartbeat aside: its worker keeps it
    fresh) and every event."""
    jobs = [
        {k: v for k, v in zip(r.keys(), r, strict=True) if k != "heartbeat_at"}
        for r in rows(db, "SELECT * FROM jobs ORDER BY id")
    ]
    events = [tuple(r) for r in rows(db, "SELECT id, job_id, event FROM job_events ORDER BY id")]
    return jobs, events


def batch(db: Db, text: str, *args: str) -> Result:
    """`update --batch` with `text` on its stdin."""
    argv = [sys.executable, "-m", "spoolctl", "update", "--db", str(db), "--json", "--batch"]
    proc = subprocess.run(
        [*argv, *args], input=text, capture_output=True, text=True, env=child_env(), timeout=60
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_each_field_changes_and_its_event_records_old_and_new(db: Db) -> None:
    job_id = add_job(db, "true", run_at=time.time() + LATER, tags={"keep": "1", "drop": "2"})
    before = job(db, job_id)
    values = {
        "--priority": "7",
        "--queue": "gpu",
        "--timeout": "1h30m",
        "--max-retries": "0",
        "--after": "2h",
        "--tag": "stage=two",
        "--untag": "drop",
        "--memory": "512M",
        "--cpus": "1.5",
    }
    flags = [x for pair in values.items() for x in pair]
    result = update(db, str(job_id), *flags, "--require-limits")
    assert result.exit_code == 0, result.stdout + result.stderr
    (entry,) = result.data["jobs"]
    assert entry["job_id"] == job_id and result.data["changed"] == 1
    after = job(db, job_id)
    expected = {
        "priority": [0, 7],
        "queue": ["default", "gpu"],
        "timeout_seconds": [300, 5400],
        "max_retries": [3, 0],
        "memory_bytes": [None, 512 << 20],
        "cpus": [None, 1.5],
        "require_limits": [None, 1],
        "tags": [{"keep": "1", "drop": "2"}, {"keep": "1", "stage": "two"}],
        "next_run_at": [before["next_run_at"], after["next_run_at"]],
    }
    assert entry["changes"] == expected
    assert updated_details(db, job_id) == [{"changes": expected}]
    assert after["next_run_at"] > before["next_run_at"]  # two hours from now, past the hour
    for column in ("priority", "queue", "timeout_seconds", "max_retries", "memory_bytes", "cpus"):
        assert after[column] == expected[column][1]
    assert json.loads(after["tags"]) == {"keep": "1", "stage": "two"}
    assert after["state"] == "queued"

    # the same values again change nothing and write no event; `none` is no timeout
    same = update(db, str(job_id), "--priority", "7", "--queue", "gpu", "--tag", "stage=two")
    assert same.data == {"jobs": [{"job_id": job_id, "changes": {}}], "changed": 0}
    assert "unchanged" in cli("update", str(job_id), "--priority", "7", db=db).stdout
    assert len(updated_details(db, job_id)) == 1
    gone = update(db, str(job_id), "--timeout", "none", "--no-require-limits")
    changes = gone.data["jobs"][0]["changes"]
    assert changes == {"timeout_seconds": [5400, 0], "require_limits": [1, None]}
    assert events_of(db, job_id) == ["added", "updated", "updated"]


def test_the_text_answer_is_one_line_per_job_escaping_what_it_shows(db: Db) -> None:
    first = add_job(db, "true", run_at=time.time() + LATER)
    second = add_job(db, "true", run_at=time.time() + LATER, priority=4)
    result = cli("update", str(first), str(second), "--priority", "4", "--tag", "t=\x1b[31m", db=db)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"Job {first}: priority 0 -> 4, tags {{}} -> {{t=\\x1b[31m}}",
        f"Job {second}: tags {{}} -> {{t=\\x1b[31m}}",
    ]


def test_waiting_and_paused_lane_jobs_keep_their_state(db: Db) -> None:
    parent = add_job(db, "true", run_at=time.time() + LATER)
    waiting = add_job(db, "true", after_jobs=(parent,))
    assert cli("pause", "held", db=db).exit_code == 0
    result = update(db, str(waiting), str(parent), "--queue", "held", "--priority", "3")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert [e["job_id"] for e in result.data["jobs"]] == [parent, waiting]
    assert (job(db, waiting)["state"], job(db, waiting)["queue"]) == ("waiting", "held")
    assert (job(db, parent)["state"], job(db, parent)["queue"]) == ("queued", "held")


def test_a_job_moved_to_an_idle_workers_lane_runs_there(db: Db) -> None:
    """An idle worker of lane `dest` (its own poll an hour apart) runs a
    queued job moved into its lane: the move is a change its watch sees (on
    PostgreSQL the update names the state, so the trigger that sends the
    notification of a queued job fires, and the fallback look remains)."""
    job_id = add_job(db, "true", lane="elsewhere")
    worker = start_worker(db, "--queue", "dest", "--poll-interval", "3600")
    try:
        registered = "SELECT id FROM workers WHERE queue = 'dest' AND state = 'running'"
        wait_for(lambda: rows(db, registered), what="the worker registered")
        assert update(db, str(job_id), "--queue", "dest").exit_code == 0
        wait_for(lambda: job(db, job_id)["state"] == "done", what="the moved job run")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=patience(30))


def test_running_and_ended_jobs_are_conflict_and_nothing_changes(db: Db) -> None:
    queued = add_job(db, "true", run_at=time.time() + LATER, lane="later")
    done = add_job(db, "true", lane="quick")
    cli("work", "--queue", "quick", "--drain", db=db)
    assert job(db, done)["state"] == "done"
    running = add_job(db, "sleep", "60", lane="busy")
    worker = start_worker(db, "--queue", "busy")
    try:
        wait_for(lambda: job(db, running)["state"] == "running", what="the job running")
        before = snapshot(db)
        for chosen in ([str(running)], [str(done)], [str(queued), str(running)]):
            result = update(db, *chosen, "--priority", "9", "--queue", "elsewhere")
            assert outcome(result) == (5, "CONFLICT"), result.stdout
            bad = int(chosen[-1])
            assert result.envelope["errors"][0]["detail"]["job_id"] == bad
            assert f"job {bad} is" in result.envelope["errors"][0]["message"]
        on_stdin = batch(db, f"{queued}\n{done}\n", "--priority", "9")
        assert outcome(on_stdin) == (5, "CONFLICT")
        assert snapshot(db) == before
    finally:
        cli("cancel", str(running), "--running", "--yes", "--now", db=db)
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=patience(30))


def test_batch_and_filter_change_all_or_nothing(db: Db) -> None:
    later = time.time() + LATER
    untagged = add_job(db, "true", run_at=later, lane="spare")  # the first id
    a = add_job(db, "true", run_at=later, lane="night", tags={"owner": "ana"})
    b = add_job(db, "true", run_at=later, lane="night", tags={"owner": "bo"})
    c = add_job(db, "true", run_at=later, lane="day", tags={"owner": "ana"})
    d = add_job(db, "true", after_jobs=(a,), tags={"owner": "ana"})  # waiting, lane default

    result = batch(db, f"# the night's\n{a}\n\n{b}  # and bo's\n", "--priority", "4")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert [e["job_id"] for e in result.envelope["data"]["jobs"]] == [a, b]
    assert [job(db, i)["priority"] for i in (a, b, c, d)] == [4, 4, 0, 0]

    # a filter takes the queued and waiting jobs that match all of it
    by_tag = update(db, "--with-tag", "owner=ana", "--max-retries", "9")
    assert sorted(e["job_id"] for e in by_tag.data["jobs"]) == [a, c, d]
    both = update(db, "--in-queue", "night", "--with-tag", "owner", "--queue", "dawn")
    assert sorted(e["job_id"] for e in both.data["jobs"]) == [a, b]
    assert [job(db, i)["queue"] for i in (a, b, c, d)] == ["dawn", "dawn", "day", "default"]
    nothing = update(db, "--in-queue", "night", "--priority", "1")
    assert nothing.exit_code == 0 and nothing.data == {"jobs": [], "changed": 0}
    assert (
        "nothing changed" in cli("update", "--in-queue", "night", "--priority", "1", db=db).stdout
    )

    # a job that cannot take the change (a tag too many once merged): none changes,
    # not even the one before it, which could
    before = snapshot(db)
    full = [x for i in range(TAG_MAX_COUNT) for x in ("--tag", f"k{i}=v")]
    crowded = update(db, str(a), str(untagged), *full)  # a has a tag already
    assert outcome(crowded) == (1, "INVALID_INPUT")
    assert f"job {a}:" in crowded.envelope["errors"][0]["message"]
    assert snapshot(db) == before
    done = add_job(db, "true", lane="quick")
    cli("work", "--queue", "quick", "--drain", db=db)
    before = snapshot(db)
    assert outcome(batch(db, f"{a}\n{done}\n", "--priority", "8")) == (5, "CONFLICT")
    assert outcome(update(db, str(a), str(10**6), "--priority", "8")) == (1, "NOT_FOUND")
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (("--priority", "1"), None),  # no job chosen
        (("{a}",), None),  # no new value
        (("{a}", "--in-queue", "default", "--priority", "1"), None),  # ids and a filter
        (("--in-queue", "default", "--priority", "1"), "{a}\n"),  # --batch ids and a filter
        (("--priority", "1"), "{a}\nnot-an-id\n"),  # a bad --batch line
        (("{a}", "--priority", str(2**31)), None),  # add's bounds
        (("{a}", "--timeout", "soon"), None),
        (("{a}", "--queue", "no spaces"), None),
        (("{a}", "--memory", "lots"), None),
        (("{a}", "--at", "1", "--after", "1m"), None),
        (("{a}", "--tag", "x=1", "--untag", "x"), None),
        (("{a}", "--tag", "novalue"), None),
        (("{a}", "--with-tag", "x=1", "--priority", "1"), None),
    ],
)
def test_bad_input_is_invalid_input_and_changes_nothing(
    db: Db, args: tuple[str, ...], stdin: str | None
) -> None:
    a = add_job(db, "true", run_at=time.time() + LATER)
    filled = [x.format(a=a) for x in args]
    before = snapshot(db)
    result = update(db, *filled) if stdin is None else batch(db, stdin.format(a=a), *filled)
    assert outcome(result) == (1, "INVALID_INPUT"), result.stdout + result.stderr
    assert snapshot(db) == before
    if stdin is not None and "not-an-id" in stdin:
        assert result.envelope["errors"][0]["detail"]["line"] == 2


def test_an_update_racing_a_claim_changes_the_job_before_it_runs_or_is_conflict(db: Db) -> None:
    """A worker drains lane `race` while updates move the two jobs it will
    claim next to lane `moved` with a new priority and timeout. Each job
    reports the lane it was claimed from (SPOOLCTL_QUEUE). An update either
    moved both its jobs before either ran (then neither runs: no worker
    serves `moved`) or was CONFLICT and changed neither; every job ends
    either moved with all its new values or run with all its old ones."""
    script = "echo $SPOOLCTL_QUEUE; sleep 0.2"
    ids = [add_job(db, "sh", "-c", script, lane="race") for _ in range(24)]
    answers: list[tuple[tuple[int, ...], tuple[int, str | None]]] = []
    next_sql = "SELECT id FROM jobs WHERE queue = 'race' AND state = 'queued' ORDER BY id LIMIT 2"

    def updates() -> None:
        while len(pair := tuple(r["id"] for r in rows(db, next_sql))) == 2:
            answers.append((pair, outcome(update(db, *map(str, pair), *CHANGE))))

    racer = threading.Thread(target=updates)
    worker = start_worker(db, "--queue", "race")
    try:
        racer.start()
        racer.join(timeout=patience(90))
        assert not racer.is_alive()

        def settled() -> bool:
            found = [job(db, i) for i in ids]
            return all(r["state"] == "done" or r["queue"] == "moved" for r in found)

        wait_for(settled, timeout=60, what="lane race drained")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=patience(30))

    assert {answer for _, answer in answers} <= {(0, None), (5, "CONFLICT")}, answers
    moved = {job_id for pair, answer in answers if answer == (0, None) for job_id in pair}
    for job_id in ids:
        row, ran = job(db, job_id), attempts_of(db, job_id)
        seen = (row["state"], row["queue"], row["priority"], row["timeout_seconds"])
        if job_id in moved:  # changed before any claim: all new values, never ran
            assert (seen, ran) == (("queued", "moved", 5, 77), [])
            assert len(updated_details(db, job_id)) == 1
        else:  # ran as submitted, claimed from its own lane, not a value changed
            assert seen == ("done", "race", 0, 300)
            assert (len(ran), output_of(db, job_id)) == (1, "race")
            assert updated_details(db, job_id) == []
    for pair, answer in answers:  # a CONFLICT: one of its jobs had been claimed
        if answer == (5, "CONFLICT"):
            assert any(attempts_of(db, job_id) for job_id in pair)


def output_of(db: Db, job_id: int) -> str:
    return cli("output", str(job_id), "--stream", "stdout", "--raw", db=db).stdout.strip()


def test_a_warned_job_keeps_a_timeout_longer_than_its_warning(db: Db) -> None:
    """`--signal-before-timeout` needs a timeout longer than its lead, on
    `update` as on `add`: a shorter timeout, or none, is refused whole."""
    later = f"{time.time() + LATER:.0f}"
    plain = add_job(db, "true", run_at=time.time() + LATER)
    warned = cli(
        "add",
        "--at",
        later,
        "--timeout",
        "10m",
        "--signal-before-timeout",
        "USR1@2m",
        "--",
        "true",
        db=db,
        json=True,
    ).data["job_id"]
    before = snapshot(db)
    for timeout in ("2m", "90s", "none"):
        refused = update(db, str(plain), str(warned), "--timeout", timeout)
        assert outcome(refused) == (1, "INVALID_INPUT"), refused.stdout + refused.stderr
        assert refused.envelope["errors"][0]["detail"]["job_id"] == warned
        assert snapshot(db) == before
    assert outcome(update(db, str(warned), "--timeout", "3m")) == (0, None)
    assert job(db, warned)["timeout_seconds"] == 180
