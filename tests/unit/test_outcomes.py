"""A worker records the attempts that ended since its last pass together
(`record_outcomes`): the successes in one statement per table. Each job still
gets exactly what recording it alone gave it: done only where the worker still
owns it, its own process, one `succeeded` event, its dependents released once,
and a failure in the same pass retried as before."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from spoolctl.cli.database import open_write
from spoolctl.db.queue import Queue
from spoolctl.db.tables import attempts, job_events, jobs
from spoolctl.services import claim
from spoolctl.services.cancel import cancel
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.outcome import Ending, Outcome, record_outcomes
from spoolctl.services.submit import submit
from spoolctl.states import FailureReason, JobState
from tests.helpers import Db

pytestmark = pytest.mark.both_backends

SUCCESS = Outcome(0, None)


@pytest.fixture
def queue(db: Db) -> Iterator[Queue]:
    opened = open_write(str(db))
    yield opened
    opened.engine.dispose()


def add(target: Queue, **spec: object) -> int:
    job = JobSpec(argv=["true"], **spec)  # type: ignore[arg-type]
    return int(target.write(lambda conn: submit(conn, job, time.time() - 1)).job_id)


def take(queue: Queue, wanted: int) -> list[claim.Claim]:
    claimant = claim.Claimant("w", 1, "default", queue.output_root)
    return queue.write(lambda conn: claim.claim_up_to(conn, claimant, wanted, time.time()))


def record(queue: Queue, endings: list[Ending]) -> list[JobState | None]:
    return queue.write(lambda conn: record_outcomes(conn, endings, worker_id="w", now=time.time()))


def ending(taken: claim.Claim, outcome: Outcome = SUCCESS, pid: int | None = None) -> Ending:
    return Ending(taken.job_id, taken.attempt_id, taken.attempt_no, outcome, pid)


def column(queue: Queue, query: object) -> dict[int, object]:
    return dict(queue.read(lambda conn: conn.execute(query).all()))  # type: ignore[arg-type]


def events_of(queue: Queue, job_id: int) -> list[str]:
    query = select(job_events.c.event).where(job_events.c.job_id == job_id)
    found = queue.read(lambda conn: conn.execute(query.order_by(job_events.c.id)).all())
    return [row.event for row in found]


def test_a_pass_records_each_job_as_it_would_alone(queue: Queue) -> None:
    ids = [add(queue, max_retries=2) for _ in range(4)]
    taken = {c.job_id: c for c in take(queue, 4)}
    assert sorted(taken) == ids
    queue.write(lambda conn: cancel(conn, ids[2], running_ok=True, now=time.time()))
    failure = Outcome(3, FailureReason.PROCESS_EXIT, "exit 3")
    states = record(
        queue,
        [
            ending(taken[ids[0]], pid=4100),
            ending(taken[ids[1]], pid=4200),
            ending(taken[ids[2]], pid=4300),
            ending(taken[ids[3]], failure, pid=4400),
        ],
    )
    assert states == [JobState.DONE, JobState.DONE, None, JobState.QUEUED]
    assert column(queue, select(jobs.c.id, jobs.c.state)) == dict(
        zip(ids, ["done", "done", "canceled", "queued"], strict=True)
    )
    attempt_states = column(queue, select(attempts.c.job_id, attempts.c.state))
    assert attempt_states == dict(
        zip(ids, ["succeeded", "succeeded", "canceled", "failed"], strict=True)
    )
    pids = column(queue, select(attempts.c.job_id, attempts.c.job_pid))
    assert pids == dict(zip(ids, [4100, 4200, None, 4400], strict=True))
    assert events_of(queue, ids[0]) == ["added", "claimed", "succeeded"]
    assert events_of(queue, ids[1]) == ["added", "claimed", "succeeded"]
    assert events_of(queue, ids[2]) == ["added", "claimed", "canceled"]
    assert events_of(queue, ids[3])[-1] == "failed"


def test_dependents_of_several_parents_in_one_pass_are_released_once(queue: Queue) -> None:
    first, second, elsewhere = add(queue), add(queue), add(queue, lane="other")
    both = add(queue, after_jobs=(first, second))
    one_left = add(queue, after_jobs=(first, elsewhere))
    any_end = add(queue, after_jobs_any=(second,))
    taken = take(queue, 2)
    assert {c.job_id for c in taken} == {first, second}
    assert record(queue, [ending(c) for c in taken]) == [JobState.DONE, JobState.DONE]
    states = column(queue, select(jobs.c.id, jobs.c.state))
    assert (states[both], states[one_left], states[any_end]) == ("queued", "waiting", "queued")
    assert events_of(queue, both) == ["added"]


def test_an_attempt_named_twice_is_recorded_once(queue: Queue) -> None:
    add(queue)
    (taken,) = take(queue, 1)
    assert record(queue, [ending(taken), ending(taken)]) == [JobState.DONE, None]
    assert events_of(queue, taken.job_id) == ["added", "claimed", "succeeded"]


def test_a_batch_of_one_success_and_none_at_all(queue: Queue) -> None:
    assert record(queue, []) == []
    add(queue)
    (taken,) = take(queue, 1)
    assert record(queue, [ending(taken, pid=77)]) == [JobState.DONE]
    assert column(queue, select(attempts.c.id, attempts.c.job_pid)) == {taken.attempt_id: 77}


def test_contained_and_plain_successes_of_one_pass_keep_what_each_measured(queue: Queue) -> None:
    """Each attempt gets its own process, cgroup and usage (a plain one's stay
    as they were), and the `succeeded` events follow the order of the pass."""
    ids = [add(queue) for _ in range(3)]
    taken = {c.job_id: c for c in take(queue, 3)}
    measured = Outcome(
        0, None, cgroup="/sys/fs/cgroup/x", peak_memory_bytes=5 << 20, cpu_time_s=0.25
    )
    unmeasured = Outcome(0, None, cgroup="/sys/fs/cgroup/y")
    order = [ids[2], ids[0], ids[1]]
    outcomes = {ids[2]: measured, ids[0]: SUCCESS, ids[1]: unmeasured}
    states = record(queue, [ending(taken[j], outcomes[j], pid=900 + j) for j in order])
    assert states == [JobState.DONE] * 3
    found = queue.read(
        lambda conn: conn.execute(
            select(
                attempts.c.job_id,
                attempts.c.state,
                attempts.c.job_pid,
                attempts.c.job_pgid,
                attempts.c.cgroup,
                attempts.c.peak_memory_bytes,
                attempts.c.cpu_time_s,
                attempts.c.exit_code,
            )
        ).all()
    )
    assert sorted(tuple(row) for row in found) == sorted(
        [
            (ids[2], "succeeded", 900 + ids[2], 900 + ids[2], "/sys/fs/cgroup/x", 5 << 20, 0.25, 0),
            (ids[0], "succeeded", 900 + ids[0], 900 + ids[0], None, None, None, 0),
            (ids[1], "succeeded", 900 + ids[1], 900 + ids[1], "/sys/fs/cgroup/y", None, None, 0),
        ]
    )
    query = select(job_events.c.job_id).where(job_events.c.event == "succeeded")
    written = queue.read(lambda conn: conn.execute(query.order_by(job_events.c.id)).scalars().all())
    assert written == order
