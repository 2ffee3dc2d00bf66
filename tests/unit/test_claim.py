"""A worker with k free slots claims up to k jobs in one statement, and takes
exactly the jobs k claims of one would have taken: claim order, --slots caps,
paused lanes, damaged rows and attempts ended elsewhere all as before."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, insert, select, update

from spoolctl import layout
from spoolctl.cli.database import open_write
from spoolctl.db.queue import Queue
from spoolctl.db.tables import attempts, job_events, jobs
from spoolctl.runner import procs
from spoolctl.runner.capacity import Capacity
from spoolctl.services import claim, lanes
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests.helpers import Db

pytestmark = pytest.mark.both_backends


@pytest.fixture
def queue(db: Db) -> Iterator[Queue]:
    """The test's queue on each backend (PostgreSQL's FOR UPDATE SKIP LOCKED
    subquery is where a limit could be overrun)."""
    opened = open_write(str(db))
    yield opened
    opened.engine.dispose()


def add(queue: Queue, **spec: object) -> int:
    job = JobSpec(argv=["true"], **spec)  # type: ignore[arg-type]
    return int(queue.write(lambda conn: submit(conn, job, time.time() - 1)).job_id)


def take(queue: Queue, wanted: int, *, slots: int | None = None) -> list[claim.Claim]:
    """Claim up to `wanted`, as a worker with that many slots free would
    (within a lane cap of `slots`)."""
    cap = Capacity(wanted, lane_cap=slots)
    claimant = claim.Claimant("w", 1, "default", queue.output_root, cap=cap)
    return queue.write(lambda conn: claim.claim_up_to(conn, claimant, wanted, time.time()))


def states(queue: Queue) -> dict[int, str]:
    return dict(queue.read(lambda conn: conn.execute(select(jobs.c.id, jobs.c.state)).all()))  # type: ignore[arg-type]


def claimed_events(queue: Queue) -> list[tuple[int, str]]:
    """(job, detail) of every claimed event, in the order they were written."""
    found = select(job_events.c.job_id, job_events.c.detail).where(job_events.c.event == "claimed")
    return [
        tuple(r)
        for r in queue.read(
            lambda conn: conn.execute(  # type: ignore[misc]
                found.order_by(job_events.c.id)
            ).all()
        )
    ]


def test_k_free_slots_take_the_first_k_jobs_in_claim_order(queue: Queue) -> None:
    ids = [add(queue, priority=p) for p in (0, 3, 1, 3, 2, 0)]
    claims = take(queue, 4)
    # priority high first, then due time, then id: both 3s, then 2, then 1
    assert [c.job_id for c in claims] == [ids[1], ids[3], ids[4], ids[2]]
    assert all(c.attempt_no == 1 for c in claims)
    # each attempt's row names the files the layout gives it (PostgreSQL's
    # one-statement claim builds them in SQL), and its claimed event was written
    rows = queue.read(
        lambda conn: conn.execute(
            select(attempts.c.id, attempts.c.job_id, attempts.c.stdout_path, attempts.c.stderr_path)
        ).all()
    )
    assert sorted(tuple(r) for r in rows) == sorted(
        (c.attempt_id, c.job_id, *layout.attempt_paths(queue.output_root, c.job_id, 1))
        for c in claims
    )
    assert all(
        (c.stdout_path, c.stderr_path) == layout.attempt_paths(queue.output_root, c.job_id, 1)
        for c in claims
    )
    assert claimed_events(queue) == [(c.job_id, '{"attempt":1}') for c in claims]
    assert sorted(i for i, s in states(queue).items() if s == "running") == sorted(
        c.job_id for c in claims
    )
    # what is left comes next, and asking for more than is due takes what is
    assert [c.job_id for c in take(queue, 5)] == [ids[0], ids[5]]
    assert take(queue, 3) == []


def test_the_slots_cap_counts_what_runs_fleet_wide(queue: Queue) -> None:
    for _ in range(6):
        add(queue)
    assert len(take(queue, 1, slots=3)) == 1  # one running (another worker's, say)
    assert len(take(queue, 5, slots=3)) == 2
    assert take(queue, 5, slots=3) == []


def test_a_paused_lane_hands_out_nothing(queue: Queue) -> None:
    add(queue)
    queue.write(
        lambda conn: lanes.pause_lanes(conn, ["default"], by="t", reason=None, now=time.time())
    )
    assert take(queue, 3) == []


def test_a_damaged_row_is_quarantined_and_the_next_job_fills_its_slot(queue: Queue) -> None:
    ids = [add(queue) for _ in range(4)]
    queue.write(
        lambda conn: conn.execute(update(jobs).where(jobs.c.id == ids[1]).values(argv="not json"))
    )
    claims = take(queue, 3)
    assert [c.job_id for c in claims] == [ids[0], ids[2], ids[3]]
    assert states(queue)[ids[1]] == "dead"
    # nothing of its claim remains: no attempt, no claimed event, never started
    assert ids[1] not in queue.read(
        lambda conn: conn.execute(select(attempts.c.job_id)).scalars().all()
    )
    assert [job for job, _ in claimed_events(queue)] == [ids[0], ids[2], ids[3]]
    started = queue.read(
        lambda conn: conn.execute(select(jobs.c.started_at).where(jobs.c.id == ids[1])).scalar_one()
    )
    assert started is None


def _ended_elsewhere(queue: Queue, job_id: int, *, alive: bool) -> None:
    """Job `job_id` had an attempt canceled by someone else; its process is
    this test's own (alive) or one whose start time does not match (gone)."""
    me = procs.self_identity()
    started = me.started_at if alive else 1.0

    def run(conn: Connection) -> None:
        conn.execute(
            insert(attempts).values(
                job_id=job_id,
                attempt_no=1,
                worker_id="old",
                worker_pid=me.pid,
                state="canceled",
                started_at=time.time() - 5,
                stdout_path="o",
                stderr_path="e",
                job_pid=me.pid,
                job_pgid=me.pid,
                job_started_at=started,
            )
        )

    queue.write(run)


def test_a_job_whose_canceled_attempt_still_runs_waits_and_is_not_counted(queue: Queue) -> None:
    ids = [add(queue) for _ in range(3)]
    _ended_elsewhere(queue, ids[0], alive=True)
    claims = take(queue, 2)
    assert [c.job_id for c in claims] == [ids[1], ids[2]]
    assert states(queue)[ids[0]] == "queued"


def test_a_job_whose_canceled_attempt_is_gone_is_not_overtaken(queue: Queue) -> None:
    """The one statement passes over it; the slow path takes it in the same
    transaction, so the k jobs claimed are still the first k in order."""
    ids = [add(queue) for _ in range(4)]
    _ended_elsewhere(queue, ids[0], alive=False)
    claims = take(queue, 2)
    assert sorted(c.job_id for c in claims) == [ids[0], ids[1]]
    assert {c.job_id: c.attempt_no for c in claims}[ids[0]] == 2  # after the canceled one
    assert take(queue, 1)[0].job_id == ids[2]
