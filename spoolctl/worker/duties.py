"""A worker's periodic duties, each a small task: `due_at()` says when it
next needs running (the loop sleeps until the earliest), `run(now)` does it
if it is due. Duties that write wait out the write backoff (`Shift.db_due`);
the lease fence, which only drives the jobs' processes, never does."""

from __future__ import annotations

import math
import signal
from functools import partial
from typing import Protocol

from sqlalchemy import Connection

from spoolctl.db.engine import write_quietly, write_tx
from spoolctl.errors import StorageFault
from spoolctl.runner import supervise
from spoolctl.services import cancel, heartbeat, lease, placement, reaper
from spoolctl.states import FailureReason
from spoolctl.worker.reaping import Reaping
from spoolctl.worker.shift import LOCK_SLICE_S, NEVER, TRANSIENT, Shift
from spoolctl.worker.steering import Steering


class Duty(Protocol):
    def due_at(self) -> float: ...

    def run(self, now: float) -> None: ...


class Heartbeat:
    """Beat the worker's row and its running jobs; a job the database no
    longer gives this worker (canceled, reaped, force-retried) has its group
    killed, except a job canceled with a first signal other than SIGKILL
    (`cancel`'s default SIGTERM): that one gets its signal now and SIGKILL
    after the grace period, as on a timeout, while the worker goes on
    (its end is recorded as any, and changes nothing: `Execution.lost`).
    Also: the queue file must still be the one the worker opened, a claim
    whose answer was lost is released, workers that died idle are buried,
    and control requests its change watch missed are delivered."""

    def __init__(self, shift: Shift, reaping: Reaping, steering: Steering) -> None:
        self.shift = shift
        self.reaping = reaping
        self.steering = steering
        self.identity: object | None = None
        """What the queue must stay (its driver's identity), read at start."""

    def due_at(self) -> float:
        return self.shift.db_due(self.shift.last_beat + self.shift.beat_every)

    def run(self, now: float) -> None:
        shift = self.shift
        if now - shift.last_beat < shift.beat_every:
            return
        self._check_database_file()
        pairs = [(job_id, e.claim.attempt_id) for job_id, e in shift.running.items() if not e.lost]
        try:
            with shift.report.timings.db, write_tx(shift.engine, LOCK_SLICE_S) as conn:
                lost = self._beat(conn, pairs, now)
                first = cancel.first_signals(conn, lost) if lost else {}
                steered = self.steering.within(conn, now, lost)
        except TRANSIENT:
            shift.backoff.failed(now)
            return
        shift.backoff.ok()
        shift.last_beat = now
        shift.fenced = False
        if shift.guard is not None:
            shift.guard.renewed()
        self.steering.act(now, steered)
        with shift.report.timings.db:
            self.reaping.bury_dead_workers(now, shift)
        killed: list[int] = []
        for job_id in lost:
            execution = shift.running[job_id]
            sig = first.get(job_id, signal.SIGKILL)
            if sig != signal.SIGKILL and execution.leader_running:
                execution.lost = True
                execution.terminate(now, sig)
                continue
            execution.kill_now()
            execution.wait_blocking()
            shift.finished_one(execution, None, None)
            if execution.claim.devices:
                killed.append(execution.claim.attempt_id)
        if killed:  # their processes are gone: else the sweep of a later beat
            release = partial(placement.release, attempt_ids=killed)
            write_quietly(shift.engine, release, LOCK_SLICE_S)

    def _beat(self, conn: Connection, pairs: list[tuple[int, int]], now: float) -> list[int]:
        shift = self.shift
        done = shift.report.executed
        lost = heartbeat.beat(conn, shift.worker_id, pairs, now, done)
        reaper.release_forgotten(conn, shift.worker_id, shift.identity.pid, set(shift.running), now)
        timing = shift.timing
        here = placement.Here(shift.hostname, timing.reap_threshold_s, timing.hang_threshold_s)
        placement.release_lingering(conn, now, here)
        return lost

    def _check_database_file(self) -> None:
        """A queue file deleted or replaced underneath would have this worker
        write into an unlinked inode nobody else sees: stop instead."""
        shift = self.shift
        if shift.queue.driver.identity() != self.identity:
            shift.db_gone = True
            raise StorageFault(
                f"the queue database {shift.queue.display} was deleted or replaced while this "
                "worker ran; it stopped (its running jobs were killed)",
                path=shift.queue.display,
                reason="replaced",
            )


