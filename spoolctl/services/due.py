"""When a lane has work: the earliest due time of its queued jobs, and the
drain rule. Read by the worker's loop between claims (claim.py takes jobs)."""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from spoolctl.db.tables import jobs
from spoolctl.states import JobState


def next_due_at(conn: Connection, lane: str) -> float | None:
    """When the earliest queued job of the lane becomes due (None: nothing queued)."""
    found = conn.execute(
        select(func.min(jobs.c.next_run_at)).where(
            jobs.c.state == JobState.QUEUED.value, jobs.c.queue == lane
        )
    ).scalar()
    return None if found is None else float(found)


def lane_settled(conn: Connection, lane: str, now: float) -> bool:
    """The drain rule: nothing running in the lane, nothing due, and no retry
    backoff pending. Jobs delayed by their submitter that never ran yet
    (attempts 0, due later) do not hold the lane open."""
    busy = conn.execute(
        select(jobs.c.id)
        .where(
            jobs.c.queue == lane,
            (jobs.c.state == JobState.RUNNING.value)
            | (
                (jobs.c.state == JobState.QUEUED.value)
                & ((jobs.c.next_run_at <= now) | (jobs.c.attempts > 0))
            ),
        )
        .limit(1)
    ).first()
    return busy is None
