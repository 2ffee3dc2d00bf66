"""Crash recovery's state changes, each named after its transition: the
stale jobs to judge (`reap_candidates`), requeueing the job of a dead owner
(`reap`), keeping it running but flagged while its orphan is unconfirmed
(`flag_unconfirmed`), releasing a claim whose answer was lost
(`release_forgotten`), burying workers that died idle (`bury_workers`).

Whether an owner is dead, and ending what is left of its attempt, is
`runner/liveness.py`'s judgement, made before any of these runs; the worker
sequences the two (`worker/reaping.py`). Every change re-checks, inside its
own write transaction, that the job is still running, still owned by the
same worker and still stale, so a worker that heartbeated meanwhile is
untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    bindparam,
    exists,
    func,
    select,
    update,
)

from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts, job_events, jobs, workers
from spoolctl.runner import procs
from spoolctl.services import placement
from spoolctl.services.deadletter import requeue_or_dead
from spoolctl.services.events import record_event
from spoolctl.services.lingering import attempt_token
from spoolctl.services.query import event_detail
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState, WorkerState


@dataclass(frozen=True)
class Candidate:
    job_id: int
    worker_id: str | None
    locked_pid: int | None
    heartbeat_at: float
    attempt_id: int | None
    job_identity: procs.ProcessIdentity | None
    job_pgid: int | None
    worker_identity: procs.ProcessIdentity | None
    worker_boot_id: str | None
    worker_hostname: str | None
    worker_heartbeat_at: float | None
    locked_at: float | None = None
    attempt_started_at: float | None = None
    token: str | None = None
    """The attempt's SPOOLCTL_ATTEMPT_TOKEN, carried by all its processes."""
    cgroup: str | None = None
    """The attempt's cgroup directories, one a line, where it had one."""
    worker_pid_space: str | None = None
    """Where the owner's pid means it (`procs.pid_space`); None: unknown (a
    row written before revision 0008, or no row of the owner at all)."""


@dataclass(frozen=True)
class OrphanCheck:
    """Whether what is left of an attempt is confirmed gone; if not, which
    process stands in the way and why."""

    gone: bool
    pid: int | None = None
    started_at: float | None = None
    reason: str | None = None


def last_sign_of_life() -> ColumnElement[float]:
    """A job's heartbeat. A running row adopted from an old database may have
    none: its lock or start time stands in, and a row with none of them is as
    old as can be."""
    return func.coalesce(jobs.c.heartbeat_at, jobs.c.locked_at, jobs.c.started_at, 0.0)


def _silent_before(before: float | BindParameter[float]) -> ColumnElement[bool]:
    return last_sign_of_life() < before


_STALE = Prepared(
    select(jobs.c.id, jobs.c.locked_by, jobs.c.locked_pid, jobs.c.locked_at)
    .add_columns(last_sign_of_life().label("heartbeat_at"))
    .where(jobs.c.state == JobState.RUNNING.value, _silent_before(bindparam("b_before")))
)
"""Runs before every claim: built once. Served by the state prefix of
ix_jobs_state_heartbeat: it reads the running rows only, as many as there are
busy slots, however large the table grows."""


def reap_candidates(conn: Connection, now: float, threshold_s: float) -> list[Candidate]:
    """Running jobs whose heartbeat is older than the reap threshold."""
    rows = _STALE.all(conn, {"b_before": now - threshold_s})
    skew = now - time.time()  # 0 on SQLite; the server's lead on PostgreSQL
    return [_candidate(conn, row, skew) for row in rows]


def _candidate(conn: Connection, row: Any, skew: float = 0.0) -> Candidate:
    attempt = conn.execute(
        select(
            attempts.c.id,
            attempts.c.job_pid,
            attempts.c.job_pgid,
            attempts.c.job_started_at,
            attempts.c.worker_id,
            attempts.c.started_at,
            attempts.c.cgroup,
        )
        .where(attempts.c.job_id == row.id, attempts.c.state == AttemptState.RUNNING.value)
        .order_by(attempts.c.attempt_no.desc())
        .limit(1)
    ).first()
    worker = None
    if row.locked_by is not None:
        worker = conn.execute(select(workers).where(workers.c.id == row.locked_by)).first()
    if worker is not None and _registered_since(worker, row):
        # A later worker re-registered under the same --worker-id: the row now
        # describes it, not the process that claimed this job.
        worker = None
    job_identity = None
    if attempt is not None and attempt.job_pid is not None:
        job_identity = procs.ProcessIdentity(attempt.job_pid, attempt.job_started_at)
    worker_identity = None
    if worker is not None:
        worker_identity = procs.ProcessIdentity(worker.pid, worker.process_started_at)
    elif row.locked_pid is not None:
        worker_identity = procs.ProcessIdentity(row.locked_pid, None)
    return Candidate(
        job_id=row.id,
        worker_id=row.locked_by,
        locked_pid=row.locked_pid,
        heartbeat_at=row.heartbeat_at,
        attempt_id=None if attempt is None else attempt.id,
        job_identity=job_identity,
        job_pgid=None if attempt is None else attempt.job_pgid,
        worker_identity=worker_identity,
        worker_boot_id=None if worker is None else worker.boot_id,
        worker_hostname=None if worker is None else worker.hostname,
        worker_heartbeat_at=None if worker is None else worker.heartbeat_at,
        locked_at=_local(row.locked_at, skew),
        attempt_started_at=None if attempt is None else _local(attempt.started_at, skew),
        token=_token_of(attempt),
        cgroup=None if attempt is None else attempt.cgroup,
        worker_pid_space=None if worker is None else worker.pid_space,
    )


