"""Judging a stale owner and what is left of its attempt, from this machine:
is the worker dead, alive, hung, or beyond its lease; fencing a hung one;
ending an orphaned attempt and confirming it is gone. Beside `procs.py`
(the OS edge it uses); the state changes that follow a verdict are
`services/reaper.py`'s, sequenced by the worker (`worker/reaping.py`).

Liveness of a stale owner, in order: a different boot means dead; the pid
gone (ProcessLookupError) means dead; not ours to signal (PermissionError)
is inconclusive, so alive; a pid now held by another process (different
start time, or no `spoolctl` in its command line) means recycled, so dead.
An owner that is alive but silent beyond the hang threshold is fenced:
killed, confirmed dead, then reaped. An owner that cannot be probed from
here (another hostname) is judged by the lease rule of `services/lease.py`.
Before a job is requeued, what is left of its attempt is ended and confirmed
gone: the recorded process group, and every process that carries the
attempt's token in its environment.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from spoolctl import containment, procs
from spoolctl.services import lease
from spoolctl.services.reaper import Candidate, OrphanCheck

ORPHAN_WAIT_S = 5.0
"""How long a SIGKILLed orphan may take to be gone before it counts as unconfirmed."""


class Verdict(Enum):
    DEAD = "dead"
    ALIVE = "alive"
    HUNG = "hung"
    LEASE_EXPIRED = "lease_expired"
    """Cannot be probed from here and silent beyond the hang threshold."""


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


def worker_is_dead(row: Any, *, boot_id: str, hostname: str) -> bool:
    if not probeable(row.hostname, hostname):
        return False
    identity = procs.ProcessIdentity(row.pid, row.process_started_at)
    return _liveness(row.boot_id, identity, boot_id=boot_id) is procs.Liveness.DEAD


def fence(cand: Candidate) -> bool:
    """SIGKILL a hung owner and confirm it is gone (only if still the same process)."""
    if cand.worker_identity is None:
        return True
    procs.kill_process_if_same(cand.worker_identity, procs.WORKER_MARKER)
    return procs.is_same_process(cand.worker_identity, procs.WORKER_MARKER) is procs.Liveness.DEAD


def end_orphan(
    cand: Candidate, *, same_machine: bool = True, cells: containment.Containment | None = None
) -> OrphanCheck:
    """Kill what is left of the candidate's attempt and confirm it is gone.

    On this machine: the recorded process group (pid plus start time), then
    every process carrying the attempt's token, which also finds an attempt
    whose pid was never recorded. A same-user process started since the
    attempt whose environment cannot be read leaves the end unconfirmed. For a
    worker that cannot be probed (`same_machine` False) recorded pids mean
    nothing here: only token holders that happen to be visible are killed.
    """
    if same_machine and cells is not None:
        why = _end_cgroups(cand, cells)
        if why is not None:
            return OrphanCheck(False, None, None, why)
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


def _end_cgroups(cand: Candidate, cells: containment.Containment) -> str | None:
    """End the attempt's cgroup (the path its row recorded) and every cgroup
    the dead worker left in this worker's sites; None once all are gone.
    What is in a cgroup cannot have left it, setsid() or not."""
    recorded = cand.cgroup
    if recorded and containment.end_path(recorded, ORPHAN_WAIT_S) is False:
        return f"cgroup {recorded.splitlines()[0]} still has processes after a kill"
    owner = cand.worker_identity
    if cand.worker_id is None or owner is None:
        return None
    if not cells.sweep(cand.worker_id, owner.pid, ORPHAN_WAIT_S):
        return f"the cgroups worker {cand.worker_id} left still have processes after a kill"
    return None


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
