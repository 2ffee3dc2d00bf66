"""The worker: reap -> claim -> execute -> record, for one queue.

One process runs up to `concurrency` attempts at once from a single-threaded
loop: children are watched through pidfds, new work is noticed by polling
SQLite's cheap `PRAGMA data_version` change counter, and heartbeats, timeouts
and signals are handled between waits. No transaction is open while a child
runs; every transaction is a short BEGIN IMMEDIATE.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from sqlalchemy import Connection, Engine

from spoolctl import procs
from spoolctl.config import Timing
from spoolctl.db.engine import read_tx, write_tx
from spoolctl.errors import Conflict, Locked
from spoolctl.services import claim as claiming
from spoolctl.services import execute, heartbeat, reaper
from spoolctl.services.outcome import Outcome, OwnershipLost, record_outcome
from spoolctl.states import FailureReason

Mode = Literal["loop", "once", "drain"]
WATCH_TICK_S = 0.01
"""How often an idle worker looks at the database's change counter."""
NO_PIDFD_TICK_S = 0.005


@dataclass(frozen=True)
class WorkerOptions:
    queue: str = "default"
    mode: Mode = "loop"
    slots: int | None = None
    worker_id: str | None = None
    poll_interval_s: float = 1.0
    concurrency: int = 1


@dataclass
class AttemptResult:
    job_id: int
    attempt_no: int
    result: str
    job_state: str | None


@dataclass
class WorkReport:
    worker_id: str
    claimed: int = 0
    results: list[AttemptResult] = field(default_factory=list)
    drained: bool = False
    stopped_by_signal: bool = False


