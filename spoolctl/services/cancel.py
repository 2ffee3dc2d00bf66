"""Cancelling jobs: queued ones at once, running ones through their worker."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, update

from spoolctl.db.tables import attempts, jobs
from spoolctl.errors import Conflict, NotFound, SafetyBlock
from spoolctl.services.deadletter import RELEASE_LOCK
from spoolctl.services.dependencies import cancel_dependents
from spoolctl.services.events import record_event
from spoolctl.services.query import get_job_row, running_attempt_id
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState


@dataclass(frozen=True)
class Canceled:
    job_id: int
    state: str
    was_running: bool


def cancel(
    conn: Connection, job_id: int, *, running_ok: bool, now: float, actor: str | None = None
) -> Canceled:
    """Cancel a queued or waiting job; a running one only with running_ok (the
    owning worker sees its heartbeat match nothing and kills the process
    group). Jobs waiting for it are canceled with `dependency_failed`.
    `actor` (who asked, when not the CLI: the web dashboard) is written into
    the `canceled` event's detail as `by`."""
    job = get_job_row(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    was_running = job.state == JobState.RUNNING
    if was_running and not running_ok:
        raise SafetyBlock(f"job {job_id} is running; cancel it with --running --yes", job_id=job_id)
    if job.state not in (JobState.QUEUED, JobState.RUNNING, JobState.WAITING):
        raise Conflict(f"job {job_id} is already {job.state}", job_id=job_id, state=job.state)
    if was_running:
        attempt_id = running_attempt_id(conn, job_id)
        if attempt_id is not None:
            conn.execute(
                update(attempts)
                .where(attempts.c.id == attempt_id)
                .values(
                    state=AttemptState.CANCELED.value,
                    failure_reason=FailureReason.CANCELED.value,
                    finished_at=now,
                    error="canceled while running",
                )
            )
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == job.state)
        .values(
            **RELEASE_LOCK,
            state=JobState.CANCELED.value,
            finished_at=now,
            last_failure_reason=FailureReason.CANCELED.value if was_running else None,
        )
    )
    detail: dict[str, object] = {"was_running": was_running}
    if actor is not None:
        detail["by"] = actor
    record_event(conn, job_id, EventKind.CANCELED, now, detail=detail)
    cancel_dependents(conn, job_id, JobState.CANCELED.value, now)
    return Canceled(job_id=job_id, state=JobState.CANCELED.value, was_running=was_running)
