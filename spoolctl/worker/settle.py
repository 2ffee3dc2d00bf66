"""Recording ended attempts and claiming the next, in one short write
transaction per pass (the reap pass first: a stale job due for judging is
judged before anything is claimed), and starting what was claimed."""

from __future__ import annotations

import time

from sqlalchemy import Connection

from spoolctl.db.backends import statements
from spoolctl.services import claim as claiming
from spoolctl.services import due, execute
from spoolctl.services.outcome import Ending, Outcome, Recording
from spoolctl.worker.reaping import Reaping
from spoolctl.worker.shift import LOCK_SLICE_S, TRANSIENT, Shift
from spoolctl.worker.spin import Spin

Ended = list[tuple[execute.Execution, Outcome]]


class Settler:
    """Claims for one worker: when to look again (`next_claim_at`, and
    whether the last look found the lane exhausted), and the pass that
    records and claims."""

    def __init__(self, shift: Shift, reaping: Reaping) -> None:
        self.shift = shift
        self.reaping = reaping
        self.next_claim_at = 0.0
        self.exhausted = False
        self.job_env = execute.encoded_environment()
        """This process's environment, encoded once: the base of every job's."""
        self.spin = Spin()
        """Whether the wait for the ends of the jobs started looks without sleeping first."""

    def settle_and_claim(self, now: float, ended: Ended, wanted: int) -> list[claiming.Claim]:
        """Record ended attempts and claim up to `wanted` (plus the slots they
        free) in one write transaction. Nothing is lost when the write fails:
        ended attempts stay in `running` and are recorded on a later pass.
        A claim looks for stale jobs to reap first, at most once per heartbeat
        interval (as the reap pass of a busy worker does): reaping waits for a
        reap threshold anyway, and a drain does not pay the scan per job."""
        shift = self.shift
        for execution, _ in ended:
            self.spin.ended(now - execution.started_at)
        try:
            with shift.report.timings.db, shift.held.write_tx(LOCK_SLICE_S) as conn:
                with statements(conn).pipeline(conn) as gathered:  # its end: one wait for all
                    self._store_last_output(conn, ended)
                    recording = self._settle(conn, ended, now, answer_now=not gathered)
                    riding = self._spawns_riding(ended, now)
                    execute.record_spawns(conn, riding)
                    scan = wanted > 0 and now - shift.last_reap_pass >= shift.beat_every
                    stale = self.reaping.stale(conn, now, shift) if scan else []
                    claiming = None if stale else self._claiming(conn, now, wanted)
                # the outcomes first: where the claim sent beside them came up
                # short, its next look sees the jobs their successes released
                states = recording.states()  # None: the attempt was no longer ours
                claims = [] if claiming is None else claiming.claims()
                if claiming is not None:
                    self._claimed(conn, now, wanted, claims)
        except TRANSIENT:
            shift.output.failed()
            shift.backoff.failed(now)
            return []
        shift.backoff.ok()
        shift.output.landed()
        for execution in riding:
            execution.spawn_recorded = True
        for (execution, outcome), state in zip(ended, states, strict=True):
            shift.finished_one(execution, outcome, state)
        if scan:
            shift.last_reap_pass = now
        if stale:
            self.reaping.reap(stale, now, shift)
            claims = self._claim_only(now, wanted)
        return claims

    def _spawns_riding(self, ended: Ended, now: float) -> list[execute.Execution]:
        """The due spawn records of jobs still running: they ride with this
        pass instead of costing a transaction of their own."""
        over = {execution.claim.job_id for execution, _ in ended}
        due = self.shift.spawns_unrecorded(now, execute.SPAWN_RECORD_DELAY_S)
        return [e for e in due if e.claim.job_id not in over]

    def _store_last_output(self, conn: Connection, ended: Ended) -> None:
        """An ended attempt's remaining output is stored (where the writer
        stores any) in the transaction that records its outcome, so whoever
        sees it ended finds all of its output in the database."""
        if ended:
            ids = [execution.claim.attempt_id for execution, _ in ended]
            self.shift.output.copy(conn, ids, final=True)

    def _settle(self, conn: Connection, ended: Ended, now: float, *, answer_now: bool) -> Recording:
        """Record the ended attempts together (`Recording.states` reads the
        answer). A job whose spawn was not recorded yet has its pid stored with
        its end."""
        endings = [
            Ending(
                execution.claim.job_id,
                execution.claim.attempt_id,
                execution.claim.attempt_no,
                outcome,
                None if execution.spawn_recorded else execution.pid,
            )
            for execution, outcome in ended
        ]
        return Recording(
            conn, endings, worker_id=self.shift.worker_id, now=now, answer_now=answer_now
        )

    def _claiming(self, conn: Connection, now: float, wanted: int) -> claiming.Claiming:
        shift = self.shift
        return claiming.Claiming(
            conn,
            wanted,
            worker_id=shift.worker_id,
            worker_pid=shift.identity.pid,
            queue=shift.options.lane,
            slots=shift.options.cap,
            output_root=shift.output_root,
            now=now,
            enforces=shift.cells.enforces,
        )

    def _claimed(
        self, conn: Connection, now: float, wanted: int, claims: list[claiming.Claim]
    ) -> None:
        self.exhausted = len(claims) < wanted
        if self.exhausted:
            self.next_claim_at = self._next_claim_time(conn, now)

    def _claim_in(self, conn: Connection, now: float, wanted: int) -> list[claiming.Claim]:
        claims = self._claiming(conn, now, wanted).claims()
        self._claimed(conn, now, wanted, claims)
        return claims

    def _claim_only(self, now: float, wanted: int) -> list[claiming.Claim]:
        try:
            with self.shift.report.timings.db, self.shift.held.write_tx(LOCK_SLICE_S) as conn:
                return self._claim_in(conn, now, wanted)
        except TRANSIENT:
            self.shift.backoff.failed(now)
            return []

    def _next_claim_time(self, conn: Connection, now: float) -> float:
        due_at = due.next_due_at(conn, self.shift.options.lane)
        fallback = now + self.shift.options.poll_interval_s
        return fallback if due_at is None or due_at <= now else min(due_at, fallback)

    def start(self, claim: claiming.Claim, now: float) -> None:
        """Spawn a claimed job (its claim committed first) in a free slot."""
        shift = self.shift
        shift.report.claimed += 1
        execution = execute.Execution(claim, shift.free_slot())
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
                    "slot": execution.slot,
                    "error": execution.spawn_error,
                }
            )
        shift.output.track(
            claim.attempt_id, {"stdout": claim.stdout_path, "stderr": claim.stderr_path}
        )