class LeaseFence:
    """No heartbeat has landed for half the hang threshold: others may requeue
    this worker's jobs once it is silent for the whole threshold, so kill them
    now (their outcome is recorded as a worker crash when the database lets
    it) and claim nothing until a heartbeat lands."""

    def __init__(self, shift: Shift) -> None:
        self.shift = shift

    def due_at(self) -> float:
        shift = self.shift
        hang = shift.timing.hang_threshold_s
        if not shift.running or hang <= 0 or shift.fenced:
            return NEVER
        return shift.last_beat + hang / 2

    def run(self, now: float) -> None:
        shift = self.shift
        hang = shift.timing.hang_threshold_s
        if shift.fenced or not lease.self_fence_due(now, shift.last_beat, hang):
            return
        shift.fenced = True
        silent = now - shift.last_beat
        error = f"worker could not heartbeat for {silent:.1f}s (half the hang threshold): fenced"
        for execution in shift.running.values():
            if execution.outcome is None and execution.forced is None:
                execution.force_end(FailureReason.WORKER_CRASH, error)


class ReapPass:
    """Claims run a reap pass first; a worker whose slots are all busy (so it
    claims nothing) runs one of its own every heartbeat interval, so crash
    recovery never waits for some worker to be idle."""

    def __init__(self, shift: Shift, reaping: Reaping) -> None:
        self.shift = shift
        self.reaping = reaping

    def due_at(self) -> float:
        return self.shift.db_due(self.shift.last_reap_pass + self.shift.beat_every)

    def run(self, now: float) -> None:
        shift = self.shift
        if now - shift.last_reap_pass < shift.beat_every:
            return
        shift.last_reap_pass = now
        with shift.report.timings.db:
            self.reaping.pass_now(now, shift)


class SpawnRecords:
    """Store the pid and start time of jobs that outlived the short delay,
    where no settle pass took them along (`Settler`): alone once the oldest
    has waited `SPAWN_RECORD_ALONE_S`, then every due one with it. Retried on
    every pass until it lands: it is what lets a reaper kill the job's group
    by its recorded identity should this worker die (the attempt token covers
    the time before)."""

    def __init__(self, shift: Shift) -> None:
        self.shift = shift

    def due_at(self) -> float:
        waiting = self.shift.spawns_unrecorded(math.inf, 0.0)
        if not waiting:
            return NEVER
        oldest = min(e.started_at for e in waiting)
        return self.shift.db_due(oldest + supervise.SPAWN_RECORD_ALONE_S)

    def run(self, now: float) -> None:
        if not self.shift.spawns_unrecorded(now, supervise.SPAWN_RECORD_ALONE_S):
            return
        due = self.shift.spawns_unrecorded(now, supervise.SPAWN_RECORD_DELAY_S)
        with self.shift.report.timings.db:
            landed = write_quietly(
                self.shift.engine, lambda conn: supervise.record_spawns(conn, due), LOCK_SLICE_S
            )
        if landed:
            for execution in due:
                execution.spawn_recorded = True
        else:
            self.shift.backoff.failed(now)


class OutputPass:
    """Store what running jobs appended to their output files since the last
    pass, where the queue's output writer stores output beyond them (a stat
    per file when nothing was). A pass that cannot write is retried after
    the write backoff, from where the database stands (see its writer)."""

    def __init__(self, shift: Shift) -> None:
        self.shift = shift
        self.next_at = 0.0

    def due_at(self) -> float:
        shift = self.shift
        if not shift.running or shift.output.pass_every_s is None:
            return NEVER
        return shift.db_due(self.next_at)

    def run(self, now: float) -> None:
        writer = self.shift.output
        if writer.pass_every_s is None or now < self.next_at:
            return
        self.next_at = now + writer.pass_every_s
        behind = writer.behind()
        if not behind:
            return
        with self.shift.report.timings.db:
            landed = write_quietly(
                self.shift.engine, lambda conn: writer.copy(conn, behind), LOCK_SLICE_S
            )
        if landed:
            writer.landed()
        else:
            writer.failed()
            self.shift.backoff.failed(now)
