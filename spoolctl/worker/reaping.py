"""A worker's duties toward other workers: reaping the jobs of dead ones
(after fencing hung ones and killing orphaned job groups) and burying the rows
of workers that died idle. The policies live in `services/reaper.py`; this
module sequences them around short transactions."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine

from spoolctl.config import Timing
from spoolctl.db.engine import read_tx, write_quietly
from spoolctl.errors import Locked, Unreachable
from spoolctl.runner import containment, liveness
from spoolctl.services import reaper
from spoolctl.states import JobState
from spoolctl.worker.shift import Shift

RETELL_S = 3600.0
"""How long the log goes without hearing again of an orphan still unconfirmed."""


@dataclass
class Reaping:
    engine: Engine
    timing: Timing
    worker_id: str
    boot_id: str
    hostname: str
    clock: Callable[[], float]
    lock_wait_s: float | None = None
    log: Callable[[dict[str, Any]], None] | None = None
    """Told of each reap and each orphan left unconfirmed (`work --log-format json`)."""
    cells: containment.Containment | None = None
    """This worker's containment: it ends a dead worker's cgroups on this machine."""
    deferred: dict[int, float] = field(default_factory=dict)
    """Job id -> when to judge it again: an owner found alive, or an orphan
    whose end could not be confirmed, is looked at once per heartbeat interval,
    not before every claim."""
    told: dict[int, tuple[tuple[Any, ...], float]] = field(default_factory=dict)
    """Job id -> the unconfirmed orphan last told to the log (attempt, pid,
    reason) and when: the same one is told again only after RETELL_S."""

    def stale(self, conn: Connection, now: float, shift: Shift) -> list[reaper.Candidate]:
        """Running jobs (not this worker's own running ones) whose heartbeat is
        older than the reap threshold and that are due for judging: read inside
        the caller's claim transaction."""
        own = shift.running
        return [
            cand
            for cand in reaper.reap_candidates(conn, now, self.timing.reap_threshold_s)
            if not (cand.worker_id == self.worker_id and cand.job_id in own)
            and self.deferred.get(cand.job_id, 0.0) <= now
        ]

    def pass_now(self, now: float, shift: Shift) -> None:
        """A reap pass of its own, for a worker too busy to claim (claims run
        one before they take anything)."""
        try:
            with read_tx(self.engine) as conn:
                candidates = self.stale(conn, now, shift)
        except (Locked, Unreachable):
            return
        self.reap(candidates, now, shift)

    def reap(self, candidates: list[reaper.Candidate], now: float, shift: Shift) -> None:
        """Judge each stale owner; reap the jobs of dead (or fenced, or beyond
        their lease) ones once what is left of their attempt is confirmed gone.
        Inconclusive means alive; unconfirmed means the job stays running.
        Whatever the verdict, nothing of `shift` (this worker, its jobs) is
        fenced or killed."""
        for cand in candidates:
            self._judge(self._as_claimed(cand, shift), now, shift)

    def _as_claimed(self, cand: reaper.Candidate, shift: Shift) -> reaper.Candidate:
        """A job this worker id claimed before this process registered, whose
        row is this process's now: judged by the predecessor it replaced,
        where that one was found gone on this machine (else by the lease)."""
        before = shift.predecessor
        if before is None or cand.worker_id != self.worker_id or cand.worker_hostname is not None:
            return cand
        if cand.locked_pid != before.identity.pid:
            return cand
        return replace(
            cand,
            worker_identity=before.identity,
            worker_boot_id=before.boot_id,
            worker_hostname=self.hostname,
            worker_pid_space=shift.pid_space,
        )

    def _judge(self, cand: reaper.Candidate, now: float, shift: Shift) -> None:
        verdict = liveness.owner_verdict(
            cand,
            now=now,
            hang_threshold_s=self.timing.hang_threshold_s,
            boot_id=self.boot_id,
            hostname=self.hostname,
            pid_space=shift.pid_space,
        )
        spared = shift.spared()
        if verdict is liveness.Verdict.ALIVE or (
            verdict is liveness.Verdict.HUNG and not liveness.fence(cand, spared)
        ):
            self._defer(cand, now)
            return
        same_machine = verdict is not liveness.Verdict.LEASE_EXPIRED
        check = liveness.end_orphan(
            cand, same_machine=same_machine, cells=self.cells, spared=spared
        )
        if not check.gone:
            self._defer(cand, now)
            if write_quietly(self.engine, partial(self._flag, cand, check), self.lock_wait_s):
                self._tell_unconfirmed(cand, check, now)
            return
        ended: list[JobState | None] = []
        if write_quietly(self.engine, partial(self._reap_one, cand, ended), self.lock_wait_s):
            self.deferred.pop(cand.job_id, None)
            self.told.pop(cand.job_id, None)
            if ended and ended[0] is not None:
                self._tell("reaped", cand, verdict=verdict.value, job_state=ended[0].value)

    def _defer(self, cand: reaper.Candidate, now: float) -> None:
        self.deferred[cand.job_id] = now + self.timing.heartbeat_interval_s

    def _reap_one(
        self, cand: reaper.Candidate, ended: list[JobState | None], conn: Connection
    ) -> None:
        threshold = self.timing.reap_threshold_s
        ended[:] = [
            reaper.reap(
                conn, cand, now=self.clock(), threshold_s=threshold, reaper_id=self.worker_id
            )
        ]

    def _tell_unconfirmed(
        self, cand: reaper.Candidate, check: reaper.OrphanCheck, now: float
    ) -> None:
        """Log an unconfirmed orphan once, not at every look (once per
        heartbeat interval for as long as it stays): again only when what
        stands in the way changes, or RETELL_S later."""
        seen = (cand.attempt_id, check.pid, check.reason)
        last = self.told.get(cand.job_id)
        if last is not None and last[0] == seen and now - last[1] < RETELL_S:
            return
        self.told[cand.job_id] = (seen, now)
        self._tell("orphan_unconfirmed", cand, pid=check.pid, reason=check.reason)

    def _tell(self, event: str, cand: reaper.Candidate, **facts: Any) -> None:
        if self.log is not None:
            self.log(
                {
                    "event": event,
                    "at": time.time(),
                    "worker_id": self.worker_id,
                    "job_id": cand.job_id,
                    "attempt_id": cand.attempt_id,
                    "dead_worker": cand.worker_id,
                    **facts,
                }
            )

    def _flag(self, cand: reaper.Candidate, check: reaper.OrphanCheck, conn: Connection) -> None:
        reaper.flag_unconfirmed(
            conn,
            cand,
            check,
            now=self.clock(),
            threshold_s=self.timing.reap_threshold_s,
            reaper_id=self.worker_id,
        )

    def bury_dead_workers(self, now: float, shift: Shift) -> None:
        """Mark rows of workers that died idle (on this machine, where their
        pid can be checked) as dead."""
        try:
            with read_tx(self.engine) as conn:
                stale = reaper.stale_workers(conn, now, self.timing.reap_threshold_s)
        except (Locked, Unreachable):
            return
        dead = [
            row
            for row in stale
            if row.id != self.worker_id
            and liveness.worker_is_dead(
                row, boot_id=self.boot_id, hostname=self.hostname, pid_space=shift.pid_space
            )
        ]
        if dead:
            bury = partial(reaper.bury_workers, rows=dead, now=now)
            write_quietly(self.engine, bury, self.lock_wait_s)
        for row in dead:  # the empty cgroup directories a dead worker left on this machine
            if self.cells is not None and row.pid != shift.identity.pid:
                self.cells.sweep(row.id, row.pid, liveness.ORPHAN_WAIT_S)