def _registered_since(worker: Any, row: Any) -> bool:
    """Whether the worker row was registered after the job was claimed, by
    another process under the same worker id: another pid, or, where the
    claim time is known, a registration after it (a restart in a fresh PID
    namespace can get the very pid the dead process had)."""
    if row.locked_pid is not None and worker.pid != row.locked_pid:
        return True
    return row.locked_at is not None and worker.started_at > row.locked_at


def _local(stamp: float | None, skew: float) -> float | None:
    """A database time on this machine's clock. Stamps are written by the
    database's clock (the server's, on PostgreSQL); they are compared here with
    local process start and boot times, which only this machine's clock gives."""
    return None if stamp is None else stamp - skew


def _token_of(attempt: Any) -> str | None:
    if attempt is None or attempt.worker_id is None or attempt.started_at is None:
        return None
    return attempt_token(attempt.worker_id, attempt.id, attempt.started_at)


_STALE_WORKERS = Prepared(
    select(workers).where(
        workers.c.state == WorkerState.RUNNING.value,
        workers.c.heartbeat_at < bindparam("b_before"),
    )
)
_BURY = Prepared(
    update(workers)
    .where(
        workers.c.id == bindparam("b_id"),
        workers.c.state == WorkerState.RUNNING.value,
        workers.c.heartbeat_at == bindparam("b_beat"),
    )
    .values(state=WorkerState.DEAD.value, stopped_at=bindparam("b_now"))
)


def stale_workers(conn: Connection, now: float, threshold_s: float) -> list[Any]:
    """Worker rows still marked running whose heartbeat is older than the threshold."""
    return _STALE_WORKERS.all(conn, {"b_before": now - threshold_s})


def bury_workers(conn: Connection, rows: list[Any], now: float) -> None:
    """Mark dead workers' rows dead (a worker killed while idle has no job for
    the reaper to find); a row that heartbeated meanwhile is left alone."""
    for row in rows:
        _BURY.execute(conn, {"b_id": row.id, "b_beat": row.heartbeat_at, "b_now": now})


def reap(
    conn: Connection, cand: Candidate, *, now: float, threshold_s: float, reaper_id: str | None
) -> JobState | None:
    """Requeue (or dead-letter) a job whose owner is confirmed dead.

    Re-checks, inside the caller's write transaction (and, on PostgreSQL, with
    the job's row locked until it commits), that the job is still running,
    still owned by the same worker and still stale; otherwise nothing changes
    and None is returned.
    """
    job = _still_stale(conn, cand, now - threshold_s)
    if job is None:
        return None
    error = f"worker {cand.worker_id or '(unrecorded)'} died ({_silence(job, now)})"
    _mark_worker_dead(conn, cand, now)
    detail = {"dead_worker": cand.worker_id, "attempt_id": cand.attempt_id}
    return _abandon(conn, job, cand.attempt_id, error, now, reaper_id, detail)


def _abandon(
    conn: Connection,
    job: Any,
    attempt_id: int | None,
    error: str,
    now: float,
    by: str | None,
    detail: dict[str, Any],
) -> JobState:
    """The job's running attempt ends abandoned by a worker crash (counted
    against max_crashes), the `reaped` event is written, and the job is
    requeued with backoff or dead-lettered. `attempt_id` None: whichever
    attempt of the job still runs. Its processes are confirmed gone (or it
    never spawned): the devices it held are released."""
    mine = attempts.c.id == attempt_id if attempt_id is not None else attempts.c.job_id == job.id
    held = conn.execute(
        select(attempts.c.id).where(mine, attempts.c.state == AttemptState.RUNNING.value)
    ).scalars()
    placement.release(conn, list(held))
    conn.execute(
        update(attempts)
        .where(mine, attempts.c.state == AttemptState.RUNNING.value)
        .values(
            state=AttemptState.ABANDONED.value,
            failure_reason=FailureReason.WORKER_CRASH.value,
            finished_at=now,
            error=error,
        )
    )
    record_event(conn, job.id, EventKind.REAPED, now, worker_id=by, detail=detail)
    return requeue_or_dead(
        conn,
        job,
        crashed=True,
        now=now,
        worker_id=by,
        failure={"last_error": error, "last_failure_reason": FailureReason.WORKER_CRASH.value},
    )


