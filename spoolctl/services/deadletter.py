"""Where an unsuccessful execution leads: back to the queue with backoff, or to
`dead`; and the manual way back from dead with a fresh budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, update

from spoolctl.db import codec
from spoolctl.db.tables import attempts, jobs
from spoolctl.errors import Conflict, NotFound, SafetyBlock
from spoolctl.services.backoff import (
    backoff_seconds,
    crash_budget_exhausted,
    failure_budget_exhausted,
)
from spoolctl.services.dependencies import cancel_dependents, restore_dependents, retried_state
from spoolctl.services.events import record_event
from spoolctl.services.job_spec import max_requeues_of
from spoolctl.services.query import get_job_row, running_attempt_id
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState

RELEASE_LOCK: dict[str, Any] = {
    "locked_by": None,
    "locked_pid": None,
    "locked_at": None,
    "heartbeat_at": None,
}


def requeue_or_dead(
    conn: Connection,
    job: Any,
    *,
    crashed: bool,
    now: float,
    worker_id: str | None,
    failure: dict[str, Any],
) -> JobState:
    """Count one unsuccessful execution of `job` (a row read in this transaction)
    and move it to queued-with-backoff or to dead. `failure` holds
    last_exit_code, last_error and last_failure_reason for the job row."""
    attempts_now = job.attempts + 1
    crashes_now = job.crashes + (1 if crashed else 0)
    if crashed:
        exhausted = crash_budget_exhausted(crashes_now, job.max_crashes)
    else:
        exhausted = failure_budget_exhausted(attempts_now - crashes_now, job.max_retries)
    values: dict[str, Any] = {
        **RELEASE_LOCK,
        **failure,
        "attempts": attempts_now,
        "crashes": crashes_now,
    }
    if exhausted:
        values.update(state=JobState.DEAD.value, finished_at=now)
    else:
        values.update(
            state=JobState.QUEUED.value,
            next_run_at=now + backoff_seconds(attempts_now),
            finished_at=None,
        )
    conn.execute(update(jobs).where(jobs.c.id == job.id).values(**values))
    if exhausted:
        record_event(
            conn,
            job.id,
            EventKind.DEAD,
            now,
            worker_id=worker_id,
            detail={"attempts": attempts_now, "crashes": crashes_now},
        )
        cancel_dependents(conn, job.id, JobState.DEAD.value, now)
        return JobState.DEAD
    return JobState.QUEUED


def requeues_on(job: Any, exit_code: int | None) -> bool:
    """Whether a plain exit with `exit_code` requeues `job` (a row read in
    this transaction): one of its `--requeue-exit` codes, while its requeues
    are below `--max-requeues`. Beyond it, the exit is an ordinary failure."""
    if exit_code is None or exit_code <= 0 or job.requeue_exits is None:
        return False
    try:
        codes = codec.load_codes(job.requeue_exits)
    except codec.DamagedValue:
        return False
    return exit_code in (codes or []) and (job.requeues or 0) < max_requeues_of(job.max_requeues)


def requeue_on_exit(
    conn: Connection,
    job: Any,
    *,
    attempt_no: int,
    exit_code: int,
    error: str,
    now: float,
    worker_id: str | None,
) -> JobState:
    """Back to queued at once (no backoff), its retry budget kept: `attempts`
    and `crashes` stay, `requeues` grows by one; the `requeued` event says
    so (detail: attempt, exit_code, requeues)."""
    requeues_now = (job.requeues or 0) + 1
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job.id)
        .values(
            **RELEASE_LOCK,
            state=JobState.QUEUED.value,
            next_run_at=now,
            finished_at=None,
            requeues=requeues_now,
            last_exit_code=exit_code,
            last_error=error,
            last_failure_reason=FailureReason.REQUEUE_EXIT.value,
        )
    )
    detail = {"attempt": attempt_no, "exit_code": exit_code, "requeues": requeues_now}
    record_event(conn, job.id, EventKind.REQUEUED, now, worker_id=worker_id, detail=detail)
    return JobState.QUEUED


def dead_letter(conn: Connection, job_id: int, reason: str, now: float) -> None:
    """Send a queued job to dead without running it (damaged or unrunnable)."""
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == JobState.QUEUED.value)
        .values(state=JobState.DEAD.value, finished_at=now, last_error=reason)
    )
    record_event(conn, job_id, EventKind.DEAD, now, detail={"reason": reason})
    cancel_dependents(conn, job_id, JobState.DEAD.value, now)


RETRYABLE = frozenset({JobState.DEAD, JobState.FAILED, JobState.CANCELED})


@dataclass(frozen=True)
class Retried:
    previous_state: str
    state: str
    restored: list[int] = field(default_factory=list)
    """Dependents put back by --with-dependents."""


def requeue(
    conn: Connection,
    job_id: int,
    *,
    force: bool,
    now: float,
    with_dependents: bool = False,
    actor: str | None = None,
    again: bool = False,
) -> Retried:
    """Manual retry: dead, failed or canceled jobs go back to queued with a fresh
    budget (attempts, crashes and requeues from zero; history kept). A running job needs
    force: its attempt is marked canceled and its worker kills the group at its
    next heartbeat. A job submitted after others goes back to waiting while
    one of them is not done (CONFLICT while one is dead or canceled). With
    `with_dependents`, the jobs canceled because this one failed are restored
    too. `actor` (who asked, when not the CLI: the web dashboard) is written
    into the `retried` event's detail as `by`.

    A `done` job is re-run only with `again` (`retry --again`): 0.4.11
    answered CONFLICT for it, and scripts may rely on that. It runs again as
    a new attempt of the same job (fresh budget; its earlier attempts, their
    output and its events stay), and the `retried` event says `again`."""
    job = get_job_row(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    state = job.state
    if state == JobState.RUNNING:
        if not force:
            raise SafetyBlock(
                f"job {job_id} is running; retry --force cancels the running attempt",
                job_id=job_id,
            )
        _cancel_running_attempt(conn, job_id, now)
    elif state == JobState.DONE and not again:
        raise Conflict(
            f"job {job_id} is done; re-run it with: spoolctl retry {job_id} --again",
            job_id=job_id,
            state=state,
        )
    elif state not in RETRYABLE and state != JobState.DONE:
        raise Conflict(
            f"job {job_id} is {state}; only dead, failed, canceled or running "
            "(with --force) jobs can be retried",
            job_id=job_id,
            state=state,
        )
    target = retried_state(conn, job_id)
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == state)
        .values(
            **RELEASE_LOCK,
            state=target.value,
            attempts=0,
            crashes=0,
            requeues=0,
            next_run_at=now,
            finished_at=None,
        )
    )
    detail: dict[str, Any] = {"from": state, "force": force}
    if state == JobState.DONE:
        detail["again"] = True
    if actor is not None:
        detail["by"] = actor
    record_event(conn, job_id, EventKind.RETRIED, now, detail=detail)
    restored = restore_dependents(conn, job_id, now) if with_dependents else []
    return Retried(str(state), target.value, restored)


def _cancel_running_attempt(conn: Connection, job_id: int, now: float) -> None:
    attempt_id = running_attempt_id(conn, job_id)
    if attempt_id is None:
        return
    conn.execute(
        update(attempts)
        .where(attempts.c.id == attempt_id, attempts.c.state == AttemptState.RUNNING.value)
        .values(
            state=AttemptState.CANCELED.value,
            failure_reason=FailureReason.CANCELED.value,
            finished_at=now,
            error="force-retried while running",
        )
    )
