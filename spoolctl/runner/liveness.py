"""Judging a stale owner and what is left of its attempt, from this machine:
is the worker dead, alive, hung, or beyond its lease; fencing a hung one;
ending an orphaned attempt and confirming it is gone. Beside `procs.py`
(the OS edge it uses); the state changes that follow a verdict are
`services/reaper.py`'s, sequenced by the worker (`worker/reaping.py`).

A worker's pid is only probed where it means that worker: on the same
machine, which is the same host name and the same pid space (machine id,
PID namespace, cgroup namespace: `procs.pid_space`). Liveness of such an
owner, in order: a different boot means dead; the pid gone
(ProcessLookupError) means dead; not ours to signal (PermissionError) is
inconclusive, so alive; a pid now held by another process (different start
time, or no `spoolctl` in its command line) means recycled, so dead. An
owner that is alive but silent beyond the hang threshold is fenced: killed,
confirmed dead, then reaped. Any other owner (another host name, another
PID namespace, or one whose row does not say: written before revision
0008, or replaced by a later registration under its worker id) cannot be
probed from here and is judged by the lease rule of `services/lease.py`.
Before a job is requeued, what is left of its attempt is ended and confirmed
gone: the recorded process group, and every process that carries the
attempt's token in its environment. Whatever the verdict, the judging
worker never fences or kills itself, nor a process of its own jobs.
"""

from __future__ import annotations

from collections.abc import Container
from enum import Enum
from typing import Any

from spoolctl.runner import containment, procs
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


def probeable(
    worker_hostname: str | None, worker_space: str | None, *, hostname: str, pid_space: str | None
) -> bool:
    """Whether a worker's process can be checked from here: the same host name
    and the same pid space (machine, PID namespace, cgroup namespace). A
    worker whose pid space is unknown (None on either side) cannot."""
    return worker_hostname == hostname and pid_space is not None and worker_space == pid_space


def owner_verdict(
    cand: Candidate,
    *,
    now: float,
    hang_threshold_s: float,
    boot_id: str,
    hostname: str,
    pid_space: str | None,
) -> Verdict:
    """Is the worker that owns `cand` dead, alive, alive but hung, or beyond
    its lease (when it cannot be probed from here)?"""
    silent_since = max(cand.worker_heartbeat_at or cand.heartbeat_at, cand.heartbeat_at)
    worker_space = cand.worker_pid_space
    if not probeable(cand.worker_hostname, worker_space, hostname=hostname, pid_space=pid_space):
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


def worker_is_dead(row: Any, *, boot_id: str, hostname: str, pid_space: str | None) -> bool:
    """Whether a worker row names a dead process: only told for a worker on
    this machine (`probeable`)."""
    if not probeable(row.hostname, row.pid_space, hostname=hostname, pid_space=pid_space):
        return False
    identity = procs.ProcessIdentity(row.pid, row.process_started_at)
    return _liveness(row.boot_id, identity, boot_id=boot_id) is procs.Liveness.DEAD


def fence(cand: Candidate, spared: Container[int] = frozenset()) -> bool:
    """SIGKILL a hung owner and confirm it is gone (only if still the same
    process). Never this worker or a process of its jobs (`spared`: this
    worker's pid and its jobs' leaders): False, not fenced."""
    if cand.worker_identity is None:
        return True
    if procs.belongs_to(cand.worker_identity.pid, spared):
        return False
    procs.kill_process_if_same(cand.worker_identity, procs.WORKER_MARKER)
    return procs.is_same_process(cand.worker_identity, procs.WORKER_MARKER) is procs.Liveness.DEAD


def end_orphan(
    cand: Candidate,
    *,
    same_machine: bool = True,
    cells: containment.Containment | None = None,
    spared: Container[int] = frozenset(),
) -> OrphanCheck:
    """Kill what is left of the candidate's attempt and confirm it is gone.

    On this machine: the recorded process group (pid plus start time), then
    every process carrying the attempt's token, which also finds an attempt
    whose pid was never recorded, or was recorded without its start time (an
    older spoolctl wrote the pid of an ended job so: that names no process).
    A same-user process started since the attempt whose environment cannot
    be read leaves the end unconfirmed. For
    a worker that cannot be probed (`same_machine` False) recorded pids mean
    nothing here: only token holders that happen to be visible are killed.
    Nothing that is this worker or one of its jobs (`spared`, with their
    groups and sessions) is ever killed: a recorded group whose number one
    of them holds cannot still exist here.
    """
    if same_machine and cells is not None:
        why = _end_cgroups(cand, cells, spared)
        if why is not None:
            return OrphanCheck(False, None, None, why)
    group = _recorded_group(cand, spared) if same_machine else None
    if group is not None:
        identity, pgid = group
        reason = procs.end_group(identity, pgid, ORPHAN_WAIT_S)
        if reason is not None:
            return OrphanCheck(False, identity.pid, identity.started_at, reason)
    if cand.token is None or cand.attempt_started_at is None:
        return OrphanCheck(True)
    if same_machine and cand.attempt_started_at < procs.boot_time() - procs.START_TIME_TOLERANCE_S:
        return OrphanCheck(True)  # started before this machine booted: nothing of it runs
    return _end_token_holders(cand.token, cand.attempt_started_at, same_machine, spared)


def _recorded_group(
    cand: Candidate, spared: Container[int]
) -> tuple[procs.ProcessIdentity, int] | None:
    """The attempt's recorded leader and process group, where they are one to
    end: a pid with its start time (without one it is no identity: the
    attempt's token tells instead), held by nothing of this worker's."""
    identity, pgid = cand.job_identity, cand.job_pgid
    if identity is None or identity.started_at is None or pgid is None:
        return None
    if pgid in spared or procs.belongs_to(identity.pid, spared):
        return None
    return identity, pgid


def _end_cgroups(
    cand: Candidate, cells: containment.Containment, spared: Container[int]
) -> str | None:
    """End the attempt's cgroup (the path its row recorded) and every cgroup
    the dead worker left in this worker's sites; None once all are gone.
    What is in a cgroup cannot have left it, setsid() or not."""
    recorded = cand.cgroup
    if recorded and containment.end_path(recorded, ORPHAN_WAIT_S) is False:
        return f"cgroup {recorded.splitlines()[0]} still has processes after a kill"
    owner = cand.worker_identity
    if cand.worker_id is None or owner is None or owner.pid in spared:
        return None  # a worker of this pid's leftovers would be this worker's own
    if not cells.sweep(cand.worker_id, owner.pid, ORPHAN_WAIT_S):
        return f"the cgroups worker {cand.worker_id} left still have processes after a kill"
    return None


TOKEN_SCANS = 3
"""A token holder may fork while it is being killed: scan again, a few times."""


def _end_token_holders(
    token: str, started_at: float, strict: bool, spared: Container[int]
) -> OrphanCheck:
    for _ in range(TOKEN_SCANS):
        scan = procs.find_token(token, started_at)
        found = [i for i in scan.found if not procs.belongs_to(i.pid, spared)]
        scan = procs.TokenScan(found, [p for p in scan.unreadable if p not in spared])
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
