"""Jobs that wait for other jobs: waiting until every parent is done, canceled
with `dependency_failed` (transitively, with events naming the parent) when
one ends dead or canceled, retry with and without its dependents, and
pipelines submitted as one batch, run by real worker processes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.queues import open_write
from spoolctl.errors import Conflict, NotFound
from spoolctl.services.cancel import cancel
from spoolctl.services.deadletter import requeue
from spoolctl.services.submit import JobSpec, submit, submit_batch
from tests.helpers import add_job, cli, events_of, inproc, job, rows


def write(db: Path, fn: Any) -> Any:
    queue = open_write(str(db))
    try:
        return queue.write(fn)
    finally:
        queue.engine.dispose()


def drain(db: Path) -> dict[str, Any]:
    """A real worker process drains the default lane."""
    result = cli("work", "--drain", db=db, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.data  # type: ignore[no-any-return]


def state(db: Path, job_id: int) -> str:
    return str(job(db, job_id)["state"])


def test_a_job_waits_until_every_parent_is_done(db: Path) -> None:
    first = add_job(db, "true")
    second = add_job(db, "true", after_jobs=(first,))
    third = add_job(db, "true", after_jobs=(first, second))
    assert [state(db, i) for i in (first, second, third)] == ["queued", "waiting", "waiting"]
    assert drain(db)["executed"] == 3
    assert [state(db, i) for i in (first, second, third)] == ["done"] * 3
    started = [r["job_id"] for r in rows(db, "SELECT job_id FROM attempts ORDER BY started_at, id")]
    assert started == [first, second, third]


def test_after_done_parents_the_job_is_queued_at_once_keeping_its_delay(db: Path) -> None:
    parent = add_job(db, "true")
    drain(db)
    later = time.time() + 3600
    child = add_job(db, "true", after_jobs=(parent,), run_at=later)
    assert state(db, child) == "queued"
    assert job(db, child)["next_run_at"] == pytest.approx(later)


def test_a_released_job_keeps_its_own_delay(db: Path) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,), run_at=time.time() + 3600)
    drain(db)
    assert state(db, parent) == "done"
    assert state(db, child) == "queued"
    assert job(db, child)["next_run_at"] > time.time() + 3000


def test_naming_a_missing_job_is_not_found_and_writes_nothing(db: Path) -> None:
    parent = add_job(db, "true")
    before = rows(db, "SELECT count(*) FROM jobs")[0][0]
    with pytest.raises(NotFound, match="999"):
        write(db, lambda c: submit(c, JobSpec(["true"], after_jobs=(parent, 999)), time.time()))
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == before
    assert rows(db, "SELECT count(*) FROM job_dependencies")[0][0] == 0


def test_after_a_failed_parent_the_job_is_created_canceled(db: Path) -> None:
    parent = add_job(db, "false", max_retries=0)
    drain(db)
    assert state(db, parent) == "dead"
    child = add_job(db, "true", after_jobs=(parent,))
    row = job(db, child)
    assert (row["state"], row["last_failure_reason"]) == ("canceled", "dependency_failed")
    assert f"job {parent} is dead" in row["last_error"]
    assert events_of(db, child) == ["added", "dependency_failed"]


def test_a_dead_parent_cancels_its_dependents_transitively(db: Path) -> None:
    parent = add_job(db, "false", max_retries=0)
    child = add_job(db, "true", after_jobs=(parent,))
    grandchild = add_job(db, "true", after_jobs=(child,))
    bystander = add_job(db, "true")
    drain(db)
    assert state(db, parent) == "dead"
    assert state(db, bystander) == "done"
    for waiting, named in ((child, parent), (grandchild, child)):
        row = job(db, waiting)
        assert (row["state"], row["last_failure_reason"]) == ("canceled", "dependency_failed")
        assert row["finished_at"] is not None
        assert events_of(db, waiting) == ["added", "dependency_failed"]
        detail = rows(
            db,
            "SELECT detail FROM job_events WHERE job_id = ? AND event = 'dependency_failed'",
            (waiting,),
        )[0]["detail"]
        assert json.loads(detail)["parent"] == named
    assert (
        rows(db, "SELECT count(*) FROM attempts WHERE job_id IN (?, ?)", (child, grandchild))[0][0]
        == 0
    )


def test_canceling_a_parent_or_a_waiting_job_cancels_what_waits(db: Path) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,))
    grandchild = add_job(db, "true", after_jobs=(child,))
    write(db, lambda c: cancel(c, child, running_ok=False, now=time.time()))
    assert state(db, child) == "canceled"
    assert job(db, grandchild)["last_failure_reason"] == "dependency_failed"
    assert state(db, parent) == "queued"
    other = add_job(db, "true", after_jobs=(parent,))
    write(db, lambda c: cancel(c, parent, running_ok=False, now=time.time()))
    assert job(db, other)["last_failure_reason"] == "dependency_failed"


def test_retry_of_the_parent_does_not_resurrect_dependents_unless_asked(db: Path) -> None:
    parent = add_job(db, "false", max_retries=0)
    child = add_job(db, "true", after_jobs=(parent,))
    grandchild = add_job(db, "true", after_jobs=(child,))
    drain(db)
    write(db, lambda c: requeue(c, parent, force=False, now=time.time()))
    assert state(db, parent) == "queued"
    assert state(db, child) == "canceled"
    write(db, lambda c: cancel(c, parent, running_ok=False, now=time.time()))
    write(db, lambda c: requeue(c, parent, force=False, now=time.time(), with_dependents=True))
    assert [state(db, i) for i in (parent, child, grandchild)] == ["queued", "waiting", "waiting"]
    assert job(db, child)["last_failure_reason"] is None
    assert events_of(db, grandchild)[-1] == "retried"
    write(
        db, lambda c: c.exec_driver_sql(f"UPDATE jobs SET argv = '[\"true\"]' WHERE id = {parent}")
    )
    drain(db)
    assert [state(db, i) for i in (parent, child, grandchild)] == ["done"] * 3


def test_a_dependent_retried_alone_is_a_conflict_while_its_parent_failed(db: Path) -> None:
    parent = add_job(db, "false", max_retries=0)
    child = add_job(db, "true", after_jobs=(parent,))
    drain(db)
    with pytest.raises(Conflict, match=f"retry {parent} --with-dependents"):
        write(db, lambda c: requeue(c, child, force=False, now=time.time()))
    assert state(db, child) == "canceled"


def test_retrying_a_waiting_job_is_a_conflict(db: Path) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,))
    with pytest.raises(Conflict, match="waiting"):
        write(db, lambda c: requeue(c, child, force=False, now=time.time()))


def test_a_batch_refers_to_its_earlier_lines(db: Path) -> None:
    specs = [
        JobSpec(["sh", "-c", "echo one >> order.txt"]),
        JobSpec(["sh", "-c", "echo two >> order.txt"], after_lines=(0,)),
        JobSpec(["sh", "-c", "echo three >> order.txt"], after_lines=(0, 1)),
    ]
    ids = write(db, lambda c: submit_batch(c, specs, time.time()))
    assert [state(db, i) for i in ids] == ["queued", "waiting", "waiting"]
    assert [tuple(r) for r in rows(db, "SELECT * FROM job_dependencies ORDER BY 1, 2")] == [
        (ids[1], ids[0]),
        (ids[2], ids[0]),
        (ids[2], ids[1]),
    ]
    drain(db)
    assert Path("order.txt").read_text().split() == ["one", "two", "three"]


def test_the_drain_is_not_held_open_by_jobs_waiting_for_another_lane(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = add_job(db, "true", queue="other")
    child = add_job(db, "true", after_jobs=(parent,))
    drained = drain(db)
    assert (drained["drained"], drained["executed"]) == (True, 0)
    assert state(db, child) == "waiting"
    assert (
        inproc(
            "work", "--db", str(db), "--json", "--drain", "--queue", "other", capsys=capsys
        ).exit_code
        == 0
    )
    assert state(db, child) == "queued"


def test_a_parent_dead_lettered_as_a_damaged_row_cancels_its_dependents(db: Path) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,))
    write(db, lambda c: c.exec_driver_sql(f"UPDATE jobs SET argv = 'oops' WHERE id = {parent}"))
    drain(db)
    assert state(db, parent) == "dead"
    assert job(db, child)["last_failure_reason"] == "dependency_failed"
    assert events_of(db, child) == ["added", "dependency_failed"]
