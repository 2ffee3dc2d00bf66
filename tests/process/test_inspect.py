"""The read-only verbs: list, show, status, workers, wait, output, feedback,
events. They never take the write lock and never create a queue. On SQLite
and on PostgreSQL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Db, WriteLock, add, child_env, has_queue, is_postgres, wait_for
from tests.populated import Populated, populate, run_quiet

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]


@pytest.fixture(scope="module")
def q(module_db: Db) -> Populated:
    return populate(module_db)


def data(q: Populated, *args: str) -> dict:
    result = q.json(*args)
    assert result.exit_code == 0, result.stdout
    return result.envelope["data"]


def error(q: Populated, *args: str) -> tuple[int, str]:
    result = q.json(*args)
    envelope = result.envelope
    assert not envelope["ok"] and envelope["data"] is None
    return result.exit_code, envelope["errors"][0]["code"]


def test_list_is_newest_first_and_hides_env_values(q: Populated) -> None:
    jobs = data(q, "list")["jobs"]
    assert [j["id"] for j in jobs] == sorted((j["id"] for j in jobs), reverse=True)
    first = next(j for j in jobs if j["id"] == q.done)
    assert first["env_keys"] == ["SECRET"] and "xyz" not in json.dumps(jobs)
    assert first["tags"] == {"team": "ml"}


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (("--state", "dead"), "dead"),
        (("--queue", "other"), "scheduled"),
        (("--tag", "team=ml"), "done"),
        (("--priority-min", "5"), "scheduled"),
        (("--state", "queued", "--queue", "other", "--priority-min", "1"), "scheduled"),
    ],
)
def test_list_filters(q: Populated, flags: tuple[str, ...], expect: str) -> None:
    found = data(q, "list", *flags)
    assert [j["id"] for j in found["jobs"]] == [getattr(q, expect)]
    assert found["count"] == 1


def test_list_limit_and_empty_filters(q: Populated) -> None:
    assert data(q, "list", "--limit", "2")["count"] == 2
    assert data(q, "list", "--tag", "team=nobody")["jobs"] == []
    assert data(q, "list", "--tag", "team=")["jobs"] == []
    assert error(q, "list", "--limit", "1001") == (1, "INVALID_INPUT")
    assert error(q, "list", "--state", "sleeping") == (1, "INVALID_INPUT")


def test_show_has_every_column_attempts_and_events(q: Populated) -> None:
    detail = data(q, "show", str(q.done))
    assert detail["job"]["env"] == {"SECRET": "xyz"}
    assert {"locked_by", "heartbeat_at", "last_failure_reason"} <= set(detail["job"])
    assert [a["state"] for a in detail["attempts"]] == ["succeeded"]
    assert [e["event"] for e in detail["events"]] == ["added", "claimed", "succeeded"]
    assert error(q, "show", "9999") == (1, "NOT_FOUND")
    assert error(q, "show", "0") == (1, "INVALID_INPUT")


def test_status_counts(q: Populated) -> None:
    status = data(q, "status")
    assert status["counts"] == {
        "queued": 1,
        "running": 0,
        "done": 1,
        "failed": 0,
        "dead": 1,
        "canceled": 1,
        "waiting": 0,
    }
    assert status["scheduled"] == 1
    assert status["queues"]["other"]["scheduled"] == 1
    assert [d["id"] for d in status["recent_dead"]] == [q.dead]


def test_workers_lists_stopped_ones_only_with_all(q: Populated) -> None:
    assert data(q, "workers")["workers"] == []
    everyone = data(q, "workers", "--all")["workers"]
    assert len(everyone) == 1 and everyone[0]["state"] == "stopped"


def test_wait_exit_codes(q: Populated) -> None:
    done = q.json("wait", str(q.done))
    assert done.exit_code == 0 and done.envelope["data"]["all_succeeded"] is True
    mixed = q.json("wait", str(q.done), str(q.dead), str(q.canceled))
    assert mixed.exit_code == 6 and mixed.envelope["ok"] is True
    assert mixed.envelope["data"]["jobs"][str(q.dead)]["last_exit_code"] == 3
    assert error(q, "wait", str(q.scheduled), "--timeout", "0.05") == (4, "TIMEOUT")
    assert error(q, "wait", "9999", "--timeout", "0") == (1, "NOT_FOUND")
    assert error(q, "wait") == (1, "MISSING_REQUIRED")


def test_output_latest_attempt_streams(q: Populated) -> None:
    out = data(q, "output", str(q.done))
    assert out["attempt_no"] == 1 and out["attempts_total"] == 1
    assert out["streams"]["stdout"]["preview"] == "hello\n"
    assert out["streams"]["stdout"]["size_bytes"] == 6
    assert set(data(q, "output", str(q.dead), "--stream", "stderr")["streams"]) == {"stderr"}
    assert error(q, "output", str(q.done), "--attempt", "2") == (1, "NOT_FOUND")


def test_output_raw_writes_bytes_unframed(q: Populated) -> None:
    result = run_quiet(*q.args("output", str(q.dead), "--stream", "stderr", "--raw"))
    assert (result.exit_code, result.stdout) == (0, "oops\n")
    both = run_quiet(*q.args("output", str(q.dead), "--raw"))
    assert (both.stdout, both.stderr) == ("", "oops\n")
    assert error(q, "output", str(q.done), "--raw") == (1, "INVALID_INPUT")


def test_output_and_feedback_of_a_job_that_never_ran(q: Populated) -> None:
    for verb in ("output", "feedback"):
        result = q.json(verb, str(q.scheduled))
        assert result.exit_code == 0
        assert [w["code"] for w in result.envelope["warnings"]] == ["NO_ATTEMPTS_YET"]
    assert q.json("output", str(q.scheduled)).envelope["data"]["attempts"] == []


def test_feedback_verdicts(q: Populated) -> None:
    good = data(q, "feedback", str(q.done))
    assert (good["succeeded"], good["terminal"], good["remediation"]) == (True, True, None)
    bad = data(q, "feedback", str(q.dead), "--tail-bytes", "3", "--stream", "stderr")
    assert (bad["succeeded"], bad["exit_code"], bad["failure_reason"]) == (False, 3, "process_exit")
    assert bad["streams"]["stderr"] == {
        "path": bad["streams"]["stderr"]["path"],
        "size_bytes": 5,
        "tail": "ps\n",
        "truncated": True,
        "missing": False,
        **(
            {"source": "database", "stored_bytes": 5, "stored_truncated": False}
            if is_postgres(q.db)
            else {}
        ),
    }
    assert (
        bad["remediation"] == f"spoolctl output {q.dead} --stream stderr; spoolctl retry {q.dead}"
    )
    pending = data(q, "feedback", str(q.scheduled))
    assert pending["succeeded"] is None and pending["remediation"].startswith("spoolctl wait")
    assert error(q, "feedback", str(q.done), "--tail-bytes", "0") == (1, "INVALID_INPUT")


def test_events_cursor_pages_through_the_ledger(q: Populated) -> None:
    everything = data(q, "events", "--limit", "0")["events"]
    first = q.json("events", "--limit", "2").envelope
    assert first["meta"]["pagination"] == {"cursor": everything[1]["id"], "first_id": 1}
    rest = q.json(
        "events", "--since-id", str(first["meta"]["pagination"]["cursor"]), "--limit", "0"
    )
    assert first["data"]["events"] + rest.envelope["data"]["events"] == everything
    only = data(q, "events", "--job", str(q.dead))["events"]
    assert {e["job_id"] for e in only} == {q.dead}


def test_events_wait_times_out_with_meta(q: Populated) -> None:
    cursor = data(q, "events", "--limit", "0")["count"] + 100
    result = q.json("events", "--since-id", str(cursor), "--wait", "--wait-timeout", "0.2")
    wait = result.envelope["meta"]["wait"]
    assert result.exit_code == 0 and wait["reason"] == "timeout" and wait["waited_ms"] >= 200


def test_events_wait_returns_when_a_record_arrives(db: Db) -> None:
    q = populate(db)
    cursor = q.json("events").envelope["meta"]["pagination"]["cursor"]
    adder = threading.Timer(0.3, lambda: add(q.db, "true"))  # a real process: own stdout
    adder.start()
    result = q.json("events", "--since-id", str(cursor), "--wait", "--wait-timeout", "20")
    adder.join()
    assert result.envelope["meta"]["wait"]["reason"] == "records_available"
    assert [e["event"] for e in result.envelope["data"]["events"]] == ["added"]


def test_events_follow_ends_with_a_control_frame(q: Populated) -> None:
    result = run_quiet(
        *q.args("events", "--json", "--follow", "--since-id", "0", "--max-events", "3")
    )
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert [f["id"] for f in frames[:3]] == [1, 2, 3]
    assert frames[3]["control"]["type"] == "end" and frames[3]["control"]["reason"] == "max_events"
    idle = run_quiet(
        *q.args("events", "--json", "--follow", "--since-id", "999", "--idle-timeout", "0.1")
    )
    assert json.loads(idle.stdout)["control"]["reason"] == "idle_timeout"
    assert error(q, "events", "--follow", "--limit", "5") == (1, "INVALID_INPUT")
    assert error(q, "events", "--wait", "--max-events", "5") == (1, "INVALID_INPUT")


def test_text_tables_are_aligned_and_plain_without_a_tty(q: Populated) -> None:
    text = run_quiet(*q.args("list")).stdout.splitlines()
    headers = ["ID", "STATE", "QUEUE", "PRI", "ATTEMPTS", "FAILURES", "CREATED", "COMMAND"]
    assert text[0].split() == headers
    column = text[0].index("STATE")
    assert all(line[column - 2 : column] == "  " for line in text[1:])
    assert "\x1b[" not in run_quiet(*q.args("status")).stdout
    workers = run_quiet(*q.args("workers", "--all")).stdout
    assert workers.startswith("WORKER") and "ago" in workers


@pytest.fixture
def write_locked(q: Populated) -> Iterator[None]:
    """Another connection holds the write lock for the whole test."""
    holder = WriteLock(q.db)
    try:
        yield
    finally:
        holder.release()


@pytest.mark.usefixtures("write_locked")
def test_read_only_verbs_answer_while_the_write_lock_is_held(
    q: Populated, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOOLCTL_BUSY_TIMEOUT", "0.2")
    started = time.monotonic()
    for args in (
        ["status"],
        ["list"],
        ["show", str(q.done)],
        ["events"],
        ["workers"],
        ["output", str(q.done)],
        ["feedback", str(q.dead)],
        ["wait", str(q.done)],
        ["prune", "--older-than", "0", "--dry-run"],
    ):
        assert q.json(*args).exit_code == 0, args
    assert time.monotonic() - started < 5
    assert q.json("cancel", str(q.scheduled)).envelope["errors"][0]["code"] == "LOCKED"


def test_inspecting_verbs_never_create_a_queue(db: Db) -> None:
    """No file on SQLite; an empty database stays empty on PostgreSQL."""
    empty = Populated(db, 1, 2, 3, 4)
    assert data(empty, "status")["counts"]["queued"] == 0
    assert data(empty, "list")["jobs"] == []
    assert data(empty, "events", "--wait", "--wait-timeout", "0")["events"] == []
    assert data(empty, "workers")["workers"] == []
    assert data(empty, "prune", "--older-than", "0", "--dry-run")["matched"] == 0
    assert error(empty, "show", "1") == (1, "NOT_FOUND")
    assert error(empty, "output", "1") == (1, "NOT_FOUND")
    assert error(empty, "wait", "1", "--timeout", "0") == (1, "NOT_FOUND")
    assert error(empty, "retry", "1") == (1, "NOT_FOUND")
    assert error(empty, "cancel", "1") == (1, "NOT_FOUND")
    assert data(empty, "prune", "--older-than", "0", "--yes")["matched"] == 0
    doctor = empty.json("doctor")
    assert (doctor.exit_code, doctor.envelope["data"]["ready"]) == (3, False), "no queue yet"
    assert not has_queue(db)
    if not is_postgres(db):
        assert not Path(db).parent.exists()


class FakeTty:
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_tty_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    from spoolctl.cli import render

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(render.sys, "stdout", FakeTty())
    assert render.style("dead", fg="red") != "dead"
    monkeypatch.setenv("NO_COLOR", "1")
    assert render.style("dead", fg="red") == "dead"


def test_a_read_verb_on_a_queue_that_does_not_exist_says_so(db: Db) -> None:
    """A mistyped --db must not look like an empty queue: the answer is the
    empty one, with warning NO_QUEUE naming where it looked; a job asked of
    it is NOT_FOUND saying no queue is there. Nothing is created."""
    where = str(db).split("@")[-1] if is_postgres(db) else str(db)
    for verb in (["status"], ["list"], ["workers"], ["events"]):
        answer = run_quiet(verb[0], "--json", "--db", str(db), *verb[1:])
        assert answer.exit_code == 0, answer.stdout
        (warning,) = answer.envelope["warnings"]
        assert warning["code"] == "NO_QUEUE" and where in warning["message"], warning
        text = run_quiet(verb[0], "--db", str(db))
        assert "warning: NO_QUEUE: no queue exists at" in text.stderr
    for verb in (["show", "7"], ["output", "7"], ["feedback", "7"], ["retry", "7"], ["wait", "7"]):
        refused = run_quiet(verb[0], "--json", "--db", str(db), *verb[1:])
        (found,) = refused.envelope["errors"]
        assert (refused.exit_code, found["code"]) == (1, "NOT_FOUND")
        assert "no queue exists at" in found["message"], (verb, found)
    assert not has_queue(db)
    add(db, "true")
    assert run_quiet("status", "--json", "--db", str(db)).envelope["warnings"] == []


def test_events_follow_starts_at_the_end_of_the_ledger_unless_since_id_is_given(
    db: Db, tmp_path: Path
) -> None:
    """As `tail -f` (and 0.4.11): without --since-id only events to come are
    printed; --since-id 0 replays every one. A stop signal ends it with the
    control frame `interrupted`."""
    q = populate(db)
    end = data(q, "events", "--limit", "0")["events"][-1]["id"]
    out = tmp_path / "follow.ndjson"
    with open(out, "w") as sink:
        follower = subprocess.Popen(
            [sys.executable, "-m", "spoolctl", *q.args("events", "--follow", "--json")],
            stdout=sink,
            stdin=subprocess.DEVNULL,
            env=child_env(),
        )
    try:

        def printed() -> list[dict[str, Any]]:
            add(q.db, "true")  # until it has read the end: then the next event shows
            lines = out.read_text().splitlines(keepends=True)
            return [json.loads(line) for line in lines if line.endswith("\n")]

        first = wait_for(printed, timeout=60, what="an event added after it started")[0]
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert first["id"] > end and first["event"] == "added", "nothing from before it started"
    frames = [json.loads(line) for line in out.read_text().splitlines()]
    assert frames[-1]["control"]["reason"] == "interrupted"
    replay = run_quiet(
        *q.args("events", "--json", "--follow", "--since-id", "0", "--max-events", "1")
    )
    assert json.loads(replay.stdout.splitlines()[0])["id"] == 1
