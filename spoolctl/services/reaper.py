"""Crash recovery: find running jobs whose worker went silent, confirm the
worker is really gone, kill any orphaned job process group, and requeue.

Liveness of a stale owner, in order: a different boot means dead; the pid
gone (ProcessLookupError) means dead; not ours to signal (PermissionError)
is inconclusive, so alive; a pid now held by another process (different start
time, or no `spoolctl` in its command line) means recycled, so dead. An owner
that is alive but silent beyond the hang threshold is fenced: killed,
confirmed dead, then reaped. An owner that cannot be probed from here (another
hostname) is judged by the lease rule of `lease.py` instead.

Before a job is requeued, what is left of its attempt is ended and confirmed
gone: the recorded process group, and every process that carries the
attempt's token in its environment (which also finds a job whose worker died
before it could record the pid). When that cannot be confirmed, the job stays
`running`, flagged with an `orphan_unconfirmed` event, and is judged again
later. The reap re-checks staleness and ownership under its own BEGIN
IMMEDIATE, so a worker that heartbeated meanwhile is untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
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

from spoolctl import procs
from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts, job_events, jobs, workers
from spoolctl.services import lease
from spoolctl.services.claim import attempt_token
from spoolctl.services.deadletter import requeue_or_dead
from spoolctl.services.events import record_event
from spoolctl.services.query import event_detail
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState, WorkerState

ORPHAN_WAIT_S = 5.0
"""How long a SIGKILLed orphan may take to be gone before it counts as unconfirmed."""


class Verdict(Enum):
    DEAD = "dead"
    ALIVE = "alive"
    HUNG = "hung"
    LEASE_EXPIRED = "lease_expired"
    """Cannot be probed from here and silent beyond the hang threshold."""


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
        )
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
        locked_at=_local(row.locked_at, skew),
        attempt_started_at=None if attempt is None else _local(attempt.started_at, skew),
        token=_token_of(attempt),
    )


def _local(stamp: float | None, skew: float) -> float | None:
    """A database time on this machine's clock. Stamps are written by the
    database's clock (the server's, on PostgreSQL); they are compared here with
    local process start and boot times, which only this machine's clock gives."""
    return None if stamp is None else stamp - skew


def _token_of(attempt: Any) -> str | None:
    if attempt is None or attempt.worker_id is None or attempt.started_at is None:
        return None
    return attempt_token(attempt.worker_id, attempt.id, attempt.started_at)


def _liveness(
    boot: str | None,
    identity: procs.ProcessIdentity | None,
    *,
    boot_id: str,
    locked_at: float | None = None,
) -> procs.Liveness:
    """Whether a recorded worker process (on this machine) is still the same
    living process. A lock taken before this machine booted, or a bare pid now
    held by a process younger than the lock, names a dead worker."""
    if boot is not None and boot != boot_id:
        return procs.Liveness.DEAD
    if locked_at is not None and locked_at < procs.boot_time() - procs.START_TIME_TOLERANCE_S:
        return procs.Liveness.DEAD
    if identity is None:
        return procs.Liveness.DEAD
    bare = identity.started_at is None  # else the start time is the stronger check
    existed_at = locked_at if bare else None
    return procs.is_same_process(identity, procs.WORKER_MARKER, existed_at=existed_at)


def probeable(worker_hostname: str | None, hostname: str) -> bool:
    """Whether a worker's process can be checked from this machine."""
    return worker_hostname is None or worker_hostname == hostname


def owner_verdict(
    cand: Candidate, *, now: float, hang_threshold_s: float, boot_id: str, hostname: str
) -> Verdict:
    """Is the worker that owns `cand` dead, alive, alive but hung, or beyond
    its lease (when it cannot be probed from here)?"""
    silent_since = max(cand.worker_heartbeat_at or cand.heartbeat_at, cand.heartbeat_at)
    if not probeable(cand.worker_hostname, hostname):
        expired = lease.lease_expired(now, silent_since, hang_threshold_s)
        return Verdict.LEASE_EXPIRED if expired else Verdict.ALIVE
    identity = cand.worker_identity
    liveness = _liveness(cand.worker_boot_id, identity, boot_id=boot_id, locked_at=cand.locked_at)
    if liveness is procs.Liveness.DEAD:
        return Verdict.DEAD
    if liveness is procs.Liveness.INCONCLUSIVE or identity is None or identity.started_at is None:
        return Verdict.ALIVE  # inconclusive means alive; never fence a bare pid
    if hang_threshold_s > 0 and now - silent_since > hang_threshold_s:
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
    if not probeable(row.hostname, hostname):
        return False
    identity = procs.ProcessIdentity(row.pid, row.process_started_at)
    return _liveness(row.boot_id, identity, boot_id=boot_id) is procs.Liveness.DEAD


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


@dataclass(frozen=True)
class OrphanCheck:
    """Whether what is left of an attempt is confirmed gone; if not, which
    process stands in the way and why."""

    gone: bool
    pid: int | None = None
    started_at: float | None = None
    reason: str | None = None


def end_orphan(cand: Candidate, *, same_machine: bool = True) -> OrphanCheck:
    """Kill what is left of the candidate's attempt and confirm it is gone.

    On this machine: the recorded process group (pid plus start time), then
    every process carrying the attempt's token, which also finds an attempt
    whose pid was never recorded. A same-user process started since the
    attempt whose environment cannot be read leaves the end unconfirmed. For a
    worker that cannot be probed (`same_machine` False) recorded pids mean
    nothing here: only token holders that happen to be visible are killed.
    """
    if same_machine and cand.job_identity is not None and cand.job_pgid is not None:
        reason = procs.end_group(cand.job_identity, cand.job_pgid, ORPHAN_WAIT_S)
        if reason is not None:
            identity = cand.job_identity
            return OrphanCheck(False, identity.pid, identity.started_at, reason)
    if cand.token is None or cand.attempt_started_at is None:
        return OrphanCheck(True)
    if same_machine and cand.attempt_started_at < procs.boot_time() - procs.START_TIME_TOLERANCE_S:
        return OrphanCheck(True)  # started before this machine booted: nothing of it runs
    return _end_token_holders(cand.token, cand.attempt_started_at, strict=same_machine)


TOKEN_SCANS = 3
"""A token holder may fork while it is being killed: scan again, a few times."""


def _end_token_holders(token: str, started_at: float, *, strict: bool) -> OrphanCheck:
    for _ in range(TOKEN_SCANS):
        scan = procs.find_token(token, started_at)
        if strict and scan.unreadable:
            pid = scan.unreadable[0]
            why = f"cannot read the environment of pid {pid} to tell whether it is the job"
            return OrphanCheck(False, pid, procs.process_start_time(pid), why)
        if not scan.found:
            return OrphanCheck(True)
        left = procs.kill_token_holders(scan, ORPHAN_WAIT_S)
        if left:
            pid = left[0]
            why = f"pid {pid} still runs {ORPHAN_WAIT_S:.0f}s after SIGKILL"
            return OrphanCheck(False, pid, procs.process_start_time(pid), why)
    return OrphanCheck(False, None, None, "the attempt's processes kept appearing")


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
    attempt of the job still runs."""
    mine = attempts.c.id == attempt_id if attempt_id is not None else attempts.c.job_id == job.id
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
