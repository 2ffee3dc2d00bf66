"""Jobs that wait for other jobs: waiting until every parent is done, canceled
with `dependency_failed` (transitively, with events naming the parent) when
one ends dead or canceled, retry with and without its dependents, and
pipelines submitted as one batch, run by real worker processes. On SQLite and
on PostgreSQL."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.database import open_write
from spoolctl.errors import Conflict, NotFound
from spoolctl.services.cancel import cancel
from spoolctl.services.deadletter import requeue
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit, submit_batch
from tests.helpers import (
    Db,
    add_job,
    cli,
    events_of,
    inproc,
    is_postgres,
    job,
    rows,
    start_worker,
    wait_for,
)

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]


def write(db: Db, fn: Any) -> Any:
    queue = open_write(str(db))
    try:
        return queue.write(fn)
    finally:
        queue.engine.dispose()


def drain(db: Db) -> dict[str, Any]:
    """A real worker process drains the default lane."""
    result = cli("work", "--drain", db=db, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.data  # type: ignore[no-any-return]


def state(db: Db, job_id: int) -> str:
    return str(job(db, job_id)["state"])


def test_a_job_waits_until_every_parent_is_done(db: Db) -> None:
    first = add_job(db, "true")
    second = add_job(db, "true", after_jobs=(first,))
    third = add_job(db, "true", after_jobs=(first, second))
    assert [state(db, i) for i in (first, second, third)] == ["queued", "waiting", "waiting"]
    assert drain(db)["executed"] == 3
    assert [state(db, i) for i in (first, second, third)] == ["done"] * 3
    started = [r["job_id"] for r in rows(db, "SELECT job_id FROM attempts ORDER BY started_at, id")]
    assert started == [first, second, third]


def test_a_released_job_is_claimed_in_the_pass_that_recorded_its_parent(db: Db) -> None:
    """A worker with one slot, a chain of three: each success releases the
    next job, and the pass that records it claims that job (its `claimed`
    event carries the pass's time, as the parent's `succeeded` does). On
    PostgreSQL the claim went out beside the outcome, before the release: it
    came up short and looked again once the release was made."""
    first = add_job(db, "true")
    second = add_job(db, "true", after_jobs=(first,))
    third = add_job(db, "true", after_jobs=(second,))
    assert drain(db)["executed"] == 3
    found = rows(db, "SELECT job_id, event, at FROM job_events WHERE job_id IS NOT NULL")
    at = {(r["job_id"], r["event"]): r["at"] for r in found}
    for parent, child in ((first, second), (second, third)):
        assert at[(child, "claimed")] == at[(parent, "succeeded")]


def test_after_done_parents_the_job_is_queued_at_once_keeping_its_delay(db: Db) -> None:
    parent = add_job(db, "true")
    drain(db)
    later = time.time() + 3600
    child = add_job(db, "true", after_jobs=(parent,), run_at=later)
    assert state(db, child) == "queued"
    assert job(db, child)["next_run_at"] == pytest.approx(later)


def test_a_released_job_keeps_its_own_delay(db: Db) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,), run_at=time.time() + 3600)
    drain(db)
    assert state(db, parent) == "done"
    assert state(db, child) == "queued"
    assert job(db, child)["next_run_at"] > time.time() + 3000


def test_naming_a_missing_job_is_not_found_and_writes_nothing(db: Db) -> None:
    parent = add_job(db, "true")
    before = rows(db, "SELECT count(*) FROM jobs")[0][0]
    with pytest.raises(NotFound, match="999"):
        write(db, lambda c: submit(c, JobSpec(["true"], after_jobs=(parent, 999)), time.time()))
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == before
    assert rows(db, "SELECT count(*) FROM job_dependencies")[0][0] == 0


def test_after_a_failed_parent_the_job_is_created_canceled(db: Db) -> None:
    parent = add_job(db, "false", max_retries=0)
    drain(db)
    assert state(db, parent) == "dead"
    child = add_job(db, "true", after_jobs=(parent,))
    row = job(db, child)
    assert (row["state"], row["last_failure_reason"]) == ("canceled", "dependency_failed")
    assert f"job {parent} is dead" in row["last_error"]
    assert events_of(db, child) == ["added", "dependency_failed"]


def test_a_dead_parent_cancels_its_dependents_transitively(db: Db) -> None:
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


def test_canceling_a_parent_or_a_waiting_job_cancels_what_waits(db: Db) -> None:
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


def test_retry_of_the_parent_does_not_resurrect_dependents_unless_asked(db: Db) -> None:
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


def test_a_dependent_retried_alone_is_a_conflict_while_its_parent_failed(db: Db) -> None:
    parent = add_job(db, "false", max_retries=0)
    child = add_job(db, "true", after_jobs=(parent,))
    drain(db)
    with pytest.raises(Conflict, match=f"retry {parent} --with-dependents"):
        write(db, lambda c: requeue(c, child, force=False, now=time.time()))
    assert state(db, child) == "canceled"


def test_retrying_a_waiting_job_is_a_conflict(db: Db) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,))
    with pytest.raises(Conflict, match="waiting"):
        write(db, lambda c: requeue(c, child, force=False, now=time.time()))


def test_a_batch_refers_to_its_earlier_lines(db: Db) -> None:
    specs = [
        JobSpec(["sh", "-c", "echo one >> order.txt"]),
        JobSpec(["sh", "-c", "echo two >> order.txt"], after_lines=(0,)),
        JobSpec(["sh", "-c", "echo three >> order.txt"], after_lines=(0, 1)),
    ]
    ids = write(db, lambda c: submit_batch(c, specs, time.time()))
    assert [state(db, i) for i in ids] == ["queued", "waiting", "waiting"]
    assert [
        tuple(r)
        for r in rows(db, "SELECT job_id, after_job_id FROM job_dependencies ORDER BY 1, 2")
    ] == [
        (ids[1], ids[0]),
        (ids[2], ids[0]),
        (ids[2], ids[1]),
    ]
    drain(db)
    assert Path("order.txt").read_text().split() == ["one", "two", "three"]


def test_the_drain_is_not_held_open_by_jobs_waiting_for_another_lane(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = add_job(db, "true", lane="other")
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


def test_a_parent_dead_lettered_as_a_damaged_row_cancels_its_dependents(db: Db) -> None:
    parent = add_job(db, "true")
    child = add_job(db, "true", after_jobs=(parent,))
    write(db, lambda c: c.exec_driver_sql(f"UPDATE jobs SET argv = 'oops' WHERE id = {parent}"))
    drain(db)
    assert state(db, parent) == "dead"
    assert job(db, child)["last_failure_reason"] == "dependency_failed"
    assert events_of(db, child) == ["added", "dependency_failed"]


# -- through the command line ------------------------------------------------


def jrun(capsys: pytest.CaptureFixture[str], db: Db, *args: str) -> Any:
    return inproc(args[0], "--db", str(db), "--json", *args[1:], capsys=capsys)


def test_add_after_job_reports_waiting_and_show_list_feedback_status_say_so(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = add_job(db, "true")
    added = jrun(capsys, db, "add", "--after-job", str(parent), "--", "true")
    assert added.exit_code == 0
    child = added.data["job_id"]
    assert (added.data["state"], added.data["after_jobs"]) == ("waiting", [parent])
    shown = jrun(capsys, db, "show", str(child)).data
    assert shown["after_jobs"] == [{"job_id": parent, "state": "queued"}]
    assert jrun(capsys, db, "show", str(parent)).data["dependents"] == [child]
    listed = jrun(capsys, db, "list", "--waiting").data["jobs"]
    assert [(j["id"], j["after_jobs"]) for j in listed] == [(child, [parent])]
    verdict = jrun(capsys, db, "feedback", str(child)).data
    assert verdict["state"] == "waiting" and verdict["terminal"] is False
    assert verdict["after_jobs"] == [{"job_id": parent, "state": "queued"}]
    status = jrun(capsys, db, "status").data
    assert status["counts"]["waiting"] == 1
    assert status["queues"]["default"]["counts"]["waiting"] == 1
    assert "after     " in inproc("show", "--db", str(db), str(child), capsys=capsys).stdout


def test_add_after_a_missing_job_is_not_found_and_writes_nothing(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = add_job(db, "true")
    result = jrun(capsys, db, "add", "--after-job", str(parent), "--after-job", "77", "--", "true")
    assert result.exit_code == 1
    assert result.envelope["errors"][0]["code"] == "NOT_FOUND"
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == 1
    bad = jrun(capsys, db, "add", "--after-job", "0", "--", "true")
    assert bad.envelope["errors"][0]["code"] == "INVALID_INPUT"


def test_add_after_a_dead_job_warns_and_feedback_says_what_to_retry(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = add_job(db, "false", max_retries=0)
    drain(db)
    added = jrun(capsys, db, "add", "--after-job", str(parent), "--", "true")
    assert added.exit_code == 0 and added.data["state"] == "canceled"
    assert [w["code"] for w in added.envelope["warnings"]] == ["DEPENDENCY_FAILED"]
    verdict = jrun(capsys, db, "feedback", str(added.data["job_id"])).data
    assert verdict["failure_reason"] == "dependency_failed"
    assert verdict["remediation"] == (
        f"spoolctl feedback {parent}; spoolctl retry {parent} --with-dependents"
    )


def test_retry_with_dependents_through_the_cli(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    parent = add_job(db, "false", max_retries=0)
    child = add_job(db, "true", after_jobs=(parent,))
    drain(db)
    conflict = jrun(capsys, db, "retry", str(child))
    assert conflict.exit_code == 5 and conflict.envelope["errors"][0]["code"] == "CONFLICT"
    retried = jrun(capsys, db, "retry", str(parent), "--with-dependents")
    assert retried.exit_code == 0
    assert (retried.data["state"], retried.data["restored"]) == ("queued", [child])
    assert state(db, child) == "waiting"
    waiting = jrun(capsys, db, "retry", str(child))
    assert waiting.exit_code == 5 and "waiting" in waiting.envelope["errors"][0]["message"]
    canceled = jrun(capsys, db, "cancel", str(child))
    assert canceled.exit_code == 0 and state(db, child) == "canceled"


def test_a_batch_pipeline_runs_in_order_on_a_real_worker(
    db: Db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "order.log"
    lines = [
        {"cmd": f"sleep 0.2; echo fetch >> {log}"},
        {},
        {"cmd": f"echo build >> {log}", "after_jobs": ["@1"]},
        {"cmd": f"echo test >> {log}", "after_jobs": ["@3"]},
        {"cmd": f"echo ship >> {log}", "after_jobs": ["@1", "@3", "@4"]},
    ]
    batch = tmp_path / "pipeline.ndjson"
    batch.write_text("\n".join(json.dumps(line) if line else "" for line in lines) + "\n")
    added = jrun(capsys, db, "add", "--batch", str(batch))
    assert added.exit_code == 0, added.stdout
    ids = added.data["job_ids"]
    assert [state(db, i) for i in ids] == ["queued", "waiting", "waiting", "waiting"]
    worker = start_worker(db, "--concurrency", "4")
    wait_for(lambda: state(db, ids[-1]) == "done", what="the pipeline to finish")
    worker.terminate()
    worker.wait(30)
    assert log.read_text().split() == ["fetch", "build", "test", "ship"]


@pytest.mark.parametrize(
    "after_jobs",
    [["@2"], ["@1", "@9"], ["@0"], ["1"], [True], "@1", [0], [{"id": 1}]],
    ids=str,
)
def test_bad_batch_references_are_invalid_input_and_write_nothing(
    db: Db, tmp_path: Path, capsys: pytest.CaptureFixture[str], after_jobs: Any
) -> None:
    add_job(db, "true")
    batch = tmp_path / "bad.ndjson"
    batch.write_text(
        json.dumps({"cmd": "true"})
        + "\n"
        + json.dumps({"cmd": "true", "after_jobs": after_jobs})
        + "\n"
    )
    result = jrun(capsys, db, "add", "--batch", str(batch))
    assert result.exit_code == 1
    assert result.envelope["errors"][0]["code"] == "INVALID_INPUT"
    assert "line 2" in result.envelope["errors"][0]["message"]
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == 1


def test_a_batch_naming_a_missing_job_writes_nothing(
    db: Db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "missing.ndjson"
    batch.write_text('{"cmd": "true"}\n{"cmd": "true", "after_jobs": ["@1", 42]}\n')
    result = jrun(capsys, db, "add", "--batch", str(batch))
    assert result.envelope["errors"][0]["code"] == "NOT_FOUND"
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == 0


def test_a_parent_dead_lettered_by_the_reaper_cancels_its_dependents(db: Db) -> None:
    parent = add_job(db, "sleep", "60", max_crashes=0)
    child = add_job(db, "true", after_jobs=(parent,))
    worker = start_worker(db)
    wait_for(lambda: state(db, parent) == "running", what="the parent to start")
    worker.kill()
    worker.wait(10)
    drain(db)
    assert (state(db, parent), job(db, parent)["last_failure_reason"]) == ("dead", "worker_crash")
    assert job(db, child)["last_failure_reason"] == "dependency_failed"
    assert events_of(db, child) == ["added", "dependency_failed"]


def test_prune_takes_the_dependency_rows_along(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    done = add_job(db, "true")
    drain(db)
    pending = add_job(db, "true", run_at=time.time() + 3600)
    child = add_job(db, "true", after_jobs=(done, pending))
    pruned = jrun(capsys, db, "prune", "--older-than", "0", "--state", "done", "--yes")
    assert pruned.exit_code == 0 and pruned.data["deleted_jobs"] == 1
    assert [tuple(r) for r in rows(db, "SELECT job_id, after_job_id FROM job_dependencies")] == [
        (child, pending)
    ]
    if not is_postgres(db):  # PostgreSQL enforces every foreign key as it goes
        assert rows(db, "PRAGMA foreign_key_check") == []
    write(db, lambda c: c.exec_driver_sql(f"UPDATE jobs SET next_run_at = 0 WHERE id = {pending}"))
    drain(db)
    assert state(db, child) == "done"


def test_list_of_many_jobs_names_what_each_waits_for(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = add_job(db, "true")
    specs = [JobSpec(["true"], after_jobs=(parent,)) for _ in range(1200)]
    write(db, lambda c: submit_batch(c, specs, time.time()))
    listed = jrun(capsys, db, "list", "--limit", "0").data["jobs"]
    assert len(listed) == 1201
    assert all(j["after_jobs"] == [parent] for j in listed if j["id"] != parent)
