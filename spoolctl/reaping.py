"""A worker's duties toward other workers: reaping the jobs of dead ones
(after fencing hung ones and killing orphaned job groups) and burying the rows
of workers that died idle. The policies live in `services/reaper.py`; this
module sequences them around short transactions."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Connection, Engine

from spoolctl.config import Timing
from spoolctl.db.engine import read_tx, write_quietly
from spoolctl.errors import Locked
from spoolctl.services import reaper


@dataclass
class Reaping:
    engine: Engine
    timing: Timing
    worker_id: str
    boot_id: str
    hostname: str
    clock: Callable[[], float]

    def stale(self, conn: Connection, now: float, own: Container[int]) -> list[reaper.Candidate]:
        """Running jobs (not this worker's own `own` ones) whose heartbeat is
        older than the reap threshold: read inside the caller's claim transaction."""
        return [
            cand
            for cand in reaper.reap_candidates(conn, now, self.timing.reap_threshold_s)
            if not (cand.worker_id == self.worker_id and cand.job_id in own)
        ]

    def reap(self, candidates: list[reaper.Candidate], now: float) -> None:
        """Judge each stale owner; reap the jobs of dead (or fenced) ones after
        killing their orphaned process groups. Inconclusive means alive."""
        for cand in candidates:
            verdict = reaper.owner_verdict(
                cand,
                now=now,
                hang_threshold_s=self.timing.hang_threshold_s,
                boot_id=self.boot_id,
                hostname=self.hostname,
            )
            if verdict is reaper.Verdict.ALIVE:
                continue
            if verdict is reaper.Verdict.HUNG and not reaper.fence(cand):
                continue
            reaper.kill_orphan(cand)
            write_quietly(self.engine, partial(self._reap_one, cand))

    def _reap_one(self, cand: reaper.Candidate, conn: Connection) -> None:
        threshold = self.timing.reap_threshold_s
        reaper.reap(conn, cand, now=self.clock(), threshold_s=threshold, reaper_id=self.worker_id)

    def bury_dead_workers(self, now: float) -> None:
        """Mark rows of workers that died idle as dead."""
        try:
            with read_tx(self.engine) as conn:
                stale = reaper.stale_workers(conn, now, self.timing.reap_threshold_s)
        except Locked:
            return
        dead = [
            row
            for row in stale
            if row.id != self.worker_id
            and reaper.worker_is_dead(row, boot_id=self.boot_id, hostname=self.hostname)
        ]
        if dead:
            write_quietly(self.engine, partial(reaper.bury_workers, rows=dead, now=now))
