"""Contention on one queue file: many submitters and workers at once, and the
write lock held past the busy timeout.

Every acknowledged add exists exactly once (and nothing unacknowledged does);
a verb that cannot get the lock answers LOCKED (exit 4) having written
nothing; a worker whose writes hit a busy lock keeps running and claims and
records once the lock is free. On SQLite and on PostgreSQL (where the write
lock is an EXCLUSIVE lock on every queue table: see tests.helpers.WriteLock).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    Db,
    WriteLock,
    attempts_of,
    child_env,
    job,
    patience,
    rows,
    start_worker,
    wait_for,
)
from tests.populated import Populated, populate, run_quiet

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_backends, pytest.mark.subprocess]
SUBMITTERS, ADDS_EACH = 8, 25

SUBMITTER = """
import json, sys
from tests.populated import run_quiet
db, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for n in range(count):
    tag = f"{me}-{n}"
    result = run_quiet("add", "--db", db, "--json", "--", "echo", tag)
    envelope = json.loads(result.stdout)
    answer = envelope["data"]["job_id"] if envelope["ok"] else envelope["errors"][0]["code"]
    print(json.dumps([tag, result.exit_code, answer]), flush=True)
"""


@pytest.fixture
def workers(db: Db, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def submit_concurrently(db: Db) -> list[tuple[str, int, object]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SUBMITTER, str(db), f"s{i}", str(ADDS_EACH)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for i in range(SUBMITTERS)
    ]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=patience(60))
        assert proc.returncode == 0, err
        answers += [tuple(json.loads(line)) for line in out.splitlines()]
    return answers  # type: ignore[return-value]


@pytest.mark.slow
def test_every_acknowledged_add_exists_exactly_once_under_contention(
    db: Db, tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    assert run_quiet("add", "--db", str(db), "--json", "--", "true").exit_code == 0
    for i in range(2):
        workers.append(
            start_worker(
                db, "--concurrency", "2", "--poll-interval", "0.1", log=tmp_path / f"worker{i}.log"
            )
        )

    answers = submit_concurrently(db)

    assert len(answers) == SUBMITTERS * ADDS_EACH
    assert {code for _, code, _ in answers} <= {0, 4}, "only success or LOCKED"
    acknowledged = {tag: job_id for tag, code, job_id in answers if code == 0}
    stored = {
        json.loads(r["argv"])[1]: r["id"]
        for r in rows(db, "SELECT id, argv FROM jobs WHERE id > 1")
    }
    assert stored == acknowledged, "an acknowledged add is missing or an unacknowledged one exists"
    wait_for(
        lambda: rows(db, "SELECT count(*) AS n FROM jobs WHERE state != 'done'")[0]["n"] == 0,
        timeout=40,
        what="every job done",
    )
    claims = Counter(
        r["job_id"] for r in rows(db, "SELECT job_id FROM job_events WHERE event = 'claimed'")
    )
    assert set(claims.values()) == {1} and len(claims) == len(acknowledged) + 1


@pytest.fixture
def q(db: Db) -> Populated:
    return populate(db)


@pytest.fixture
def held(q: Populated) -> Iterator[WriteLock]:
    """Another connection holds the write lock until the test releases it."""
    holder = WriteLock(q.db)
    yield holder
    holder.release()


def counts(db: Db) -> tuple[int, ...]:
    return tuple(
        rows(db, f"SELECT count(*) AS n FROM {table}")[0]["n"]
        for table in ("jobs", "attempts", "job_events", "workers")
    )


@pytest.mark.usefixtures("held")
def test_a_lock_held_past_the_busy_timeout_is_locked_and_writes_nothing(
    q: Populated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOOLCTL_BUSY_TIMEOUT", "0.001")
    batch = tmp_path / "batch.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["false"]}\n')
    before = counts(q.db)
    for args in (
        ["add", "--", "true"],
        ["add", "--key", "k1", "--", "true"],
        ["add", "--batch", str(batch)],
        ["cancel", str(q.scheduled)],
        ["retry", str(q.dead)],
        ["prune", "--older-than", "0s", "--yes"],
    ):
        result = q.json(*args)
        assert result.exit_code == 4, (args, result.stdout)
        assert [e["code"] for e in result.envelope["errors"]] == ["LOCKED"], args
        assert counts(q.db) == before, f"{args} wrote while answering LOCKED"
    assert job(q.db, q.scheduled)["state"] == "queued"
    assert job(q.db, q.dead)["state"] == "dead"


def test_a_worker_that_hits_a_busy_lock_keeps_running_and_records_once_free(
    q: Populated, tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    env = {"SPOOLCTL_BUSY_TIMEOUT": "0.05"}
    worker = start_worker(q.db, "--poll-interval", "0.1", env=env, log=tmp_path / "w.log")
    workers.append(worker)
    running = run_quiet(*q.args("add", "--json", "--", "sh", "-c", "sleep 0.3; echo ran"))
    running_id = json.loads(running.stdout)["data"]["job_id"]
    wait_for(lambda: job(q.db, running_id)["state"] == "running", what="the first claim")
    later = run_quiet(*q.args("add", "--json", "--after", "1s", "--", "echo", "later"))
    later_id = json.loads(later.stdout)["data"]["job_id"]

    holder = WriteLock(q.db)
    beat = rows(q.db, "SELECT heartbeat_at FROM workers WHERE pid = ?", (worker.pid,))[0][0]
    time.sleep(2.5)  # the job ends and the delayed one falls due while the lock is held
    frozen = rows(q.db, "SELECT heartbeat_at FROM workers WHERE pid = ?", (worker.pid,))[0][0]
    alive_while_locked = worker.poll() is None
    unrecorded = job(q.db, running_id)["state"] == "running"
    holder.release()

    assert alive_while_locked and frozen == beat, "the worker's writes did not hit the lock"
    assert unrecorded and Path(attempts_of(q.db, running_id)[0]["stdout_path"]).exists()
    wait_for(lambda: job(q.db, later_id)["state"] == "done", what="the claim after the lock")
    assert job(q.db, running_id)["state"] == "done"
    assert Path(attempts_of(q.db, running_id)[0]["stdout_path"]).read_text() == "ran\n"
    assert worker.poll() is None, "the worker died of a busy lock"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=patience(20)) == 0
