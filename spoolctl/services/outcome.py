"""Recording how an attempt ended: success, or a job-owned failure.

Every write is conditional on the attempt still running and the job still
owned by this worker, so a late writer (a job that finished while it was
being reaped, canceled or force-retried) changes nothing.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from spoolctl.db.prepared import Sent, item_binds
from spoolctl.services import outcome_statements as sql
from spoolctl.services import placement
from spoolctl.services.deadletter import requeue_on_exit, requeue_or_dead, requeues_on
from spoolctl.services.dependencies import release_dependents_of
from spoolctl.services.event_row import event_row
from spoolctl.services.events import record_event, record_events
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


@dataclass(frozen=True)
class Ending:
    """One attempt's end, as its worker records it. pid: the job's process
    when its spawn was not recorded yet (it ended within the spawn-record
    delay), stored on the attempt with its end, so the common short job costs
    no statement of its own for it."""

    job_id: int
    attempt_id: int
    attempt_no: int
    outcome: Outcome
    pid: int | None = None
    holds: bool = False
    """The attempt holds devices: released with its end (its worker saw its
    processes end), whether or not the attempt was still this worker's."""


def record_outcomes(
    conn: Connection, endings: Sequence[Ending], *, worker_id: str, now: float
) -> list[JobState | None]:
    """Record the ends of a worker's attempts, each job's state after it (None
    where this worker no longer owns it) in the order given. The successes are
    recorded together, a statement per table for all of them (one for the
    three where the backend runs writes inside a WITH:
    `outcome_statements.mark_done`), then the jobs that waited for them are
    released; a failure's retry or dead-letter is decided one by one."""
    return Recording(conn, endings, worker_id=worker_id, now=now, answer_now=True).states()


class Recording:
    """`record_outcomes` in two halves, for a pass that claims too: made, it
    sends the successes' statement and records any failure; `states()` reads
    the successes' answer and releases the jobs waiting for them. In a
    pipeline (`Statements.pipeline`), a claim sent in between shares that
    answer's round trip, but does not see the dependents released after it
    (`Claiming.claims` looks again where it came up short). With answer_now,
    the successes are whole before anything else is sent, as in
    `record_outcomes`."""

    def __init__(
        self,
        conn: Connection,
        endings: Sequence[Ending],
        *,
        worker_id: str,
        now: float,
        answer_now: bool,
    ) -> None:
        self._endings = endings
        placement.release(conn, [e.attempt_id for e in endings if e.holds])
        self._successes = _Successes(
            conn, [e for e in endings if e.outcome.succeeded], worker_id=worker_id, now=now
        )
        if answer_now:
            self._successes.flags()
        self._failed = {
            i: record_failure(
                conn,
                job_id=e.job_id,
                attempt=(e.attempt_id, e.attempt_no),
                worker_id=worker_id,
                outcome=e.outcome,
                now=now,
                pid=e.pid,
            )
            for i, e in enumerate(endings)
            if not e.outcome.succeeded
        }

    def states(self) -> list[JobState | None]:
        done = iter(self._successes.flags())
        return [
            self._failed[i] if i in self._failed else JobState.DONE if next(done) else None
            for i in range(len(self._endings))
        ]


class _Successes:
    """A pass's successes, sent (`_mark_done`): `flags()` reads the answer
    (once) and releases the jobs that waited for them."""

    def __init__(
        self, conn: Connection, endings: Sequence[Ending], *, worker_id: str, now: float
    ) -> None:
        self._conn, self._endings, self._worker_id, self._now = conn, endings, worker_id, now
        self._batch: list[int] = []
        self._again: list[int] = []  # a job named twice (never in practice): after the others
        seen: set[int] = set()
        for i, e in enumerate(endings):
            (self._again if e.job_id in seen else self._batch).append(i)
            seen.add(e.job_id)
        first = [endings[i] for i in self._batch]
        self._marked = _mark_done(conn, first, worker_id, now) if first else []
        self._flags: list[bool] | None = None

    def flags(self) -> list[bool]:
        if self._flags is not None:
            return self._flags
        conn, endings = self._conn, self._endings
        marked = self._marked if isinstance(self._marked, list) else self._marked.all()
        done = {int(row.id) for row in marked}
        awaited = [int(row.id) for row in marked if row.awaited]
        release_dependents_of(conn, awaited)
        first = set(self._batch)
        flags = [i in first and endings[i].job_id in done for i in range(len(endings))]
        if self._again:
            later = _Successes(
                conn, [endings[i] for i in self._again], worker_id=self._worker_id, now=self._now
            )
            for i, flag in zip(self._again, later.flags(), strict=True):
                flags[i] = flag
        self._flags = flags
        return flags


