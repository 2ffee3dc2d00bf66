"""Recording how an attempt ended: success, or a job-owned failure.

Every write is conditional on the attempt still running and the job still
owned by this worker, so a late writer (a job that finished while it was
being reaped, canceled or force-retried) changes nothing.
"""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Float, Integer, Text, bindparam, exists, func, select, update

from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts, jobs
from spoolctl.services.deadletter import RELEASE_LOCK, requeue_or_dead
from spoolctl.services.dependencies import release_dependents
from spoolctl.services.events import record_event
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState

SUCCEEDED = "succeeded"
"""The label of a successful attempt (`Outcome.label`, `work`'s results)."""


@dataclass(frozen=True)
class Outcome:
    """How one execution ended. reason None means success.

    exit_code is null for a timed-out attempt, as in 0.4.11 (its scripts read
    null there): the job did not exit, it was stopped. How it was stopped is
    `signal`, kept apart, never in exit_code's place."""

    exit_code: int | None
    reason: FailureReason | None
    error: str | None = None
    signal: int | None = None
    """The signal that ended the job's leader, when one did: a timeout's
    SIGTERM, SIGKILL after the grace period, or a kill from outside."""
    cgroup: str | None = None
    """The attempt's cgroup directories (one a line) where it was contained."""
    peak_memory_bytes: int | None = None
    cpu_time_s: float | None = None
    """What the cgroup measured (None: not contained, or not measured here)."""

    @property
    def succeeded(self) -> bool:
        return self.reason is None

    @property
    def label(self) -> str:
        return SUCCEEDED if self.reason is None else self.reason.value


def signal_of(returncode: int) -> int | None:
    """The signal a child's return code says ended it (Popen's -N), else None."""
    return -returncode if returncode < 0 else None