def default_worker_id() -> str:
    return f"{procs.hostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    """Runs jobs of one queue from one SQLite file until its mode says stop."""

    def __init__(
        self,
        engine: Engine,
        output_root: Path,
        options: WorkerOptions,
        timing: Timing,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.output_root = output_root
        self.options = options
        self.timing = timing
        self.clock = clock
        self.worker_id = options.worker_id or default_worker_id()
        self.identity = procs.self_identity()
        self.hostname = procs.hostname()
        self.boot_id = procs.boot_id()
        self.running: dict[int, execute.Execution] = {}
        self.report = WorkReport(self.worker_id)
        self.signals = 0
        self._last_beat = 0.0
        self._next_claim_at = 0.0
        self._claim_exhausted = False
        self._data_version: int | None = None

    # -- lifecycle -------------------------------------------------------

    def run(self) -> WorkReport:
        self._register()
        with self._signal_handling() as wake_fd, self._watch_connection() as watch:
            try:
                self._loop(wake_fd, watch)
            finally:
                self._shutdown()
        return self.report

    def _register(self) -> None:
        now = self.clock()
        with write_tx(self.engine) as conn:
            existing = heartbeat.get_worker(conn, self.worker_id)
            if existing is not None and existing.state == "running":
                other = procs.ProcessIdentity(existing.pid, existing.process_started_at)
                alive = procs.is_same_process(other, procs.WORKER_MARKER)
                if existing.pid != self.identity.pid and alive is not procs.Liveness.DEAD:
                    raise Conflict(
                        f"worker id {self.worker_id!r} is in use by live pid {existing.pid}",
                        worker_id=self.worker_id,
                    )
            heartbeat.register_worker(
                conn,
                heartbeat.WorkerInfo(
                    id=self.worker_id,
                    hostname=self.hostname,
                    pid=self.identity.pid,
                    process_started_at=self.identity.started_at,
                    boot_id=self.boot_id,
                    queue=self.options.queue,
                    slots=self.options.slots,
                    concurrency=self.options.concurrency,
                ),
                now,
            )
        self._last_beat = now

    def _shutdown(self) -> None:
        """Kill what still runs (only after a hard stop or a fatal error) and
        mark the worker stopped, best effort."""
        for execution in list(self.running.values()):
            execution.kill_now()
            execution.wait_blocking()
        self.running.clear()
        try:
            with write_tx(self.engine) as conn:
                heartbeat.retire_worker(
                    conn, self.worker_id, self.clock(), len(self.report.results)
                )
        except Exception:
            pass

    # -- the loop --------------------------------------------------------

    def _loop(self, wake_fd: int, watch: Any) -> None:
        while True:
            now = self.clock()
            if self.signals >= 2:
                self._hard_stop(now)
                return
            self._beat_if_due(now)
            self._collect(now)
            if self._may_claim(now, watch):
                self._reap_pass(now)
                self._fill(now)
            if self._finished(now):
                return
            self._wait(wake_fd, now)

    def _may_claim(self, now: float, watch: Any) -> bool:
        if self.signals or len(self.running) >= self.options.concurrency:
            return False
        if self.options.mode == "once" and self.report.claimed:
            return False
        changed = self._database_changed(watch)
        return changed or not self._claim_exhausted or now >= self._next_claim_at

    def _fill(self, now: float) -> None:
        while len(self.running) < self.options.concurrency:
            claim = self._claim(now)
            if claim is None:
                self._claim_exhausted = True
                self._schedule_next_claim(now)
                return
            self._claim_exhausted = False
            self._start(claim, now)
            if self.options.mode == "once":
                return

    def _claim(self, now: float) -> claiming.Claim | None:
        try:
            with write_tx(self.engine) as conn:
                return claiming.claim_next(
                    conn,
                    worker_id=self.worker_id,
                    worker_pid=self.identity.pid,
                    queue=self.options.queue,
                    slots=self.options.slots,
                    output_root=self.output_root,
                    now=now,
                )
        except Locked:
            return None  # busy beyond the timeout: the job stays queued for the next pass

    def _schedule_next_claim(self, now: float) -> None:
        due = None
        try:
            with read_tx(self.engine) as conn:
                due = claiming.next_due_at(conn, self.options.queue)
        except Locked:
            pass
        fallback = now + self.options.poll_interval_s
        self._next_claim_at = fallback if due is None or due <= now else min(due, fallback)

    def _start(self, claim: claiming.Claim, now: float) -> None:
        self.report.claimed += 1
        slot = self._free_slot()
        execution = execute.Execution(claim, slot)
        execution.start(self.worker_id, now)
        self.running[claim.job_id] = execution
        self._record_spawn(execution)

    def _record_spawn(self, execution: execute.Execution) -> None:
        """Store the job's pid and start time on its attempt. Retried at every
        heartbeat until it lands: without it a reaper could not kill the job's
        group should this worker die, and the job could run twice at once."""
        if execution.proc is None or execution.spawn_recorded:
            return
        execution.spawn_recorded = self._write_quietly(
            partial(execute.record_spawn, execution=execution)
        )

    def _free_slot(self) -> int:
        used = {e.slot for e in self.running.values()}
        return next(i for i in range(self.options.concurrency) if i not in used)

    def _collect(self, now: float) -> None:
        for job_id, execution in list(self.running.items()):
            outcome = execution.poll(now)
            if outcome is not None:
                self._record(execution, outcome)
                del self.running[job_id]

    def _record(self, execution: execute.Execution, outcome: Outcome) -> None:
        claim = execution.claim
        state = None
        while True:
            try:
                with write_tx(self.engine) as conn:
                    state = record_outcome(
                        conn,
                        job_id=claim.job_id,
                        attempt_id=claim.attempt_id,
                        worker_id=self.worker_id,
                        outcome=outcome,
                        now=self.clock(),
                    )
                break
            except Locked:
                continue  # the outcome must not be lost: keep trying
            except OwnershipLost:
                break
        self.report.results.append(
            AttemptResult(
                claim.job_id,
                claim.attempt_no,
                outcome.label if state is not None else "lost_ownership",
                None if state is None else state.value,
            )
        )
        self._claim_exhausted = False

    def _finished(self, now: float) -> bool:
        mode = self.options.mode
        if self.signals:
            return not self.running
        if mode == "once":
            return not self.running and (self.report.claimed > 0 or self._claim_exhausted)
        if mode == "drain" and not self.running and self._claim_exhausted:
            try:
                with read_tx(self.engine) as conn:
                    settled = claiming.lane_settled(conn, self.options.queue, now)
            except Locked:
                return False
            self.report.drained = settled
            return settled
        return False

    # -- heartbeats and reaping ------------------------------------------

    def _beat_if_due(self, now: float) -> None:
        if now - self._last_beat < self.timing.heartbeat_interval_s:
            return
        pairs = [(job_id, e.claim.attempt_id) for job_id, e in self.running.items()]
        try:
            with write_tx(self.engine) as conn:
                lost = heartbeat.beat(conn, self.worker_id, pairs, now, len(self.report.results))
        except Locked:
            return
        self._last_beat = now
        for job_id in lost:
            execution = self.running.pop(job_id)
            execution.kill_now()
            execution.wait_blocking()
            self.report.results.append(
                AttemptResult(job_id, execution.claim.attempt_no, "lost_ownership", None)
            )
        for execution in self.running.values():
            self._record_spawn(execution)

    def _reap_pass(self, now: float) -> None:
        threshold = self.timing.reap_threshold_s
        try:
            with read_tx(self.engine) as conn:
                candidates = reaper.reap_candidates(conn, now, threshold)
        except Locked:
            return
        for cand in candidates:
            if cand.worker_id == self.worker_id and cand.job_id in self.running:
                continue
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
            self._write_quietly(partial(self._reap, cand))

    def _reap(self, cand: reaper.Candidate, conn: Connection) -> None:
        threshold = self.timing.reap_threshold_s
        reaper.reap(conn, cand, now=self.clock(), threshold_s=threshold, reaper_id=self.worker_id)

    # -- stopping ----------------------------------------------------------

    def _hard_stop(self, now: float) -> None:
        for execution in self.running.values():
            execution.force_end(FailureReason.CANCELED, "worker stopped by a second signal")
        for execution in list(self.running.values()):
            execution.wait_blocking()
            outcome = execution.poll(now)
            if outcome is not None:
                self._record(execution, outcome)
        self.running.clear()
        self.report.stopped_by_signal = True

    @contextmanager
    def _signal_handling(self) -> Iterator[int]:
        """First SIGINT/SIGTERM: finish running jobs, then exit. Second: kill them."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)

        def handler(_signum: int, _frame: FrameType | None) -> None:
            self.signals += 1
            self.report.stopped_by_signal = True

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        old_wakeup = signal.set_wakeup_fd(write_fd)
        try:
            yield read_fd
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, old in previous.items():
                signal.signal(sig, old)
            os.close(read_fd)
            os.close(write_fd)

    # -- waiting -----------------------------------------------------------

    @contextmanager
    def _watch_connection(self) -> Iterator[Any]:
        raw = self.engine.raw_connection()
        try:
            yield raw
        finally:
            raw.close()

    def _database_changed(self, watch: Any) -> bool:
        try:
            cursor = watch.cursor()
            cursor.execute("PRAGMA data_version")
            version = cursor.fetchone()[0]
            cursor.close()
        except Exception:
            return True
        changed = bool(version != self._data_version)
        self._data_version = version
        return changed

    def _wait(self, wake_fd: int, now: float) -> None:
        deadline = self._last_beat + self.timing.heartbeat_interval_s
        for execution in self.running.values():
            deadline = min(deadline, execution.next_wakeup())
        idle_capacity = len(self.running) < self.options.concurrency and not self.signals
        if idle_capacity and not (self.options.mode == "once" and self.report.claimed):
            deadline = min(deadline, now + WATCH_TICK_S, self._next_claim_at)
        fds = [wake_fd] + [e.pidfd for e in self.running.values() if e.pidfd is not None]
        if any(e.pidfd is None for e in self.running.values()):
            deadline = min(deadline, now + NO_PIDFD_TICK_S)
        timeout = max(0.0, deadline - now)
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            return
        if wake_fd in ready:
            with suppress(BlockingIOError):
                os.read(wake_fd, 512)

    def _write_quietly(self, fn: Callable[[Any], object]) -> bool:
        """Run fn in a write transaction; False if the lock stayed busy."""
        try:
            with write_tx(self.engine) as conn:
                fn(conn)
        except Locked:
            return False
        return True