def _finish_params(
    attempt_id: int,
    state: AttemptState,
    outcome: Outcome | None,
    now: float,
    pid: int | None,
    measured: Outcome | None = None,
) -> tuple[bool, dict[str, Any]]:
    """The values of `FINISH_ATTEMPT` (False) or, for an attempt its worker
    contained, of `FINISH_CONTAINED` (True). measured: where the cgroup path
    and usage come from (the outcome)."""
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
        return False, params
    usage = {
        "b_cgroup": measured.cgroup,
        "b_peak": measured.peak_memory_bytes,
        "b_cpu": measured.cpu_time_s,
    }
    return True, {**params, **usage}


def _finish_attempts(conn: Connection, finished: Sequence[tuple[bool, dict[str, Any]]]) -> None:
    """`_finish_params` results, a driver call per statement for all of them."""
    for contained, statement in ((False, sql.FINISH_ATTEMPT), (True, sql.FINISH_CONTAINED)):
        rows = [params for is_contained, params in finished if is_contained is contained]
        if rows:
            statement.execute_many(conn, rows)


def _owned_job(conn: Connection, job_id: int, attempt_id: int, worker_id: str) -> Any:
    params = {"b_id": job_id, "b_worker": worker_id, "b_attempt": attempt_id}
    return sql.OWNED_JOB.first(conn, params)


def _mark_done(
    conn: Connection, endings: Sequence[Ending], worker_id: str, now: float
) -> Sent | list[Any]:
    """These successes' jobs marked done (`outcome_statements.mark_done`),
    where this worker still owns both job and attempt (a stale outcome of a
    canceled attempt never touches a job the same worker claimed again);
    for endings naming distinct jobs. Where the statement also finishes the
    attempts and writes the events, its rows are not read yet; else they are
    read, and the attempts and events of the jobs it marked follow, a
    statement each for all of them."""
    statement, finishes = sql.mark_done(conn, len(endings))
    items = [_marking(place, e, finishes) for place, e in enumerate(endings)]
    params = {**item_binds(items), "b_worker": worker_id, "b_now": now}
    if finishes:
        return statement.send(conn, params)
    marked = statement.all(conn, params)
    done = {int(row.id) for row in marked}
    recorded = [e for e in endings if e.job_id in done]
    _finish_attempts(
        conn,
        [
            _finish_params(e.attempt_id, AttemptState.SUCCEEDED, None, now, e.pid, e.outcome)
            for e in recorded
        ],
    )
    record_events(
        conn, [event_row(e.job_id, EventKind.SUCCEEDED, now, worker_id=worker_id) for e in recorded]
    )
    return marked


def _marking(place: int, e: Ending, finishes: bool) -> dict[str, Any]:
    """One success's values in `mark_done`'s statement; where it finishes
    the attempt too, its place in the pass, process and what its cgroup
    measured as well."""
    item: dict[str, Any] = {"b_job_id": e.job_id, "b_attempt_id": e.attempt_id}
    if finishes:
        item["b_ord"] = place
        item["b_pid"] = e.pid
        item["b_contained"] = int(e.outcome.cgroup is not None)
        item["b_cgroup"] = e.outcome.cgroup
        item["b_peak"] = e.outcome.peak_memory_bytes
        item["b_cpu"] = e.outcome.cpu_time_s
    return item


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
    if _requeues(job, outcome):
        return _requeue(conn, job, attempt, worker_id, outcome, now, pid)
    timed_out = outcome.reason is FailureReason.TIMEOUT
    crashed = outcome.reason is FailureReason.WORKER_CRASH
    attempt_state = AttemptState.TIMED_OUT if timed_out else AttemptState.FAILED
    if crashed:
        attempt_state = AttemptState.ABANDONED
    _finish_attempts(conn, [_finish_params(attempt_id, attempt_state, outcome, now, pid)])
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


def _requeues(job: Any, outcome: Outcome) -> bool:
    """A plain exit (no timeout, no signal) with one of the job's
    `--requeue-exit` codes, within its `--max-requeues`."""
    plain = outcome.reason is FailureReason.PROCESS_EXIT and outcome.signal is None
    return plain and requeues_on(job, outcome.exit_code)


def _requeue(
    conn: Connection,
    job: Any,
    attempt: tuple[int, int],
    worker_id: str,
    outcome: Outcome,
    now: float,
    pid: int | None,
) -> JobState:
    """The attempt ends `requeued` (reason `requeue_exit`, its exit code
    kept) and the job goes back to the queue (`deadletter.requeue_on_exit`)."""
    attempt_id, attempt_no = attempt
    assert outcome.exit_code is not None
    error = f"exit {outcome.exit_code}: requeued (--requeue-exit)"
    requeued = Outcome(outcome.exit_code, FailureReason.REQUEUE_EXIT, error)
    ended = _finish_params(attempt_id, AttemptState.REQUEUED, requeued, now, pid, outcome)
    _finish_attempts(conn, [ended])
    return requeue_on_exit(
        conn,
        job,
        attempt_no=attempt_no,
        exit_code=outcome.exit_code,
        error=error,
        now=now,
        worker_id=worker_id,
    )