def _still_stale(conn: Connection, cand: Candidate, before: float) -> Any:
    """The candidate's job row, if it is still running, still owned by the same
    worker and still silent since before `before` (read under the write lock)."""
    return conn.execute(
        select(jobs)
        .where(
            jobs.c.id == cand.job_id,
            jobs.c.state == JobState.RUNNING.value,
            _silent_before(before),
            _same_owner(cand.worker_id),
        )
        .with_for_update()
    ).first()


def _silence(job: Any, now: float) -> str:
    for column in ("heartbeat_at", "locked_at", "started_at"):
        value = getattr(job, column)
        if value is not None:
            label = "heartbeat" if column == "heartbeat_at" else column.removesuffix("_at")
            return f"{label} {now - value:.1f}s old"
    return "no heartbeat, lock or start time recorded"


def _mark_worker_dead(conn: Connection, cand: Candidate, now: float) -> None:
    if cand.worker_id is None:
        return
    conn.execute(
        update(workers)
        .where(
            workers.c.id == cand.worker_id,
            workers.c.state == WorkerState.RUNNING.value,
            workers.c.pid == cand.locked_pid,
        )
        .values(state=WorkerState.DEAD.value, stopped_at=now)
    )


def flag_unconfirmed(
    conn: Connection,
    cand: Candidate,
    check: OrphanCheck,
    *,
    now: float,
    threshold_s: float,
    reaper_id: str | None,
) -> bool:
    """The owner is gone but its attempt's end is not confirmed: the job stays
    running. Marks the worker dead, records a pid the token scan discovered on
    an attempt that had none, and writes one `orphan_unconfirmed` event per
    attempt and cause. False when the job changed meanwhile."""
    if _still_stale(conn, cand, now - threshold_s) is None:
        return False
    _mark_worker_dead(conn, cand, now)
    if cand.attempt_id is not None and check.pid is not None and check.started_at is not None:
        conn.execute(
            update(attempts)
            .where(attempts.c.id == cand.attempt_id, attempts.c.job_pid.is_(None))
            .values(job_pid=check.pid, job_pgid=check.pid, job_started_at=check.started_at)
        )
    detail = {"attempt_id": cand.attempt_id, "pid": check.pid, "reason": check.reason}
    if _latest_flag(conn, cand.job_id) != detail:
        detail["dead_worker"] = cand.worker_id
        record_event(
            conn, cand.job_id, EventKind.ORPHAN_UNCONFIRMED, now, worker_id=reaper_id, detail=detail
        )
    return True


def _latest_flag(conn: Connection, job_id: int) -> dict[str, Any] | None:
    row = conn.execute(
        select(job_events.c.detail)
        .where(
            job_events.c.job_id == job_id,
            job_events.c.event == EventKind.ORPHAN_UNCONFIRMED.value,
        )
        .order_by(job_events.c.id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    detail = event_detail(row.detail)
    return {k: detail.get(k) for k in ("attempt_id", "pid", "reason")}


def _same_owner(worker_id: str | None):  # type: ignore[no-untyped-def]
    return jobs.c.locked_by.is_(None) if worker_id is None else jobs.c.locked_by == worker_id


def release_forgotten(
    conn: Connection, worker_id: str, worker_pid: int, running: set[int], now: float
) -> list[int]:
    """Requeue (or dead-letter) jobs the database says this worker runs but it
    does not: a claim whose commit landed while its answer was lost (a
    connection cut at COMMIT). Nothing else would: the worker's own heartbeat
    keeps its row fresh, so no reaper judges it dead. Checked inside the
    heartbeat's transaction, where the worker's view of what it runs is exact
    (claims are started in the loop pass that made them). Only this process's
    own claims whose job was never spawned: a job claimed by an earlier process
    under the same worker id may still run, and is the reaper's to judge."""
    never_spawned = ~exists().where(
        attempts.c.job_id == jobs.c.id,
        attempts.c.state == AttemptState.RUNNING.value,
        attempts.c.job_pid.is_not(None),
    )
    forgotten = conn.execute(
        select(jobs)
        .where(
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.locked_by == worker_id,
            jobs.c.locked_pid == worker_pid,
            never_spawned,
        )
        .with_for_update()
    ).all()
    released = []
    for job in forgotten:
        if job.id in running:
            continue
        error = f"worker {worker_id} lost its claim of this job before starting it"
        detail = {"dead_worker": worker_id, "forgotten_claim": True}
        _abandon(conn, job, None, error, now, worker_id, detail)
        released.append(job.id)
    return released
