"""Recording ended attempts and claiming the next, in one short write
transaction per pass (`services/settle.py`; the reap pass first: a stale job
due for judging is judged before anything is claimed), and starting what was
claimed in a place of the worker's capacity."""

from __future__ import annotations

import time
from dataclasses import replace

from sqlalchemy import Connection

from spoolctl.runner import containment, supervise
from spoolctl.services import control, reaper
from spoolctl.services.claim import Claim, Claimant
from spoolctl.services.outcome import Ending, Outcome
from spoolctl.services.settle import Settled, settle
from spoolctl.worker import warnings
from spoolctl.worker.reaping import Reaping
from spoolctl.worker.shift import LOCK_SLICE_S, TRANSIENT, Shift
from spoolctl.worker.spin import Spin
from spoolctl.worker.steering import Steering

Ended = list[tuple[supervise.Execution, Outcome]]


class Settler:
    """Claims for one worker: who claims (`claimant`), when to look again
    (`next_claim_at`, and whether the last look found the lane exhausted),
    and the pass that records and claims."""

    def __init__(self, shift: Shift, reaping: Reaping, steering: Steering) -> None:
        self.shift = shift
        self.reaping = reaping
        self.steering = steering
        self.claimant = Claimant(
            shift.worker_id,
            shift.identity.pid,
            shift.options.lane,
            shift.queue.output_root,
            cap=shift.capacity,
            inventory=shift.capacity.inventory,
            live_within_s=shift.timing.reap_threshold_s,
        )
        """Fixed as the worker starts; what its cells enforce once probed (`contain`)."""
        self.next_claim_at = 0.0
        self.exhausted = False
        self.job_env = supervise.encoded_environment()
        """This process's environment, encoded once: the base of every job's."""
        self.spin = Spin()
        """Whether the wait for the ends of the jobs started looks without sleeping first."""

    def contain(self, cells: containment.Containment) -> None:
        """The worker contains its attempts in `cells`: claim what they can enforce."""
        self.claimant = replace(self.claimant, enforces=cells.enforces)

    def settle_and_claim(
        self, now: float, ended: Ended, wanted: int, *, steer: bool = False
    ) -> list[Claim]:
        """Record ended attempts and claim up to `wanted` (plus the slots they
        free) in one write transaction; with steer, the requests waiting for
        this worker's attempts are settled in it too, and acted on once it
        commits (`Steering.within`). Nothing is lost when the write fails:
        ended attempts stay in `running` and are recorded on a later pass.
        A claim looks for stale jobs to reap first, at most once per heartbeat
        interval (as the reap pass of a busy worker does): reaping waits for a
        reap threshold anyway, and a drain does not pay the scan per job."""
        shift = self.shift
        for execution, _ in ended:
            self.spin.ended(now - execution.started_at)
        riding = self._spawns_riding(ended, now)
        scan = wanted > 0 and now - shift.last_reap_pass >= shift.beat_every
        stale: list[reaper.Candidate] = []

        def beside(conn: Connection) -> bool:
            """The spawn records riding with this pass, and the stale scan:
            a claim waits for the reap of what it found."""
            nonlocal stale
            supervise.record_spawns(conn, riding)
            stale = self.reaping.stale(conn, now, shift) if scan else []
            return not stale

        endings = [_ending(execution, outcome) for execution, outcome in ended]
        warned = warnings.unrecorded(shift.running.values())

        def first(conn: Connection) -> None:
            warnings.record(conn, warned, shift.worker_id)

        room = shift.capacity.room(execution.place for execution, _ in ended)
        steered: list[control.Request] = []
        try:
            with shift.report.timings.db, shift.held.write_tx(LOCK_SLICE_S) as conn:
                steered = self.steering.within(conn, now) if steer else []
                settled = settle(
                    conn,
                    self.claimant,
                    endings,
                    wanted,
                    now,
                    output=shift.output,
                    beside=beside,
                    first=first,
                    room=room,
                )
        except TRANSIENT:
            shift.output.failed()
            shift.backoff.failed(now)
            return []
        shift.backoff.ok()
        shift.output.landed()
        warnings.landed(warned)
        self.steering.act(now, steered)
        for execution in riding:
            execution.spawn_recorded = True
        for (execution, outcome), state in zip(ended, settled.states, strict=True):
            shift.finished_one(execution, outcome, state)
        if settled.claimed:
            self._claimed(now, wanted, settled)
        if scan:
            shift.last_reap_pass = now
        if stale:
            self.reaping.reap(stale, now, shift)
            return self._claim_only(now, wanted)
        return settled.claims

    def _spawns_riding(self, ended: Ended, now: float) -> list[supervise.Execution]:
        """The due spawn records of jobs still running: they ride with this
        pass instead of costing a transaction of their own."""
        over = {execution.claim.job_id for execution, _ in ended}
        due = self.shift.spawns_unrecorded(now, supervise.SPAWN_RECORD_DELAY_S)
        return [e for e in due if e.claim.job_id not in over]

    def _claimed(self, now: float, wanted: int, settled: Settled) -> None:
        self.exhausted = len(settled.claims) < wanted
        if self.exhausted:
            due_at = settled.next_due_at
            fallback = now + self.shift.options.poll_interval_s
            self.next_claim_at = (
                fallback if due_at is None or due_at <= now else min(due_at, fallback)
            )

    def _claim_only(self, now: float, wanted: int) -> list[Claim]:
        try:
            with self.shift.report.timings.db, self.shift.held.write_tx(LOCK_SLICE_S) as conn:
                settled = settle(
                    conn, self.claimant, [], wanted, now, room=self.shift.capacity.room()
                )
        except TRANSIENT:
            self.shift.backoff.failed(now)
            return []
        self._claimed(now, wanted, settled)
        return settled.claims

    def start(self, claim: Claim, now: float) -> None:
        """Spawn a claimed job (its claim committed first) in a place of the
        worker's capacity (released when its end is recorded)."""
        shift = self.shift
        earlier = shift.running.get(claim.job_id)
        if earlier is not None:  # canceled, in its grace period, and claimed again since
            earlier.kill_now()
            earlier.wait_blocking()
            shift.finished_one(earlier, None, None)
        shift.report.claimed += 1
        execution = supervise.Execution(claim, shift.capacity.allocate(claim))
        with shift.report.timings.spawn:
            execution.start(self.job_env, shift.worker_id, now, cells=shift.cells)
        shift.running[claim.job_id] = execution
        self.spin.spawned(now)
        if shift.log is not None:
            shift.log(
                {
                    "event": "attempt_started",
                    "at": time.time(),
                    "worker_id": shift.worker_id,
                    "queue": claim.queue,
                    "job_id": claim.job_id,
                    "attempt_id": claim.attempt_id,
                    "attempt_no": claim.attempt_no,
                    "pid": execution.pid,
                    "slot": execution.place.slot,
                    "error": execution.spawn_error,
                }
            )
        shift.output.track(
            claim.attempt_id, {"stdout": claim.stdout_path, "stderr": claim.stderr_path}
        )


def _ending(execution: supervise.Execution, outcome: Outcome) -> Ending:
    """An ended attempt as its outcome is recorded: a job whose spawn was not
    recorded yet has its pid stored with its end."""
    claim = execution.claim
    pid = None if execution.spawn_recorded else execution.pid
    held = bool(claim.devices)
    return Ending(claim.job_id, claim.attempt_id, claim.attempt_no, outcome, pid, held)
