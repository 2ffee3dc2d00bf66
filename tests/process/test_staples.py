"""`retry --again` (a done job runs again, as a new attempt) and `remove`
(a job that never ran leaves every view, and the ledger keeps it). On SQLite
and on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.helpers import Db, add, attempts_of, cli, events_of, job, rows
from tests.populated import Populated, populate, run_json, run_quiet

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]


@pytest.fixture
def q(db: Db) -> Populated:
    return populate(db)


def drain(q: Populated) -> None:
    assert q.json("work", "--drain").exit_code == 0


def test_retry_of_a_done_job_is_conflict_unless_asked_again(q: Populated) -> None:
    """0.4.11 answered CONFLICT (exit 5) for it, and still does; --again
    re-runs it as attempt 2, and attempt 1's output stays."""
    before = attempts_of(q.db, q.done)
    assert q.outcome("retry", str(q.done)) == (5, "CONFLICT")
    text = run_quiet(*q.args("retry", str(q.done)))
    assert f"spoolctl retry {q.done} --again" in text.stderr
    result = q.json("retry", str(q.done), "--again")
    assert result.envelope["data"] == {
        "job_id": q.done,
        "state": "queued",
        "previous_state": "done",
    }
    row = job(q.db, q.done)
    assert (row["state"], row["attempts"], row["crashes"]) == ("queued", 0, 0)
    assert events_of(q.db, q.done)[-1] == "retried"
    drain(q)
    assert job(q.db, q.done)["state"] == "done"
    after = attempts_of(q.db, q.done)
    assert [a["attempt_no"] for a in after] == [1, 2]
    assert after[0]["stdout_path"] == before[0]["stdout_path"]
    first = q.json("output", str(q.done), "--attempt", "1").envelope["data"]
    assert (first["attempt_no"], first["streams"]["stdout"]["preview"]) == (1, "hello\n")
    second = q.json("output", str(q.done)).envelope["data"]
    assert (second["attempt_no"], second["streams"]["stdout"]["preview"]) == (2, "hello\n")
    # --again changes nothing for the states retry already took
    assert q.json("retry", str(q.dead), "--again").envelope["data"]["state"] == "queued"
    assert q.outcome("retry", str(q.scheduled), "--again") == (5, "CONFLICT")


def test_remove_takes_a_queued_job_out_of_every_view_and_ledgers_it(q: Populated) -> None:
    later = add(q.db, "echo", "later", opts=("--after", "1h"))
    result = q.json("remove", str(q.scheduled), str(later))
    assert result.exit_code == 0, result.stdout
    assert result.envelope["data"] == {
        "removed": sorted([q.scheduled, later]),
        "count": 2,
        "dependents_canceled": [],
    }
    listed = [j["id"] for j in q.jobs()["jobs"]]
    assert q.scheduled not in listed and later not in listed
    assert q.outcome("show", str(q.scheduled)) == (1, "NOT_FOUND")
    counts = q.json("status").envelope["data"]
    assert counts["counts"].get("queued", 0) == 0, counts
    removed = [
        e
        for e in q.json("events", "--limit", "0").envelope["data"]["events"]
        if e["event"] == "removed"
    ]
    assert [(e["job_id"], e["detail"]["job_id"], e["detail"]["from"]) for e in removed] == [
        (None, q.scheduled, "queued"),
        (None, later, "queued"),
    ]
    assert removed[0]["detail"]["queue"] == "other"
    assert removed[1]["detail"]["argv"] == ["echo", "later"]
    text = run_quiet(*q.args("events"))
    assert f"job {later:<6} removed" in text.stdout
    after = add(q.db, "echo", "after")  # a removed id is never given again
    assert after > later


def test_remove_refuses_bad_ids_and_changes_nothing(q: Populated) -> None:
    def queue_now() -> list[object]:
        return [tuple(r) for r in rows(q.db, "SELECT id, state FROM jobs ORDER BY id")]

    before = queue_now()
    assert q.outcome("remove", str(q.scheduled), "999") == (1, "NOT_FOUND")
    assert q.outcome("remove", str(q.scheduled), str(q.done)) == (5, "CONFLICT")
    assert q.outcome("remove", str(q.canceled)) == (5, "CONFLICT")
    assert q.outcome("remove", str(q.dead)) == (5, "CONFLICT")
    assert q.outcome("remove", "0") == (1, "INVALID_INPUT")
    assert q.outcome("remove", "x") == (1, "INVALID_INPUT")
    assert q.outcome("remove") == (1, "MISSING_REQUIRED")
    assert queue_now() == before
    failing = add(q.db, "false", opts=("--max-retries", "2"))
    drain_once = q.json("work", "--once")
    assert drain_once.exit_code == 0
    assert job(q.db, failing)["state"] == "queued"  # waits for its retry: it has run
    result = q.json("remove", str(failing))
    assert (result.exit_code, result.envelope["errors"][0]["detail"]["attempts"]) == (5, 1)
    assert len(attempts_of(q.db, failing)) == 1
    text = cli("remove", "--db", str(q.db), "999")
    assert (text.exit_code, text.stderr.count("Traceback")) == (1, 0)
    assert "NOT_FOUND" in text.stderr


def test_remove_cancels_what_waited_for_it(q: Populated) -> None:
    parent = add(q.db, "true", opts=("--after", "1h"))
    child = add(q.db, "true", opts=("--after-job", str(parent)))
    grandchild = add(q.db, "true", opts=("--after-job", str(child)))
    either = add(q.db, "true", opts=("--after-job-any", str(parent)))
    both = add(q.db, "true", opts=("--after-job", str(parent)))
    result = q.json("remove", str(parent), str(both))
    data = result.envelope["data"]
    assert data["removed"] == [parent, both]
    assert data["dependents_canceled"] == [child, grandchild]
    row = job(q.db, child)
    assert (row["state"], row["last_failure_reason"]) == ("canceled", "dependency_failed")
    assert events_of(q.db, child)[-1] == "dependency_failed"
    assert job(q.db, either)["state"] == "queued"
    gone = rows(
        q.db,
        "SELECT count(*) FROM job_dependencies WHERE job_id IN (?, ?) OR after_job_id IN (?, ?)",
        (parent, both, parent, both),
    )
    assert gone[0][0] == 0
    assert run_json("retry", "--db", str(q.db), str(child)).exit_code == 0


def test_resume_of_a_lane_nothing_named_says_so(q: Populated) -> None:
    text = run_quiet(*q.args("resume", "nope"))
    assert text.exit_code == 0
    assert "not paused" in text.stdout and "no job or worker has used this lane" in text.stdout
    assert "already running" not in text.stdout
    data = q.json("resume", "nope").envelope["data"]
    assert (data["changed"], data["unknown_queues"]) == (False, ["nope"])
    assert q.json("resume", "other").envelope["data"]["unknown_queues"] == []
    paused = q.json("pause", "typo").envelope["data"]
    assert (paused["changed"], paused["unknown_queues"]) == (True, ["typo"])
