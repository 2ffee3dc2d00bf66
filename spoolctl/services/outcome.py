"""Recording how an attempt ended: success, or a job-owned failure.

Every write is conditional on the attempt still running and the job still
owned by this worker, so a late writer (a job that finished while it was
being reaped, canceled or force-retried) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, select, update

from spoolctl.db.tables import attempts, jobs, workers
from spoolctl.services.deadletter import RELEASE_LOCK, requeue_or_dead
from spoolctl.services.events import record_event
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState


@dataclass(frozen=True)
class Outcome:
    """How one execution ended. reason None means success."""

    exit_code: int | None
    reason: FailureReason | None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.reason is None

    @property
    def label(self) -> str:
        return "succeeded" if self.reason is None else self.reason.value


def record_outcome(
    conn: Connection,
    *,
    job_id: int,
    attempt_id: int,
    worker_id: str,
    outcome: Outcome,
    now: float,
) -> JobState | None:
    """Record the end of an attempt; None if this worker no longer owns it."""
    if outcome.reason is None:
        return record_success(
            conn, job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, now=now
        )
    return record_failure(
        conn, job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, outcome=outcome, now=now
    )


def _finish_attempt(
    conn: Connection, attempt_id: int, state: AttemptState, outcome: Outcome | None, now: float
) -> bool:
    result = conn.execute(
        update(attempts)
        .where(attempts.c.id == attempt_id, attempts.c.state == AttemptState.RUNNING.value)
        .values(
            state=state.value,
            finished_at=now,
            exit_code=0 if outcome is None else outcome.exit_code,
            error=None if outcome is None else outcome.error,
            failure_reason=None
            if outcome is None or outcome.reason is None
            else outcome.reason.value,
        )
    )
    return result.rowcount == 1


def _owned_job(conn: Connection, job_id: int, worker_id: str):  # type: ignore[no-untyped-def]
    return conn.execute(
        select(jobs).where(
            jobs.c.id == job_id,
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.locked_by == worker_id,
        )
    ).first()


def _count_run(conn: Connection, worker_id: str) -> None:
    conn.execute(
        update(workers).where(workers.c.id == worker_id).values(jobs_run=workers.c.jobs_run + 1)
    )


def record_success(
    conn: Connection, *, job_id: int, attempt_id: int, worker_id: str, now: float
) -> JobState | None:
    if _owned_job(conn, job_id, worker_id) is None:
        return None
    if not _finish_attempt(conn, attempt_id, AttemptState.SUCCEEDED, None, now):
        return None
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(
            **RELEASE_LOCK,
            state=JobState.DONE.value,
            finished_at=now,
            last_exit_code=0,
            last_error=None,
            last_failure_reason=None,
        )
    )
    record_event(conn, job_id, EventKind.SUCCEEDED, now, worker_id=worker_id)
    _count_run(conn, worker_id)
    return JobState.DONE


def record_failure(
    conn: Connection,
    *,
    job_id: int,
    attempt_id: int,
    worker_id: str,
    outcome: Outcome,
    now: float,
) -> JobState | None:
    """A job-owned failure (exit, timeout, spawn failure, shutdown kill)."""
    assert outcome.reason is not None
    job = _owned_job(conn, job_id, worker_id)
    if job is None:
        return None
    timed_out = outcome.reason is FailureReason.TIMEOUT
    attempt_state = AttemptState.TIMED_OUT if timed_out else AttemptState.FAILED
    if not _finish_attempt(conn, attempt_id, attempt_state, outcome, now):
        return None
    record_event(
        conn,
        job_id,
        EventKind.TIMED_OUT if timed_out else EventKind.FAILED,
        now,
        worker_id=worker_id,
        detail={
            "exit_code": outcome.exit_code,
            "reason": outcome.reason.value,
            "error": outcome.error,
        },
    )
    _count_run(conn, worker_id)
    return requeue_or_dead(
        conn,
        job,
        crashed=False,
        now=now,
        worker_id=worker_id,
        failure={
            "last_exit_code": outcome.exit_code,
            "last_error": outcome.error,
            "last_failure_reason": outcome.reason.value,
        },
    )