def signal_name(number: int) -> str:
    """SIGTERM for 15; `signal N` for a number the platform has no name for."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_label(exit_code: int | None, signal: int | None) -> str | None:
    """How an attempt ended, for people: its exit code, else the signal that
    stopped it (a timed-out attempt has no exit code), else None."""
    if exit_code is not None:
        return str(exit_code)
    return None if signal is None else signal_name(signal)


def record_outcome(
    conn: Connection,
    *,
    job_id: int,
    attempt_id: int,
    attempt_no: int,
    worker_id: str,
    outcome: Outcome,
    now: float,
    pid: int | None = None,
) -> JobState | None:
    """Record the end of an attempt; None if this worker no longer owns it.

    pid: the job's process when its spawn was not recorded yet (it ended
    within the spawn-record delay), stored on the attempt with its end, so the
    common short job costs no statement of its own for it."""
    if outcome.reason is None:
        return record_success(
            conn,
            job_id=job_id,
            attempt_id=attempt_id,
            worker_id=worker_id,
            now=now,
            pid=pid,
            measured=outcome,
        )
    return record_failure(
        conn,
        job_id=job_id,
        attempt=(attempt_id, attempt_no),
        worker_id=worker_id,
        outcome=outcome,
        now=now,
        pid=pid,
    )


_PID = bindparam("b_job_pid", type_=Integer)
_FINISHED: dict[str, Any] = {
    "state": bindparam("b_state"),
    "finished_at": bindparam("b_now"),
    "exit_code": bindparam("b_exit"),
    "error": bindparam("b_error"),
    "failure_reason": bindparam("b_reason"),
    "job_pid": func.coalesce(attempts.c.job_pid, _PID),
    "job_pgid": func.coalesce(attempts.c.job_pgid, _PID),
}
_RUNNING_ATTEMPT = (
    attempts.c.id == bindparam("b_id"),
    attempts.c.state == AttemptState.RUNNING.value,
)
_FINISH_ATTEMPT = Prepared(update(attempts).where(*_RUNNING_ATTEMPT).values(**_FINISHED))
"""The attempt's end, and its process (leader of its own group) if the
spawn record had not stored it yet."""
_FINISH_CONTAINED = Prepared(
    update(attempts)
    .where(*_RUNNING_ATTEMPT)
    .values(
        **_FINISHED,
        cgroup=func.coalesce(attempts.c.cgroup, bindparam("b_cgroup", type_=Text)),
        peak_memory_bytes=bindparam("b_peak", type_=Integer),
        cpu_time_s=bindparam("b_cpu", type_=Float),
    )
)
"""The same for an attempt its worker contained: its cgroup and usage too."""
_ATTEMPT_STILL_RUNS = exists().where(
    attempts.c.id == bindparam("b_attempt"), attempts.c.state == AttemptState.RUNNING.value
)
_OWNED = (
    jobs.c.id == bindparam("b_id"),
    jobs.c.state == JobState.RUNNING.value,
    jobs.c.locked_by == bindparam("b_worker"),
    _ATTEMPT_STILL_RUNS,
)
"""The job is running, owned by this worker, and its attempt is still the one
running: checked first, so the attempt update that follows cannot miss."""
_OWNED_JOB = Prepared(select(jobs).where(*_OWNED).with_for_update())
"""FOR UPDATE (PostgreSQL; SQLite's write lock already covers it): the row stays
as read until the failure is recorded, whoever else wants to change it."""
_MARK_DONE = Prepared(
    update(jobs)
    .where(*_OWNED)
    .values(
        **RELEASE_LOCK,
        state=JobState.DONE.value,
        finished_at=bindparam("b_now"),
        last_exit_code=0,
        last_error=None,
        last_failure_reason=None,
    )
)
"""Built once: recording an outcome binds values instead of rebuilding statements."""


def _finish_attempt(
    conn: Connection,
    attempt_id: int,
    state: AttemptState,
    outcome: Outcome | None,
    now: float,
    pid: int | None,
    measured: Outcome | None = None,
) -> None:
    """measured: where the cgroup path and usage come from (the outcome)."""
    reason = None if outcome is None or outcome.reason is None else outcome.reason.value
    measured = measured or outcome
    params = {
        "b_id": attempt_id,
        "b_state": state.value,
        "b_now": now,
        "b_exit": 0 if outcome is None else outcome.exit_code,
        "b_error": None if outcome is None else outcome.error,
        "b_reason": reason,
        "b_job_pid": pid,
    }
    if measured is None or measured.cgroup is None:
        _FINISH_ATTEMPT.execute(conn, params)
        return
    usage = {"b_cgroup": measured.cgroup, "b_peak": measured.peak_memory_bytes,
             "b_cpu": measured.cpu_time_s}  # fmt: skip
    _FINISH_CONTAINED.execute(conn, {**params, **usage})


def _owned_job(conn: Connection, job_id: int, attempt_id: int, worker_id: str) -> Any:
    params = {"b_id": job_id, "b_worker": worker_id, "b_attempt": attempt_id}
    return _OWNED_JOB.first(conn, params)


def record_success(
    conn: Connection,
    *,
    job_id: int,
    attempt_id: int,
    worker_id: str,
    now: float,
    pid: int | None = None,
    measured: Outcome | None = None,
) -> JobState | None:
    """The attempt succeeded and the job is done, if this worker still owns both
    (a stale outcome of a canceled attempt never touches a job the same worker
    claimed again)."""
    owned = {"b_id": job_id, "b_worker": worker_id, "b_attempt": attempt_id, "b_now": now}
    if _MARK_DONE.execute(conn, owned).rowcount != 1:
        return None
    _finish_attempt(conn, attempt_id, AttemptState.SUCCEEDED, None, now, pid, measured)
    record_event(conn, job_id, EventKind.SUCCEEDED, now, worker_id=worker_id)
    release_dependents(conn, job_id)
    return JobState.DONE


def record_failure(
    conn: Connection,
    *,
    job_id: int,
    attempt: tuple[int, int],
    worker_id: str,
    outcome: Outcome,
    now: float,
    pid: int | None = None,
) -> JobState | None:
    """A job-owned failure (exit, timeout, spawn failure, shutdown kill), or a
    worker crash that the worker recorded itself (it fenced itself after it
    could not heartbeat): that one counts against the crash budget.

    attempt: (row id, attempt number). The event's detail names the attempt
    and the signal that ended it: the ledger is where the signal is kept (the
    attempts table has no column for it), and `show` reads it back from there."""
    assert outcome.reason is not None
    attempt_id, attempt_no = attempt
    job = _owned_job(conn, job_id, attempt_id, worker_id)
    if job is None:
        return None
    timed_out = outcome.reason is FailureReason.TIMEOUT
    crashed = outcome.reason is FailureReason.WORKER_CRASH
    attempt_state = AttemptState.TIMED_OUT if timed_out else AttemptState.FAILED
    if crashed:
        attempt_state = AttemptState.ABANDONED
    _finish_attempt(conn, attempt_id, attempt_state, outcome, now, pid)
    record_event(
        conn,
        job_id,
        EventKind.TIMED_OUT if timed_out else EventKind.FAILED,
        now,
        worker_id=worker_id,
        detail={
            "attempt": attempt_no,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "reason": outcome.reason.value,
            "error": outcome.error,
        },
    )
    return requeue_or_dead(
        conn,
        job,
        crashed=crashed,
        now=now,
        worker_id=worker_id,
        failure={
            "last_exit_code": outcome.exit_code,
            "last_error": outcome.error,
            "last_failure_reason": outcome.reason.value,
        },
    )
