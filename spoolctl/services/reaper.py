"""Crash recovery: find running jobs whose worker went silent, confirm the
worker is really gone, kill any orphaned job process group, and requeue.

Liveness of a stale owner, in order: a different boot means dead; the pid
gone (ProcessLookupError) means dead; not ours to signal (PermissionError)
is inconclusive, so alive; a pid now held by another process (different start
time, or no `spoolctl` in its command line) means recycled, so dead. An owner
that is alive but silent beyond the hang threshold is fenced: killed,
confirmed dead, then reaped. The reap re-checks staleness and ownership under
its own BEGIN IMMEDIATE, so a worker that heartbeated meanwhile is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from spoolctl import procs
from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts, jobs, workers
from spoolctl.services.deadletter import requeue_or_dead
from spoolctl.services.events import record_event
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState, WorkerState


class Verdict(Enum):
    DEAD = "dead"
    ALIVE = "alive"
    HUNG = "hung"


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


_STALE = Prepared(
    select(jobs.c.id, jobs.c.locked_by, jobs.c.locked_pid, jobs.c.heartbeat_at)
    .where(jobs.c.state == JobState.RUNNING.value, jobs.c.heartbeat_at < bindparam("b_before"))
    .order_by(jobs.c.heartbeat_at)
)
"""Runs before every claim: built once."""


def reap_candidates(conn: Connection, now: float, threshold_s: float) -> list[Candidate]:
    """Running jobs whose heartbeat is older than the reap threshold."""
    rows = _STALE.all(conn, {"b_before": now - threshold_s})
    return [_candidate(conn, row) for row in rows]


def _candidate(conn: Connection, row: Any) -> Candidate:
    attempt = conn.execute(
        select(attempts.c.id, attempts.c.job_pid, attempts.c.job_pgid, attempts.c.job_started_at)
        .where(attempts.c.job_id == row.id, attempts.c.state == AttemptState.RUNNING.value)
        .order_by(attempts.c.attempt_no.desc())
        .limit(1)
    ).first()
    worker = None
    if row.locked_by is not None:
        worker = conn.execute(select(workers).where(workers.c.id == row.locked_by)).first()
    if worker is not None and row.locked_pid is not None and worker.pid != row.locked_pid:
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
    )


def _liveness(
    hostname: str | None,
    boot: str | None,
    identity: procs.ProcessIdentity | None,
    *,
    boot_id: str,
    my_hostname: str,
) -> procs.Liveness:
    """Whether a recorded worker process is still the same living process."""
    if hostname is not None and hostname != my_hostname:
        return procs.Liveness.INCONCLUSIVE  # another machine: cannot probe
    if boot is not None and boot != boot_id:
        return procs.Liveness.DEAD
    if identity is None:
        return procs.Liveness.DEAD
    return procs.is_same_process(identity, procs.WORKER_MARKER)


def owner_verdict(
    cand: Candidate, *, now: float, hang_threshold_s: float, boot_id: str, hostname: str
) -> Verdict:
    """Is the worker that owns `cand` dead, alive, or alive but hung?"""
    identity = cand.worker_identity
    liveness = _liveness(
        cand.worker_hostname, cand.worker_boot_id, identity, boot_id=boot_id, my_hostname=hostname
    )
    if liveness is procs.Liveness.DEAD:
        return Verdict.DEAD
    if liveness is procs.Liveness.INCONCLUSIVE or identity is None or identity.started_at is None:
        return Verdict.ALIVE  # inconclusive means alive; never fence a bare pid
    silent_since = cand.worker_heartbeat_at or cand.heartbeat_at
    if hang_threshold_s > 0 and now - max(silent_since, cand.heartbeat_at) > hang_threshold_s:
        return Verdict.HUNG
    return Verdict.ALIVE


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


def worker_is_dead(row: Any, *, boot_id: str, hostname: str) -> bool:
    identity = procs.ProcessIdentity(row.pid, row.process_started_at)
    liveness = _liveness(row.hostname, row.boot_id, identity, boot_id=boot_id, my_hostname=hostname)
    return liveness is procs.Liveness.DEAD


def bury_workers(conn: Connection, rows: list[Any], now: float) -> None:
    """Mark dead workers' rows dead (a worker killed while idle has no job for
    the reaper to find); a row that heartbeated meanwhile is left alone."""
    for row in rows:
        _BURY.execute(conn, {"b_id": row.id, "b_beat": row.heartbeat_at, "b_now": now})


def fence(cand: Candidate) -> bool:
    """SIGKILL a hung owner and confirm it is gone (only if still the same process)."""
    if cand.worker_identity is None:
        return True
    procs.kill_process_if_same(cand.worker_identity, procs.WORKER_MARKER)
    return procs.is_same_process(cand.worker_identity, procs.WORKER_MARKER) is procs.Liveness.DEAD


def kill_orphan(cand: Candidate) -> bool:
    """Kill the dead owner's job process group if its leader is still the job."""
    if cand.job_identity is None or cand.job_pgid is None:
        return False
    return procs.kill_group_if_same(cand.job_identity, cand.job_pgid)


def reap(
    conn: Connection, cand: Candidate, *, now: float, threshold_s: float, reaper_id: str | None
) -> JobState | None:
    """Requeue (or dead-letter) a job whose owner is confirmed dead.

    Re-checks, inside the caller's BEGIN IMMEDIATE, that the job is still
    running, still owned by the same worker and still stale; otherwise nothing
    changes and None is returned.
    """
    job = conn.execute(
        select(jobs).where(
            jobs.c.id == cand.job_id,
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.heartbeat_at < now - threshold_s,
            _same_owner(cand.worker_id),
        )
    ).first()
    if job is None:
        return None
    error = f"worker {cand.worker_id} died (heartbeat {now - job.heartbeat_at:.1f}s old)"
    if cand.attempt_id is not None:
        conn.execute(
            update(attempts)
            .where(attempts.c.id == cand.attempt_id, attempts.c.state == AttemptState.RUNNING.value)
            .values(
                state=AttemptState.ABANDONED.value,
                failure_reason=FailureReason.WORKER_CRASH.value,
                finished_at=now,
                error=error,
            )
        )
    if cand.worker_id is not None:
        conn.execute(
            update(workers)
            .where(
                workers.c.id == cand.worker_id,
                workers.c.state == WorkerState.RUNNING.value,
                workers.c.pid == cand.locked_pid,
            )
            .values(state=WorkerState.DEAD.value, stopped_at=now)
        )
    record_event(
        conn,
        cand.job_id,
        EventKind.REAPED,
        now,
        worker_id=reaper_id,
        detail={"dead_worker": cand.worker_id, "attempt_id": cand.attempt_id},
    )
    return requeue_or_dead(
        conn,
        job,
        crashed=True,
        now=now,
        worker_id=reaper_id,
        failure={"last_error": error, "last_failure_reason": FailureReason.WORKER_CRASH.value},
    )


def _same_owner(worker_id: str | None):  # type: ignore[no-untyped-def]
    return jobs.c.locked_by.is_(None) if worker_id is None else jobs.c.locked_by == worker_id
