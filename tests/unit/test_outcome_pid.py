"""A job that ends before its spawn record lands has its process written with
its outcome, in the same statement that ends the attempt: the attempt always
names the process (and its group) that ran it, and a spawn record that did
land is never overwritten."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, select, update

from spoolctl.cli.database import open_write
from spoolctl.db.queue import Queue
from spoolctl.db.tables import attempts
from spoolctl.services import claim
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.outcome import Ending, Outcome, record_outcomes
from spoolctl.services.submit import submit
from spoolctl.states import FailureReason
from tests.helpers import Db

pytestmark = pytest.mark.both_backends


@pytest.fixture
def queue(db: Db) -> Iterator[Queue]:
    opened = open_write(str(db))
    yield opened
    opened.engine.dispose()


def claimed(queue: Queue) -> claim.Claim:
    job = JobSpec(argv=["true"], max_retries=1)
    queue.write(lambda conn: submit(conn, job, time.time() - 1))

    def take(conn: Connection) -> claim.Claim:
        claimant = claim.Claimant("w", 1, "default", queue.output_root)
        (found,) = claim.claim_up_to(conn, claimant, 1, time.time())
        return found

    return queue.write(take)


def end(queue: Queue, taken: claim.Claim, outcome: Outcome, pid: int | None) -> object:
    return queue.write(
        lambda conn: record_outcomes(
            conn,
            [Ending(taken.job_id, taken.attempt_id, taken.attempt_no, outcome, pid)],
            worker_id="w",
            now=time.time(),
        )[0]
    )


def process_of(queue: Queue, attempt_id: int) -> tuple[object, object, object]:
    query = select(attempts.c.job_pid, attempts.c.job_pgid, attempts.c.job_started_at).where(
        attempts.c.id == attempt_id
    )
    return tuple(queue.read(lambda conn: conn.execute(query).one()))  # type: ignore[return-value]


@pytest.mark.parametrize(
    "outcome", [Outcome(0, None), Outcome(3, FailureReason.PROCESS_EXIT, "exit 3")]
)
def test_an_unrecorded_spawn_is_written_with_the_outcome(queue: Queue, outcome: Outcome) -> None:
    taken = claimed(queue)
    assert process_of(queue, taken.attempt_id) == (None, None, None)
    assert end(queue, taken, outcome, pid=4242) is not None
    assert process_of(queue, taken.attempt_id) == (4242, 4242, None)


def test_a_recorded_spawn_is_kept(queue: Queue) -> None:
    taken = claimed(queue)
    queue.write(
        lambda conn: conn.execute(
            update(attempts)
            .where(attempts.c.id == taken.attempt_id)
            .values(job_pid=77, job_pgid=77, job_started_at=123.5)
        )
    )
    end(queue, taken, Outcome(0, None), pid=4242)
    assert process_of(queue, taken.attempt_id) == (77, 77, 123.5)
